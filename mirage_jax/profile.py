"""Device-time measurement: the chained method of BENCHMARKS.md ("How to time").

One jitted program calls the operation N times in a chain and is timed against the same program
with one call; (t(N+1) − t(1)) / N is the per-call device time, free of the ~37 µs of Python
dispatch a lone call pays. Calls are chained by `lax.optimization_barrier` over (the next call's
inputs, the previous call's outputs): the calls run in order and XLA can neither hoist, merge
nor common them out, yet no extra kernel runs (an `x + acc·0` link would add a small kernel per
call to custom-call kernels but fuse into XLA's own, a bias of a few µs). Input sets rotate so
that the chain's working set exceeds the L2 cache, so small problems are not timed hot in L2.
Warm-up first; each repeat times both programs back to back; the result is the median and
spread over repeats. On a CPU it runs the same way for tests, labelled as not device time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import jax
import numpy as np

L2_BYTES = 50 * 2**20
"""The H100's L2 cache (50 MiB); rotation makes the chain's working set exceed 2× this."""


@dataclass(frozen=True)
class Timing:
    """One operation's timing.

    Arguments:
        median_us: median per-call time over repeats, in µs.
        p10_us, p90_us: 10th and 90th percentiles over repeats.
        n: number of repeats (samples).
        chain: N, calls per chained program.
        input_sets: distinct input sets rotated through the chain.
        device: the device's kind (e.g. "NVIDIA H100 80GB HBM3", "cpu").
        device_time: True when measured on a GPU (device time); False on the CPU.
        method: how it was measured, in words (write it into results files).
        samples_us: the per-repeat estimates.
    """

    median_us: float
    p10_us: float
    p90_us: float
    n: int
    chain: int
    input_sets: int
    device: str
    device_time: bool
    method: str
    samples_us: tuple[float, ...] = field(default=(), repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples_us"] = list(self.samples_us)
        return d

    def __str__(self) -> str:
        kind = "device" if self.device_time else "CPU wall (not device time)"
        return (
            f"{self.median_us:.2f} µs [p10 {self.p10_us:.2f}, p90 {self.p90_us:.2f}] "
            f"({kind}, n={self.n}, chain={self.chain}, sets={self.input_sets})"
        )


def _nbytes(xs: Sequence[Any]) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in xs)


def chained(fn: Callable[..., Any], calls: int) -> Callable[..., Any]:
    """A function of R input sets running `fn` `calls` times, set i % R for call i, in order.

    Each call's inputs pass through `lax.optimization_barrier` together with the previous
    call's outputs, which orders the calls and hides their equality from XLA without adding
    any kernel. Returns every call's outputs (so none is dead code).
    """

    def run(sets):
        prev = None
        outs = []
        for i in range(calls):
            xs = sets[i % len(sets)]
            if prev is not None:
                xs, prev = jax.lax.optimization_barrier((xs, prev))
            prev = fn(*xs)
            outs.append(prev)
        return outs

    return jax.jit(run)


def _device_kind() -> tuple[str, bool]:
    d = jax.devices()[0]
    return getattr(d, "device_kind", d.platform), d.platform == "gpu"


def time_device(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Callable[[int], Sequence[Any]],
    *,
    chain: int = 32,
    repeats: int = 25,
    warmup: int = 3,
    max_sets: int | None = None,
    rotate_bytes: int = 2 * L2_BYTES,
) -> Timing:
    """Per-call device time of `fn` by the chained method (see the module docstring).

    Arguments:
        fn: a JAX function of positional arrays (jitted or not).
        inputs: one input set, or `seed -> input set` to draw rotating sets.
        chain: N, the calls in the long program (the short one makes 1).
        repeats: samples; each times both programs once, back to back.
        warmup: untimed runs of each program first (compilation, autotuning, caches).
        max_sets: cap on distinct input sets (default: chain + 1, all distinct).
        rotate_bytes: draw sets until together they exceed this many bytes.
    """
    if chain < 1 or repeats < 1:
        raise ValueError("chain and repeats must be >= 1")
    if callable(inputs):
        first = [jax.device_put(x) for x in inputs(0)]
        per_set = max(1, _nbytes(first))
        want = min(max_sets or chain + 1, chain + 1, max(1, math.ceil(rotate_bytes / per_set)))
        sets = [first] + [[jax.device_put(x) for x in inputs(s)] for s in range(1, want)]
    else:
        sets = [[jax.device_put(x) for x in inputs]]
    sets = [tuple(s) for s in sets]
    long_prog = chained(fn, chain + 1)
    short_prog = chained(fn, 1)
    short_sets = sets[:1]
    for _ in range(warmup):
        jax.block_until_ready(long_prog(sets))
        jax.block_until_ready(short_prog(short_sets))

    def wall(prog, arg) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(prog(arg))
        return time.perf_counter() - t0

    samples = []
    for _ in range(repeats):
        t_long = wall(long_prog, sets)
        t_short = wall(short_prog, short_sets)
        samples.append((t_long - t_short) / chain * 1e6)
    arr = np.asarray(samples)
    device, on_gpu = _device_kind()
    method = (
        f"chained: one jitted program calls the op {chain + 1} times (inputs tied to the "
        f"previous outputs by lax.optimization_barrier; {len(sets)} rotating input sets), "
        f"timed against 1 call; per call = (t({chain + 1}) - t(1)) / {chain}; {warmup} warm-up "
        f"runs; median and p10/p90 over {repeats} repeats"
        + ("" if on_gpu else "; CPU wall clock, NOT device time")
    )
    return Timing(
        median_us=float(np.median(arr)),
        p10_us=float(np.percentile(arr, 10)),
        p90_us=float(np.percentile(arr, 90)),
        n=repeats,
        chain=chain,
        input_sets=len(sets),
        device=device,
        device_time=on_gpu,
        method=method,
        samples_us=tuple(float(s) for s in samples),
    )


def copy_bandwidth(nbytes: int = 1 << 30, **kwargs: Any) -> tuple[float, Timing]:
    """Measured device copy bandwidth in bytes/s (read + write), by the same method."""
    n = nbytes // 2 // 4
    timing = time_device(lambda x: x + 1.0, [np.ones(n, np.float32)], **kwargs)
    return 2 * n * 4 / (timing.median_us * 1e-6), timing
