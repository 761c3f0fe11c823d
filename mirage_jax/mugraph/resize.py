"""The same µGraph at other input shapes: grids, loops, maps and ops kept, tiles re-inferred.

A µGraph's structure (ops, grid, forloop_range, imaps, forloop dims, omaps) does not name its
sizes except through its input shapes, so `with_input_shapes` gives the same structure at new
shapes, or a `MuGraphError` naming the rule the new shapes break (an uneven split, a shape
rule). Used to verify a small instance of an expensive µGraph (the verifier's cost grows with
the number of elements, its correctness class does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mirage_jax.mugraph.graph import BlockInput, KernelOp, MuGraph, make_params
from mirage_jax.mugraph.validate import kernel_shapes


def with_input_shapes(g: MuGraph, shapes: Sequence[Sequence[int]]) -> MuGraph:
    """`g` with input i of shape `shapes[i]`; every block input follows its argument."""
    if len(shapes) != len(g.inputs):
        raise ValueError(f"{g!r} has {len(g.inputs)} inputs, got {len(shapes)} shapes")
    new: list[KernelOp] = []
    for op in g.ops:
        if op.op == "input":
            shape = tuple(int(s) for s in shapes[op.param("index")])
            params = make_params(**{**dict(op.params), "shape": shape})
            new.append(KernelOp("input", (), params))
        elif op.block_graph is not None:
            known = kernel_shapes(MuGraph(tuple(new), ()))
            bg = op.block_graph
            inputs = tuple(
                BlockInput(known[a][0], b.dtype, b.imap, b.forloop_dim)
                for a, b in zip(op.args, bg.inputs)
            )
            new.append(
                KernelOp(
                    op.op,
                    op.args,
                    op.params,
                    type(bg)(bg.grid, bg.forloop_range, inputs, bg.ops, bg.outputs),
                )
            )
        else:
            new.append(op)
    out = MuGraph.build(new, g.outputs, g.meta)
    out.shapes  # noqa: B018  (raises MuGraphError where the new shapes break a rule)
    return out


def with_numbers(g: MuGraph, numbers: Mapping[int, tuple[Sequence[int], int]]) -> MuGraph:
    """`g` with graph-defined kernel op i run over grid `numbers[i][0]` with a for-loop of
    `numbers[i][1]` iterations (the other kernels' numbers as they are); maps and ops kept,
    tiles and the shapes kernels pass on (a split's partials) re-inferred. The structure is
    `g`'s; a `MuGraphError` names the rule the new numbers break (an uneven split)."""
    new: list[KernelOp] = []
    for i, op in enumerate(g.ops):
        bg = op.block_graph
        if bg is None:
            new.append(op)
            continue
        grid, loop = numbers.get(i, (bg.grid, bg.forloop_range))
        grid = tuple(int(x) for x in grid)
        if len(grid) != len(bg.grid):
            raise ValueError(f"kernel op {i}: grid {grid} for a grid of {len(bg.grid)} axes")
        known = kernel_shapes(MuGraph(tuple(new), ()))  # an earlier kernel's outputs may change
        inputs = tuple(
            BlockInput(known[a][0], b.dtype, b.imap, b.forloop_dim)
            for a, b in zip(op.args, bg.inputs)
        )
        blocks = type(bg)(grid, int(loop), inputs, bg.ops, bg.outputs)
        new.append(KernelOp(op.op, op.args, op.params, blocks))
    out = MuGraph.build(new, g.outputs, g.meta)
    out.shapes  # noqa: B018  (raises MuGraphError where the numbers break a rule)
    return out
