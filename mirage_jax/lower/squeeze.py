"""A kernel's tiles without the leading dims every tile holds once.

A block graph's tensors keep the program's rank: sdpa's attention tile is [1, 1, 64, 128]
(batch and KV head each one per block, on the grid). Triton code over such 4-D tiles reshapes
to 2-D around every `tl.dot` and back, and its layouts for the 4-D reductions are not those of
the dots: on the H100 (2026-11-27) the sdpa b=8 kernel took 32.7 µs as generated at rank 4
and 26.8 µs as the same statements at rank 2. `squeezed` gives the plan whose tiles drop those
dims; the generator addresses memory with the full dims (`triton_access.tile_access`'s
`drop`), so the dropped dims still place the tile through the grid.
"""

from __future__ import annotations

import dataclasses

from mirage_jax.lower.plan import KernelPlan
from mirage_jax.mugraph.graph import BlockOp, make_params

DIM_PARAMS = ("reduce_sum", "reduce_max", "concat")
"""Block ops whose `dim` parameter names a tile dim."""


def squeezed(plan: KernelPlan) -> tuple[KernelPlan, int]:
    """(the plan with the leading dims every tile (padded and not) holds once dropped, how many
    were dropped); the plan itself and 0 where its tensors' ranks differ or none can go. A
    kernel with a matmul keeps two dims, any other one."""
    ranks = {len(p) for p in plan.pads} | {len(t) for t in plan.info.tiles}
    if len(ranks) != 1:
        return plan, 0
    (rank,) = ranks
    keep = 2 if plan.matmuls else 1
    drop = 0
    while (
        drop < rank - keep
        and all(p[drop] == 1 for p in plan.pads)
        and all(t[drop] == 1 for t in plan.info.tiles)
    ):
        drop += 1
    if not drop:
        return plan, 0
    ops = []
    for op in plan.bg.ops:
        if op.op in DIM_PARAMS:
            d = op.param("dim") % rank - drop
            if d < 0:
                return plan, 0  # along a dropped dim (a reduction of one element)
            op = BlockOp(op.op, op.args, make_params(**{**dict(op.params), "dim": d}))
        ops.append(op)
    bg = dataclasses.replace(plan.bg, ops=tuple(ops))
    info = dataclasses.replace(plan.info, tiles=tuple(t[drop:] for t in plan.info.tiles))
    pads = tuple(p[drop:] for p in plan.pads)
    return dataclasses.replace(plan, bg=bg, info=info, pads=pads), drop
