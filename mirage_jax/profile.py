"""Device-time measurement: the chained method and the profiler-trace method.

One jitted program calls the operation N times in a chain and is timed against the same program
with one call; (t(N+1) − t(1)) / N is the per-call device time, free of the ~37 µs of Python
dispatch a lone call pays. Calls are chained by `lax.optimization_barrier` over (the next call's
inputs, the previous call's outputs): the calls run in order and XLA can neither hoist, merge
nor common them out, yet no extra kernel runs (an `x + acc·0` link would add a small kernel per
call to custom-call kernels but fuse into XLA's own, a bias of a few µs). Input sets rotate so
that the chain's working set exceeds the L2 cache, so small problems are not timed hot in L2.
Warm-up first; each repeat times both programs back to back; the result is the median and
spread over repeats. On a CPU it runs the same way for tests, labelled as not device time.

The second method, `time_trace` (the results tables' clock), runs the operation `calls` times under
`jax.profiler.trace` and sums, per call, the durations of the kernels the GPU ran (the XSpace's
"/device:GPU:N" plane, its stream lines). It counts no launch gap, so it reads lower than the
chained method wherever kernels are shorter than the host needs to launch them; the difference
of the two is that launch-bound share (experiments/timing_check.py measures both).
"""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile
import time
import warnings
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
    """Bytes of the array leaves of `xs` (arguments may be pytrees: modules, dicts)."""
    leaves = [x for x in jax.tree_util.tree_leaves(xs) if hasattr(x, "shape")]
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)


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


def _input_sets(
    inputs: Sequence[Any] | Callable[[int], Sequence[Any]],
    calls: int,
    max_sets: int | None,
    rotate_bytes: int,
) -> list[tuple[Any, ...]]:
    """Device-resident input sets: enough to exceed `rotate_bytes`, at most `calls`."""
    if not callable(inputs):
        return [tuple(jax.device_put(x) for x in inputs)]
    first = [jax.device_put(x) for x in inputs(0)]
    per_set = max(1, _nbytes(first))
    want = min(max_sets or calls, calls, max(1, math.ceil(rotate_bytes / per_set)))
    sets = [first] + [[jax.device_put(x) for x in inputs(s)] for s in range(1, want)]
    return [tuple(s) for s in sets]


def warm(
    fn: Callable[..., Any],
    inputs: Callable[[int], Sequence[Any]],
    calls: int = 30,
    rotate_bytes: int = 2 * L2_BYTES,
) -> None:
    """Draw the input sets `time_trace(fn, inputs, calls=calls)` will rotate over and run `fn`
    once on the first (compiling it): what a timing would do before its first call, done
    ahead (in a thread, beside other compiles); `inputs` should cache its sets."""
    sets = _input_sets(inputs, calls, None, rotate_bytes)
    jax.block_until_ready(fn(*sets[0]))


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
    sets = _input_sets(inputs, chain + 1, max_sets, rotate_bytes)
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


# ---------------------------------------------------------------------------- profiler trace
@dataclass(frozen=True)
class KernelEvent:
    """One kernel (or memcpy/memset) the GPU ran, from a profiler trace; times in ns."""

    name: str
    start_ns: float
    duration_ns: float
    stream: str
    labels: tuple[str, ...] = ()
    """The event's text stats (the op it ran for, its op_name where the trace has it)."""


def gpu_events(xspace: Any) -> list[KernelEvent]:
    """The events on the GPU planes' stream lines of a `jax.profiler.ProfileData`, by start.

    Derived lines ("XLA Modules", "XLA Ops", "Steps", ...) repeat the kernels' time and are
    skipped: only lines named "Stream ..." are read.
    """
    out = []
    for plane in xspace.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for e in line.events:
                with warnings.catch_warnings():  # the stats' binding type warns on iteration
                    warnings.simplefilter("ignore", DeprecationWarning)
                    labels = tuple(v for _, v in e.stats if isinstance(v, str))
                out.append(KernelEvent(e.name, e.start_ns, e.duration_ns, line.name, labels))
    return sorted(out, key=lambda e: e.start_ns)


def trace_events(run: Callable[[], Any], log_dir: str | None = None) -> list[KernelEvent]:
    """Run `run()` (it should block until its work is done) under the profiler; its GPU events.

    Raises RuntimeError when the trace has no GPU plane (no GPU, or CUPTI missing).
    """
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as tmp:
        where = log_dir or tmp
        with jax.profiler.trace(where):
            run()
        files = sorted(glob.glob(os.path.join(where, "**", "*.xplane.pb"), recursive=True))
        if not files:
            raise RuntimeError(f"jax.profiler.trace wrote no .xplane.pb under {where}")
        data = ProfileData.from_file(max(files, key=os.path.getmtime))
        if not any(p.name.startswith("/device:GPU") for p in data.planes):
            raise RuntimeError(
                "the profiler trace has no GPU plane: time_trace needs a CUDA GPU and CUPTI"
            )
        return gpu_events(data)


@dataclass(frozen=True)
class TraceTiming(Timing):
    """A `Timing` by the profiler-trace method, with the per-kernel breakdown.

    Arguments:
        kernels: (kernel name, mean µs per call, launches per call), longest first.
        span_us: median per call of last kernel end − first kernel start (one call alone).
    """

    kernels: tuple[tuple[str, float, float], ...] = ()
    span_us: float = 0.0
    regions: tuple[tuple[int, float], ...] = ()
    """(region index, mean µs per call) of `mirage_jax.jit`'s kernels, by the region name scope
    their ops carry (`assemble.REGION_SCOPE`, where the trace has op names: `region_times`)."""


REGION_LABEL = re.compile(r"mirage_jax\.region(\d+)(?![0-9])")


def region_times(events: Sequence[KernelEvent], calls: int) -> tuple[tuple[int, float], ...]:
    """Mean µs per call of the events of each `mirage_jax.jit` region, told apart by the name
    scope in their labels (`assemble.REGION_SCOPE`); none where no label names a region."""
    per: dict[int, float] = {}
    for e in events:
        found = {int(m) for text in e.labels for m in REGION_LABEL.findall(text)}
        if len(found) == 1:
            (k,) = found
            per[k] = per.get(k, 0.0) + e.duration_ns / 1e3 / calls
    return tuple(sorted(per.items()))


def per_call(events: Sequence[KernelEvent], calls: int) -> tuple[list[float], list[float]]:
    """Split a trace of `calls` identical calls into calls: (kernel µs, span µs) per call.

    Each call runs the same kernels, so the events (by start) fall into `calls` groups of
    equal size; a trace that does not divide evenly is reported as one group.
    """
    if not events:
        return [0.0] * calls, [0.0] * calls
    if len(events) % calls:
        total = sum(e.duration_ns for e in events) / calls / 1e3
        return [total], [(events[-1].start_ns + events[-1].duration_ns - events[0].start_ns) / 1e3]
    k = len(events) // calls
    sums, spans = [], []
    for i in range(calls):
        g = events[i * k : (i + 1) * k]
        sums.append(sum(e.duration_ns for e in g) / 1e3)
        spans.append((max(e.start_ns + e.duration_ns for e in g) - g[0].start_ns) / 1e3)
    return sums, spans


def time_trace(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Callable[[int], Sequence[Any]],
    *,
    calls: int = 50,
    warmup: int = 3,
    max_sets: int | None = None,
    rotate_bytes: int = 2 * L2_BYTES,
    feed: Callable[[tuple[Any, ...], Any], Sequence[Any]] | None = None,
) -> TraceTiming:
    """Per-call device time of `fn` by the profiler-trace method (GPU only).

    Each of `calls` calls is dispatched and completed alone (rotating input sets, as in
    `time_device`), under one `jax.profiler.trace`; per call, the durations of the kernels the
    GPU ran are summed. The result is the median and spread over calls, and every kernel's
    mean time per call.

    `feed(args, outputs)`: the arguments of the next call on the same input set, as a decode
    loop passes its donated caches on (a function with `donate_argnums` can run each buffer
    once); without it every call reuses its set's arguments.
    """
    if calls < 1:
        raise ValueError("calls must be >= 1")
    sets = _input_sets(inputs, calls, max_sets, rotate_bytes)
    jfn = fn if hasattr(fn, "lower") else jax.jit(fn)

    def call(i: int) -> None:
        args = sets[i % len(sets)]
        out = jax.block_until_ready(jfn(*args))
        if feed is not None:
            sets[i % len(sets)] = tuple(feed(args, out))

    for i in range(warmup):
        call(i)

    def run() -> None:
        for i in range(calls):
            call(i)

    events = trace_events(run)
    sums, spans = per_call(events, calls)
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.duration_ns / 1e3)
    kernels = sorted(
        ((n, sum(v) / calls, len(v) / calls) for n, v in by_name.items()), key=lambda k: -k[1]
    )
    arr = np.asarray(sums)
    device, _ = _device_kind()
    return TraceTiming(
        median_us=float(np.median(arr)),
        p10_us=float(np.percentile(arr, 10)),
        p90_us=float(np.percentile(arr, 90)),
        n=len(sums),
        chain=1,
        input_sets=len(sets),
        device=device,
        device_time=True,
        method=(
            f"profiler trace: {calls} calls, each dispatched and completed alone ({len(sets)} "
            f"rotating input sets), under jax.profiler.trace; per call = sum of the durations "
            f"of the kernels on the GPU's stream lines (no launch gaps); {warmup} warm-up "
            f"calls; median and p10/p90 over calls"
            + ("; each call's outputs fed to the next on its set (donated buffers)" if feed else "")
        ),
        samples_us=tuple(float(s) for s in sums),
        kernels=tuple((n, float(us), float(c)) for n, us, c in kernels),
        span_us=float(np.median(spans)),
        regions=region_times(events, calls),
    )
