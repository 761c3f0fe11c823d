"""Interface steps a µGraph's kernels apply where they load an input, instead of XLA before them.

A region whose input is shifted or scaled by a constant (`lax_ir.layouts`: Gemma's `1 + scale`
norm gain; attention's 1/sqrt(d), moved from the scores onto the queries) is searched with the
changed value as its input, so the search spends no block op on it. Left to XLA, the step is a
kernel launch of its own on every call, and it keeps the kernel from reading a permuted input
in place; `with_load_steps` gives the µGraph that takes the input as stored and applies the
constant in each kernel that reads it: one `add_scalar` / `mul_scalar` block op after the block
input (rounded to the input's dtype, as XLA's is), or, for a pre-defined kernel op, one such
kernel-level op before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lax_ir.interface import Ops, merged
from mirage_jax.mugraph.graph import (
    BlockGraph,
    BlockOp,
    BlockOutput,
    KernelOp,
    MuGraph,
    make_params,
)

LOAD_STEPS = {"shift": "add_scalar", "scale": "mul_scalar"}
"""Interface steps a kernel can apply where it loads an input (x + c, x · c, in x's dtype), and
the op that applies each."""

Step = tuple[str, float]


def split_load_steps(ops: Ops) -> tuple[Ops, Ops]:
    """(the steps XLA applies, those the kernel applies on load, in order): the shifts and
    scales by a constant, which commute with the layout steps around them."""
    load = tuple(op for op in ops if op[0] in LOAD_STEPS)
    if not load:
        return ops, ()
    return merged(tuple(op for op in ops if op[0] not in LOAD_STEPS)), load


def _block_shifted(bg: BlockGraph, shifts: Mapping[int, Sequence[Step]]) -> BlockGraph:
    """`bg` with the steps `shifts[j]` applied to block input j before any op reads it."""
    n_in = len(bg.inputs)
    front: list[BlockOp] = []
    now: dict[int, int] = {}  # block input -> the tensor that holds it shifted
    for j in sorted(shifts):
        t = j
        for kind, c in shifts[j]:
            front.append(BlockOp(LOAD_STEPS[kind], (t,), make_params(scalar=float(c))))
            t = n_in + len(front) - 1
        now[j] = t
    m = len(front)

    def moved(t: int) -> int:
        return now.get(t, t) if t < n_in else t + m

    ops = [*front, *(BlockOp(o.op, tuple(moved(a) for a in o.args), o.params) for o in bg.ops)]
    outs = tuple(BlockOutput(moved(o.arg), o.omap) for o in bg.outputs)
    return BlockGraph(bg.grid, bg.forloop_range, bg.inputs, tuple(ops), outs)


def with_load_steps(g: MuGraph, steps: Mapping[int, Sequence[Step]]) -> MuGraph:
    """`g` taking input k without its load steps `steps[k]` (("shift", c), ("scale", c)) and
    applying them, in order, in the kernels that read it; the same function of the inputs
    without them."""
    if not steps:
        return g
    for k, st in steps.items():
        bad = [s for s, _ in st if s not in LOAD_STEPS]
        if bad:
            raise ValueError(f"input {k}: step {bad[0]!r} is not one a kernel applies on load")
    shift_of = {
        (i, 0): tuple((kind, float(c)) for kind, c in steps[op.param("index")])
        for i, op in enumerate(g.ops)
        if op.op == "input" and steps.get(op.param("index"))
    }
    new: list[KernelOp] = []
    where: dict[int, int] = {}  # old op index -> new op index
    shifted: dict[tuple, tuple] = {}  # old input ref -> the kernel-level shifted value's ref

    def ref(r: tuple) -> tuple:
        return (where[r[0]], r[1])

    readers = {a for op in g.ops if op.block_graph is None and op.op != "input" for a in op.args}
    for i, op in enumerate(g.ops):
        if op.block_graph is not None:
            bshift = {j: shift_of[a] for j, a in enumerate(op.args) if a in shift_of}
            bg = _block_shifted(op.block_graph, bshift) if bshift else op.block_graph
            new.append(KernelOp(op.op, tuple(ref(a) for a in op.args), op.params, bg))
        elif op.op == "input":
            new.append(op)
        else:
            args = tuple(shifted.get(a, ref(a)) for a in op.args)
            new.append(KernelOp(op.op, args, op.params, None))
        where[i] = len(new) - 1
        if (i, 0) in shift_of and (i, 0) in readers:
            r = ref((i, 0))
            for kind, c in shift_of[(i, 0)]:
                new.append(KernelOp(LOAD_STEPS[kind], (r,), make_params(scalar=c)))
                r = (len(new) - 1, 0)
            shifted[(i, 0)] = r
    out = MuGraph.build(new, tuple(ref(r) for r in g.outputs), g.meta)
    out.shapes  # noqa: B018  (raises MuGraphError where a shape rule breaks)
    return out
