"""Re-tiling the for-loop when a block graph's tiles do not fit in shared memory.

A µGraph fixes each block's tiles, but it leaves one freedom the lowering may take: walking a
contracted dim in more, smaller steps. `retile(bg, s)` splits each loop step into `s` (F → F·s
along the existing forloop dims), or, for a loop-free graph (F = 1), introduces a loop over the
K dim of matmuls whose operands are block inputs. The result is accepted only if it evaluates
equal to the original in float64 on random inputs (the µGraph semantics of
`mirage_jax.mugraph.run_block_graph`), so a graph whose ops do not sum over the split dim
(an rms_norm across it, say) is never re-tiled.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mirage_jax.mugraph import (
    BlockGraph,
    BlockGraphBuilder,
    MuGraphError,
    block_info,
    run_block_graph,
)
from mirage_jax.mugraph.ops import OPS

RTOL = 1e-9


def sink_accumulators(bg: BlockGraph) -> BlockGraph:
    """For F = 1, move ops whose arguments are all `accum_sum` outputs into the loop.

    With one iteration accum_sum is the identity, so op(accum_sum(a), accum_sum(b)) equals
    accum_sum(op(a, b)); after the move a loop over the matmul's K can be introduced.
    """
    if bg.forloop_range != 1:
        return bg
    n_in = len(bg.inputs)
    b = BlockGraphBuilder(bg.grid, 1)
    ids: dict[int, int] = {}  # old tensor -> new tensor (value after the loop)
    loop_of: dict[int, int] = {}  # old post tensor -> new loop tensor it accumulates
    for k, x in enumerate(bg.inputs):
        ids[k] = loop_of[k] = b.input(x.shape, x.dtype, x.imap, x.forloop_dim)
    for k, op in enumerate(bg.ops):
        t = n_in + k
        if op.op == "accum_sum" and op.args[0] in loop_of:
            loop_of[t] = loop_of[op.args[0]]
            ids[t] = b.op("accum_sum", loop_of[op.args[0]])
            continue
        sinkable = (
            op.op != "accum_sum"
            and OPS[op.op].kind != "accum"
            and all(
                a >= n_in and bg.ops[a - n_in].op == "accum_sum" and a in loop_of for a in op.args
            )
        )
        if sinkable:
            inner = b.op(op.op, *[loop_of[a] for a in op.args], **dict(op.params))
            loop_of[t] = inner
            ids[t] = b.op("accum_sum", inner)
        else:
            ids[t] = b.op(op.op, *[ids[a] for a in op.args], **dict(op.params))
    for o in bg.outputs:
        b.output(ids[o.arg], o.omap)
    new = b.build()
    live = _live(new)
    return new if live == new else live


def _live(bg: BlockGraph) -> BlockGraph:
    """`bg` without dead ops (the canonical form drops them; inputs keep their positions)."""
    return bg.canonical()[0]


def _candidate(bg: BlockGraph, factor: int) -> BlockGraph | None:
    bg = sink_accumulators(bg)
    info = block_info(bg)
    n_in = len(bg.inputs)
    loop_dims: dict[int, int] = {}
    if bg.forloop_range > 1:
        loop_dims = {k: b.forloop_dim for k, b in enumerate(bg.inputs) if b.forloop_dim is not None}
    else:
        for op in bg.ops:
            if op.op != "matmul" or any(a >= n_in for a in op.args):
                continue
            a, b = op.args
            ra, rb = len(bg.inputs[a].shape), len(bg.inputs[b].shape)
            for k, d in ((a, ra - 1), (b, rb - 2)):
                if loop_dims.get(k, d) != d:
                    return None
                loop_dims[k] = d
    if not loop_dims:
        return None
    for k, d in loop_dims.items():
        if info.tiles[k][d] % factor:
            return None
    inputs = tuple(
        dataclasses.replace(b, forloop_dim=loop_dims.get(k, b.forloop_dim))
        for k, b in enumerate(bg.inputs)
    )
    new = dataclasses.replace(bg, inputs=inputs, forloop_range=bg.forloop_range * factor)
    try:
        block_info(new)
    except MuGraphError:
        return None
    return new


def equal_semantics(a: BlockGraph, b: BlockGraph, seed: int = 0) -> bool:
    """Whether two block graphs over the same arguments agree in float64 on random inputs."""
    from lax_ir import FloatAlgebra

    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(x.shape) * 0.5 for x in a.inputs]
    alg = FloatAlgebra(np, "float64")
    ya = run_block_graph(a, xs, alg)
    yb = run_block_graph(b, xs, alg)
    for u, v in zip(ya, yb):
        u, v = np.asarray(u), np.asarray(v)
        if u.shape != v.shape or not np.isfinite(u).all():
            return False
        if np.linalg.norm(u - v) > RTOL * max(np.linalg.norm(u), 1e-300):
            return False
    return True


def retile(bg: BlockGraph, factor: int) -> BlockGraph | None:
    """`bg` with each loop step split in `factor` (see the module doc), or None if invalid."""
    new = _candidate(bg, factor)
    if new is None or not equal_semantics(bg, new):
        return None
    return new
