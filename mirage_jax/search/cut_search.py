"""The pieces of a region searched on their own and stitched into one µGraph (`cuts`), and the
stitched kernels fused into one where they are independent (`hfuse`).

The driver calls `search_cuts` when the region's one-piece µGraphs are starved (far from its
memory floor) or missing; each piece is searched by the driver's own `search`, without cuts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from lax_ir.program import Program
from mirage_jax.mugraph import ONE_LAUNCH, MuGraph, MuGraphError
from mirage_jax.search import cost as cost_model
from mirage_jax.search import cuts as cut_mod
from mirage_jax.search import hfuse
from mirage_jax.search.confirm import verify_full
from mirage_jax.search.workers import pool_for


def search_cuts(
    search,
    program: Program,
    budget,
    seed: int,
    target,
    device,
    deadline: float,
    workers: int,
    problem: Any,
):
    """µGraphs stitched from the best µGraph of each piece (each found by `search`, the
    driver's own, with the region's `workers`: its pool), smallest cut sets first; with their
    horizontally fused variants. The stitches are verified at full size with each trial a job
    in that pool (`confirm.verify_full` against the region's `problem`)."""
    with pool_for(workers) as raw:

        def verify(graphs: list[MuGraph]) -> list:
            return verify_full(raw, problem, list(graphs), budget.trials)

        return _search_cuts(
            search, program, budget, seed, target, device, deadline, workers, verify
        )


def _search_cuts(search, program, budget, seed, target, device, deadline, workers, verify):
    """`search_cuts` with the pool's `verify`."""
    memo: dict[str, Any] = {}  # piece hash -> its SearchResult
    found = []
    stats: dict[str, Any] = {"sets_tried": 0, "pieces_searched": 0, "stitched": 0, "failed": 0}
    per_output = False  # has the empty cut set (one kernel per output) been stitched?
    for cs in cut_mod.cut_sets(program, budget.max_kernels - 1):
        if time.monotonic() > deadline:
            stats["stopped"] = "time"
            break
        stats["sets_tried"] += 1
        parts, loop_free, split, own = {}, {}, {}, {}
        pieces = [
            (out, *cut_mod.piece(program, out, cs)) for out in [*sorted(cs), *program.outputs]
        ]
        todo = {sub.canonical_hash: sub for _, sub, _ in pieces if sub.canonical_hash not in memo}
        if todo:
            left = max(1.0, deadline - time.monotonic())
            sub_budget = dataclasses.replace(
                budget, time_s=min(left, budget.time_s / 4), cuts=False, confirm=1,
                results=4 if budget.reread else 2,
                max_kernels=max(1, budget.max_kernels - len(cs)),
            )  # fmt: skip
            got = _search_pieces(
                search, list(todo.values()), sub_budget, seed, workers, target, device
            )
            for key, r in zip(todo, got):
                memo[key] = r
                stats["pieces_searched"] += 1
                for k in ("verified", "accepted", "rejected", "generated"):
                    stats[k] = stats.get(k, 0) + int(r.stats.get(k, 0) or 0)
        for out, sub, sources in pieces:
            r = memo[sub.canonical_hash]
            if not r:
                break
            parts[out] = (r.best, sources)
            loop_free[out] = (next((m for m in r.mugraphs if _loop_free(m)), r.best), sources)
            split[out] = (next((m for m in r.mugraphs if _split_pair(m)), r.best), sources)
            own[out] = (next((m for m in r.mugraphs if _own_kernels(m)), r.best), sources)
        else:
            at = f"cut at %{','.join(map(str, cs))}"
            if per_output:  # one kernel per output worked: this cut is its one rival, stitched
                # from the pieces' own kernels (a pre-defined GEMM piece shares no launch)
                head = f"{at}, own kernels: "
                got = _launches(program, cs, own, head, verify, target, device, stats)
                if got is None:
                    continue
                found += got
                break
            head = f"{at}: " if cs else "one kernel per output: "
            got = _launches(program, cs, parts, head, verify, target, device, stats)
            if got is None:
                continue
            found += got
            found += _loop_free_launch(program, cs, parts, loop_free, verify, device, stats)
            if budget.reread:
                found += _split_levels(program, cs, parts, split, verify, device, stats)
            if cs:
                break  # the first working cut set (smallest, nearest the inputs) is kept
            # One kernel per output recomputes the shared prologue in every block; the first
            # working cut after it materialises the prologue once (a norm's rounded row, read
            # by plain GEMVs), stitched from the pieces' own kernels only: the two compete in
            # `select` where the region is large enough to pay the cut's search
            # (`RIVAL_CUT_MIN_BYTES`).
            per_output = _input_bytes(program) >= RIVAL_CUT_MIN_BYTES or _starved(
                min(c for c, _, _ in found), program, device
            )
            if not per_output:
                break
    return found, stats


RIVAL_CUT_MIN_BYTES = 32 << 20
"""A region whose one-kernel-per-output stitch works also gets its first cut, as a rival,
only where its inputs take at least this many bytes: there the cut's extra launch (the norm's
kernel, about 1.5 µs) is small beside the GEMVs, and its search (4-5 s a region on 2 CPUs)
buys something. On the H200 (2026-11-29, `never_slower_h200_2026-11-29_s34*`) equinox's 7B
norm + gate/up ran 49.3-49.7 µs cut against 51.0-52.8 without, its norm + Q/K/V 16.4-16.5
against 17.1-17.2; the realistic blocks' regions (3-12 MB) are below it."""


def _starved(seconds: float, program: Program, device) -> bool:
    """Is a stitch estimated at `seconds` starved (`cost.STARVED` times the region's memory
    floor)? One kernel per output that recomputes a prefill's norm in every block, with K whole
    in its tiles (equinox's LayerNorm + Q/K/V over 256 rows: 94.9 µs estimated, 50.5 on the
    H200, XLA 19.0), is; the cut that materialises the norm once lets the GEMMs loop over K."""
    return seconds > cost_model.STARVED * cost_model.memory_floor_s(program, device)


def _input_bytes(program: Program) -> int:
    """The bytes of a region's inputs (its weights, at decode)."""
    return sum(cost_model.nbytes(shape, dtype) for shape, dtype in program.input_avals)


PIECES_AT_ONCE = 4
"""Pieces of one cut set searched at once (threads) where the search has a worker pool: each
piece's enumeration and verification are pool jobs, too few to keep 12 workers busy (a 7B
norm + projection's pieces took 1-5 s each, one after another)."""


def _search_pieces(search, subs: list, budget, seed: int, workers: int, target, device) -> list:
    """The pieces' `SearchResult`s (`search`, the driver's, with the region's `workers`),
    several at once in threads where there is a pool (`PIECES_AT_ONCE`), else in turn."""

    def one(sub):
        return search(
            sub, budget=budget, seed=seed, workers=workers, progress=False, target=target,
            device=device,
        )  # fmt: skip

    if workers <= 1 or len(subs) < 2:
        return [one(sub) for sub in subs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(subs), PIECES_AT_ONCE), "mirage_jax-piece") as ex:
        return list(ex.map(one, subs))


def _split_pair(g: MuGraph) -> bool:
    """Is `g` a split-K kernel and its combining kernel (two graph-defined kernels, the second
    reading the first)?"""
    ks = g.graph_defined()
    return len(ks) == 2 and any(a[0] == ks[0][0] for a in ks[1][1].args)


def _split_levels(program, cs, parts, split, verify, device, stats) -> list:
    """With `Budget.reread`: the pieces' best split-K µGraphs stitched (a piece without one
    keeps its best), launched one dependency level at a time (`MuGraph.launch_levels`: the
    split kernels as one launch, their combining kernels as another), where that differs from
    the stitch of their best ones."""
    if all(split[o][0] is parts[o][0] for o in parts):
        return []
    got = _stitched(program, cs, split, verify, stats)
    if got is None:
        return []
    g, v = got
    stats["stitched"] += 1
    desc = "one launch per level, split: " + _structures(program, cs, split)
    if all(len(lv) < 2 for lv in g.dependency_levels()):
        return []
    return [_one_launch(g, _stitched_meta(program, cs, v), desc, device)]


def _own_kernels(g: MuGraph) -> bool:
    """Is every kernel of `g` graph-defined (no pre-defined GEMM, which no launch can share)?"""
    return all(op.op == "input" or op.block_graph is not None for op in g.ops)


def _launches(program, cs, parts, head: str, verify, target, device, stats) -> list | None:
    """The pieces' µGraphs (`parts`) stitched and verified (`_stitched`), described as `head`
    and their structures, with its one-launch and fused variants (`_fused`); None where the
    stitch fails."""
    got = _stitched(program, cs, parts, verify, stats)
    if got is None:
        return None
    g, v = got
    stats["stitched"] += 1
    c = cost_model.estimate(g, device)
    desc = head + _structures(program, cs, parts)
    meta = {"structure": desc, "cost": c.to_dict(), **_stitched_meta(program, cs, v)}
    return [
        (c.seconds, MuGraph(g.ops, g.outputs, meta), desc),
        *_fused(g, meta, desc, verify, target, device, stats),
    ]


def _loop_free(g: MuGraph) -> bool:
    """Is every graph-defined kernel of `g` loop-free (its K whole in one tile)?"""
    return all(op.block_graph.forloop_range == 1 for _, op in g.graph_defined())


def _loop_free_launch(program, cs, parts, loop_free, verify, device, stats) -> list:
    """The pieces' best loop-free µGraphs stitched and launched as one, where that differs from
    the stitch of their best ones and its kernels are independent: the cost model rates the
    K loop of a skinny GEMM too well (H100, 8 rows, a norm + GEMM: loop-free tiles of 16
    columns 6.3 µs for N=1536, the model's loop form 8.4), so this tiling is timed too."""
    if all(loop_free[o][0] is parts[o][0] for o in parts):
        return []
    got = _stitched(program, cs, loop_free, verify, stats, want=hfuse.fusible)
    if got is None:
        return []
    g, v = got
    desc = "one launch for all outputs, loop-free: " + _structures(program, cs, loop_free)
    return [_one_launch(g, _stitched_meta(program, cs, v), desc, device)]


def _stitched(program, cs, parts, verify, stats, want=None) -> tuple[MuGraph, Any] | None:
    """The pieces' µGraphs (`parts`) stitched into one and verified against the region at full
    size, with the verdict; None (counted as failed) where the stitch is invalid or not equal,
    or (not counted) where `want` refuses it before its verification. `verify`: graphs ->
    their verdicts (`search_cuts`'s, in the search's pool)."""
    g = cut_mod.stitch(program, cs, parts)
    try:
        g.shapes  # noqa: B018 (validate: a piece may keep a cut value wider than the next reads)
    except MuGraphError:
        stats["failed"] += 1
        return None
    if want is not None and not want(g):
        return None
    (v,) = verify([g])
    if not v:
        stats["failed"] += 1
        return None
    return g, v


def _structures(program: Program, cs, parts) -> str:
    """The pieces' structures, in stitching order, for a stitched µGraph's description."""
    return " | ".join(
        parts[o][0].meta.get("structure", "?") for o in [*sorted(cs), *program.outputs]
    )


def _stitched_meta(program: Program, cs, v) -> dict:
    """The meta of a stitched µGraph verified at full size (`v`), less structure and cost."""
    return {
        "name": program.meta.get("name", "region"), "cuts": list(cs), "verified": "full",
        "bound": v.bound, "trials": v.trials,
    }  # fmt: skip


def _one_launch(g: MuGraph, meta: dict, desc: str, device) -> tuple[float, MuGraph, str]:
    """(cost, µGraph, description) of `g`'s independent kernels as one launch (`ONE_LAUNCH`):
    the same kernels, so the same verdict (`meta`'s)."""
    one = MuGraph(g.ops, g.outputs, {**meta, ONE_LAUNCH: True})
    c = cost_model.estimate(one, device)
    return (
        c.seconds,
        MuGraph(g.ops, g.outputs, {**one.meta, "structure": desc, "cost": c.to_dict()}),
        desc,
    )


FUSED_KEPT = 4
"""Horizontally fused variants of a stitched µGraph verified and kept (`hfuse`)."""


def _fused(g: MuGraph, meta: dict, desc: str, verify, target, device, stats: dict) -> list:
    """The stitched µGraph's kernels as one launch (`ONE_LAUNCH`: the same kernels, so the same
    verdict) and fused into one (`hfuse.fused_variants`), those verified against the region at
    full size all at once (`verify`); (cost, µGraph, description) for those that pass."""
    out = []
    if hfuse.fusible(g):  # the same kernels, each with its own tiling, as one launch
        d = "one launch for all outputs: " + desc.split(": ", 1)[-1]
        out.append(_one_launch(g, meta, d, device))
    elif any(len(level) > 1 for level in g.dependency_levels()):  # a cut's prologue first
        out.append(_one_launch(g, meta, "one launch per level: " + desc, device))
    fused = hfuse.fused_variants(g, target, device, keep=FUSED_KEPT)
    verdicts = verify([f for _, f in fused]) if fused else []
    for (cost_s, f), v in zip(fused, verdicts):
        if not v:
            stats["fused_failed"] = stats.get("fused_failed", 0) + 1
            continue
        d = "one kernel for all outputs: " + desc.split(": ", 1)[-1]
        m = {**meta, "structure": d, "cost": f.meta.get("cost"), "bound": v.bound,
             "trials": v.trials}  # fmt: skip
        out.append((cost_s, MuGraph(f.ops, f.outputs, m), d))
    stats["fused"] = stats.get("fused", 0) + len(out)
    return out
