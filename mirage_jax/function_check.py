"""The whole-function check: the function with its kernels against `jax.jit` of the function.

Per-region selection compares a kernel with XLA's code for the same region; cutting the
program there can still cost XLA fusions across the region's boundary. So on the first call
of a signature (on a GPU), the assembled function and the function itself under `jax.jit` are
timed the same way as the results tables (`profile.time_trace`: the GPU's kernel time per
call, rotating random inputs); unless the kernels make it faster, the signature runs as plain
`jax.jit`. The outcome, with both times, is cached under the function's Program hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend import core as jex_core

FUNCTION_CHECK = "function_check"
"""The cache-key option that marks a whole-function entry (its value: the kernels' keys)."""


@dataclass(frozen=True)
class FunctionCheck:
    """The outcome: "kernels" (the assembled function is faster) or "xla", with both times."""

    choice: str
    kernels_us: float | None
    xla_us: float | None
    method: str
    source: str = "measured"  # or "cache"

    @property
    def reason(self) -> str:
        if self.kernels_us is None or self.xla_us is None:
            return f"whole function: {self.choice} ({self.method})"
        verdict = "faster" if self.choice == "kernels" else "not faster"
        return (
            f"whole function with kernels {self.kernels_us:.2f} µs against jax.jit "
            f"{self.xla_us:.2f} µs ({self.method}, {self.source}): {verdict}"
        )

    def timings(self) -> dict[str, Any]:
        return {
            "choice": self.choice,
            "kernels_us": self.kernels_us,
            "xla_us": self.xla_us,
            "method": self.method,
        }

    @staticmethod
    def from_timings(t: dict[str, Any]) -> FunctionCheck:
        return FunctionCheck(t["choice"], t["kernels_us"], t["xla_us"], t["method"], "cache")


def kernels_key(cache_keys: Sequence[str]) -> str:
    """What the check depends on: the cache keys of the substituted regions' entries."""
    return hashlib.sha256(json.dumps(sorted(cache_keys)).encode()).hexdigest()


def measure(
    program: Any, assembled: Callable[[Sequence[Any]], list[Any]], seed: int = 0, calls: int = 30
) -> FunctionCheck:
    """Time `assembled` (flat inputs, as `assemble` returns) and the captured function itself
    under `jax.jit` on the same random inputs; call it eagerly (not inside a trace)."""
    from mirage_jax.profile import time_trace
    from mirage_jax.select import random_inputs

    original = jax.jit(jex_core.jaxpr_as_fun(program.meta["jaxpr"]))
    with_kernels = jax.jit(lambda *xs: assembled(xs))

    def inputs(s: int) -> list[Any]:
        return random_inputs(program, seed + s)

    xla = time_trace(original, inputs, calls=calls)
    mine = time_trace(with_kernels, inputs, calls=calls)
    choice = "kernels" if mine.median_us < xla.median_us else "xla"
    return FunctionCheck(choice, mine.median_us, xla.median_us, "mirage_jax.profile.time_trace")
