"""One Lax region's replacement: search and select a µGraph, lower it, wrap it for autodiff.

`search_region` runs the search and `select` (in a fresh thread: it is called at trace
time) and returns what the cache stores; `region_kernel` lowers a chosen µGraph for a backend
and wraps it as a `jax.custom_jvp` whose tangent is the XLA jvp of the region. Used by
`mirage_jax.api`; every failure is returned as a reason (the region then runs as XLA).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import jax

import lax_ir
from lax_ir.interface import (
    Ops,
    View,
    Views,
    adapt,
    apply_ops,
    read_view,
    view_stored_shape,
    write_view,
)
from lax_ir.views import free_reshape, input_view, output_view
from mirage_jax._env import device_kind, fallback, has_gpu, warn_once
from mirage_jax.known_inputs import canonical_constants, with_values
from mirage_jax.lower import backends
from mirage_jax.mugraph.load_steps import split_load_steps, with_load_steps
from mirage_jax.search.order import TIME_TOP


def gpu_default_backend() -> str:
    """What backend="auto" lowers to on a GPU (`backends.gpu_default`)."""
    return backends.gpu_default()


def effective_backend(backend: str) -> tuple[str | None, str]:
    """The backend kernels are lowered for, or (None, why every region stays XLA)."""
    gpu = has_gpu()
    name, why = backends.resolve(backend, gpu)
    if name is None and backend != "xla" and not gpu:
        warn_once(
            "no-gpu",
            f"no GPU: mirage_jax.jit runs the XLA path (backend={backend!r} needs a GPU); "
            "pass backend='pallas-interpret' to run the kernels in Pallas interpret mode "
            "(slow, for testing)",
        )
    return name, why


class SearchUnavailable(RuntimeError):
    """The search cannot run here (the message says why)."""


@dataclass(frozen=True)
class SearchOutcome:
    """A region's search result as stored: the chosen µGraph, or None when XLA is best."""

    mugraph: Any
    mugraph_json: str | None
    verdict_json: str | None
    timings: Mapping[str, Any]
    reason: str
    cacheable: bool = True  # False where a failure may not recur (nothing lowered, say)
    runner_up: bool = False  # `mugraph` lost its region narrowly: XLA runs it, unless the
    # whole-function check finds the function faster with it (`mirage_jax.runner_up`)

    @property
    def kernel(self) -> Any:
        """The µGraph that runs the region (None: XLA, the runner-up's region too)."""
        return None if self.runner_up else self.mugraph


def search_region(
    program: Any,
    opts: Any,
    backend: str,
    avals: Sequence[tuple] | None = None,
    searched: Future | None = None,
    known: Mapping[int, Any] | None = None,
) -> SearchOutcome:
    """Search µGraphs for one region and select the fastest verified one, or XLA.

    `mirage_jax.select` chooses: each candidate is verified again at full size (the
    record keeps the output matching) and must pass a float64 check (`FLOAT_TOL`). On a GPU
    the top `time_top` (option, default `order.TIME_TOP`) are timed against XLA, which wins
    ties. Without a GPU (pallas-interpret, reference) nothing is timed: the cost model's best
    that passes wins.
    With the region's own input `avals` (shape, dtype), a region with layout steps at its
    interface is timed as its function calls it: those steps included (`select.InContext`).
    `searched`: the search already started by `SearchAhead` (its result is selected from).
    `known`: the region's inputs whose values depend on no input, by its input position
    (`known_inputs.constant_inputs`): candidates are timed and checked with those values, and
    lowered knowing them (a kernel skips the steps a mask hides whole), as they will run.
    """
    if searched is not None:
        found = searched.result()
        return eagerly(select_searched_or_not, found, program, opts, backend, avals, known)
    search_mod = _search_module()
    return eagerly(_search_and_select, search_mod, program, opts, backend, avals, known)


def _search_module() -> Any:
    try:
        from mirage_jax import search as search_mod
    except ImportError as e:
        raise SearchUnavailable(f"mirage_jax.search is not available ({e})") from e
    return search_mod


SEARCHES_AT_ONCE = 2
"""Regions searched at once where the search has a worker pool: one search leaves most of a
16-CPU machine's 12 workers idle (its driver verifies and cuts in this process), so two share
the pool (Llama-7B equinox b=8 on the H100 host: 39 s of searches one after another)."""


def search_order(regions: Sequence[Any]) -> list[Any]:
    """The regions in the order their searches start: fewest nodes first (region order among
    equals). Selections run one at a time, on the GPU, as the searches end; a small region's
    search ends in 1-3 s and its selection then runs while the large ones still search. In
    region order the queue waited for the two largest first (Llama-7B equinox b=1 on the
    H200, 2026-11-29: norm + Q/K/V and norm + gate/up searched 18-20 s before any selection
    began, then 31 s of selections ran one after another, the small regions' last)."""
    return sorted(regions, key=lambda r: (len(r.program.nodes), r.index))


class SearchAhead:
    """The searches of several regions, run in background threads (`SEARCHES_AT_ONCE` at a
    time where there are worker processes, else one after another), so each region's selection
    (lowering and timing on the GPU, in the caller's thread) overlaps the next regions'
    searches. A context manager; leaving it early (an error, an interrupt) cancels the
    searches not yet started."""

    def __init__(self, programs: Sequence[Any], opts: Any, gates: Sequence[Future] | None = None):
        """`gates`: per program, a future the caller completes with a `SearchOutcome` (the
        region decided without a search: `compute_gated`) or None (search it); each search
        waits for its gate, so the caller can decide later regions while earlier ones search."""
        from concurrent.futures import ThreadPoolExecutor

        options = getattr(opts, "options", None) or {}
        at_once = int(options.get("searches_at_once", SEARCHES_AT_ONCE))
        if at_once < 1:
            raise ValueError(f"options['searches_at_once'] must be at least 1, got {at_once}")
        at_once = at_once if getattr(opts, "workers", 1) > 1 else 1
        self._pool = ThreadPoolExecutor(at_once, thread_name_prefix="mirage_jax-search")
        gates = gates if gates is not None else [done(None) for _ in programs]
        self.futures: list[Future] = [
            self._pool.submit(_search_ahead, program, opts, gate)
            for program, gate in zip(programs, gates)
        ]

    def __enter__(self) -> SearchAhead:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self._pool.shutdown(wait=kind is None, cancel_futures=True)


def compute_gated(
    program: Any, opts: Any, backend: str, avals: Sequence[tuple] | None = None
) -> SearchOutcome | None:
    """The region as XLA, not searched, where no kernel of ours can win it on this GPU
    (`compute_gate`: XLA below our GEMMs' compute floor, or elementwise ops only, which XLA
    fuses into their neighbours); None where it is to be searched.
    Times XLA for large regions only, and only where kernels are timed (a GPU backend); a
    failure to time it is reported (strict: raised) and the region is searched as usual."""
    from mirage_jax import compute_gate

    if not timed_here(backend):
        return None
    fused = compute_gate.fused_by_xla(program, opts, device_kind())
    if fused is not None:
        return SearchOutcome(None, None, None, fused[1], fused[0])
    context = in_context(program, opts, backend, avals) if has_steps(program, avals) else None
    try:
        got = eagerly(compute_gate.unwinnable, program, opts, backend, device_kind(), context)
    except Exception as e:
        fallback(
            f"compute-gate:{program.canonical_hash}",
            f"mirage_jax: could not time XLA for {program.meta.get('name', 'a region')} before "
            f"its search ({type(e).__name__}: {e}); it is searched",
            e,
            opts.strict,
        )
        return None
    if got is None:
        return None
    reason, timings = got
    return SearchOutcome(None, None, None, timings, reason)


def timed_here(backend: str) -> bool:
    """Are kernels timed against XLA here (a GPU, and a backend that runs on it)?"""
    return has_gpu() and backends.get(backend).needs_gpu


def has_steps(program: Any, avals: Sequence[tuple] | None) -> bool:
    """Is the region timed in context (`in_context`): its own input `avals` known, and layout
    steps at its interface?"""
    return avals is not None and bool(program.meta.get("interface"))


def done(value: Any) -> Future:
    """A completed future holding `value` (a region decided without a search)."""
    f: Future = Future()
    f.set_result(value)
    return f


def _search_ahead(program: Any, opts: Any, gate: Future) -> Any:
    decided = gate.result()
    return decided if decided is not None else search_only(_search_module(), program, opts)


def select_searched_or_not(
    found: Any,
    program: Any,
    opts: Any,
    backend: str,
    avals: Sequence[tuple] | None = None,
    known: Mapping[int, Any] | None = None,
) -> SearchOutcome:
    """`select_searched` for a `search_only` result (a `SearchOutcome` passes through)."""
    if isinstance(found, SearchOutcome):
        return found
    return select_searched(found, program, opts, backend, avals, known)


def eagerly(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a fresh thread: called at trace time, and JAX's trace state is per
    thread, so what it runs and times runs eagerly instead of being staged into the trace."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirage_jax-eager") as pool:
        return pool.submit(fn, *args).result()


def region_avals(part: Any, region: Any) -> list[tuple[tuple[int, ...], str]]:
    """The (shape, dtype) of each of `region`'s own inputs in its partition's program."""
    nodes = part.program.nodes
    return [(tuple(nodes[i].shape), nodes[i].dtype) for i in region.inputs]


def in_context(
    program: Any,
    opts: Any,
    backend: str,
    avals: Sequence[tuple],
    known: Mapping[int, Any] | None = None,
) -> Any:
    """`select.InContext` for a region whose interface has layout steps: random inputs of the
    region's own `avals` (those in `known` at their values), XLA and kernels wrapped in the
    steps (`adapt`), kernels reading the inputs in the layout they are stored in
    (`stored_views`) and knowing `known`, as `region_kernel` does."""
    from lax_ir.domain import nonnegative_inputs
    from mirage_jax.select import InContext, random_arrays

    st = stored_views(program, backend)
    canonical = nonnegative_inputs(program)  # drawn so at the region's own positions
    own = {pos for k, (pos, _) in enumerate(program.meta["interface"]["inputs"]) if k in canonical}
    told = canonical_constants(program, known or {})
    return InContext(
        inputs=with_values(
            lambda seed: random_arrays(avals, opts.seed + seed, nonnegative=own), known or {}
        ),
        wrap=lambda fn, kernel: adapt(fn, program, stored=st.steps if kernel else None),
        lower=lambda g, backend, order=None: lower_mugraph(
            g,
            backend,
            opts.lower_config,
            st.views,
            None,
            region_out_dtypes(program, order),
            st.loads,
            told,
        ),
    )


def _search_and_select(
    search_mod: Any,
    program: Any,
    opts: Any,
    backend: str,
    avals: Sequence[tuple] | None = None,
    known: Mapping[int, Any] | None = None,
) -> SearchOutcome:
    return select_searched_or_not(
        search_only(search_mod, program, opts), program, opts, backend, avals, known
    )


def reread_option(options: Mapping[str, Any] | None) -> bool:
    """`mirage_jax.jit`'s `options["reread"]` (True where absent): the search splits a norm +
    projection over K and launches the stitch by level (`search.Budget.reread`). On by default
    since the H200 runs of 2026-11-28 (docs/decisions.md, "reread on by default"). Raises
    ValueError for a value that is not a bool (checked when the function is wrapped)."""
    reread = (options or {}).get("reread", True)
    if not isinstance(reread, bool):
        raise ValueError(f"options['reread'] must be True or False, got {reread!r}")
    return reread


def search_only(search_mod: Any, program: Any, opts: Any) -> Any:
    """The search half of `search_region`: a `SearchResult` with µGraphs to select from, or
    the `SearchOutcome` (XLA) when there is none. Needs no GPU (`mirage_jax.zoo` runs it on
    CPU workers and the selection where the GPU is)."""
    t0 = time.perf_counter()
    limits: dict[str, Any] = {"time_s": opts.budget_s}
    if opts.max_candidates is not None:
        limits["max_candidates"] = opts.max_candidates
    limits["reread"] = reread_option(getattr(opts, "options", None))  # split norm + projections
    try:
        result = search_mod.search(
            program,
            budget=search_mod.Budget(**limits),
            seed=opts.seed,
            workers=opts.workers,
            progress=opts.progress,
        )
    except search_mod.SearchError as e:
        return SearchOutcome(None, None, None, {}, f"outside the search's fragment: {e}")
    searched = {"stop": result.stop_reason, "search_s": round(time.perf_counter() - t0, 2)}
    if not result.mugraphs:
        return SearchOutcome(None, None, None, searched, result.message or result.stop_reason)
    result.stats["search_s"] = searched["search_s"]
    return result


def select_searched(
    result: Any,
    program: Any,
    opts: Any,
    backend: str,
    avals: Sequence[tuple] | None = None,
    known: Mapping[int, Any] | None = None,
) -> SearchOutcome:
    """The selection half of `search_region`: lower, check and (on a GPU) time the searched
    µGraphs of `result` against XLA (`mirage_jax.select`), with the `known` inputs' values
    (`search_region`); what the cache stores."""
    from mirage_jax import compute_gate
    from mirage_jax.cache import mugraph_to_json
    from mirage_jax.search import Budget
    from mirage_jax.select import FLOAT_TOL, RUNNER_UP_WITHIN, random_inputs, select

    t0 = time.perf_counter()
    timed = timed_here(backend)
    context = timed and has_steps(program, avals)
    # by µGraph input, for the canonical-input timing (in context, `in_context` has its own)
    told = {} if context else canonical_constants(program, known or {})
    sel = select(
        result,
        program,
        backend=backend,
        top=int(opts.options.get("time_top", TIME_TOP)) if timed else None,
        tie=0.0,
        timed=timed,  # by select's default clock, the results tables' (profile.time_trace)
        inputs=with_values(lambda s: random_inputs(program, opts.seed + s), told),
        rtol=FLOAT_TOL,
        lower=lambda g, backend: jax.jit(lower_mugraph(g, backend, opts.lower_config, known=told)),
        verify_trials=Budget().trials,  # the search's: its full-size verdicts are reused
        seed=opts.seed,
        strict=opts.strict,
        tune_warps=opts.lower_config is None,
        compile_threads=int(opts.options.get("compile_threads", 4)),
        context=in_context(program, opts, backend, avals, known) if context else None,
        xla=compute_gate.known_xla(program, opts, backend, context) if timed else None,
        near=float(opts.options.get("runner_up_within", RUNNER_UP_WITHIN)) if timed else 0.0,
    )
    t = {
        "device": device_kind(),
        "search": result.message,
        "stop": result.stop_reason,
        "search_s": result.stats.get("search_s"),
        "select_s": round(time.perf_counter() - t0, 2),
        "select_phases_s": {k: round(v, 2) for k, v in sel.extra.get("phases", {}).items()},
        "search_phases_s": dict(result.stats.get("seconds", {})),
        "candidates": len(sel.contenders[1:]),  # µGraphs lowered and checked (XLA is [0])
        "timed": sum(c.us is not None for c in sel.contenders[1:]),
    }
    if timed and sel.passed:
        t |= {"xla_us": sel.xla_us, "mugraph_us": sel.fastest_us, "method": sel.method}
    chosen = sel.chosen
    runner = sel.runner_up_contender
    if chosen is None and runner is not None and runner.verdict is not None:
        g = runner.mugraph
        record = runner.verdict.record(program.canonical_hash, g.canonical_hash)
        t |= {"runner_up_us": runner.us}
        return SearchOutcome(g, mugraph_to_json(g), record, t, sel.reason, runner_up=True)
    if chosen is None:  # cacheable only if some µGraph passed (lost to XLA)
        return SearchOutcome(None, None, None, t, sel.reason, cacheable=bool(sel.passed))
    if not timed:
        t |= {"estimated_us": chosen.estimate_us, "method": sel.method}
    g = chosen.mugraph
    record = chosen.verdict.record(program.canonical_hash, g.canonical_hash)
    return SearchOutcome(g, mugraph_to_json(g), record, t, sel.reason)


def region_kernel(
    decision: Any,
    region: Any,
    backend: str,
    lower_config: Any,
    strict: bool | None = None,
    after: Sequence[Ops] | None = None,
    known: Mapping[int, Any] | None = None,
) -> Callable | str:
    """The region's replacement (a custom_jvp around the lowered µGraph), or why not. `after`:
    the layout steps the program applies to each region output (`lax_ir.views.layout_after`),
    so a kernel can write an output in the layout they end in; `known`: the region's inputs
    whose values depend on no input of the program, by position, as the region receives them
    (`known_inputs.constant_inputs`), whose masks a kernel may skip (`lower.masked_steps`).

    A failure is a warning and the region runs as XLA; in strict mode it raises (`fallback`).
    """
    program = region.program
    st = stored_views(program, backend, after)
    views = st.views
    order = (decision.verification or {}).get("output_order")
    order = list(order) if order else list(range(len(program.outputs)))
    out_views = {k: v for k, (v, _) in st.outputs.items()}
    try:
        impl = lower_mugraph(
            decision.mugraph,
            backend,
            lower_config,
            views,
            {order[k]: v for k, v in out_views.items()},
            region_out_dtypes(program, order),
            st.loads,
            canonical_constants(program, known or {}),
        )
    except Exception as e:  # any failure: reported (strict: raised), the region stays XLA
        fallback(
            f"lower:{decision.cache_key}:{backend}",
            f"mirage_jax: could not lower the µGraph of region {region.index} for "
            f"{backend} ({type(e).__name__}: {e}); it runs as XLA",
            e,
            strict,
        )
        return f"lowering failed ({type(e).__name__}: {e})"

    def ordered(*xs: Any) -> list[Any]:
        # A µGraph may keep an output in another float dtype than the region's (an fp32
        # residual stream times fp16 weights: `validate.result_dtype`; f16 inputs upcast and
        # returned as fp32); `impl` returns it in the region's dtype.
        outs = list(impl(*xs))
        return [outs[i] for i in order]

    specs = [
        jax.ShapeDtypeStruct(view_stored_shape(s, views[k]) if k in views else s, d)
        for k, (s, d) in enumerate(program.input_avals)
    ]
    try:
        got = [(tuple(o.shape), str(o.dtype)) for o in jax.eval_shape(ordered, *specs)]
    except Exception as e:  # any failure: reported (strict: raised), the region stays XLA
        fallback(
            f"lower-shape:{decision.cache_key}:{backend}",
            f"mirage_jax: the lowered µGraph of region {region.index} fails to trace "
            f"({type(e).__name__}: {e}); it runs as XLA",
            e,
            strict,
        )
        return f"lowered kernel fails to trace ({type(e).__name__})"
    want = [
        (view_stored_shape(s, out_views[k]) if k in out_views else tuple(s), str(d))
        for k, (s, d) in enumerate(program.output_avals)
    ]
    if got != want:
        fallback(
            f"lower-avals:{decision.cache_key}:{backend}",
            f"mirage_jax: the lowered µGraph of region {region.index} returns {got}, the region "
            f"{want}; it runs as XLA",
            None,
            strict,
        )
        return "lowered kernel has the wrong output shapes/dtypes"
    out_steps = {k: steps for k, (_, steps) in st.outputs.items()}
    jvp = with_xla_jvp(ordered, program, views, out_views, st.loads)
    return adapt(jvp, program, st.steps, out_steps)


@dataclass(frozen=True)
class Stored:
    """How a kernel takes a region's inputs and writes its outputs: `views`, position -> the
    permutation or `SplitView` it reads a stored array through; `steps`, position -> the
    interface steps XLA still applies to such an input, to one whose layout steps are only a
    reshape (`lax_ir.views`), or to one whose shift or scale the kernel applies; `loads`,
    position -> the steps the kernel applies where it loads the input (`mugraph.load_steps`);
    `outputs`, output k -> (view, steps): the kernel writes the array `view` reads as the
    output, which `steps` make the region's (`lax_ir.views.output_view`)."""

    views: Views
    steps: dict[int, Ops]
    outputs: dict[int, tuple[View, Ops]]
    loads: dict[int, Ops] = field(default_factory=dict)


def stored_views(program: Any, backend: str, after: Sequence[Ops] | None = None) -> Stored:
    """The region's inputs the kernel reads in the layout they are stored in: a weight stored
    as W that the µGraph reads as Wᵀ (equinox's and Gemma's layouts), a KV cache stored
    (B, S, heads, D) read as Kᵀ per head, GPT-2's Q, K and V split from one projection. Only
    where the backend reads views in place (`VIEWS`: Triton), and the stored array's contiguous
    axis is one of the tile's two (loads stay coalesced); XLA then no longer copies them on
    every call. Layout steps that only reshape are a free reshape for any backend. An input's
    shift or scale by a constant (Gemma's `1 + scale`, attention's 1/sqrt(d) on the queries) the
    kernel applies where it loads it, for any backend, instead of XLA launching a kernel for it
    on every call; the layout steps around it may then be a view.

    `outputs`: output k -> (view, steps) where the kernel writes the array that `view` reads as
    the output, so that the layout steps `after[k]` the program applies to it move no data
    (`lax_ir.views.output_view`); only with `after`."""
    interface = program.meta.get("interface")
    if interface is None:
        return Stored({}, {}, {})
    b = backends.get(backend)
    in_place = b.module is not None and getattr(b.load(), "VIEWS", False)
    shapes = interface["shapes"]
    views: Views = {}
    steps: dict[int, Ops] = {}
    loads: dict[int, Ops] = {}
    for k, (pos, ops) in enumerate(interface["inputs"]):
        ops, load = split_load_steps(ops)
        if load:
            loads[k] = load
        got = input_view(shapes[pos], ops) if in_place else None
        if got is not None:
            steps[k], views[k] = got
            continue
        free = free_reshape(shapes[pos], ops)
        if free is not None:
            steps[k] = free
        elif load:
            steps[k] = ops
    outputs = {}
    for k, ops in enumerate(interface["outputs"] if in_place and after else ()):
        got = output_view(program.output_avals[k][0], ops, after[k])
        if got is not None:
            outputs[k] = got
    return Stored(views, steps, outputs, loads)


def region_out_dtypes(program: Any, order: Sequence[int] | None = None) -> dict[int, str]:
    """µGraph output position -> the region's dtype for it (`order[k]`: the µGraph output that
    is region output k, the verdict's output order), so a kernel stores it in that dtype
    (`lower(out_dtypes=)`) instead of XLA converting it after: rounding an fp32 accumulator,
    or widening a µGraph that keeps its float16 inputs' dtype where the region upcasts."""
    order = list(order) if order else list(range(len(program.output_avals)))
    return {order[k]: str(d) for k, (_, d) in enumerate(program.output_avals)}


def lower_mugraph(
    mugraph: Any,
    backend: str,
    lower_config: Any = None,
    views: Views | None = None,
    out_views: Views | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    loads: Mapping[int, Ops] | None = None,
    known: Mapping[int, Any] | None = None,
) -> Callable[..., Sequence[Any]]:
    """The µGraph as a JAX function for a backend of `backends.BACKENDS` (not "auto"/"xla");
    inputs in `views` arrive as stored, outputs in `out_views` leave as stored, outputs in
    `out_dtypes` in that dtype (`lower`); inputs in `loads` arrive without
    those steps, which the kernels apply (`mugraph.load_steps`)."""
    from mirage_jax.lower import lower

    if loads:
        mugraph = with_load_steps(mugraph, loads)

    extra: dict[str, Any] = {"views": views} if views else {}
    if out_views:
        extra["out_views"] = out_views
    if out_dtypes:
        extra["out_dtypes"] = out_dtypes
    if known:
        extra["known"] = known
    return lower(mugraph, backend=backend, config=lower_config, **extra)


def with_xla_jvp(
    impl: Callable[..., Sequence[Any]],
    program: Any,
    views: Views | None = None,
    out_views: Views | None = None,
    loads: Mapping[int, Ops] | None = None,
) -> Callable[..., list[Any]]:
    """`impl` as a custom_jvp whose tangent is the XLA jvp of the region `program`.

    The kernel computes the primal; the tangent is XLA's, linear in the input tangents, so
    forward mode, reverse mode (JAX transposes the tangent), higher orders and vmap all work
    as they do under `jax.jit`. Inputs in `views` come as stored, outputs in `out_views` leave
    as stored, inputs in `loads` without those steps (`stored_views`).
    """
    views_, outs_, loads_ = views or {}, out_views or {}, loads or {}

    def xla(*xs: Any) -> tuple[Any, ...]:
        xs = tuple(read_view(x, views_[k]) if k in views_ else x for k, x in enumerate(xs))
        xs = tuple(apply_ops(x, loads_[k]) if k in loads_ else x for k, x in enumerate(xs))
        ys = lax_ir.evaluate(program, *xs)
        return tuple(write_view(y, outs_[k]) if k in outs_ else y for k, y in enumerate(ys))

    @jax.custom_jvp
    def kernel(*xs: Any) -> tuple[Any, ...]:
        return tuple(impl(*xs))

    @kernel.defjvp
    def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        _, out_tangents = jax.jvp(xla, primals, tangents)
        return kernel(*primals), out_tangents

    return lambda *xs: list(kernel(*xs))


# ---------------------------------------------------------------------- public entry points
