"""`search`: budgets, tasks, verification, numbers, kernel cuts, statistics, workers.

The search of one region runs in phases (each timed in the statistics):

1. prepare: check the region is inside the fragment, find its logical dimensions, shrink it
   (`dims.shrink`), derive the targets' abstract expressions (`expr`; saturated on first use
   in each process);
2. enumerate: one task per schedule class (loop dimension, split-K dimension: independent
   subtrees, run by a process pool), iterative deepening over the number of block ops,
   depth-major across tasks so small graphs are found first everywhere; closed graphs are
   verified at once on the small representative (`fields.verify` against the shrunk region,
   grid 2, loop 2) and memoised by structure (`tasks.run_task`); then pre-defined kernel ops
   (GEMMs left to XLA, `predefined`) are enumerated and the rest of the region behind each
   prefix is searched the same way, one task group per prefix (`Budget.max_predefined`,
   `predefined_share` of the time); if no µGraph of graph-defined kernels only was found, the
   region is cut at matmul prologues and the pieces are searched (`cuts`);
3. numbers: every accepted structure is instantiated at full size over its candidate grids
   and loop ranges, checked against the target's limits and ranked by the cost model;
4. confirm: the first candidates of the returned order (cost order, with the best of up to
   two other kernel-level plans promoted behind the best: `order.return_order`) that `select`
   will time (`order.timing_order`) are verified at full size, in parallel in the pool.

The depth policy: once a task's smallest graph is found at depth d, it goes on to depth
d + `Budget.extra_depth` only; depths beyond the smallest success overall plus that margin are
not explored. A budget that runs out returns what was found with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lax_ir.pieces import reaches_exp
from lax_ir.program import Program
from mirage_jax.mugraph import TARGETS, MuGraph, MuGraphError, Target, block_info, validate
from mirage_jax.mugraph.validate import KernelLimitError
from mirage_jax.search import cost as cost_model
from mirage_jax.search import predefined as pre_mod
from mirage_jax.search.budget import Budget as Budget
from mirage_jax.search.confirm import call, confirm
from mirage_jax.search.cut_search import search_cuts
from mirage_jax.search.diagnose import blockers, one_piece_dead_ends
from mirage_jax.search.enumerate import Counters
from mirage_jax.search.recipe import RECIPE, encode
from mirage_jax.search.schedule import numbers_for
from mirage_jax.search.structure import Numbers, Structure, instantiate
from mirage_jax.search.tasks import Problem, prepare, run_keyed, run_task, takes_rms, tasks_of
from mirage_jax.search.workers import pool_for, problem_blob, shared_pool

STOP_REASONS = ("exhausted", "time", "candidates", "no-candidates")


@dataclass(frozen=True)
class SearchResult:
    """What `search` found for one region.

    Arguments:
        mugraphs: verified µGraphs, best (lowest estimated cost) first.
        stop_reason: "exhausted", "time", "candidates" or "no-candidates".
        stats: counts (generated, pruned by reason, verified, accepted, rejected), seconds per
            phase, e-graph and budget details.
        structures: a one-line description per accepted structure.
        message: a sentence for people (says so when nothing was found).
        verdicts: µGraph hash -> (trials, seed, `fields.Verdict`) of its full-size verification,
            so `select` asks none of them again, in this process or another.
    """

    mugraphs: tuple[MuGraph, ...]
    stop_reason: str
    stats: Mapping[str, Any]
    structures: tuple[str, ...] = ()
    message: str = ""
    program_hash: str = ""
    verdicts: Mapping[str, tuple[int | None, int, Any]] = field(default_factory=dict)

    @property
    def best(self) -> MuGraph | None:
        return self.mugraphs[0] if self.mugraphs else None

    def __bool__(self) -> bool:
        return bool(self.mugraphs)

    def to_json(self) -> str:
        """The result as JSON: stop reason, message, stats, structures, µGraph summaries."""
        return json.dumps(
            {
                "program": self.program_hash,
                "stop_reason": self.stop_reason,
                "message": self.message,
                "stats": self.stats,
                "structures": list(self.structures),
                "mugraphs": [
                    {k: v for k, v in g.meta.items() if k != "source"} | {"hash": g.canonical_hash}
                    for g in self.mugraphs
                ],
            },
            sort_keys=True,
            default=str,
            ensure_ascii=False,
        )


# ---------------------------------------------------------------------------- search
def search(
    program: Program,
    *,
    budget: Budget | None = None,
    seed: int = 0,
    workers: int = 1,
    progress: bool | None = None,
    target: Target | str = "h100",
    device: cost_model.Device = cost_model.H100,
) -> SearchResult:
    """Search verified µGraphs for one Lax region.

    Arguments:
        program: the region (a `lax_ir.Program`, e.g. `lax_ir.partition(p).regions[k].program`).
        budget: limits (`Budget()` by default).
        seed: makes verification (and so the result) reproducible.
        workers: processes for the enumeration, the numbers and the full-size verification
            (1: in this process); one pool for all of its phases (and its kernel cuts).
        progress: a progress bar on stderr (None: only when stderr is a terminal).
        target: launch limits (a `mugraph.Target` or "h100"/"a100"/"mirage").
        device: the cost model's device.

    Raises SearchError (naming the op) for a region outside the fragment.
    """
    budget = budget or Budget()
    target = TARGETS[target] if isinstance(target, str) else target
    with shared_pool():
        return _search(program, budget, seed, workers, progress, target, device)


def _search(
    program: Program,
    budget: Budget,
    seed: int,
    workers: int,
    progress: bool | None,
    target: Target,
    device: cost_model.Device,
) -> SearchResult:
    """`search` inside its pool's block."""
    t_all = time.perf_counter()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    problem = prepare(program, seed=seed, budget=budget)
    tasks = tasks_of(problem, budget)
    blocked = blockers(program)  # what no µGraph expresses: skips, and the message where none
    seconds["prepare"] = time.perf_counter() - t0

    # with cuts possible, the one-piece enumeration gets a share of the time, the pieces the rest
    cut_deadline = time.monotonic() + budget.time_s
    share = budget.cut_share if budget.cuts and budget.max_kernels >= 2 else 0.0
    deadline = time.monotonic() + budget.time_s * (1.0 - share)
    run = _Run(budget, problem)
    run.stats.update(
        tasks=len(tasks),
        schedule_classes=[t.mapping.describe() for t in tasks if t.shard[0] == 0],
    )
    run.bar = _progress_bar(progress, len(tasks) * max(1, budget.max_block_ops - 1))
    pre_stats: dict[str, Any] = {}
    with pool_for(workers) as raw:
        pool = None if raw is None else _Dispatch(raw, *problem_blob(problem))
        try:
            dead_ends = one_piece_dead_ends(blocked)
            if dead_ends:  # no one-piece µGraph can express them: the pieces get the time
                run.stats["one_piece_skipped"] = dead_ends
            else:
                run.deepen(tasks, budget.max_block_ops, deadline, pool, beyond(program))
            n_main = len(run.accepted)
            # pre-defined kernels (GEMMs left to XLA), then graph-defined kernel(s) for the rest
            if budget.max_predefined > 0 and budget.max_kernels >= 2:
                t0 = time.perf_counter()
                pre_deadline = min(
                    cut_deadline, time.monotonic() + budget.time_s * budget.predefined_share
                )
                kc = pre_mod.KernelCounters()
                limit = min(budget.max_predefined, budget.max_kernels - 1)
                prefixes = pre_mod.KernelEnumerator(problem, limit, kc).run()
                pre_tasks: list = []
                for g, prefix in enumerate(prefixes, start=1):
                    pre_tasks += tasks_of(problem, budget, prefix, len(tasks) + len(pre_tasks), g)
                for t in pre_tasks:
                    run.known.setdefault(t.index, {})
                seconds["predefined_prefixes"] = time.perf_counter() - t0
                if pre_tasks and run.stop_reason == "exhausted":
                    run.deepen(pre_tasks, budget.predefined_block_ops, pre_deadline, pool)
                pre_stats = {
                    "generated": kc.generated, "kept": kc.kept, "pruned": dict(sorted(kc.pruned.items())),
                    "prefixes": [p.description + " → [" + ",".join(
                        f"x{t.ref[1]}" if t.ref[0] == "in" else f"k{t.ref[1]}" for t in p.rest
                    ) + "]" for p in prefixes],
                    "tasks": len(pre_tasks), "accepted": len(run.accepted) - n_main,
                }  # fmt: skip
                seconds["predefined"] = time.perf_counter() - t0
        finally:
            if run.bar is not None:
                # the total is an estimate (pruned tasks end early, pre-defined kernels add tasks):
                # a notebook's bar left short of it would turn red and stay, so it ends full
                run.bar.total = run.bar.n
                run.bar.close()
    stats, counters, accepted = run.stats, run.counters, run.accepted
    stop_reason = run.stop_reason
    seconds["enumerate"] = run.enum_s
    seconds["verify_small"] = run.verify_s
    stats["accepted"] = len(accepted)
    stats["predefined"] = pre_stats
    saturation = run.saturation

    # numbers: instantiate every accepted structure at full size, rank by the cost model
    t0 = time.perf_counter()
    instances: list[tuple[float, int, MuGraph, str]] = []
    descriptions = []
    name = lambda c: f"d{c}({problem.sizes[c]})"  # noqa: E731
    best_one = None  # the cheapest instance without pre-defined kernels (seconds)
    best_blocks: tuple[int, ...] = ()  # its kernels' blocks
    recipes: dict[str, tuple[Structure, Numbers]] = {}  # µGraph hash -> how it was built
    keep = budget.numbers_per_structure
    from fields import memory

    large = memory.trial_bytes(program, program) > memory.LARGE_TRIAL
    jobs = lambda t: [(a[2], t, device, keep, deadline) for a in accepted]  # noqa: E731
    with pool_for(workers) as raw:  # the structures in parallel (the search's shared pool)
        numbered = call(raw, problem, _instances, jobs(target))
        if not any(found for found, _ in numbered) and target.max_blocks < WIDE_BLOCKS:
            # no structure has an instance within the target's block cap: past it
            wide = dataclasses.replace(target, max_blocks=WIDE_BLOCKS)
            numbered = call(raw, problem, _instances, jobs(wide))
            stats["wide_grids"] = any(found for found, _ in numbered)
    stats["numbers_cut_short"] = sum(short for _, short in numbered)
    for rank, ((depth, task_index, s, key), (found, _)) in enumerate(zip(accepted, numbered)):
        desc = s.describe(name)
        descriptions.append(desc)
        for g, c, nums in found:
            recipes[g.canonical_hash] = (s, nums)
            meta = dict(g.meta)
            meta.update(
                structure=desc, cost=c.to_dict(), depth=depth, task=task_index,
                name=program.meta.get("name", "region"),
            )  # fmt: skip
            if large:  # a later process verifies it on the same reduced instance
                with contextlib.suppress(TypeError):  # a value JSON cannot keep: none kept
                    meta[RECIPE] = encode(s, nums)
            instances.append((c.seconds, rank, MuGraph(g.ops, g.outputs, meta), key))
            if not any(k.predefined for k in s.kernels) and (
                best_one is None or c.seconds < best_one
            ):
                best_one, best_blocks = c.seconds, c.blocks
    seconds["numbers"] = time.perf_counter() - t0

    # kernel cuts: when no µGraph of graph-defined kernels only was found, or the best is far
    # from the region's memory floor (outputs on dims no one grid axis splits: one block),
    # search the pieces
    floor_s = cost_model.memory_floor_s(program, device)
    stats["best_over_floor"] = None if best_one is None else round(best_one / floor_s, 2)
    stats["best_blocks"] = list(best_blocks)
    # with `Budget.reread` a norm + projection may close whole as a split whose combining
    # kernel takes the rms in one block; its pieces are searched too (`cost.STARVED`)
    starved = best_one is None or best_one > cost_model.STARVED * floor_s
    starved = starved or (budget.reread and 1 in best_blocks and takes_rms(problem))
    if starved and budget.cuts and budget.max_kernels >= 2:
        t0 = time.perf_counter()
        found, cut_stats = search_cuts(
            search, program, budget, seed, target, device, cut_deadline, workers, problem
        )
        for c, g, desc in found:
            descriptions.append(desc)
            instances.append((c, len(descriptions), g, "cut:" + g.canonical_hash))
        stats["cuts"] = cut_stats
        seconds["cuts"] = time.perf_counter() - t0
    instances.sort(key=lambda x: (x[0], x[1], x[2].canonical_hash))
    stats["instances"] = len(instances)

    # confirm: full-size verification of the best
    t0 = time.perf_counter()
    confirm_by = cut_deadline - 0.1 * budget.time_s if math.isfinite(budget.time_s) else math.inf
    with pool_for(workers) as raw:
        kept, failed, verdicts = confirm(problem, instances, budget, confirm_by, raw, recipes)
    seconds["verify_full"] = time.perf_counter() - t0
    stats["confirm_failed"] = failed
    seconds["total"] = time.perf_counter() - t_all
    stats["generated"] = counters.generated + stats.get("cuts", {}).get("generated", 0)
    for k in ("verified", "accepted", "rejected"):  # the pieces' work counts too
        stats[k] += stats.get("cuts", {}).get(k, 0)
    stats["nodes"] = counters.nodes
    stats["closed"] = counters.closed
    stats["pruned"] = dict(sorted(counters.pruned.items()))
    stats["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    stats["egraph"] = saturation
    stats["shrunk"] = problem.shrunk
    stats["small_sizes"] = {f"d{c}": s for c, s in problem.small.items()}
    stats["sizes"] = {f"d{c}": s for c, s in problem.sizes.items()}
    stats["budget"] = asdict(budget)
    stats["workers"] = workers
    if not kept and stop_reason == "exhausted":
        stop_reason = "no-candidates"
    message = _message(kept, stop_reason, descriptions)
    if not kept:
        stats["blockers"] = blocked
        if blocked:
            message += "; what the search does not handle yet here: " + "; ".join(blocked)
    from mirage_jax.log import logger

    logger.debug(
        "%s search: %s, %d µGraph(s) in %.1f s: %s", program.meta.get("name", "region"),
        stop_reason, len(kept), time.perf_counter() - t_all, message,
    )  # fmt: skip
    return SearchResult(
        tuple(kept), stop_reason, stats, tuple(dict.fromkeys(descriptions)), message,
        program.canonical_hash, {h: (budget.trials, seed, v) for h, v in verdicts.items()},
    )  # fmt: skip


@dataclass(frozen=True)
class _Dispatch:
    """A worker pool and this search's problem (sent with each task: the pool may be shared)."""

    pool: Any
    key: str
    blob: bytes

    def map(self, args: list[tuple]) -> list:
        run = functools.partial(run_keyed, self.key, self.blob)
        return list(self.pool.map(run, *zip(*args)))


class _Run:
    """The enumeration's state across phases: counters, statistics, accepted structures."""

    def __init__(self, budget: Budget, problem: Problem):
        self.budget = budget
        self.problem = problem  # run here where there is no pool (no process-wide state:
        # a function's regions are searched in several threads at once)
        self.counters = Counters()
        self.stats: dict[str, Any] = {
            "verified": 0, "accepted": 0, "rejected": 0, "invalid": 0, "duplicates": 0,
            "inherited": 0,
        }  # fmt: skip
        self.accepted: list[tuple[int, int, Structure, str]] = []  # (depth, class, structure, key)
        self.accepted_keys: set[tuple[int, str]] = set()
        self.known: dict[int, dict] = {}
        self.stop_reason = "exhausted"
        self.examined = 0
        self.enum_s = self.verify_s = 0.0
        self.saturation: dict = {}
        self.bar = None

    def deepen(self, tasks, max_depth: int, deadline: float, pool, past: int = 0) -> None:
        """Iterative deepening over `tasks`, depth-major; the depth policy is per task group.
        Up to `past` levels beyond `max_depth` are searched by the groups that found nothing
        (`beyond`)."""
        budget = self.budget
        found_at: dict[int, int] = {}
        best: dict[int, int] = {}  # group -> smallest kernel depth found
        streamed: set[int] = set()  # groups with a structure whose GEMMs stream K in a loop
        for t in tasks:
            self.known.setdefault(t.index, {})

        def extra(g: int) -> int:  # deeper while only loop-free GEMM kernels are known
            return budget.extra_depth if g in streamed else budget.loop_extra_depth

        for depth in range(2, max_depth + past + 1):
            alive = [
                t for t in tasks
                if (t.group not in best or depth <= best[t.group] + extra(t.group))
                and (t.cls not in found_at or depth <= found_at[t.cls] + extra(t.group))
                and (depth <= max_depth or t.group not in best)
            ]  # fmt: skip
            if not alive:
                break
            left = budget.max_candidates - self.examined
            args = [(t, depth, deadline, left, self.known[t.index]) for t in alive]
            if pool is not None:
                outcomes = pool.map(args)
            else:
                outcomes = []
                for a in args:
                    outcomes.append(run_task(*a, problem=self.problem))
                    if outcomes[-1].stopped:
                        break
            group = {t.index: t.group for t in alive}
            cls = {t.index: t.cls for t in alive}
            new = []  # (class, root candidate, order in its task, outcome index, structure, key)
            for o in sorted(outcomes, key=lambda o: o.index):
                _merge(self.counters, o.counters)
                for k in ("verified", "rejected", "invalid", "duplicates", "inherited"):
                    self.stats[k] += getattr(o, k)
                self.examined += o.verified + o.invalid
                self.enum_s += o.enumerate_s
                self.verify_s += o.verify_s
                self.saturation = o.saturation or self.saturation
                self.known[o.index].update(o.verdicts)
                for j, ((s, key), r) in enumerate(zip(o.accepted, o.roots)):
                    new.append((cls[o.index], r, j, o.index, s, key))
                if o.stopped and self.stop_reason == "exhausted":
                    self.stop_reason = o.stopped
                if o.stopped == "candidates":
                    break  # the tasks after it, run by a pool, would not run in one process
            # in the order one task per class finds them (class, first op, depth-first), each
            # key once (shards of a class may both close a graph another path also builds)
            for c, _, _, index, s, key in sorted(new, key=lambda a: a[:4]):
                if (c, key) in self.accepted_keys:
                    continue
                self.accepted_keys.add((c, key))
                self.accepted.append((depth, c, s, key))
                found_at.setdefault(c, depth)
                total = sum(len(k.ops) for k in s.kernels)  # a split-K pair counts both
                g = group[index]
                best[g] = min(best.get(g, total), total)
                if s.streams_gemms():
                    streamed.add(g)
            if self.bar is not None:
                self.bar.update(len(alive))
                self.bar.set_postfix(
                    depth=depth, generated=self.counters.generated,
                    pruned=sum(self.counters.pruned.values()), verified=self.stats["verified"],
                    accepted=len(self.accepted),
                )  # fmt: skip
            if self.stop_reason != "exhausted":
                break
            if self.examined >= budget.max_candidates:
                self.stop_reason = "candidates"
                break
            self.stats["depth"] = max(self.stats.get("depth", 0), depth)


ATTENTION_OPS = 8
"""The compute ops of a plain attention (QKᵀ, the mask's add, the shift's max and sub, exp,
the sum, the division, PV): its online-softmax kernel fits `Budget.max_block_ops`."""


def beyond(program: Program) -> int:
    """Levels past `Budget.max_block_ops` that an attention region with more score ops than a
    plain one is searched to, while nothing is found: the attention core is never cut, so its
    one-piece kernel is the only form. Gemma-2's soft cap (`50·tanh(s/50)`, then the mask) needs
    12 block ops."""
    kept = {i for i, _ in program.ops()}
    ops = [i for i in kept if program.nodes[i].op not in ("reshape", "broadcast_in_dim", "convert")]
    attention = any(program.nodes[i].op == "matmul" and reaches_exp(program, i, kept) for i in ops)
    return min(2, max(0, len(ops) - ATTENTION_OPS)) if attention else 0


def _merge(into: Counters, c: Counters) -> None:
    into.nodes += c.nodes
    into.generated += c.generated
    into.closed += c.closed
    for k, v in c.pruned.items():
        into.pruned[k] = into.pruned.get(k, 0) + v


WIDE_BLOCKS = 32768
"""Blocks per kernel a region's structures are numbered with where none of them has an
instance within the target's `max_blocks` (sdpa at Llama-7B size, batch 8: no tile fits in
shared memory at 4096 blocks); at most 65535 on a CUDA grid's y and z axes, a power of two
below. The cap stays where anything fits: raising it would change every region's numbers."""

MIN_NUMBERS = 64
"""Number choices each structure is instantiated with even past the search's deadline (the
largest grids come first)."""


def _instances(
    problem: Problem, s: Structure, target: Target, device, keep: int, deadline: float
) -> tuple[list, bool]:
    """`keep` cheap valid full-size instances of structure `s`, of different shapes, each as
    (µGraph, cost, numbers), and whether the deadline (`time.monotonic()`) cut its numbers short.

    The cost model is rough, so the instances returned differ in what it is least sure of:
    the best instance per (blocks, per-iteration tile bytes) class, powers of two apart. Past
    `deadline`, a structure with an instance stops after `MIN_NUMBERS` number choices: on two
    CPUs lora's 114 structures took 48 s to number in full under a 10 s budget.
    """
    best: dict[tuple, tuple] = {}
    contiguous = cost_model.stored_axes(problem.program)
    short = False
    # A kernel past the target's limits (shared memory, a batched block matmul) is so for
    # every choice that gives it the same tiles: its own grid and loop, and the grids of the
    # kernels before it (a split kernel's partials are an input's axis). Those choices are
    # skipped unbuilt: at Llama-7B size a structure had 9078 choices, all past the limits.
    past_limits: set[tuple] = set()
    tried = 0
    for nums in numbers_for(s, problem.sizes, max_blocks=target.max_blocks):
        keys = [(k, nums.grids[: k + 1], nums.loops[k]) for k in range(len(nums.grids))]
        if not past_limits.isdisjoint(keys):
            continue
        if tried >= MIN_NUMBERS and best and time.monotonic() > deadline:
            short = True
            break
        tried += 1
        try:
            g = instantiate(s, problem.program.input_avals, problem.sizes, nums)
            validate(g, target)
        except KernelLimitError as e:
            # which kernel it was, by its numbers (the µGraph's canonical order may differ)
            same = [
                k for k, (grid, loop) in enumerate(zip(nums.grids, nums.loops))
                if (tuple(n for n in grid if n > 1) or (1,)) == e.grid and loop == e.loop
            ]  # fmt: skip
            if len(same) == 1:
                past_limits.add(keys[same[0]])
            continue
        except MuGraphError:
            continue
        c = cost_model.estimate(g, device, contiguous)
        cls = (tuple(max(0, b).bit_length() for b in c.blocks), _loop_tile_class(g))
        cand = (c.seconds, g.canonical_hash, g, c, nums)
        if cls not in best or cand[:2] < best[cls][:2]:
            best[cls] = cand
    scored = sorted(best.values(), key=lambda x: (x[0], x[1]))
    return [(g, c, nums) for _, _, g, c, nums in scored[:keep]], short


def _loop_tile_class(g: MuGraph) -> tuple[int, ...]:
    """log2 of the bytes each block loads per loop iteration, per graph-defined kernel."""
    out = []
    for _, op in g.graph_defined():
        bg = op.block_graph
        info = block_info(bg)
        n = sum(
            math.prod(info.tiles[k]) * 2
            for k, b in enumerate(bg.inputs)
            if b.forloop_dim is not None
        )
        out.append(n.bit_length())
    return tuple(out)


def _message(kept, stop_reason: str, descriptions) -> str:
    if kept:
        head = f"{len(kept)} verified µGraph(s) from {len(set(descriptions))} structure(s)"
        return head + ("" if stop_reason == "exhausted" else f"; stopped early ({stop_reason})")
    if stop_reason == "no-candidates":
        return (
            "no µGraph found: the search space was exhausted without a verified candidate; "
            "run this region as XLA"
        )
    return f"no µGraph found before the {stop_reason} budget ran out; run this region as XLA"


def _progress_bar(progress: bool | None, total: int):
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    if not progress:
        return None
    # tqdm.auto: a widget in Jupyter, text on a terminal (as mirage_jax.jit's own bar)
    from mirage_jax.progress import progress_bar

    return progress_bar(
        total=total, desc="µGraph search", unit="task", file=sys.stderr, leave=False
    )
