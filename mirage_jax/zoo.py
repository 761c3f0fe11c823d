"""Optimising many functions at many shapes at once: plan, search, time, store.

`optimize_many(jobs, ...)` (and `mirage-jax optimize --models ...`) runs four phases:

1. plan: capture each job (a function at one set of argument shapes), partition it, and
   collect its Lax regions by cache key (`Resolver.key`: canonical hash, device kind, backend,
   library version, options), so a region shared by several jobs or batch sizes is searched
   once; regions already in the cache are skipped (a rerun does only what is missing);
2. search: one task per distinct region (`regions.search_only`, CPU only), on the local
   process pool or as Ray tasks (`mirage_jax.ray_backend`);
3. select: for each region with µGraphs, one task that lowers, checks and, on a GPU, times
   them against XLA (`regions.select_searched`); a Ray task of this kind holds one GPU. On a
   machine with no GPU nothing is timed: the cost model's best that passes is kept, as
   `mirage_jax.jit` does there;
4. store: the driver alone writes each result into the cache as it arrives, as the entry
   `mirage_jax.jit` would write (`Resolver.entry`), so a run that is killed loses nothing
   finished.

A task that fails (an exception, or its worker process dying) is tried once more; a second
failure is reported in the summary with its cause and the other regions go on.

Reproducible runs (`reproducible=True`, `--reproducible`): searches have no wall-clock stop
(`search.Budget(time_s=math.inf)`) and end when exhausted or after `max_candidates`, so each
entry depends on its region, the options and the seed only: not on the executor, the worker
count, the machine's load or the order tasks finish in (what a worker keeps from earlier
tasks, `fields.verify`'s verdicts, is what it would compute again). `comparable` gives the
fields such runs agree on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mirage_jax.log import logger

MAX_ATTEMPTS = 2
"""A failed task is tried once more, then reported."""
FAULT_VAR = "MIRAGE_JAX_ZOO_KILL"
"""Testing hook, read by the driver: `HASHPREFIX` makes the search task of a region whose
canonical hash starts with it kill its own worker process on its first attempt;
`HASHPREFIX:always` on every attempt; several, comma-separated."""


# ---------------------------------------------------------------------- jobs and plan
@dataclass(frozen=True)
class Job:
    """One function at one set of arguments (arrays or `jax.ShapeDtypeStruct`s, pytrees)."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def model_jobs(
    names: Sequence[str] | None = None, batches: Sequence[int] = (1, 8), size: str = "tiny"
) -> list[Job]:
    """The real-model set of `experiments.models` (all models when `names` is None or
    contains "all") at each of `batches`, as jobs on abstract arguments. The set is the
    repository's: it needs an editable install of a clone (`pip install -e .`)."""
    try:
        from experiments import models
    except ModuleNotFoundError as e:
        if e.name != "experiments":
            raise
        raise ModuleNotFoundError(
            "mirage_jax.zoo.model_jobs needs the repository's `experiments` package, which a "
            "wheel does not install: clone the repository and `pip install -e .` in it",
            name=e.name,
        ) from e

    chosen = models.names() if not names or "all" in names else list(names)
    out = []
    for name in chosen:
        for b in batches:
            m = models.get(name, b, size)
            out.append(Job(m.key, m.fn, m.abstract_args()))
    return out


@dataclass
class PlannedRegion:
    """One distinct region: its key, the region (of its first job), the region's own input
    avals, every (job, region index) that contains it, and its cached decision if any."""

    key: str
    region: Any
    avals: list[tuple[tuple[int, ...], str]]
    users: list[str]
    cached: Any = None  # a `RegionDecision` read from the cache


@dataclass
class Plan:
    """The distinct regions of all jobs, and the jobs that could not be captured."""

    regions: dict[str, PlannedRegion]
    backend: str | None
    why_not: str
    device: str
    errors: list[tuple[str, str]] = field(default_factory=list)
    trivial: int = 0

    @property
    def missing(self) -> list[PlannedRegion]:
        return [r for r in self.regions.values() if r.cached is None]


def plan(jobs: Iterable[Job], owner: Any, backend: str | None, why_not: str, device: str) -> Plan:
    """Capture and partition every job; one `PlannedRegion` per distinct cache key, looked up
    in `owner`'s cache (`owner`: a `MirageJit` carrying the options and the cache)."""
    import lax_ir
    from mirage_jax.api import _capture
    from mirage_jax.regions import region_avals
    from mirage_jax.resolve import Resolver

    out = Plan({}, backend, why_not, device)
    resolver = Resolver(owner, backend or "xla")
    resolver.device = device
    for job in jobs:
        try:
            part = lax_ir.partition(_capture(job.fn, tuple(job.args), dict(job.kwargs)))
        except Exception as e:  # one job that cannot be captured does not stop the others
            out.errors.append((job.name, f"capture failed ({type(e).__name__}: {e})"))
            continue
        for region in part.regions:
            if region.is_trivial:
                out.trivial += 1
                continue
            key = resolver.key(region)
            user = f"{job.name}.r{region.index}"
            if key in out.regions:
                out.regions[key].users.append(user)
                continue
            pr = PlannedRegion(key, region, region_avals(part, region), [user])
            if backend is not None and owner.cache is not None:
                pr.cached = resolver.lookup(region)
            out.regions[key] = pr
    return out


# ---------------------------------------------------------------------- tasks
def search_task(program: Any, opts: Any, attempt: int = 1, fault: str = "") -> Any:
    """Phase 2 on a worker: `regions.search_only` (a `SearchResult`, or the XLA outcome);
    `fault` is the driver's `FAULT_VAR` (a test of killed workers)."""
    _fault(program, attempt, fault)
    from mirage_jax import search as search_mod
    from mirage_jax.regions import search_only

    return search_only(search_mod, program, opts)


def select_task(
    result: Any, program: Any, opts: Any, backend: str, avals: Any, attempt: int = 1
) -> tuple[Any, dict[str, Any]]:
    """Phase 3 on a worker (on a GPU where there is one): `regions.select_searched`, and where
    it ran (host, pid, GPU ids, seconds)."""
    import socket

    from mirage_jax._env import device_kind
    from mirage_jax.regions import select_searched

    t0 = time.perf_counter()
    outcome = select_searched(result, program, opts, backend, avals)
    where = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "gpus": _gpu_ids(),
        "device": device_kind(),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return outcome, where


def _gpu_ids() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ",".join(str(i) for i in ray.get_gpu_ids())
    except Exception:  # not under Ray: the visible devices say it
        pass
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def _fault(program: Any, attempt: int, spec: str) -> None:
    for item in filter(None, spec.split(",")):
        prefix, _, when = item.partition(":")
        if program.canonical_hash.startswith(prefix) and (when == "always" or attempt == 1):
            os._exit(17)  # a worker killed mid-task


# ---------------------------------------------------------------------- results
@dataclass
class RegionResult:
    """What happened to one distinct region (one row of the summary)."""

    key: str
    users: list[str]
    status: str  # "kernel", "xla", "failed" or "not stored"
    source: str  # "cache" or "search"
    reason: str
    structure: str = ""
    speedup: float | None = None
    attempts: int = 0  # of the last task (2: it was retried)
    retried: int = 0  # failed tasks of this region that were tried again
    where: dict[str, Any] = field(default_factory=dict)
    entry: Any = None  # the stored `CacheEntry`

    @property
    def origin(self) -> str:
        return self.users[0] + (f" (+{len(self.users) - 1})" if len(self.users) > 1 else "")


@dataclass
class Report:
    """The outcome of `optimize_many`: one `RegionResult` per distinct region."""

    results: list[RegionResult]
    plan: Plan
    executor: str
    seconds: float
    searched: int = 0
    timed: int = 0
    search_results: dict[str, Any] = field(default_factory=dict)
    budget: str = ""  # the searches' budget, in words

    def count(self, **match: str) -> int:
        return sum(all(getattr(r, k) == v for k, v in match.items()) for r in self.results)

    @property
    def failed(self) -> list[RegionResult]:
        return [r for r in self.results if r.status == "failed"]

    def text(self) -> str:
        """The summary table: per region, the structure chosen and its speedup, or why XLA."""
        p = self.plan
        head = (
            f"# {len(self.results)} distinct region(s) of {len(_jobs(p))} job(s) "
            f"({sum(len(r.users) for r in self.results)} in all, {p.trivial} trivial); "
            f"{self.count(source='cache')} cached, {self.searched} searched, {self.timed} "
            f"selected, {self.count(status='kernel')} kernel(s), {len(self.failed)} failed; "
            f"{self.executor}, {self.seconds:.1f} s"
        )
        lines = [head] + ([f"# search budget: {self.budget}"] if self.budget else [])
        if p.backend is None:
            lines.append(f"# every region runs as XLA: {p.why_not}")
        for name, why in p.errors:
            lines.append(f"# {name}: {why}")
        rows = [("key", "region", "choice", "source", "speedup", "structure or why XLA")]
        for r in self.results:
            speed = f"{r.speedup:.2f}x" if r.speedup else "-"
            what = r.structure if r.status == "kernel" else r.reason
            rows.append((r.key[:12], r.origin, r.status, r.source, speed, what))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            cells = [c.ljust(w) for c, w in zip(row[:5], widths)]
            lines.append("  ".join([*cells, _short(row[5])]))
        return "\n".join(lines)


WALL_CLOCK = ("search_s", "select_s", "select_phases_s", "search_phases_s")
"""Timings of an entry that are seconds of wall clock, not choices."""


def comparable(entry: Any) -> dict[str, Any]:
    """A cache entry's fields but its creation time and the wall-clock seconds in its timings
    (`WALL_CLOCK`): what two reproducible runs with the same seed store alike."""
    d = dataclasses.asdict(entry)
    d.pop("created_at")
    timings = {k: v for k, v in entry.timings.items() if k not in WALL_CLOCK}
    d["timings_json"] = json.dumps(timings, sort_keys=True)
    return d


def _jobs(p: Plan) -> set[str]:
    return {u.rsplit(".r", 1)[0] for r in p.regions.values() for u in r.users} | {
        n for n, _ in p.errors
    }


def _short(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _speedup(timings: Mapping[str, Any] | None) -> float | None:
    try:
        return float(timings["xla_us"]) / float(timings["mugraph_us"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _structure(mugraph: Any) -> str:
    return "" if mugraph is None else str(mugraph.meta.get("structure", ""))


# ---------------------------------------------------------------------- the driver
def run(
    the_plan: Plan,
    owner: Any,
    executor: Any,
    *,
    progress: bool | None = None,
    search_fn: Callable[..., Any] = search_task,
    select_fn: Callable[..., Any] = select_task,
    searched: Mapping[str, Any] | None = None,
    stop_after_search: bool = False,
) -> Report:
    """Search and select every region of `the_plan` missing from the cache with `executor`,
    storing each result in `owner.cache` as it arrives (the only writer).

    `searched`: search results by key from an earlier run (`Report.search_results`), whose
    regions are only selected; `stop_after_search`: search only (the results are in
    `Report.search_results`, nothing is selected or stored).
    """
    from mirage_jax.progress import progress_bar
    from mirage_jax.regions import SearchOutcome
    from mirage_jax.resolve import Resolver

    t0 = time.perf_counter()
    results: dict[str, RegionResult] = {}
    for pr in the_plan.regions.values():
        d = pr.cached
        if the_plan.backend is None:
            results[pr.key] = RegionResult(pr.key, pr.users, "xla", "none", the_plan.why_not)
        elif d is not None:
            results[pr.key] = RegionResult(
                pr.key, pr.users, d.status, "cache", d.reason, _structure(d.mugraph),
                _speedup(d.timings),
            )  # fmt: skip
    todo = [] if the_plan.backend is None else the_plan.missing
    backend = the_plan.backend or "xla"
    resolver = Resolver(owner, backend)
    resolver.device = the_plan.device
    opts = owner.opts
    task_opts = type(opts)(**(opts.kwargs() | {"workers": 1, "progress": False}))
    disable = None if progress is None else not progress
    bar = progress_bar(total=len(the_plan.regions), desc="mirage_jax optimize", unit="region",
               disable=disable, initial=len(results))  # fmt: skip
    cached = sum(r.source == "cache" for r in results.values())
    counts = {"searched": 0, "timed": 0, "cached": cached, "failed": 0}
    pending: dict[Any, tuple[str, PlannedRegion, int, Any]] = {}
    retried: dict[str, int] = {}

    def submit(kind: str, pr: PlannedRegion, attempt: int, found: Any = None) -> None:
        program = pr.region.program
        if kind == "search":
            fault = os.environ.get(FAULT_VAR, "")
            h = executor.submit("search", search_fn, program, task_opts, attempt, fault)
        else:
            h = executor.submit(
                "select", select_fn, found, program, task_opts, backend, pr.avals, attempt
            )
        pending[h] = (kind, pr, attempt, found)

    def finish(pr: PlannedRegion, outcome: Any, attempts: int, where: dict) -> None:
        entry = resolver.entry(pr.region, outcome)
        status, reason = ("xla" if outcome.kernel is None else "kernel"), outcome.reason
        if outcome.cacheable and owner.cache is not None:
            try:
                owner.cache.put(entry)
                counts["cached"] += 1
            except Exception as e:  # reported; the other regions go on
                counts["failed"] += 1
                status, reason = "failed", f"not stored in {owner.cache.path} ({e}); {reason}"
        elif not outcome.cacheable:
            status = "not stored"
        results[pr.key] = RegionResult(
            pr.key, pr.users, status, "search", reason, _structure(outcome.mugraph),
            _speedup(outcome.timings), attempts, retried.get(pr.key, 0), where, entry,
        )  # fmt: skip
        bar.update(1)
        bar.set_postfix(counts, refresh=True)
        logger.info("region %s (%s): %s: %s", pr.key[:12], pr.users[0], status, outcome.reason)

    search_results: dict[str, Any] = {}

    def searched_one(pr: PlannedRegion, value: Any, attempt: int) -> None:
        if stop_after_search:
            search_results[pr.key] = value
            bar.update(1)
            bar.set_postfix(counts, refresh=True)
        elif isinstance(value, SearchOutcome):
            finish(pr, value, attempt, {})
        else:
            submit("select", pr, 1, value)

    try:
        for pr in todo:
            if searched is not None and pr.key in searched:
                searched_one(pr, searched[pr.key], 1)
            else:
                submit("search", pr, 1)
        while pending:
            for h, ok, value in executor.wait(list(pending)):
                kind, pr, attempt, found = pending.pop(h)
                if not ok:
                    why = f"{kind} task failed ({type(value).__name__}: {_short(value, 300)})"
                    logger.warning("region %s attempt %d: %s", pr.key[:12], attempt, why)
                    if attempt < MAX_ATTEMPTS:
                        retried[pr.key] = retried.get(pr.key, 0) + 1
                        submit(kind, pr, attempt + 1, found)
                        continue
                    counts["failed"] += 1
                    results[pr.key] = RegionResult(
                        pr.key, pr.users, "failed", kind, f"{why}, after {attempt} attempts",
                        attempts=attempt, retried=retried.get(pr.key, 0),
                    )  # fmt: skip
                    bar.update(1)
                    bar.set_postfix(counts, refresh=True)
                    continue
                if kind == "search":
                    counts["searched"] += 1
                    searched_one(pr, value, attempt)
                else:
                    counts["timed"] += 1
                    outcome, where = value
                    finish(pr, outcome, attempt, where)
    finally:
        bar.close()
        executor.close()
    ordered = [results[k] for k in the_plan.regions if k in results]
    return Report(
        ordered, the_plan, executor.name, time.perf_counter() - t0, counts["searched"],
        counts["timed"], search_results, budget_text(opts),
    )  # fmt: skip


def budget_text(opts: Any) -> str:
    """A search budget in words: wall clock per region (or none: reproducible), candidates."""
    from mirage_jax.search import Budget

    n = opts.max_candidates if opts.max_candidates is not None else Budget.max_candidates
    if math.isinf(opts.budget_s):
        return f"reproducible: no wall-clock stop, at most {n} candidates per search"
    return f"{opts.budget_s:g} s per region, at most {n} candidates per search"


RAY_MODES = ("off", "auto", "local")
"""off: the local process pool; auto: join the running Ray cluster; local: start one here."""


def optimize_many(
    jobs: Iterable[Job],
    *,
    backend: str = "auto",
    budget_s: float = 60.0,
    cache: Any = None,
    seed: int = 0,
    workers: int = 1,
    ray: str = "off",
    options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    ray_init: Mapping[str, Any] | None = None,
    gpus: int = 0,
    reproducible: bool = False,
    max_candidates: int | None = None,
) -> Report:
    """Search (and cache) kernels for many functions at many shapes; each distinct region is
    searched once, and regions already in the cache are skipped.

    Arguments:
        jobs: the functions and their arguments (`Job`; `model_jobs` gives the real-model set).
        backend, budget_s, cache, seed, options: as in `mirage_jax.jit` (`budget_s` per
            region; the entries written are those `mirage_jax.jit` writes).
        workers: local processes searching regions at once (`ray="off"`).
        ray: "off" (the local process pool), "auto" (join the running Ray cluster, as after
            `ray start --head`) or "local" (start a Ray cluster on this machine).
        progress: a progress bar over regions (None: only on a terminal).
        ray_init: extra `ray.init` arguments (e.g. num_cpus, num_gpus for `ray="local"`).
        gpus: with `ray="off"`, select in one process per GPU (GPUs 0..gpus-1) instead of in
            this process.
        reproducible: no wall-clock stop (`budget_s` unused): each search ends when exhausted
            or after `max_candidates`, and the entries depend on the seed only (on a GPU the
            timed choice between kernel and XLA still depends on the timings).
        max_candidates: closed graphs each search examines at most (None: `search.Budget`'s
            default, 20000).
    """
    from mirage_jax.api import MirageJit

    if ray not in RAY_MODES:
        raise ValueError(f"ray must be one of {', '.join(RAY_MODES)}, got {ray!r}")
    owner = MirageJit(
        _nothing, backend=backend, budget_s=math.inf if reproducible else budget_s, cache=cache,
        seed=seed, workers=1, options=options, progress=False, max_candidates=max_candidates,
    )  # fmt: skip
    if ray == "off":
        from mirage_jax.local_backend import LocalExecutor

        executor: Any = LocalExecutor(workers, gpus)
    else:
        from mirage_jax.ray_backend import RayExecutor

        executor = RayExecutor(ray, **dict(ray_init or {}))
    try:
        device, name, why = executor.target(backend)
        the_plan = plan(jobs, owner, name, why, device)
    except BaseException:
        executor.close()
        raise
    return run(the_plan, owner, executor, progress=progress)


def _nothing() -> None:
    """The function of the options-carrying `MirageJit` (never called)."""
