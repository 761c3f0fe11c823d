"""Horizontal fusion: independent graph-defined kernels of a µGraph run as one kernel.

A region with several outputs of different widths (a norm before the Q, K and V projections)
has no one-kernel µGraph in the search's space: a grid axis splits one logical dimension, and
Q's width is not K's. The cuts then give one kernel per output, each recomputing the shared
prologue. But every block of a kernel can compute a tile of each output at once: one grid axis
may split Q's width, K's and V's each into the same number of parts (the µGraph allows it: an
imap names a dimension per input). At decode sizes a kernel's fixed cost (launch, the first
loads' latency, the tail) is most of its time, so one kernel for all outputs is worth more
than the best tiling of each (H100, 2026-11-25: a norm + GEMM of 8 rows takes 4.8 µs at N=256
and 6.9 µs at N=2816; `experiments/results/skinny_sweep_2026-11-25.json`).

`fused_variants(g, ...)` takes a µGraph whose graph-defined kernels read only the µGraph's
inputs and whose grids have one rank, and returns fused µGraphs over the grid sizes and loop
ranges valid for every kernel at once (shared inputs read once, shared block ops merged by
the µGraph's canonical form), cheapest first by the cost model. Each keeps the structure its
kernels were verified with, only the numbers change, and the caller verifies them again.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mirage_jax.mugraph import (
    BlockGraph,
    BlockInput,
    BlockOp,
    BlockOutput,
    KernelOp,
    MuGraph,
    MuGraphError,
    block_info,
    validate,
)
from mirage_jax.search import cost as cost_model
from mirage_jax.search.schedule import LOOP_RANGES


def _split_sizes(bg: BlockGraph, shapes: list[tuple[int, ...]], axis: int) -> list[int]:
    """The sizes grid axis `axis` of `bg` splits: per input and output, the dim it names."""
    out = [b.shape[b.imap[axis]] for b in bg.inputs if b.imap[axis] is not None]
    out += [shapes[j][o.omap[axis]] for j, o in enumerate(bg.outputs) if o.omap[axis] is not None]
    return out


def _loop_sizes(bg: BlockGraph) -> list[int]:
    return [b.shape[b.forloop_dim] for b in bg.inputs if b.forloop_dim is not None]


def _choices(sizes: list[int], max_blocks: int) -> list[int]:
    """Counts g dividing every size with each size/g a power of two."""
    return [
        g
        for g in range(1, min([max_blocks, *sizes]) + 1)
        if all(s % g == 0 and (s // g) & (s // g - 1) == 0 for s in sizes)
    ]


def _fuse(
    g: MuGraph, kernels: list[int], axes: dict[int, list[int]], grid: tuple[int, ...], loop: int
) -> MuGraph:
    """One graph-defined kernel doing the work of `kernels` (indices into g.ops); fused grid
    axis f is axis `axes[i][f]` of kernel i (the kernel's other axes are dropped)."""
    inputs: list[BlockInput] = []
    args: list[tuple] = []
    seen: dict[tuple, int] = {}
    ops: list[tuple[str, tuple[int, ...], tuple]] = []  # args as ("in", k) / ("op", j)
    outputs: list[tuple[tuple, tuple]] = []
    where: dict[tuple[int, int], int] = {}  # (kernel op, output) -> fused kernel's output
    for i in kernels:
        op = g.ops[i]
        bg = op.block_graph
        ids: list[tuple] = []
        for a, b in zip(op.args, bg.inputs):
            b = BlockInput(b.shape, b.dtype, tuple(b.imap[x] for x in axes[i]), b.forloop_dim)
            key = (a, b)
            if key not in seen:
                seen[key] = len(inputs)
                inputs.append(b)
                args.append(a)
            ids.append(("in", seen[key]))
        for bop in bg.ops:
            ops.append((bop.op, tuple(ids[t] for t in bop.args), bop.params))
            ids.append(("op", len(ops) - 1))
        for j, o in enumerate(bg.outputs):
            where[(i, j)] = len(outputs)
            outputs.append((ids[o.arg], tuple(o.omap[x] for x in axes[i])))
    n_in = len(inputs)

    def tid(ref: tuple) -> int:
        return ref[1] if ref[0] == "in" else n_in + ref[1]

    fused = BlockGraph(
        grid,
        loop,
        tuple(inputs),
        tuple(BlockOp(name, tuple(tid(a) for a in a_), p) for name, a_, p in ops),
        tuple(BlockOutput(tid(t), omap) for t, omap in outputs),
    )
    # the fused kernel takes the place of the first; the others go
    first = kernels[0]
    new_ops: list[KernelOp] = []
    index: dict[int, int] = {}
    for i, op in enumerate(g.ops):
        if i in kernels[1:]:
            continue
        if i == first:
            op = KernelOp("graph_defined", tuple(args), (), fused)
        index[i] = len(new_ops)
        new_ops.append(op)
    fused_at = index[first]
    outs = []
    for r in g.outputs:
        if r[0] in kernels:
            outs.append((fused_at, where[r]))
        else:
            outs.append((index[r[0]], r[1]))
    return MuGraph.build(new_ops, outs, dict(g.meta))


def _axis_maps(g: MuGraph, ks: list[int]) -> dict[int, list[int]] | None:
    """Per kernel, its grid axis for each fused axis: first the axes that split an input all
    kernels share in the same way (the rows of a shared activation), then the one axis that
    splits only the kernel's own inputs (its output's width); None if a kernel has no such
    axis or several."""
    shared_args = set.intersection(*(set(g.ops[i].args) for i in ks))

    def sig(i: int, a: int) -> frozenset:
        op = g.ops[i]
        return frozenset(
            (r, b.imap[a]) for r, b in zip(op.args, op.block_graph.inputs)
            if r in shared_args and b.imap[a] is not None
        )  # fmt: skip

    sigs = {i: [sig(i, a) for a in range(len(g.ops[i].block_graph.grid))] for i in ks}
    common = set.intersection(*({x for x in sigs[i] if x} for i in ks))
    order = sorted(common, key=repr)
    maps: dict[int, list[int]] = {}
    for i in ks:
        own = [a for a, x in enumerate(sigs[i]) if not x]
        if len(own) != 1 or any(sigs[i].count(x) != 1 for x in order):
            return None
        maps[i] = [sigs[i].index(x) for x in order] + own
    return maps


def _sector_wide(g: MuGraph, device: cost_model.Device) -> bool:
    """Do all the kernel's split inputs have tile rows of at least a memory sector?"""
    for _, op in g.graph_defined():
        info = block_info(op.block_graph)
        for k, b in enumerate(op.block_graph.inputs):
            tile = info.tiles[k]
            row = tile[-1] * np.dtype(b.dtype).itemsize
            if tile[-1] < b.shape[-1] and row < device.line_bytes:
                return False
    return True


def fusible(g: MuGraph) -> list[int]:
    """The graph-defined kernels of `g`, if there are several and they read only inputs
    (else []): `MuGraph.independent_kernels`."""
    return list(g.independent_kernels())


def fused_variants(
    g: MuGraph, target, device: cost_model.Device = cost_model.H100, keep: int = 4
) -> list[tuple[float, MuGraph]]:
    """Fused µGraphs of `g` over the numbers valid for all its kernels, cheapest first."""
    ks = fusible(g)
    axes = _axis_maps(g, ks) if ks else None
    if not axes:
        return []
    shapes = g.shapes
    axis_choices = []
    for f in range(len(axes[ks[0]])):
        sizes: list[int] = []
        for i in ks:
            bg = g.ops[i].block_graph
            outs = [shapes[(i, j)][0] for j in range(len(bg.outputs))]
            sizes += _split_sizes(bg, outs, axes[i][f])
        axis_choices.append(_choices(sizes, target.max_blocks))
    loop_sizes = [s for i in ks for s in _loop_sizes(g.ops[i].block_graph)]
    loops = [f for f in LOOP_RANGES if all(s % f == 0 for s in loop_sizes)]
    if any(not _loop_sizes(g.ops[i].block_graph) for i in ks):
        loops = [1]  # a kernel without a loop cannot walk one
    found: dict[tuple, tuple] = {}  # (loop-free, sector-wide) -> (seconds, hash, µGraph, cost)
    for grid in itertools.product(*axis_choices):
        if math.prod(grid) > target.max_blocks:
            continue
        for f in loops:
            try:
                fused = _fuse(g, ks, axes, tuple(grid), f)
                validate(fused, target)
            except MuGraphError:
                continue
            c = cost_model.estimate(fused, device)
            cand = (c.seconds, fused.canonical_hash, fused, c)
            key = (f == 1, _sector_wide(fused, device))
            if key not in found or cand[:2] < found[key][:2]:
                found[key] = cand
    # the best of each kind: the model knows least the cost of the loop (on the H100 a
    # loop-free norm + GEMM of 8 rows beat its K-loop form 4.8 µs to 8.3) and of narrow tiles
    # against fewer blocks (the skinny sweep), so those kinds are all timed
    best = sorted({c[1]: c for c in found.values()}.values(), key=lambda x: x[:2])[:keep]
    return [
        (s, MuGraph(f.ops, f.outputs, {**dict(g.meta), "cost": c.to_dict()}))
        for s, _, f, c in sorted(best, key=lambda x: x[:2])
    ]
