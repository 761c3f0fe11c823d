"""The one registry of backends: name -> lowering module, interpret flag, availability, description.

`lower()`, `mirage_jax.jit`, `explain` and the CLI read it; nothing else names a backend.
A backend lowers each graph-defined kernel of a µGraph with its module's `build_kernel`
(pre-defined kernel ops always run as their jnp meaning, which XLA fuses); "reference" lowers
nothing and runs the µGraph's own evaluator. `mirage_jax.jit` also accepts the two choices in
`CHOICES` that are not backends: "auto" (resolved by `resolve`) and "xla" (replace nothing).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType


class UnknownBackend(ValueError):
    """A backend name that is not registered (the message lists the choices)."""


@dataclass(frozen=True)
class Backend:
    """One way to run a µGraph's graph-defined kernels.

    Arguments:
        name: what users pass (`backend=`, `--backend`).
        module: the lowering module (with `build_kernel`, `default_config`), or None for the
            µGraph's jnp evaluator.
        interpret: kernels run in interpret mode (on any machine; slow).
        needs_gpu: the kernels only run on a CUDA GPU.
        requires: Python packages it imports at lowering time.
        description: one line for help texts.
        problem: why the installed packages cannot run it, or None (checked after `requires`).
    """

    name: str
    module: str | None
    interpret: bool
    needs_gpu: bool
    description: str
    requires: tuple[str, ...] = ()
    problem: Callable[[], str | None] | None = None

    def missing(self) -> tuple[str, ...]:
        """The required packages that do not import here."""
        return tuple(p for p in self.requires if importlib.util.find_spec(p) is None)

    def available(self, has_gpu: bool) -> tuple[bool, str]:
        """Can it run here? (ok, why not)."""
        if self.needs_gpu and not has_gpu:
            return False, f"backend {self.name!r} needs a GPU (no GPU here)"
        missing = self.missing()
        if missing:
            return False, f"backend {self.name!r} needs {', '.join(missing)} (the `gpu` extra)"
        if self.problem is not None and (problem := self.problem()):
            return False, f"backend {self.name!r}: {problem}"
        return True, ""

    def load(self) -> ModuleType:
        """The lowering module (imported on first use)."""
        if self.module is None:
            raise UnknownBackend(f"backend {self.name!r} has no lowering module")
        return importlib.import_module(self.module)


_PALLAS = "mirage_jax.lower.pallas"
_TRITON = "mirage_jax.lower.triton"

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("pallas", _PALLAS, False, True, "Pallas kernels (Triton lowering), GPU"),
        Backend(
            "triton", _TRITON, False, True, "generated Triton kernels through jax-triton, GPU",
            ("jax_triton",), lambda: jax_triton_problem(),
        ),
        Backend(
            "pallas-interpret", _PALLAS, True, False,
            "Pallas kernels in interpret mode (any machine, slow; for testing)",
        ),
        Backend(
            "reference", None, False, False,
            "the µGraph's own jnp evaluator instead of kernels (for testing)",
        ),
    )
}  # fmt: skip
"""The backends `lower()` accepts."""

CHOICES: dict[str, str] = {
    "auto": "on a GPU Triton through jax-triton where it is installed, else Pallas; XLA "
    "without a GPU",
    **{name: b.description for name, b in BACKENDS.items()},
    "xla": "never replace a region",
}
"""What `mirage_jax.jit(backend=...)` and `--backend` accept, with a line each."""


def get(name: str) -> Backend:
    """The backend `name`, or UnknownBackend listing the choices."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}"
        ) from None


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


@functools.cache
def jax_triton_problem() -> str | None:
    """Why the installed jax-triton cannot launch kernels here, or None where it can tell none.

    jax-triton imports even where it does not fit the installed triton: it then replaces
    triton's NVIDIA backend with a stub and every kernel fails at its first call (seen with
    jax-triton 0.4.1 beside triton 3.6). This says so once, before any region is searched.
    """
    try:
        from jax_triton import triton_lib
    except Exception as e:  # any import failure makes the backend unusable
        return f"jax_triton does not import ({type(e).__name__}: {e})"
    cuda = getattr(getattr(triton_lib, "cb", None), "CUDABackend", None)
    if cuda is not None and not str(getattr(cuda, "__module__", "")).startswith("triton"):
        return (
            f"jax-triton {_version('jax-triton')} cannot load triton {_version('triton')}'s "
            "NVIDIA backend (jax-triton 0.3.1 matches triton 3.6; 0.4 needs triton >= 3.7): "
            'install the matching jax-triton (pip install "mirage-jax[gpu]")'
        )
    return None


def gpu_default() -> str:
    """What "auto" lowers to on a GPU: jax-triton where it imports and fits the installed
    triton (`jax_triton_problem`), else Pallas (with a warning naming the problem).

    On the H100 (experiments/results/h100-2026-11-21-final.md) the best searched µGraph through
    our Triton source was never more than 2% slower than through Pallas and faster on 12 of 21
    benchmarks (attention at b=8/16 by 1.5-1.7x); Pallas is the fallback when jax-triton is
    not installed (the `gpu` extra).
    """
    triton = BACKENDS["triton"]
    if triton.missing():
        return "pallas"
    problem = triton.problem() if triton.problem is not None else None
    if problem:
        from mirage_jax._env import warn_once

        warn_once("jax-triton-unusable", f"mirage_jax: {problem}; backend='auto' uses Pallas")
        return "pallas"
    return "triton"


def resolve(choice: str, has_gpu: bool) -> tuple[str | None, str]:
    """The backend a `jit` choice lowers to here, or (None, why every region stays XLA)."""
    if choice not in CHOICES:
        raise UnknownBackend(f"backend must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "xla":
        return None, "backend='xla'"
    name = gpu_default() if choice == "auto" and has_gpu else choice
    if name == "auto":
        return None, "no GPU (backend='pallas-interpret' runs kernels in interpret mode)"
    ok, why = BACKENDS[name].available(has_gpu)
    return (name, "") if ok else (None, f"{why} (backend='pallas-interpret' runs anywhere)")


def describe() -> str:
    """The choices as one help line: "auto (…), pallas (…), …"."""
    return ", ".join(f"{name} ({text})" for name, text in CHOICES.items())
