"""`mirage_jax.jit`: the decorator. Capture, partition, resolve each region, assemble one jit.

`jit(fn)` returns a `MirageJit` that wraps `jax.jit(traced)`. At trace time, `traced` captures
`fn` on the tracers' avals (static arguments are baked in), partitions the Program, and
resolves every Lax region: the in-process memo, then the SQLite cache, then (if allowed) the
search, choosing a verified µGraph or XLA. Each chosen µGraph is lowered and wrapped in a
`jax.custom_jvp` whose tangent is the XLA jvp of its region; `assemble` then re-binds the
function's own traced equations with the kernels substituted where their regions' outputs
were computed. With no kernel, the function itself runs, exactly as under `jax.jit`.
`jax.jit`'s own cache means a second call with the same signature does none of this (see
`MirageJit.stats`).

Anything that cannot be done (no GPU, no search module, a failed lowering, a stale cache
entry) falls back to XLA for that region, with one clear warning, never a crash; in strict
mode (`strict=True` or `MIRAGE_JAX_STRICT=1`) every failure raises `FallbackError` with its
cause instead.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, as_completed
from dataclasses import dataclass, field
from typing import Any

import jax

import lax_ir
from lax_ir.views import layout_after
from mirage_jax._env import _WARNED as _WARNED
from mirage_jax._env import FallbackError as FallbackError
from mirage_jax._env import MirageWarning as MirageWarning
from mirage_jax._env import device_kind as device_kind
from mirage_jax._env import fallback, settle_trace_context, strict_default, trace_context_size
from mirage_jax._env import has_gpu as has_gpu
from mirage_jax._env import warn_once as warn_once
from mirage_jax.assemble import assemble
from mirage_jax.cache import Cache
from mirage_jax.function_check import forget_draws
from mirage_jax.function_choice import FunctionChoice
from mirage_jax.known_inputs import constant_inputs
from mirage_jax.log import logger, region_line
from mirage_jax.lower import backends
from mirage_jax.nnx_state import Stateful, StateMutation, watch
from mirage_jax.regions import (
    SearchAhead,
    compute_gated,
    region_avals,
    region_kernel,
    reread_option,
    search_order,
)
from mirage_jax.regions import SearchOutcome as SearchOutcome
from mirage_jax.regions import SearchUnavailable as SearchUnavailable
from mirage_jax.regions import effective_backend as effective_backend
from mirage_jax.regions import gpu_default_backend as gpu_default_backend
from mirage_jax.regions import lower_mugraph as lower_mugraph
from mirage_jax.regions import search_region as search_region
from mirage_jax.regions import with_xla_jvp as with_xla_jvp
from mirage_jax.resolve import RegionDecision as RegionDecision
from mirage_jax.resolve import Resolver, xla_decision
from mirage_jax.scan_bodies import has_scan, with_scan_bodies
from mirage_jax.static_leaves import hint_static_leaves

BACKENDS = tuple(backends.CHOICES)
"""What `backend=` accepts (`mirage_jax.lower.backends.CHOICES` says what each is)."""
SEARCH_MODES = ("auto", "cached", "off")
"""auto: cache, then search on a miss; cached: cache only; off: plain XLA, no cache."""
DEFAULT_BUDGET_S = 60.0
_DONATE = ("donate_argnums", "donate_argnames")


# ---------------------------------------------------------------------- records
@dataclass
class JitStats:
    """Counters for what tracing did (the tests count captures and searches)."""

    traces: int = 0
    captures: int = 0
    searches: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    memo_hits: int = 0
    kernels: int = 0
    xla_regions: int = 0
    fallbacks: int = 0


@dataclass(frozen=True)
class TraceRecord:
    """One trace of a MirageJit: the Program, its partition, one decision per region."""

    name: str
    program: Any
    partition: Any
    decisions: tuple[RegionDecision, ...]
    backend: str
    search: str
    error: str = ""
    function_check: Any = None  # `function_check.FunctionCheck` where kernels were timed
    phases_s: Mapping[str, float] = field(default_factory=dict)  # where the trace's time went


@dataclass(frozen=True)
class _Options:
    backend: str
    search: str
    budget_s: float
    seed: int
    workers: int
    options: Mapping[str, Any] = field(default_factory=dict)
    lower_config: Any = None
    progress: bool | None = None  # tqdm's disable: None = only on a terminal
    strict: bool = False  # every fallback to XLA raises (FallbackError)
    function_check: bool = True  # time the assembled function against jax.jit (on a GPU)
    max_candidates: int | None = None  # the search's candidate budget (None: Budget's)

    def kwargs(self) -> dict[str, Any]:
        """The options as `MirageJit` keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ---------------------------------------------------------------------- the decorator
def _workers(workers: int | None) -> int:
    """`workers`, or the machine's default (`search.workers.default_workers`) for None."""
    from mirage_jax.search.workers import default_workers

    if workers is None:
        return default_workers()
    if int(workers) < 1:
        raise ValueError(f"workers must be at least 1, got {workers!r}")
    return int(workers)


class MirageJit:
    """A function compiled like `jax.jit`, with Lax regions replaced by verified kernels.

    Call it like the wrapped function. `stats` counts what tracing did, `records` keeps the
    most recent traces (see `mirage_jax.explain` for a readable report), and `lower`/`trace`
    pass through to the underlying `jax.jit` object.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None,
        backend: str = "auto",
        search: str = "auto",
        budget_s: float = DEFAULT_BUDGET_S,
        cache: Cache | str | bool | None = None,
        seed: int = 0,
        workers: int | None = None,
        options: Mapping[str, Any] | None = None,
        lower_config: Any = None,
        progress: bool | None = None,
        strict: bool | None = None,
        function_check: bool = True,
        max_candidates: int | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {SEARCH_MODES}, got {search!r}")
        reread_option(options)  # a bad value is refused here, not as a region's fallback
        self.fn = fn
        self.opts = _Options(
            backend, search, float(budget_s), int(seed), _workers(workers), dict(options or {}),
            lower_config, progress, strict_default() if strict is None else bool(strict),
            bool(function_check), None if max_candidates is None else int(max_candidates),
        )  # fmt: skip
        self.cache = _open_cache(cache)
        self.stats = JitStats()
        self.records: list[TraceRecord] = []
        self.scan_bodies: list[MirageJit] = []  # the jits of its scans' bodies (`scan_bodies`)
        self._in_scan = False  # a scan's body (`_scan_body`)
        self._memo: dict[str, RegionDecision] = {}
        self._context_size = 0  # JAX's trace-context size when the last trace began
        self._checks: dict[str, Any] = {}  # whole-function checks by signature key
        self._watch = True  # the capture raises where fn changes nnx state (`nnx_state`)
        self._stateful: Stateful | None = None  # set once fn has changed nnx state
        self._jit_kwargs = {
            "static_argnums": static_argnums,
            "static_argnames": static_argnames,
            "donate_argnums": donate_argnums,
            "donate_argnames": donate_argnames,
        }

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            return self._traced(*args, **kwargs)

        self._jitted = jax.jit(traced, **self._jit_kwargs)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        settle_trace_context()
        traces = self.stats.traces
        if self._stateful is not None:  # the function changes nnx state (`nnx_state`)
            return self._stateful(args, kwargs)
        try:
            out = self._jitted(*args, **kwargs)
        except StateMutation as e:
            self._stateful = Stateful(self, e)
            return self._stateful(args, kwargs)
        except (TypeError, jax.errors.ConcretizationTypeError) as e:
            hint_static_leaves(e, args, kwargs)
            raise
        if self.stats.traces != traces and trace_context_size() != self._context_size:
            logger.info(
                "%s: a module imported during this call registered a JAX trace-context state, "
                "so the next call traces and compiles again (add it to "
                "mirage_jax._env.TRACE_CONTEXT_MODULES)",
                self._name,
            )
        return out

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"<mirage_jax.jit {name} backend={self.opts.backend} search={self.opts.search}>"

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).lower` of the assembled function."""
        settle_trace_context()
        return self._jitted.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).trace` of the assembled function (runs the resolution)."""
        settle_trace_context()
        return self._jitted.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """The output shapes and dtypes, as `jax.eval_shape` gives them for a `jax.jit` object
        (static arguments stay static; `jax.eval_shape(f, ...)` traces them all)."""
        return self._jitted.trace(*args, **kwargs).out_info

    def with_options(self, **changes: Any) -> MirageJit:
        """A new MirageJit with some options changed (`fn=`: of another function)."""
        cache = self.cache if self.cache is not None else False
        kw = {**self._jit_kwargs, **self.opts.kwargs(), "cache": cache} | changes
        return MirageJit(kw.pop("fn", self.fn), **kw)

    @property
    def last(self) -> TraceRecord | None:
        """The most recent trace record."""
        return self.records[-1] if self.records else None

    # ------------------------------------------------------------------ trace time
    @property
    def _name(self) -> str:
        """The function's name, as the log and the records give it."""
        return getattr(self.fn, "__name__", "function")

    def _traced(self, *args: Any, **kwargs: Any) -> Any:
        self.stats.traces += 1
        self._context_size = trace_context_size()
        name = self._name
        clock = _Phases()
        fn = self.fn  # with its scans' bodies optimised where it has scans (`scan_bodies`)
        try:
            program = _capture(watch(fn) if self._watch else fn, args, kwargs)
            if self.opts.search != "off" and has_scan(program.meta["jaxpr"]):
                fn = with_scan_bodies(program, self._scan_body)
                program = _capture(watch(fn) if self._watch else fn, args, kwargs)
            self.stats.captures += 1
            part = lax_ir.partition(program)
            clock.lap("capture")
        except StateMutation:  # `__call__` carries the state out (`nnx_state.Stateful`)
            raise
        except Exception as e:  # capture never should fail; if it does, XLA still runs
            self.stats.fallbacks += 1
            fallback(
                f"capture:{id(self.fn)}",
                f"mirage_jax.jit could not capture {name} ({type(e).__name__}: {e}); "
                "running it as plain XLA",
                e,
                self.opts.strict,
            )
            self._record(TraceRecord(name, None, None, (), self.opts.backend, self.opts.search,
                                     error=f"{type(e).__name__}: {e}"))  # fmt: skip
            return self.fn(*args, **kwargs)
        backend, why_not = (
            (None, "search='off'")
            if self.opts.search == "off"
            else effective_backend(self.opts.backend)
        )
        decisions, replacements = self._resolve(part, backend, why_not)
        clock.lap("search_and_select")
        run = None
        if replacements:
            asm = self._assemble(program, part, replacements, backend)
            decisions = self._demote(part, decisions, asm.skipped)
            if asm.substituted:
                run = lax_ir.as_function(program, asm.fn)
        clock.lap("assemble")
        check = None
        if self.opts.function_check and backend is not None and backends.get(backend).needs_gpu:
            chosen = FunctionChoice(self, program, part, backend, clock)
            decisions, run, check = chosen.settle(
                decisions, replacements, asm if run is not None else None
            )
        forget_draws()
        for d in decisions:
            logger.info("%s", region_line(name, d))
        if check is not None:
            logger.info("%s: %s", name, check.reason)
        logger.info("%s: trace %s", name, clock.line())
        self._record(
            TraceRecord(
                name,
                program,
                part,
                decisions,
                self.opts.backend,
                self.opts.search,
                function_check=check,
                phases_s=clock.phases,
            )
        )
        if run is None:  # nothing replaced: the function itself, exactly as under jax.jit
            return fn(*args, **kwargs)
        return run(*args, **kwargs)

    def _scan_body(self, body: Callable[..., Any]) -> MirageJit:
        """A `mirage_jax.jit` of a scan's body (a flat function), with this one's options and
        cache; kept in `scan_bodies`."""
        cache = self.cache if self.cache is not None else False

        def scan_body(*xs: Any) -> Any:
            return body(*xs)

        scan_body.__name__ = scan_body.__qualname__ = f"{self._name}.scan_body"
        inner = MirageJit(scan_body, **{**self.opts.kwargs(), "cache": cache})
        inner._in_scan = True
        self.scan_bodies.append(inner)
        return inner

    def _assemble(
        self, program: Any, part: Any, replacements: Mapping[int, Callable], backend: str
    ) -> Any:
        """`assemble` with the inputs whose updated copies `copy_update` writes."""
        return assemble(program, part, replacements, self._copied(program, backend))

    def _copied(self, program: Any, backend: str) -> Sequence[int]:
        """The inputs XLA must copy to update: all of them on a GPU backend, unless some
        argument is donated or this is a scan's body (whose inputs XLA may update in place)."""
        donates = any(self._jit_kwargs[k] not in (None, (), []) for k in _DONATE)
        if not backends.get(backend).needs_gpu or donates or self._in_scan:
            return ()
        return range(len(program.meta["jaxpr"].jaxpr.invars))

    def _demote(self, part: Any, decisions: Sequence[Any], reasons: Mapping[int, str]) -> tuple:
        """`decisions` with the regions in `reasons` turned to XLA for that reason (counted)."""
        self.stats.kernels -= len(reasons)
        self.stats.xla_regions += len(reasons)
        return tuple(
            xla_decision(part.regions[d.index], reasons[d.index], d) if d.index in reasons else d
            for d in decisions
        )

    def _record(self, record: TraceRecord) -> None:
        self.records.append(record)  # in place: a stateful call's jit shares the list
        del self.records[:-8]

    def _resolve(
        self, part: Any, backend: str | None, why_not: str
    ) -> tuple[tuple[RegionDecision, ...], dict[int, Callable]]:
        """Per region: what it runs as, and the kernels that replace regions (`backend` None:
        every region is XLA, for `why_not`)."""
        decisions: list[RegionDecision] = []
        replacements: dict[int, Callable] = {}
        pending = [r for r in part.regions if not r.is_trivial]
        for region in part.regions:
            if region.is_trivial:
                decisions.append(
                    xla_decision(
                        region, "trivial region (only shape/dtype plumbing): nothing to fuse"
                    )
                )
            elif self.opts.search == "off":
                decisions.append(xla_decision(region, "search='off'"))
            elif backend is None:
                decisions.append(xla_decision(region, why_not))
        if self.opts.search == "off" or backend is None or not pending:
            self.stats.xla_regions += len(decisions)
            return tuple(decisions), replacements
        resolver = Resolver(self, backend)
        found = {r.index: resolver.lookup(r) for r in pending}
        misses = search_order([r for r in pending if found[r.index] is None])
        if misses and self.opts.search == "auto":
            from mirage_jax.progress import progress_bar

            progress = self.opts.progress
            disable = None if progress is None else not progress  # None: only on a terminal
            from mirage_jax.search.workers import shared_pool

            # One pool of search workers for all of this call's regions; the searches run
            # ahead in a background thread while each searched region is selected here.
            # Regions no kernel of ours can win (`compute_gated`) are decided here, in order,
            # while the searches of the ones before them run.
            gates = [Future() for _ in misses]
            with shared_pool(), SearchAhead([r.program for r in misses], self.opts, gates) as ahead:
                try:
                    for region, gate in zip(misses, gates):
                        avals = region_avals(part, region)
                        gate.set_result(compute_gated(region.program, self.opts, backend, avals))
                finally:  # an interrupt: the waiting searches end instead of waiting forever
                    for gate in gates:
                        if not gate.done():
                            gate.set_exception(CancelledError())
                # each region selected as soon as its search ends (the GPU is free sooner than
                # in region order: a region searched quickly waits for none searched slowly)
                of = dict(zip(ahead.futures, misses))
                bar = progress_bar(
                    as_completed(ahead.futures),
                    total=len(misses),
                    desc="mirage_jax search",
                    unit="region",
                    disable=disable,
                )
                for searched in bar:
                    region = of[searched]
                    avals = region_avals(part, region)
                    known = constant_inputs(part.program, region)
                    found[region.index] = resolver.search(region, avals, searched, known)
        for region in pending:
            decision = found[region.index] or xla_decision(
                region, "not in the cache (search='cached')"
            )
            if decision.status == "kernel":
                impl = self._kernel(part, region, decision, backend)
                if isinstance(impl, str):
                    decision = xla_decision(region, impl, decision)
                else:
                    replacements[region.index] = impl
            decisions.append(decision)
        decisions.sort(key=lambda d: d.index)
        self.stats.kernels += sum(d.status == "kernel" for d in decisions)
        self.stats.xla_regions += sum(d.status == "xla" for d in decisions)
        return tuple(decisions), replacements

    def _kernel(self, part: Any, region: Any, decision: Any, backend: str) -> Callable | str:
        """The region's kernel for a kernel decision (`regions.region_kernel`), its outputs
        written in the layout the program's XLA steps after it end in; or why not."""
        inside = {i for r in part.regions for i in r.nodes}
        xla = set(range(len(part.program.nodes))) - inside
        after = [layout_after(part.program, o, xla) for o in region.outputs]
        opts = self.opts
        known = constant_inputs(part.program, region)
        return region_kernel(
            decision, region, backend, opts.lower_config, opts.strict, after, known
        )


# ---------------------------------------------------------------------- helpers
class _Phases:
    """Wall-clock seconds per phase of one trace (capture, search and selection, the
    whole-function check), for `TraceRecord.phases_s` and the log."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._t = self._start = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = round(now - self._t, 3)
        self._t = now

    def line(self) -> str:
        total = time.perf_counter() - self._start
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        return f"{total:.1f} s ({parts})"


def _open_cache(cache: Cache | str | bool | None) -> Cache | None:
    if cache is False:
        return None
    if isinstance(cache, Cache):
        return cache
    if cache is None or cache is True:
        return Cache()
    return Cache(cache)


def _capture(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Capture `fn` on the avals of the (traced) arguments; weak types are kept."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    weak = []
    specs = []
    for x in leaves:
        if isinstance(x, (jax.core.Tracer, jax.Array)):
            aval = jax.typeof(x)
            specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype))
            weak.append(bool(getattr(aval, "weak_type", False)))
        else:
            specs.append(x)
            weak.append(False)
    if any(weak):
        from jax._src.lax import lax as lax_internal  # the one way to make a weak-typed value

        @functools.wraps(fn)
        def with_weak(*a: Any, **k: Any) -> Any:
            ls, tr = jax.tree_util.tree_flatten((a, k))
            ls = [
                lax_internal._convert_element_type(v, v.dtype, weak_type=True) if w else v
                for v, w in zip(ls, weak)
            ]
            a2, k2 = jax.tree_util.tree_unflatten(tr, ls)
            return fn(*a2, **k2)

        target = with_weak
    else:
        target = fn
    sa, sk = jax.tree_util.tree_unflatten(tree, specs)
    return lax_ir.capture(target, *sa, **sk)


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    backend: str = "auto",
    search: str = "auto",
    budget_s: float = DEFAULT_BUDGET_S,
    cache: Cache | str | bool | None = None,
    seed: int = 0,
    workers: int | None = None,
    options: Mapping[str, Any] | None = None,
    lower_config: Any = None,
    progress: bool | None = None,
    strict: bool | None = None,
    function_check: bool = True,
    max_candidates: int | None = None,
) -> Any:
    """Compile `fn` like `jax.jit`, replacing its Lax regions with verified fused kernels.

    Usable as `jit(fn, ...)`, `@jit` and `@jit(...)`.

    Arguments:
        fn: the function (pytrees in and out).
        static_argnums, static_argnames, donate_argnums, donate_argnames: as in `jax.jit`.
        backend: one of `BACKENDS`; "auto" lowers to Triton on a GPU (jax-triton, else Pallas)
            and keeps XLA elsewhere.
        search: "auto" (cache, then search on a miss), "cached" (cache only), "off" (XLA).
        budget_s: search time budget per region, in seconds; `math.inf`: no wall-clock
            stop, each search ends when exhausted or by `max_candidates` (reproducible).
        cache: a `Cache`, a database path, None for the default path, False for none.
        seed: the search seed (results are deterministic for a seed).
        workers: search worker processes (None: the CPUs less two, at most 12; 1 searches in
            this process).
        options: extra options that change the result (part of the cache key); e.g.
            `{"reread": False}` keeps the search from splitting a norm + projection over K
            (`search.Budget.reread`, on by default here).
        lower_config: a lowering config passed to `mirage_jax.lower.lower`.
        progress: show a progress bar while searching (None: only on a terminal).
        strict: every fallback to XLA (a failed capture, search, lowering or cache read)
            raises `FallbackError` with its cause instead of warning (None: the
            `MIRAGE_JAX_STRICT` environment variable decides).
        function_check: on a GPU, time the function with its kernels against `jax.jit` of
            the function on the first call of a signature and keep the faster (cached with
            both times); False keeps the kernels the per-region selection chose.
        max_candidates: closed graphs a search examines at most (`search.Budget`; None: its
            default, 20000); not part of the cache key, like `budget_s`.
    """
    kwargs = dict(
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
        backend=backend,
        search=search,
        budget_s=budget_s,
        cache=cache,
        seed=seed,
        workers=workers,
        options=options,
        lower_config=lower_config,
        progress=progress,
        strict=strict,
        function_check=function_check,
        max_candidates=max_candidates,
    )
    if fn is None:
        return functools.partial(jit, **kwargs)
    if not callable(fn):
        raise TypeError(f"mirage_jax.jit expects a function, got {type(fn).__name__}")
    return MirageJit(fn, **kwargs)


def superoptimize(
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "auto",
    budget_s: float = DEFAULT_BUDGET_S,
    cache: Cache | str | bool | None = None,
    seed: int = 0,
    workers: int | None = None,
    search: str = "auto",
    static_argnums: int | Sequence[int] | None = None,
    progress: bool | None = None,
    max_candidates: int | None = None,
    **kwargs: Any,
) -> TraceRecord:
    """Search (and cache) kernels for `fn` at the given arguments; returns the trace record.

    `args`/`kwargs` may be arrays or `jax.ShapeDtypeStruct`s; nothing is executed. The options
    are `jit`'s.
    """
    f = fn if isinstance(fn, MirageJit) else None
    if f is None:
        f = MirageJit(
            fn,
            static_argnums=static_argnums,
            backend=backend,
            search=search,
            budget_s=budget_s,
            cache=cache,
            seed=seed,
            workers=workers,
            progress=progress,
            max_candidates=max_candidates,
        )
    f.trace(*args, **kwargs)
    assert f.last is not None
    return f.last
