"""Kernel-level plans with cuts: materialise some intermediate tensors, search each piece.

When no one- or two-kernel µGraph is found within the block-op depth (qknorm: both norms
and the attention in one block graph need 14 block ops), the region is cut at intermediate
nodes: each cut node becomes a kernel output (the piece of the region that computes it from
the region inputs and earlier cuts) and an input of the rest. Each piece is searched on its
own (the same search, without further cuts), and the best µGraph of every piece is stitched
into one µGraph, which is verified against the whole region at full size.

Cut candidates are the tensors a matmul reads that the region computes (its prologues: a
normalised query or key, attention probabilities), smallest sets first, nodes nearest the
inputs first. Before them, a region with several outputs tries the empty cut set: one kernel
per output, each recomputing the prologue the outputs share (a norm before Q, K and V
projections of different widths, which one grid cannot tile).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from lax_ir.program import Node, Program, make_params
from mirage_jax.mugraph import MuGraph, MuGraphBuilder
from mirage_jax.mugraph.validate import narrower_float

PASS = ("convert", "broadcast_in_dim", "reshape")


def computed_matmul_args(program: Program) -> list[tuple[int, int]]:
    """(arg, source) for each matmul argument the region computes: the node the matmul reads,
    and the node behind the converts and broadcasts between them (`PASS`)."""
    nodes = program.nodes
    out: list[tuple[int, int]] = []
    for _, n in program.ops():
        if n.op != "matmul":
            continue
        for a in n.args:
            b = a
            while nodes[b].op in PASS:
                b = nodes[b].args[0]
            if nodes[b].op not in ("input", "constant"):
                out.append((a, b))
    return out


def cut_candidates(program: Program) -> list[int]:
    """Computed nodes a matmul reads (through converts and broadcasts), nearest inputs first;
    where a convert narrows the value on the way (a float32 norm rounded to float16 for its
    projection), the convert: the piece then stores what the matmul reads, in half the bytes,
    and the matmul's piece reads the dtype its kernel expects."""
    return sorted(
        {_narrowest(program, arg, source) for arg, source in computed_matmul_args(program)}
    )


def _narrowest(program: Program, arg: int, source: int) -> int:
    """The narrowing convert nearest the matmul between `arg` and `source`, else `source`."""
    nodes = program.nodes
    b = arg
    while b != source:
        n = nodes[b]
        if (
            n.op == "convert"
            and np.dtype(n.dtype).itemsize < np.dtype(nodes[n.args[0]].dtype).itemsize
        ):
            return b
        b = n.args[0]
    return source


def cut_sets(program: Program, max_cuts: int) -> list[tuple[int, ...]]:
    cands = cut_candidates(program)
    # No cut: one kernel per output, each recomputing what the outputs share (a norm before
    # projections of different widths, which no one grid tiles).
    sets: list[tuple[int, ...]] = [()] if 1 < len(program.outputs) <= max_cuts + 1 else []
    for k in range(1, max_cuts + 1):
        sets.extend(itertools.combinations(cands, k))
    return sets


def piece(program: Program, output: int, cuts: Sequence[int]) -> tuple[Program, list[int]]:
    """The part of `program` computing node `output` from region inputs and `cuts`.

    Returns the piece as a Program and, per piece input, the node it stands for.
    """
    nodes = program.nodes
    stop = set(program.inputs) | (set(cuts) - {output})
    keep: set[int] = set()
    stack = [output]
    while stack:
        i = stack.pop()
        if i in keep:
            continue
        keep.add(i)
        if i not in stop:
            stack.extend(nodes[i].args)
    order = sorted(keep)
    sources = [i for i in order if i in stop]
    index = {old: new for new, old in enumerate(order)}
    new_nodes = []
    for i in order:
        n = nodes[i]
        if i in stop:
            new_nodes.append(
                Node("input", (), n.shape, n.dtype, make_params(index=sources.index(i)))
            )
        else:
            new_nodes.append(
                Node(n.op, tuple(index[a] for a in n.args), n.shape, n.dtype, n.params)
            )
    name = program.meta.get("name", "region")
    sub = Program.build(
        new_nodes, [index[i] for i in sources], [index[output]], {"name": f"{name}.piece%{output}"}
    )
    return sub, sources


def inline(
    kb: MuGraphBuilder, g: MuGraph, args: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Replay the kernel ops of `g` into builder `kb` with its inputs bound to `args`."""
    refs: dict[tuple[int, int], tuple[int, int]] = {}
    for pos, i in enumerate(g.inputs):
        refs[(i, 0)] = args[pos]
    for i, op in enumerate(g.ops):
        if op.op == "input":
            continue
        a = [refs[r] for r in op.args]
        if op.block_graph is not None:
            for j, r in enumerate(kb.graph_defined(a, op.block_graph)):
                refs[(i, j)] = r
        else:
            refs[(i, 0)] = kb.op(op.op, *a, **dict(op.params))
    return [refs[r] for r in g.outputs]


def stored_as(g: MuGraph, dtype: str) -> MuGraph:
    """`g` (a piece with one output) storing that output in `dtype` where its kernel computes
    it wider (a norm piece in float32 cut at the program's 16-bit convert: the next pieces
    read the rounded row, in half the bytes); `g` itself otherwise."""
    ((i, j),) = g.outputs
    op = g.ops[i]
    have = g.shapes[(i, j)][1]
    if op.block_graph is None or not narrower_float(dtype, have):
        return g
    bg = op.block_graph
    outputs = list(bg.outputs)
    outputs[j] = dataclasses.replace(outputs[j], dtype=dtype)
    new = dataclasses.replace(op, block_graph=dataclasses.replace(bg, outputs=tuple(outputs)))
    return MuGraph((*g.ops[:i], new, *g.ops[i + 1 :]), g.outputs, g.meta)


def stitch(
    program: Program, cuts: Sequence[int], parts: dict[int, tuple[MuGraph, list[int]]]
) -> MuGraph:
    """One µGraph from the pieces' µGraphs (`parts`: output node -> (µGraph, input nodes))."""
    kb = MuGraphBuilder()
    value: dict[int, tuple[int, int]] = {}
    for i in program.inputs:
        n = program.nodes[i]
        value[i] = kb.input(n.shape, n.dtype)
    for out in [*sorted(cuts), *program.outputs]:
        g, sources = parts[out]
        if out in cuts:
            g = stored_as(g, program.nodes[out].dtype)
        (value[out],) = inline(kb, g, [value[s] for s in sources])
    return kb.build([value[o] for o in program.outputs])
