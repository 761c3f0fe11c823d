"""What the decorator asks of its environment: one warning per cause, strictness, the device."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings

import jax

import lax_ir


class MirageWarning(UserWarning):
    """mirage_jax ran (part of) a function as plain XLA; the message says why."""


class FallbackError(RuntimeError):
    """Strict mode: mirage_jax would have run part of a function as XLA (the cause is chained)."""


STRICT_ENV = "MIRAGE_JAX_STRICT"
"""Set to 1 to make every fallback to XLA raise `FallbackError` (as `jit(strict=True)`)."""

_WARNED: set[str] = set()


def strict_default() -> bool:
    """Is strict mode on by the environment (`MIRAGE_JAX_STRICT`)?"""
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def fallback(
    key: str, message: str, cause: BaseException | None = None, strict: bool | None = None
) -> None:
    """A failure that makes (part of) a function run as XLA: a warning, or in strict mode
    (`strict`, default `strict_default()`) a `FallbackError` with `cause` chained."""
    if strict_default() if strict is None else strict:
        raise FallbackError(message) from cause
    warn_once(key, message)


def _library_dirs() -> tuple[str, ...]:
    import os

    dirs = [jax.__file__, lax_ir.__file__, __file__, functools.__file__]
    return tuple(os.path.dirname(os.path.abspath(d)) for d in dirs)


def warn_once(key: str, message: str) -> None:
    """Warn with `message` the first time `key` is seen in this process.

    The warning points at the first frame outside jax, lax_ir and mirage_jax (the user's call).
    """
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, MirageWarning, stacklevel=2, skip_file_prefixes=_library_dirs())


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def device_kind() -> str:
    """The default device's kind, e.g. "NVIDIA H100 80GB HBM3" or "cpu"."""
    try:
        return str(jax.devices()[0].device_kind)
    except (RuntimeError, IndexError):
        return "unknown"


TRACE_CONTEXT_MODULES = ("jax.experimental.pallas", "jax._src.pallas.fuser")
"""Modules that register JAX trace-context states when first imported, and that lowering a
kernel imports (Pallas' interpreter imports the fuser on first use)."""


@functools.cache
def settle_trace_context() -> None:
    """Import `TRACE_CONTEXT_MODULES` before a first call is dispatched.

    `jax.jit` keys its cache on the trace context, which grows when such a module is imported.
    Imported during the first call's trace, it makes the second call with the same arguments
    trace, search its memo and compile again (4.5 s on a tiny GPT-2 block in interpret mode).
    """
    for name in TRACE_CONTEXT_MODULES:
        with contextlib.suppress(ImportError):  # another jax release: nothing to settle
            importlib.import_module(name)


def trace_context_size() -> int:
    """How many states `jax.jit`'s cache key holds (to notice one registered mid-trace)."""
    from jax._src import config

    return len(config.trace_context_names())
