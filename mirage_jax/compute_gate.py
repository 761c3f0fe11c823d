"""Regions no kernel of ours can win: XLA is faster than our kernels' compute floor.

A region made of large GEMMs (a prefill's projections over 4096 rows) is compute-bound, and
every kernel the search can produce does at least the region's matmul flops at no more than the
rate our lowered kernels have ever reached (`CEILING_FLOPS`, measured per device). Where XLA's
measured time for the region is already below `flops / ceiling`, only a kernel faster than any
of ours has been could win, so the search (enumeration, cuts, full-size verification: 50 s for
one GPT-2 prefill projection at b=8 on the H100) is skipped and the region runs as XLA with
both numbers in its reason.

Only regions whose compute floor is at least `MIN_FLOOR_US` are checked (the others cost an XLA
timing for nothing); XLA's time is kept for `select`, which then does not measure it again.
Off with the option `compute_gate=False` (to search anyway, e.g. after improving the GEMMs).

A region of elementwise ops only (`fused_by_xla`: no matmul, no reduction; a rotary product,
a scalar rescale) is not searched either: in the whole function XLA fuses such ops into their
neighbours, which a kernel of its own cannot match, however it does alone. Off with the option
`elementwise_gate=False`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from lax_ir.program import matmul_flops as matmul_flops

CEILING_FLOPS: dict[str, float] = {"H100": 3.0e14, "H200": 3.0e14}
"""Per device kind (a substring of `jax.Device.device_kind`): a rate above the fastest any of
our kernels has run, in flop/s of matmuls. Measured on the H100 (2026-11-25, fp16, device
time): gqa's attention at b=16, 8.6 Gflop in 30.6 µs (281 Tflop/s), the fastest; GEMM-shaped
regions at most 207 (GPT-2 prefill b=8's fc2 + residual: 34.4 Gflop in 166.3 µs). A region
gated here could only be won by a kernel faster than any of ours has been. Raise it when the
lowering gets faster (the H200's compute is the H100's: the same ceiling)."""

MIN_FLOOR_US = 5.0
"""Regions whose compute floor at the ceiling is below this are searched without the check."""

_XLA: dict[tuple, tuple[float, str]] = {}
_LOCK = threading.Lock()


def ceiling(device: str) -> float | None:
    """Our kernels' ceiling on `device` (flop/s), or None where it was never measured."""
    return next((v for k, v in CEILING_FLOPS.items() if k in device), None)


def floor_us(program: Any, device: str) -> float | None:
    """The least time any of our kernels for `program` can take on `device` (µs), or None."""
    peak = ceiling(device)
    return None if peak is None else matmul_flops(program) / peak * 1e6


def _key(program: Any, opts: Any, backend: str, in_context: bool) -> tuple:
    return (program.canonical_hash, opts.seed, backend, in_context)


def time_xla(
    program: Any,
    opts: Any,
    backend: str,
    context: Any = None,
    timer: Callable[..., Any] | None = None,
) -> tuple[float, str]:
    """XLA's time for the region (µs) and the method, measured as `select` measures it: in
    `context` (`select.InContext`) where the region has layout steps at its interface, else
    on the canonical inputs; kept for `known_xla`."""
    from mirage_jax.select import IN_CONTEXT, _default_timer, as_timing, random_inputs, xla_timed_fn

    run = xla_timed_fn(program, lambda s: random_inputs(program, opts.seed + s), context)
    us, method = as_timing((timer or _default_timer)(*run))
    if context is not None:
        method += IN_CONTEXT
    with _LOCK:
        _XLA[_key(program, opts, backend, context is not None)] = (us, method)
    return us, method


def known_xla(program: Any, opts: Any, backend: str, in_context: bool) -> tuple[float, str] | None:
    """XLA's time for the region if `time_xla` measured it in this process, else None."""
    with _LOCK:
        return _XLA.get(_key(program, opts, backend, in_context))


ELEMENTWISE_EVIDENCE = (
    "on the H100, 2026-11-25, the real-model blocks' 14 such kernels that won their regions "
    "alone were all left out by the whole-function check, the function faster without them"
)


def fused_by_xla(program: Any, opts: Any, device: str) -> tuple[str, dict[str, Any]] | None:
    """(reason, timings) for a region of elementwise ops only, which XLA fuses into its
    neighbours in the whole function; None for any other region, or with the option off."""
    from lax_ir.ops import ELEMENTWISE, SHAPE_OPS

    if not opts.options.get("elementwise_gate", True):
        return None
    ops = [n.op for _, n in program.ops()]
    if not ops or any(op not in ELEMENTWISE and op not in (*SHAPE_OPS, "constant") for op in ops):
        return None
    reason = (
        "not searched: elementwise ops only, which XLA fuses into their neighbours in the whole "
        f"function and a kernel of their own cannot ({ELEMENTWISE_EVIDENCE})"
    )
    return reason, {"device": device, "search_s": 0.0}


def unwinnable(
    program: Any,
    opts: Any,
    backend: str,
    device: str,
    context: Any = None,
    timer: Callable[..., Any] | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """(reason, timings) for a region no kernel of ours can win on `device`, or None where it
    may be won or is not checked (a small compute floor, the option off, a device never
    measured). Times XLA (`time_xla`) only for the regions it checks."""
    if not opts.options.get("compute_gate", True):
        return None
    least = floor_us(program, device)
    if least is None or least < MIN_FLOOR_US:
        return None
    xla_us, method = time_xla(program, opts, backend, context, timer)
    if xla_us > least:
        return None
    gflop = matmul_flops(program) / 1e9
    reason = (
        f"not searched: XLA {xla_us:.2f} µs is below our kernels' compute floor "
        f"{least:.2f} µs ({gflop:.1f} Gflop of matmuls at {ceiling(device) / 1e12:.0f} "
        "Tflop/s, above the fastest any of our kernels has run on this device)"
    )
    timings = {"device": device, "xla_us": xla_us, "compute_floor_us": round(least, 2),
               "method": method, "search_s": 0.0}  # fmt: skip
    return reason, timings
