"""A kernel's for-loop split over the grid: two launches instead of one (Triton backend).

A decode GEMM reads a weight of a few MB into a handful of rows. Its generated kernel splits
the weight's columns over the grid and walks the rows in its loop, so 16-88 blocks each wait
on 4-8 dependent steps; on the H100 (2026-11-26) each such kernel took about 5 µs however
little it read. With `TritonConfig.loop_split` = S the same plan runs as

1. a *partial* launch of S times the blocks, each walking F/S of the loop's F steps and
   storing its raw fp32 accumulators (`part{j}`, one row per block and split);
2. a *finishing* launch over the plan's own grid that sums each accumulator's S partials,
   then finalises them, runs the post-loop ops and stores the outputs, as the one-launch
   kernel does after its loop.

The µGraph is unchanged (its verification holds); only the order of the fp32 sums differs.
A plan qualifies where every accumulator is a sum (`ADDITIVE`, or `accum_keep`, whose every
step holds the same value) and S divides F (`split_refusal`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.triton_rules import lane, lane_total, lanes

ADDITIVE = frozenset(
    {"accum_sum", "accum_sum_last", "accum_mean_last", "accum_rms_last", "accum_sum_todimx"}
)
"""Accumulators whose value after the loop is the sum of their values over parts of it."""

KEPT = frozenset({"accum_keep"})
"""Accumulators that hold one loop-invariant value: any part's is the whole loop's."""


@dataclass(frozen=True)
class LoopPart:
    """What `triton._body` emits for one launch of a split kernel.

    Arguments:
        mode: "partial" (its steps of the loop, then the raw accumulators stored) or "finish"
            (the partials summed, then the epilogue and the stores).
        splits: S, the parts the loop is split into.
        split: (partial) the expression of this block's part, 0..S-1.
        block: the expression of this block's flat index in the plan's own grid.
    """

    mode: str
    splits: int
    split: str
    block: str


def split_refusal(plan: KernelPlan, splits: int) -> str | None:
    """Why `plan`'s loop cannot be split into `splits` parts, or None where it can."""
    F = plan.forloop_range
    if splits < 2:
        return f"loop_split {splits}: nothing to split"
    if F < 2 or F % splits:
        return f"loop_split {splits} does not divide the loop's {F} steps"
    if plan.shifts:
        return "its accumulators rescale by a running max (not a plain sum)"
    for t in plan.accumulators:
        op = plan.op(t).op
        if op not in ADDITIVE and op not in KEPT:
            return f"accumulator {op} is not a sum"
    if not plan.accumulators:
        return "no accumulator to split"
    return None


def partial_shapes(plan: KernelPlan, splits: int) -> list[jax.ShapeDtypeStruct]:
    """The fp32 arrays of the partial launch: per accumulator, one padded tile per block and
    split (row `block * splits + split`)."""
    rows = math.prod(plan.grid) * splits
    return [jax.ShapeDtypeStruct((rows, *plan.pads[t]), np.float32) for t in plan.accumulators]


def flat_block(grid: Sequence[int], pids: Sequence[str]) -> str:
    """The expression of a block's flat (row-major) index from its grid position `pids`."""
    terms = []
    for a, pid in enumerate(pids):
        inner = math.prod(grid[a + 1 :])
        terms.append(f"{pid} * {inner}" if inner > 1 else pid)
    return " + ".join(terms) or "0"


def _offsets(pads: tuple[int, ...]) -> str:
    strides = [math.prod(pads[d + 1 :]) for d in range(len(pads))]
    return " + ".join(f"{lane(pads, d)} * {s}" for d, s in enumerate(strides)) or "0"


def store_partials(
    plan: KernelPlan, accs: Sequence[int], emit: Callable[[str], Any], p: str, part: LoopPart,
    ind: str, ctx_of: Callable[[int], Any],
) -> None:  # fmt: skip
    """Emit the partial launch's stores: each raw accumulator in its row of `part{j}`."""
    emit(f"{ind}# the raw accumulators of this part of the loop, for the finishing launch")
    row = f"({part.block}) * {part.splits} + {part.split}"
    for j, t in enumerate(accs):
        size = math.prod(plan.pads[t])
        raw = lane_total(ctx_of(t), f"{p}acc{t}")  # an accumulator kept in lanes: their sum
        emit(f"{ind}tl.store({p}part{j} + ({row}) * {size} + {_offsets(plan.pads[t])}, {raw})")


def sum_partials(
    plan: KernelPlan, accs: Sequence[int], emit: Callable[[str], Any], p: str, part: LoopPart,
    ind: str, ctx_of: Callable[[int], Any],
) -> None:  # fmt: skip
    """Emit the finishing launch's accumulators: the sum of their S partials (a kept value:
    the first part's)."""
    S = part.splits
    emit(f"{ind}# the accumulators: the sums of the {S} parts of the loop (partial launch)")
    for j, t in enumerate(accs):
        size = math.prod(plan.pads[t])
        at = f"{p}part{j} + (({part.block}) * {S} + {{s}}) * {size} + {_offsets(plan.pads[t])}"
        if plan.op(t).op in KEPT:
            emit(f"{ind}{p}acc{t} = tl.load({at.format(s=0)})  # {plan.op(t).op}: part 0's")
            continue
        if lanes(ctx_of(t)):  # the parts stored their lanes' sums: the op's own tile
            emit(f"{ind}{p}acc{t} = tl.zeros({tuple(plan.pads[t])!r}, dtype=tl.float32)")
        emit(f"{ind}for {p}s in tl.static_range({S}):")
        emit(f"{ind}    {p}acc{t} = {p}acc{t} + tl.load({at.format(s=p + 's')})")
