"""The one executable semantics of µGraphs: a vectorised evaluator over the Algebra protocol.

A block graph runs on all blocks and loop iterations at once. A block tensor before its
accumulator is one value with batch dims (gx, gy, gz, F) followed by the tile dims; after it,
(gx, gy, gz) + tile. A dim is 1 where the value does not vary (a replicated input along a
grid axis, an input without a for-loop dim), and broadcasting does the rest, so a replicated
weight is never copied per block. Inputs become tiles by one reshape + transpose of the whole
tensor: along an imap'd dim, block b takes contiguous chunk b of dim/grid; along the loop dim,
iteration i takes chunk i of that (offset (b·F + i)·tile, as in the original's loader).
Outputs concatenate blocks along their omap dims by the inverse reshape + transpose.

Only Algebra methods are used, so `FloatAlgebra()` (jnp, dtype-faithful, jittable),
`FloatAlgebra(numpy, "float64")` (the reference) and `fields.FieldAlgebra` all evaluate the same
code; `fields.verify(mugraph, program)` compares a µGraph with a lax_ir Program directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mirage_jax.mugraph.ops import OPS, Ctx
from mirage_jax.mugraph.validate import GRID_RANK, BlockInfo, block_info

# `graph.py` builds on this module; its classes are named here for the annotations only.
BlockGraph = BlockInput = BlockOutput = MuGraph = Any


def load_input(alg: Any, x: Any, b: BlockInput, bg: BlockGraph, tile: tuple[int, ...]) -> Any:
    """The device tensor `x` as tiles: shape (gx|1, gy|1, gz|1, F|1) + tile."""
    sizes: list[int] = []
    labels: list[tuple[int, int]] = []  # (0, axis) grid, (1, 0) loop, (2, dim) tile
    for d in range(len(b.shape)):
        for a, m in enumerate(b.imap):
            if m == d:
                sizes.append(bg.grid[a])
                labels.append((0, a))
        if b.forloop_dim == d:
            sizes.append(bg.forloop_range)
            labels.append((1, 0))
        sizes.append(tile[d])
        labels.append((2, d))
    perm = tuple(sorted(range(len(labels)), key=lambda i: labels[i]))
    batch = [
        bg.grid[a] if a < len(b.imap) and b.imap[a] is not None else 1 for a in range(GRID_RANK)
    ]
    batch.append(bg.forloop_range if b.forloop_dim is not None else 1)
    if tuple(sizes) != tuple(b.shape):
        x = alg.reshape(x, tuple(sizes))
    if perm != tuple(range(len(perm))):
        x = alg.transpose(x, perm)
    return alg.reshape(x, (*batch, *tile))


def store_output(alg: Any, v: Any, full: tuple[int, ...], o: BlockOutput, bg: BlockGraph) -> Any:
    """Concatenate the per-block tiles of `v` (shape (gx, gy, gz) + tile) along the omap."""
    grid3 = (*bg.grid, *(1,) * (GRID_RANK - len(bg.grid)))
    tile = full[GRID_RANK:]
    target = (*grid3, *tile)
    if tuple(full) != target:
        v = alg.broadcast_in_dim(v, target, tuple(range(len(target))))
    omap = (*o.omap, *(None,) * (GRID_RANK - len(o.omap)))
    perm = [a for a in range(GRID_RANK) if omap[a] is None]
    shape = list(tile)
    for d in range(len(tile)):
        for a in range(GRID_RANK):
            if omap[a] == d:
                perm.append(a)
                shape[d] *= grid3[a]
        perm.append(GRID_RANK + d)
    if tuple(perm) != tuple(range(len(perm))):
        v = alg.transpose(v, tuple(perm))
    return alg.reshape(v, tuple(shape))


def run_block_graph(
    bg: BlockGraph, args: Sequence[Any], alg: Any, info: BlockInfo | None = None
) -> list[Any]:
    """Evaluate a block graph on its device-tensor arguments; returns its device outputs."""
    info = info or block_info(bg)
    vals: list[Any] = [
        load_input(alg, x, b, bg, info.tiles[k]) for k, (x, b) in enumerate(zip(args, bg.inputs))
    ]
    n_in = len(bg.inputs)
    for k, op in enumerate(bg.ops):
        t = n_in + k
        spec = OPS[op.op]
        ctx = Ctx(
            alg=alg,
            dtype=info.dtypes[t],
            nb=len(info.batch[op.args[0]]),
            arg_shapes=tuple(info.full(a) for a in op.args),
            out_shape=info.full(t),
            params=dict(op.params),
            forloop_range=bg.forloop_range,
            arg_dtypes=tuple(info.dtypes[a] for a in op.args),
        )
        vals.append(spec.apply(ctx, [vals[a] for a in op.args]))
    outs = [store_output(alg, vals[o.arg], info.full(o.arg), o, bg) for o in bg.outputs]
    return [alg.convert(v, o.dtype) if o.dtype else v for v, o in zip(outs, bg.outputs)]


def interpret(g: MuGraph, inputs: Sequence[Any], alg: Any) -> list[Any]:
    """Evaluate µGraph `g` on positional `inputs` over an Algebra; returns its outputs."""
    if len(inputs) != len(g.inputs):
        raise TypeError(f"{g!r} takes {len(g.inputs)} inputs, got {len(inputs)}")
    shapes = g.shapes
    env: dict[tuple[int, int], Any] = {}
    for pos, i in enumerate(g.inputs):
        env[(i, 0)] = inputs[pos]
    for i, op in enumerate(g.ops):
        if op.op == "input":
            continue
        args = [env[a] for a in op.args]
        if op.block_graph is not None:
            for j, v in enumerate(run_block_graph(op.block_graph, args, alg)):
                env[(i, j)] = v
            continue
        env[(i, 0)] = apply_kernel_op(alg, op, args, shapes, i)
    return [env[r] for r in g.outputs]


def apply_kernel_op(alg: Any, op: Any, args: Sequence[Any], shapes: Any, i: int) -> Any:
    """Pre-defined kernel op `i` of a µGraph (its `shapes`) on evaluated `args`: its meaning.

    `lower()` runs pre-defined kernel ops through this too (over jax.numpy), so the evaluator
    and the lowering are the same code.
    """
    shape, dtype = shapes[(i, 0)]
    ctx = Ctx(
        alg=alg,
        dtype=dtype,
        nb=0,
        arg_shapes=tuple(shapes[a][0] for a in op.args),
        out_shape=shape,
        params=dict(op.params),
        arg_dtypes=tuple(shapes[a][1] for a in op.args),
    )
    return OPS[op.op].apply(ctx, list(args))


def evaluate(g: MuGraph, *inputs: Any) -> list[Any]:
    """Run a µGraph with jax.numpy, dtype-faithful (jittable)."""
    from lax_ir import FloatAlgebra

    return interpret(g, inputs, FloatAlgebra())


def evaluate_reference(g: MuGraph, *inputs: Any) -> list[Any]:
    """Run a µGraph in float64 numpy."""
    import numpy as np

    from lax_ir import FloatAlgebra

    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    return interpret(g, xs, FloatAlgebra(np, "float64"))
