"""The orders of a search's µGraphs: the order it returns them in, and the ones `select` times.

`return_order`: the search's (cost order, other kernel-level plans and distinct kernels
promoted); `timing_order`: the first of every structure, `top` in all. The search verifies at
full size the ones `select` will time, so `select` finds their verdicts in the memo.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mirage_jax.mugraph import ONE_LAUNCH, MuGraph


def timing_order(mugraphs: Sequence[MuGraph], top: int | None) -> list[tuple[int, MuGraph]]:
    """The µGraphs to lower and time, with their ranks: the cost model's best of each structure
    first (in the model's order), then the second best of each, and so on, `top` in all (None:
    all), and beside them the best one-launch form of each structure that has one.

    The model ranks tilings of one structure well and different structures less so (on the
    H100, 2026-11-24, a split-KV decode attention it placed fifth ran 3.9 µs against 10.0 for
    its first pick and 7.0 for XLA), so a few timings should see each structure once.
    """
    # round robin over structures: every structure's n-th tiling before any (n+1)-th (on the
    # H100, 2026-11-26, equinox's down projection kept XLA, 4.82 µs against 6.43 for the best
    # µGraph timed, once two new structures took the places of the loop-free tilings that had
    # won it at 4.03 µs in an earlier run)
    nth: dict[Any, int] = {}
    rounds: list[tuple[int, int]] = []
    for k, g in enumerate(mugraphs):
        key = structure_key(g.meta.get("structure", k))
        nth[key] = nth.get(key, -1) + 1
        rounds.append((nth[key], k))
    order = [k for _, k in sorted(rounds)]
    first = [k for n, k in rounds if n == 0]
    if top is not None:  # timed: none the model puts far behind its best (a one-block GEMV)
        costs = [(mugraphs[k].meta.get("cost") or {}).get("us") for k in order]
        best = min((c for c in costs if c is not None), default=None)
        order = [k for k, c in zip(order, costs) if c is None or c <= FAR_BEHIND * best]
        # one launch of kernels another µGraph has (`ONE_LAUNCH`): the first of each
        # such structure is timed beside the `top`, not in place of one of them
        one = {k for k in order if mugraphs[k].meta.get(ONE_LAUNCH)}
        counted = [k for k in order if k not in one][:top]
        order = [k for k in order if k in counted or (k in one and k in first)]
    return [(k, mugraphs[k]) for k in order]


def structure_key(structure: Any) -> Any:
    """A structure's description with each kernel's block ops as a sorted multiset: structures
    that differ only in the order of their epilogue ops ("div silu div mul" against "div div
    silu mul": on the H100, 2026-11-26, two of nnx's six timing places) are one for the round
    robin, so its places go to structures whose kernels differ."""
    if not isinstance(structure, str):
        return structure
    return _KERNEL_OPS.sub(lambda m: ": " + " ".join(sorted(m.group(1).split())) + "]", structure)


_KERNEL_OPS = re.compile(r": ((?:[a-z_0-9]+ ?)+)\]")
"""The block ops of one kernel in a structure's description: `[grid[…] loop[…]: op op …]`."""

TIME_TOP = 6
"""How many µGraphs of a region `select` times by default (and the search confirms at full
size): the first two rounds of three structures, or one of each of six."""

FAR_BEHIND = 8.0
"""`timing_order` times no µGraph estimated slower than this multiple of the best estimate:
the model errs by less than that in this direction (its misses are kernels it thinks fast)."""


def signature(g: MuGraph) -> tuple:
    """What a lowering sees of a µGraph: per kernel its grid, loop range and op names, and
    which kernels are launched as one."""
    kernels = tuple(
        (
            op.block_graph.grid,
            op.block_graph.forloop_range,
            tuple(sorted(b.op for b in op.block_graph.ops)),
        )
        if op.block_graph is not None
        else op.op
        for op in g.ops
        if op.op != "input"
    )
    return (g.launch_groups(), *kernels)


def plan(g: MuGraph) -> tuple[str, ...]:
    """The kernel-level plan of a µGraph: its pre-defined kernel ops (none: all fused)."""
    return tuple(op.op for op in g.ops if op.op != "input" and op.block_graph is None)


PLANS = 2  # other kernel-level plans promoted behind the best µGraph


def return_order(graphs: list[tuple[int, MuGraph]]) -> list[int]:
    """The return order of cost-ordered (index, µGraph) pairs, as indices.

    Cost order, except that (1) behind the best come the best µGraphs of up to `PLANS` other
    kernel-level plans (`plan`: e.g. a pre-defined GEMM then a fused epilogue, against one
    fused kernel), whose relative cost the model knows least; (2) a µGraph whose kernels a
    lowering would see as the same as an earlier one's (same grids, loop ranges, ops) waits
    until every distinct one is listed. The first few, which `select` times, then differ.
    """
    seen: set[tuple] = set()
    first, later = [], []
    for i, g in graphs:
        sig = signature(g)
        (later if sig in seen else first).append((i, g))
        seen.add(sig)
    ordered = first + later
    head = ordered[:1]
    plans = {plan(g) for _, g in head}
    for i, g in ordered[1:]:
        if len(head) > PLANS:
            break
        if plan(g) not in plans:
            head.append((i, g))
            plans.add(plan(g))
    promoted = {i for i, _ in head}
    return [i for i, _ in head] + [i for i, _ in ordered if i not in promoted]
