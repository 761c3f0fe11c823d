"""`select`: lower the most promising searched µGraphs, time them and XLA, keep the fastest.

It sits above the search (it takes a `SearchResult`), the lowering and the timers.

The search ranks its µGraphs by the cost model; `select` lowers `top` of them (the best of each
structure first, `timing_order`) with
the chosen backend (verifying each at full size first when asked), checks each against the
region run in float64 (a lowering that computes something else is dropped, never timed), times
them and the plain XLA function the same way (`mirage_jax.profile.time_trace`, the GPU's
kernel time per call that the results tables use, unless a `timer` is given), and returns the fastest. XLA is a contender and wins ties:
a µGraph is chosen only if it is faster than XLA by more than `tie` (relative). Untimed
(`timed=False`, e.g. no GPU), the cost model's best µGraph that passes is taken.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lax_ir.interface import adapt
from lax_ir.program import Program
from mirage_jax.float_check import FloatErrors, float_reference
from mirage_jax.lower.kernel_graph import WARPS
from mirage_jax.lower.registry import LoweringError
from mirage_jax.mugraph import MuGraph
from mirage_jax.search.cost import stored_axes
from mirage_jax.search.driver import SearchResult
from mirage_jax.search.order import FAR_BEHIND as FAR_BEHIND
from mirage_jax.search.order import timing_order
from mirage_jax.tuning import (
    row_major_variant,
    speculative_variant,
    tuned_variants,
    tuning_bases,
    within,
)


class NotEqual(ValueError):
    """A candidate the full-size verification rejects."""


FLOAT_TOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 5e-3, "float64": 1e-9}
"""Per output dtype: the relative error (to max |reference|) a lowered kernel may show against
float64 (f32 dots may run as TF32 on the GPU). `mirage_jax.jit` checks with these."""


@dataclass(frozen=True)
class InContext:
    """How to time a region as its function calls it: its own inputs (`inputs(seed)`, before
    the interface's layout steps), and each contender wrapped in those steps (`wrap(fn,
    kernel)`: XLA fuses them into its region; a kernel pays them as XLA copies, less those it
    reads in place), the kernel lowered by `lower(g, backend, order)` for that (`order`: the
    µGraph output that is region output k, so it stores each in the region's dtype)."""

    inputs: Callable[[int], Sequence[Any]]
    wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]]
    lower: Callable[..., Any]


RUNNER_UP_WITHIN = 0.10
"""Where XLA keeps a region, a verified µGraph that took at most this fraction longer is its
runner-up, tried in the whole function (`mirage_jax.runner_up`; option `runner_up_within`,
0 turns it off)."""


@dataclass(frozen=True)
class Contender:
    """One candidate: a µGraph (or XLA), its time, or why it was dropped."""

    label: str
    us: float | None
    mugraph: MuGraph | None = None
    error: str = ""
    estimate_us: float | None = None
    max_rel_error: float | None = None
    verdict: Any = None  # the full-size `fields.Verdict` when `select` verified it


@dataclass(frozen=True)
class Prepared:
    """A candidate verified, lowered, checked and compiled: its contender (untimed, or with
    the reason it was dropped), its output order and the (function, inputs) to time."""

    contender: Contender
    order: list[int] | None
    run: tuple[Callable[..., Any], Callable[[int], Sequence[Any]]] | None = None


@dataclass(frozen=True)
class Selection:
    """The outcome of `select`.

    Arguments:
        best: the chosen µGraph, or None when XLA is kept.
        reason: why.
        runner_up: where XLA is kept, the fastest µGraph if it came within `near` of XLA
            (verified): the whole-function check tries it (`mirage_jax.runner_up`).
        contenders: every candidate considered, XLA first.
        method: how times were measured ("cost model" when nothing was timed).
    """

    best: MuGraph | None
    reason: str
    contenders: tuple[Contender, ...] = ()
    method: str = ""
    backend: str = ""
    extra: dict = field(default_factory=dict)
    runner_up: MuGraph | None = None

    @property
    def runner_up_contender(self) -> Contender | None:
        """The contender of `runner_up` (None where there is none)."""
        return next((c for c in self.passed if c.mugraph is self.runner_up), None)

    @property
    def xla_us(self) -> float | None:
        return self.contenders[0].us if self.contenders else None

    @property
    def passed(self) -> tuple[Contender, ...]:
        """The µGraph contenders that lowered, ran and passed the checks."""
        return tuple(c for c in self.contenders[1:] if not c.error)

    @property
    def chosen(self) -> Contender | None:
        """The contender of `best` (None when XLA is kept)."""
        return next((c for c in self.passed if c.mugraph is self.best), None)

    @property
    def fastest_us(self) -> float | None:
        """The fastest timed µGraph's time (None if none was timed)."""
        return min((c.us for c in self.passed if c.us is not None), default=None)

    def to_json(self) -> str:
        return json.dumps(
            {
                "best": None if self.best is None else self.best.canonical_hash,
                "reason": self.reason,
                "backend": self.backend,
                "method": self.method,
                "contenders": [
                    {
                        "label": c.label,
                        "us": c.us,
                        "estimate_us": c.estimate_us,
                        "error": c.error,
                        "max_rel_error": c.max_rel_error,
                        "structure": None if c.mugraph is None else c.mugraph.meta.get("structure"),
                    }
                    for c in self.contenders
                ],
            },
            sort_keys=True,
        )


def random_inputs(program: Program, seed: int, scale: float = 0.25) -> list[np.ndarray]:
    """Inputs for timing: N(0, scale²) in each input's dtype (small, so exp stays finite);
    |N(0, scale²)| for inputs a square root needs non-negative (`lax_ir.domain`)."""
    from lax_ir.domain import nonnegative_inputs

    return random_arrays(program.input_avals, seed, scale, nonnegative_inputs(program))


def random_arrays(
    avals: Sequence[tuple[Sequence[int], str]],
    seed: int,
    scale: float = 0.25,
    nonnegative: Collection[int] = (),
) -> list[np.ndarray]:
    """N(0, scale²) arrays of the given (shape, dtype)s, the same for a seed on any machine;
    their absolute values at the positions in `nonnegative`.

    Drawn in chunks of `_CHUNK` elements, each from its own stream of the seed
    (`np.random.SeedSequence.spawn`), on several threads: a 7B-size block's 186M inputs took
    3.3 s on one core, drawn for each whole-function check and each region's selection.
    """
    kids = np.random.SeedSequence(seed).spawn(len(avals))
    outs, jobs = [], []
    for pos, ((shape, dtype), kid) in enumerate(zip(avals, kids)):
        out = np.empty(tuple(shape), dtype)
        flat = out.reshape(-1)
        n = flat.size
        pieces = kid.spawn(max(1, -(-n // _CHUNK)))
        positive = pos in nonnegative
        jobs += [(flat[j * _CHUNK : (j + 1) * _CHUNK], ss, positive) for j, ss in enumerate(pieces)]
        outs.append(out)

    def fill(job: tuple[np.ndarray, np.random.SeedSequence, bool]) -> None:
        part, ss, positive = job
        v = np.random.default_rng(ss).standard_normal(part.size, dtype=np.float32)
        v *= np.float32(scale)
        if positive:
            np.abs(v, out=v)
        np.copyto(part, v, casting="unsafe")

    if len(jobs) <= 2:
        for job in jobs:
            fill(job)
    else:
        with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            list(pool.map(fill, jobs))
    return outs


_CHUNK = 1 << 22
"""Elements per independently seeded piece of a random input (`random_arrays`)."""


def _default_timer(fn: Callable[..., Any], inputs: Callable[[int], Sequence[Any]]):
    from mirage_jax.profile import time_trace

    t = time_trace(fn, inputs, calls=30)
    return t.median_us, "mirage_jax.profile.time_trace"


def select(
    result: SearchResult,
    program: Program,
    *,
    backend: str = "pallas",
    top: int | None = 4,
    tie: float = 0.02,
    timer: Callable[[Callable[..., Any], Callable[[int], Sequence[Any]]], Any] | None = None,
    timed: bool = True,
    inputs: Callable[[int], Sequence[Any]] | None = None,
    rtol: float | Mapping[str, float] = 2e-2,
    lower: Callable[..., Any] | None = None,
    verify_trials: int | None = None,
    seed: int = 0,
    strict: bool = False,
    context: InContext | None = None,
    tune_warps: bool = False,
    compile_threads: int = 4,
    xla: tuple[float, str] | None = None,
    near: float = 0.0,
) -> Selection:
    """Time the `top` best µGraphs of `result` and XLA; return the fastest (XLA wins ties).

    Arguments:
        result: a `search` result for `program`.
        program: the region (XLA runs it as plain jnp under `jax.jit`).
        backend: the lowering backend ("pallas", "triton", ...).
        top: how many µGraphs to lower and time (None: all): the best estimated of each
            structure first, then the rest (`timing_order`).
        tie: a µGraph must beat XLA by more than this fraction.
        timer: `timer(fn, inputs) -> median µs` or `(median µs, method)`; default:
            `mirage_jax.profile.time_trace` (kernel time per call on a GPU, 30 calls over
            rotating `inputs`).
        timed: False: time nothing; take the first µGraph (the cost model's best) that passes.
        inputs: `seed -> input set`; default `random_inputs(program, seed)`.
        rtol: a lowered µGraph whose result differs from the region's in float64 by more than
            this (max relative error, normalised by the output's max magnitude) is dropped;
            a mapping gives it per output dtype (`FLOAT_TOL`; 2e-2 for dtypes it lacks).
        lower: `lower(mugraph, backend=...) -> fn`; default `mirage_jax.lower.lower`.
        verify_trials: if given, each µGraph is first verified against `program` at full size
            (`fields.verify` with this many trials and `seed`); one that is not equal is
            dropped, and the verdict's output matching orders its outputs for the float check.
        strict: a candidate that fails for any reason but a `LoweringError` (the backend
            cannot build it) or a verdict of "not equal" raises instead of being dropped.
        context: time XLA and the µGraphs as the function calls the region (`InContext`),
            interface included; where timed, the float check runs that same compiled function
            on the region's own inputs (so the stored views and loads are checked too).
        tune_warps: also time the fastest µGraph, and the fastest of another structure within
            `tuning.RETUNE_WITHIN` of it (`tuning_bases`), at their own variants
            (`tuning.tuned_variants`): 8 warps per block (`WARPS`) and, where it takes at most
            `SMALL_TUNING_US`, 2 and its loops split over the grid (`LOOP_SPLIT`); on Triton,
            its tiles' full rank where that differs (`FULL_RANK`); a decode GEMV's weights read
            in wide tiles, a split's combine over more blocks and, on Triton, the split over
            more parts: µGraphs of their own, timed unverified and verified at full size only
            where one wins; then, on Triton, the winner launched row-major where it is large
            (`ROW_MAJOR`, `tuning.row_major_variant`), and the winner with its online softmax
            against its first step's max (`SPECULATIVE_MAX`, `tuning.speculative_variant`).
            The lowering reads the meta when given no config; the fastest is kept. No variant
            is timed for a winner slower than XLA by more than `tuning.TUNE_WITHIN`.
        compile_threads: timed, the candidates are verified, lowered and compiled this many at
            a time (threads), and then timed one at a time.
        xla: XLA's time (µs) and method where already measured the same way (in `context`
            if one is given; `compute_gate.time_xla`): not measured again.
        near: where XLA is kept, the fastest µGraph that took at most (1 + near) × XLA's time
            is verified (if not yet) and returned as the selection's `runner_up`.
    """
    import jax

    from fields import memory

    _known_verdicts(result, program, verify_trials, seed)
    late = False  # verify only the fastest, after timing (a large region: `LARGE_TRIAL`)
    if verify_trials is not None and result.mugraphs:  # before the float64 reference's memory
        import fields

        need, have = memory.trial_bytes(program, program), memory.room()
        # a verdict the search found on a reduced instance (`search.reduced`) answers it
        answered = any(
            fields.known(g, program, trials=verify_trials, seed=seed) for g in result.mugraphs
        )
        if need > have and not answered:
            why = f"not verified: {memory.too_large(need, have)}"
            return Selection(None, why, (Contender("xla", xla[0] if xla else None),), "", backend)
        late = timed and need > memory.LARGE_TRIAL

    # XLA and every candidate are timed on the same input sets: drawn once per seed.
    inputs = functools.cache(inputs or (lambda seed: random_inputs(program, seed)))
    if context is not None:
        context = dataclasses.replace(context, inputs=functools.cache(context.inputs))
    timer = timer or _default_timer
    if lower is None:
        from mirage_jax.lower import lower as lower_fn

        lower = lower_fn

    def timed_fn(mugraph: MuGraph, order=None):
        """A kernel's function as the function calls the region (`context`: its own inputs,
        the interface's steps) and its inputs."""
        raw = context.lower(mugraph, backend=backend, order=order)
        fn = (lambda *xs: [raw(*xs)[i] for i in order]) if order else raw
        return jax.jit(context.wrap(fn, True)), context.inputs

    def run_timer(fn, feed):
        return as_timing(timer(fn, feed))

    def tol(dtype: str) -> float:
        return rtol.get(dtype, 2e-2) if isinstance(rtol, Mapping) else rtol

    phases = dict.fromkeys(
        ("xla_s", "reference_s", "verify_s", "lower_s", "check_s", "time_s"), 0.0
    )
    lock = threading.Lock()

    @contextlib.contextmanager
    def phase(name: str):  # seconds per step of the selection, kept in its timings
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with lock:  # candidates are prepared in threads
                phases[name] += time.perf_counter() - t0

    xla_us, method = None, "cost model"
    xla_run = None  # XLA's function and inputs, timed after the candidates are prepared
    if timed and xla is not None:
        xla_us, method = xla
    elif timed:
        xla_run = xla_timed_fn(program, inputs, context)
    # The float check runs what is timed: in `context`, the kernel as the function calls it
    # (its stored views and loads, the interface's steps) on the region's own inputs, against
    # the float64 reference of those inputs; one compile per candidate, not two.
    own = timed and context is not None
    with phase("reference_s"):
        xs = context.inputs(0) if own else inputs(0)
        ref_fn = functools.partial(float_reference, program)
        got = adapt(ref_fn, program)(*xs) if own else ref_fn(*xs)
        errors = FloatErrors([np.asarray(o, np.float64) for o in got])

    def prepare(label: str, g: MuGraph, known: tuple | None = None) -> Prepared:
        """Verify (unless `known`: its verdict and output order), lower, check one µGraph and
        compile what will be timed; safe to run for several µGraphs at once (threads)."""
        est = (g.meta.get("cost") or {}).get("us")
        verdict, order = known or (None, None)
        try:
            if known is None and verify_trials is not None and not late:
                with phase("verify_s"):
                    verdict, order = _verify(g, program, verify_trials, seed)
            run = None
            with phase("lower_s"):  # the timed function compiled here, not in the timing
                if own:  # returns the region's outputs, in its order
                    run = timed_fn(g, order)
                    outs = list(run[0](*xs))
                else:
                    fn = lower(g, backend=backend)
                    outs = list(fn(*xs))
                    outs = [outs[i] for i in order] if order else outs
                    run = (fn, inputs) if timed else None
            with phase("check_s"):  # the kernel's first run ends here, then the compare
                errs = errors(outs)
            err = max(errs)
            if not all(e <= tol(d) for e, (_, d) in zip(errs, program.output_avals)):  # NaN too
                why = f"wrong result: {err:.3g}"
                return Prepared(Contender(label, None, g, why, est, err, verdict), order)
        except Exception as e:  # a failure drops the candidate, with the reason
            if strict and not isinstance(e, (LoweringError, NotEqual, memory.TooLarge)):
                raise
            msg = f"{type(e).__name__}: {e}"[:300]
            return Prepared(Contender(label, None, g, msg, est, None, verdict), order)
        return Prepared(Contender(label, None, g, "", est, err, verdict), order, run)

    def attempt(p: Prepared) -> Contender:
        """Time one prepared µGraph (the timer runs alone: one trace at a time)."""
        c = p.contender
        if c.error or not timed:
            return c
        try:
            with phase("time_s"):
                return dataclasses.replace(c, us=run_timer(*p.run)[0])
        except Exception as e:  # as in `prepare`: a failure drops the candidate
            if strict and not isinstance(e, (LoweringError, NotEqual)):
                raise
            return dataclasses.replace(c, error=f"{type(e).__name__}: {e}"[:300])

    best: tuple[float, MuGraph] | None = None
    candidates = timing_order(result.mugraphs, top)
    t0 = time.perf_counter()
    if timed:  # all verified, lowered and compiled (threads), then each timed alone
        threads = max(1, min(int(compile_threads), len(candidates) + 1))
        with concurrent.futures.ThreadPoolExecutor(threads, "mirage_jax-select") as pool:
            # XLA's function compiles and its timing inputs are drawn beside the candidates
            warming = None if xla_run is None else pool.submit(_warm_xla, xla_run, phase)
            prepared = list(pool.map(lambda kg: prepare(f"mugraph[{kg[0]}]", kg[1]), candidates))
            if warming is not None:
                warming.result()
        if xla_run is not None:
            with phase("xla_s"):
                xla_us, method = run_timer(*xla_run)
            if context is not None:
                method += IN_CONTEXT
    else:  # one after another, until the first that passes
        prepared = (prepare(f"mugraph[{k}]", g) for k, g in candidates)
    contenders = [Contender("xla", xla_us)]
    first: list[tuple[Contender, Any]] = []  # timed in the first round, with output orders
    for p in prepared:
        c = attempt(p)
        contenders.append(c)
        if c.error:
            continue
        g = c.mugraph
        if not timed:
            _log(program, contenders)
            why = "the cost model's best that lowers and passes the float check (not timed)"
            return Selection(g, why, tuple(contenders), method, backend, {"phases": phases})
        first.append((c, p.order))
        if best is None or c.us < best[0]:
            best = (c.us, g)
    phases["prepare_and_time_s"] = time.perf_counter() - t0
    if tune_warps and best is not None and within(best[0], xla_us):
        contiguous = stored_axes(program)
        variants, known = [], []  # each with its base's verdict where its numbers are the same
        for k in tuning_bases([(c.us, c.mugraph) for c, _ in first]):
            c, order = first[k]
            if WARPS in c.mugraph.meta:
                continue
            same, other = tuned_variants(c.label, c.mugraph, c.us, backend, contiguous)
            # those at other numbers are verified at full size (seconds at 7B) only if one wins
            variants += same + other
            known += [(c.verdict, order)] * len(same) + [(None, order)] * len(other)
        threads = max(1, min(int(compile_threads), len(variants)))
        with concurrent.futures.ThreadPoolExecutor(threads, "mirage_jax-tune") as pool:
            ready = list(pool.map(lambda lg, k: prepare(lg[0], lg[1], k), variants, known))
        for p in ready:
            more = attempt(p)
            contenders.append(more)
            if not more.error and more.us < best[0]:
                best = (more.us, more.mugraph)
        # the winner launched row-major, then its online softmax against its first step's
        # max: the same µGraph each time (its verdict)
        won = [(c, o) for c, o in first] + [(p.contender, p.order) for p in ready]

        def time_twin(how: str, twin: MuGraph | None) -> None:
            nonlocal best
            if twin is None:
                return
            c, order = next((c, o) for c, o in won if c.mugraph is best[1])
            more = attempt(prepare(f"{c.label} {how}", twin, (c.verdict, order)))
            contenders.append(more)
            won.append((more, order))
            if not more.error and more.us < best[0]:
                best = (more.us, more.mugraph)

        time_twin("launched row-major", row_major_variant(best[1], backend, best[0]))
        time_twin("with its first step's max as reference", speculative_variant(best[1], backend))
    unverified = (
        verify_trials is not None
        and best is not None
        and not any(c.mugraph is best[1] and c.verdict is not None for c in contenders)
    )  # a variant at other numbers (`wide_variants`) won: verified now, or the next fastest
    if (
        (late or unverified)
        and best is not None
        and xla_us is not None
        and best[0] < xla_us * (1.0 - tie)
    ):
        best = _verify_fastest(contenders, program, verify_trials, seed, phase, xla_us * (1 - tie))
    _log(program, contenders)
    if best is None:
        first = next((f" (first failure: {c.error})" for c in contenders[1:]), "")
        why = f"no µGraph lowered and ran correctly; XLA kept{first}"
        return Selection(None, why, tuple(contenders), method, backend, {"phases": phases})
    if best[0] < xla_us * (1.0 - tie):
        why = f"fastest: {best[0]:.2f} µs against XLA {xla_us:.2f} µs"
        return Selection(best[1], why, tuple(contenders), method, backend, {"phases": phases})
    margin = f"within {tie:.0%} or slower" if tie else "not faster"
    why = f"XLA kept: {xla_us:.2f} µs, best µGraph {best[0]:.2f} µs ({margin})"
    runner_up = None
    if near > 0 and best[0] <= xla_us * (1.0 + near):
        close = xla_us * (1.0 + near) + 1e-9
        # a variant timed unverified (`wide_variants`) is verified now, like a winner
        found = (
            _verify_fastest(contenders, program, verify_trials, seed, phase, close)
            if late or unverified
            else best
        )
        runner_up = None if found is None else found[1]
        if runner_up is not None:
            mine = next(c.us for c in contenders[1:] if c.mugraph is runner_up)
            why += f"; runner-up for the whole-function check ({mine:.2f} µs)"
    return Selection(None, why, tuple(contenders), method, backend, {"phases": phases}, runner_up)


IN_CONTEXT = ", in context (the region's own inputs and layout steps)"
"""What a timing method says when it was timed as the function calls the region."""


def xla_timed_fn(
    program: Program, inputs: Callable[[int], Sequence[Any]], context: InContext | None = None
) -> tuple[Callable[..., Any], Callable[[int], Sequence[Any]]]:
    """XLA's function for the region and the inputs `select` times it on: in `context` (the
    region's own inputs, the interface's steps) where given, else on `inputs`."""
    import jax

    import lax_ir

    def fn(*xs):
        return tuple(lax_ir.evaluate(program, *xs))

    if context is not None:
        return jax.jit(context.wrap(fn, False)), context.inputs
    return jax.jit(fn), inputs


def as_timing(got: Any) -> tuple[float, str]:
    """A timer's answer as (µs, method): a timer may return the µs alone."""
    return got if isinstance(got, tuple) else (float(got), "")


def _warm_xla(run: tuple, phase: Callable[[str], Any]) -> None:
    """Compile XLA's timed function and draw its timing inputs (`profile.warm`)."""
    from mirage_jax.profile import warm

    with phase("xla_s"):
        warm(*run)


def _log(program: Program, contenders: list[Contender]) -> None:
    """Every contender at debug level: its time, or why it was dropped."""
    from mirage_jax.log import logger

    name = program.meta.get("name", "region")
    for c in contenders:
        what = f"{c.us:.2f} µs" if c.us is not None else (c.error or "not timed")
        structure = "" if c.mugraph is None else f" {c.mugraph.meta.get('structure', '')}"
        if c.mugraph is not None:  # its numbers: grid and loop steps per kernel
            structure += " " + " ".join(
                f"{op.block_graph.grid}x{op.block_graph.forloop_range}"
                for _, op in c.mugraph.graph_defined()
            )
        logger.debug("%s candidate %s: %s%s", name, c.label, what, structure)


def _verify_fastest(
    contenders: list[Contender],
    program: Program,
    trials: int,
    seed: int,
    phase: Callable,
    faster_than: float,
) -> tuple[float, MuGraph] | None:
    """Verify the timed µGraphs faster than `faster_than` µs at full size, fastest first,
    until one is equal (a large region: one verification instead of one per candidate); those
    found unequal, or too large for the memory, get the reason as their error in
    `contenders`, the one found its verdict. Returns its (µs, µGraph), or None."""
    timed = sorted(
        (
            k
            for k, c in enumerate(contenders)
            if k and not c.error and c.us is not None and c.us < faster_than
        ),
        key=lambda k: contenders[k].us,
    )
    for k in timed:
        c = contenders[k]
        try:
            with phase("verify_s"):
                verdict, order = _verify(c.mugraph, program, trials, seed)
        except (NotEqual, MemoryError) as e:
            contenders[k] = dataclasses.replace(c, error=f"{type(e).__name__}: {e}"[:300])
            continue
        if order is not None and order != sorted(order):  # the float check compared unmatched
            contenders[k] = dataclasses.replace(c, error="outputs matched in another order")
            continue
        contenders[k] = dataclasses.replace(c, verdict=verdict)
        return c.us, c.mugraph
    return None


def _known_verdicts(result: Any, program: Program, trials: int | None, seed: int) -> None:
    """The search's full-size verdicts (`SearchResult.verdicts`) answer the same questions
    here, also where `select` runs in another process than the search (a pool, a Ray task)."""
    if trials is None or getattr(result, "program_hash", "") != program.canonical_hash:
        return
    import fields

    by_hash = {g.canonical_hash: g for g in result.mugraphs}
    for h, (t, s, verdict) in (getattr(result, "verdicts", None) or {}).items():
        if h in by_hash and (t, s) == (trials, seed):
            fields.remember(by_hash[h], program, verdict, trials=trials, seed=seed)


def _verify(g: MuGraph, program: Program, trials: int, seed: int) -> tuple[Any, list[int] | None]:
    """`fields.verify` at full size: the verdict and the output order (raises if not equal).
    Where `trials` leave the bound above the trusted 1e-9 (2 trials of GPT-2's tanh-GELU
    region: 6.4e-9), it verifies again with the trials that reach it: the cache rejects an
    entry with a weaker bound when it is read (and the region is searched again); where they
    cannot and no verdict is known, it runs those trials only (`fields.verify_to_bound`)."""
    import fields

    verdict = fields.verify_to_bound(g, program, trials=trials, seed=seed)
    if not verdict.equal:
        raise NotEqual(f"not equal to the region at full size ({verdict.reason})")
    order = verdict.output_order
    return verdict, None if order is None else list(order)
