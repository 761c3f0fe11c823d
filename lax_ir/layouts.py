"""Layouts out of a region's Program: transposes and unit-dim reshapes move to its interface.

The µGraph has no transpose or reshape op, so a region that reads `k.T`, writes `(P V)ᵀ` or
inserts a unit axis into Q in its middle has no candidate. These rewrites keep the region's
meaning and move such layout ops to its edges, where `adapt` applies them in XLA:

- **input**: a transpose or reshape of an input becomes a new input (the region's input with
  that layout op applied before the call);
- **output**: an output that is a transpose or reshape of another value is that value, with
  the layout op applied after the call;
- **operand order**: `A @ B`, with A read from an input and B a computed value laid out as
  `swap(P)` (its last two axes exchanged, e.g. the einsum form `Vᵀ Pᵀ` of attention's PV),
  becomes `swap(P @ swap(A))` when it is an output: the computed operand comes first, the
  swaps go to the edges;
- **scale**: `(A @ B) * c`, c a scalar constant and A an input (attention's 1/sqrt(d) on Q), is
  `(c A) @ B` with the scaling done before the call (exact for a power of two; otherwise one
  rounding, inside any float tolerance), which saves the kernel one op;
- **unit axes**: a reshape that only inserts size-1 axes into an elementwise result is applied
  to the operands instead (right-aligned broadcasting keeps their meaning), until it reaches
  the inputs.
- **shift**: `x + c` (or `x − c`), x an input and c a scalar constant (Gemma's `1 + scale`
  norm gain), is a new input with the shift as an interface step; a kernel applies it where it
  loads x (`mirage_jax.regions.stored_views`), so the search spends no block op on it.
- **broadcasts**: a broadcast that only inserts unit axes is a reshape; a broadcast of an input
  (a mask's bias) is taken at its rank with unit axes and widened inside the region, and where
  a reshape after it regroups the widened axes among themselves (heads grouped for GQA), the
  reshape is taken first, on the small input;
- **regrouped rows**: an elementwise op on a reshape that splits or merges a computed value's
  axes (flax nnx's `LinearGeneral`: a projection's row split into heads) and on inputs of its
  shape (the heads' bias) runs on the value, the inputs reshaped at the interface and the
  reshape after; a transpose that moves only unit axes is a reshape;
- **transposed operand**: `W @ xᵀ`, W an input and x computed (equinox's `weight @ x` vmapped
  over rows), is `(x Wᵀ)ᵀ`; the result's transpose then moves past unit-inserting reshapes and
  elementwise ops (an input operand transposed back at the interface) to the outputs.

The rules for transposes are in `lax_ir.transpose_layouts`, those for rows merged before a
projection in `lax_ir.row_layouts`, the steps they share in `lax_ir.layout_graph`; this module
holds the others and runs them all (`hoist_layouts`). The interface they build is described in
`lax_ir.interface`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lax_ir import transpose_layouts as T
from lax_ir.layout_graph import (
    LayoutGraph,
    input_chain,
    is_bitcast,
    layout_step,
    op_before,
    unit_positions,
)
from lax_ir.ops import ELEMENTWISE
from lax_ir.program import Node, Program, make_params
from lax_ir.row_layouts import flatten_rows_rule, transposed_rows_rule

MAX_STEPS = 64


def _input_rule(g: LayoutGraph) -> bool:
    for j in g.live():
        n = g.nodes[j]
        if n.op in ("reshape", "transpose") and g.nodes[n.args[0]].op == "input":
            x = n.args[0]
            if x not in g.inputs or j in g.inputs:
                continue
            g.replace(j, g.new_input(n, x, layout_step(n)))
            return True
    return False


def _output_rule(g: LayoutGraph) -> bool:
    for k, o in enumerate(g.outputs):
        n = g.nodes[o]
        if n.op not in ("reshape", "transpose") or g.users(o) or g.outputs.count(o) > 1:
            continue
        g.outputs[k] = n.args[0]
        g.out_ops[k] = (layout_step(n), *g.out_ops[k])
        return True
    return False


def _unit_rule(g: LayoutGraph) -> bool:
    for j in g.live():
        n = g.nodes[j]
        if n.op != "reshape":
            continue
        y = n.args[0]
        yn = g.nodes[y]
        if yn.op not in ELEMENTWISE or len(g.users(y)) != 1 or y in g.outputs:
            continue
        pos = unit_positions(yn.shape, n.shape)
        if pos is None:
            if (
                tuple(yn.shape) != tuple(n.shape)
                and is_bitcast(yn.shape, n.shape)
                and all(
                    not g.nodes[a].shape
                    or (g.nodes[a].op == "input" and g.nodes[a].shape == yn.shape)
                    for a in yn.args
                )
            ):  # a bitcast of an elementwise value of inputs: the inputs take the layout
                args = tuple(
                    a
                    if not g.nodes[a].shape
                    else g.add(Node("reshape", (a,), n.shape, g.nodes[a].dtype, make_params()))
                    for a in yn.args
                )
                g.replace(j, g.add(Node(yn.op, args, n.shape, yn.dtype, yn.params)))
                return True
            continue
        args = []
        for a in yn.args:
            an = g.nodes[a]
            if not an.shape:
                args.append(a)
                continue
            padded = [1] * (len(yn.shape) - len(an.shape)) + list(an.shape)
            for k in pos:
                padded.insert(k, 1)
            shape = tuple(padded)
            args.append(
                a
                if shape == an.shape
                else g.add(Node("reshape", (a,), shape, an.dtype, make_params()))
            )
        new = g.add(Node(yn.op, tuple(args), n.shape, yn.dtype, yn.params))
        g.replace(j, new)
        return True
    return False


def _collapse_rule(g: LayoutGraph) -> bool:
    """A reshape of a reshape is one reshape; a reshape back to its source's shape is the
    source."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "reshape":
            continue
        src = g.nodes[n.args[0]]
        if tuple(src.shape) == tuple(n.shape):
            g.replace(j, n.args[0])
            return True
        if src.op == "reshape":
            inner = src.args[0]
            if tuple(g.nodes[inner].shape) == tuple(n.shape):
                g.replace(j, inner)
            else:
                g.replace(j, g.add(Node("reshape", (inner,), n.shape, n.dtype, n.params)))
            return True
    return False


def _sink_rule(g: LayoutGraph) -> bool:
    """An elementwise op on bitcast reshapes of computed values of one shape (a matmul's
    column laid out as a row) is the op on those values, reshaped after: the reshape moves
    towards the outputs. (Reshapes of inputs move the other way, to the interface.)"""
    for j in g.live():
        n = g.nodes[j]
        if n.op not in ELEMENTWISE:
            continue
        shaped = [a for a in n.args if g.nodes[a].shape]
        srcs = {g.nodes[a].args[0] for a in shaped if g.nodes[a].op == "reshape"}
        if not shaped or len(srcs) != len(set(shaped)):
            continue
        src_shape = {tuple(g.nodes[s].shape) for s in srcs}
        if len(src_shape) != 1 or any(tuple(g.nodes[a].shape) != n.shape for a in shaped):
            continue
        (shape,) = src_shape
        if shape == tuple(n.shape) or not is_bitcast(shape, n.shape):
            continue
        if unit_positions(shape, n.shape) is not None:
            continue
        if all(g.nodes[s].op == "input" for s in srcs):
            continue
        args = tuple(g.nodes[a].args[0] if g.nodes[a].shape else a for a in n.args)
        inner = g.add(Node(n.op, args, shape, n.dtype, n.params))
        g.replace(j, g.add(Node("reshape", (inner,), n.shape, n.dtype, make_params())))
        return True
    return False


_LAID = ("input", "constant", "broadcast_in_dim", "reshape", "transpose")


def _sink_regroup_rule(g: LayoutGraph) -> bool:
    """An elementwise op on reshapes that regroup one computed shape's axes (a projection's
    row split into heads: flax nnx's `LinearGeneral`, [1, 1024] -> [1, 1, 8, 128]; its rows
    split back into batch and tokens, [32, 64] -> [2, 16, 64]) and on inputs of the op's shape
    or broadcast along whole regrouped blocks (its heads' bias, a [1, 1, 64] bias) is the op
    on the computed values, reshaped after; the inputs are reshaped at the interface. A
    row-major reshape is a bitcast, so the reshape moves to the outputs for free where
    `_sink_rule` (non-unit sizes unchanged) does not apply."""
    for j in g.live():
        n = g.nodes[j]
        if n.op not in ELEMENTWISE:
            continue
        shaped = [a for a in n.args if g.nodes[a].shape]
        moved = [  # reshapes of computed values (a broadcast's own rules place it)
            a
            for a in shaped
            if g.nodes[a].op == "reshape"
            and g.nodes[g.nodes[a].args[0]].op not in _LAID
            and tuple(g.nodes[a].shape) == tuple(n.shape)
        ]
        sources = {tuple(g.nodes[g.nodes[a].args[0]].shape) for a in moved}
        if len(sources) != 1:
            continue
        (shape,) = sources
        if is_bitcast(shape, n.shape) or any(
            a not in moved and input_chain(g, a) is None for a in shaped
        ):
            continue
        small = {}
        for a in shaped:
            if a not in moved and tuple(g.nodes[a].shape) != tuple(n.shape):
                small[a] = _regrouped_broadcast(shape, n.shape, g.nodes[a].shape)
        if any(v is None for v in small.values()):
            continue
        op_before(g, j, moved, shape, ("reshape", shape), ("reshape", make_params()), small)
        return True
    return False


def _scalar_operand_rule(g: LayoutGraph) -> bool:
    """A scalar constant broadcast to an elementwise op's shape (a loss's 1/n, jnp's
    `full_like`) is the scalar: numpy broadcasting gives the op its shape from its other
    operands, and the other layout rules no longer meet a broadcast there."""
    for j in g.live():
        n = g.nodes[j]
        if n.op not in ELEMENTWISE or len(n.args) != 2:
            continue
        for k, a in enumerate(n.args):
            an, other = g.nodes[a], g.nodes[n.args[1 - k]]
            if an.op != "broadcast_in_dim" or tuple(other.shape) != tuple(n.shape):
                continue
            c = g.nodes[an.args[0]]
            if c.op != "constant" or c.shape or c.dtype != an.dtype:
                continue
            args = tuple(an.args[0] if i == k else b for i, b in enumerate(n.args))
            g.replace(j, g.add(Node(n.op, args, n.shape, n.dtype, n.params)))
            return True
    return False


def _reduce_all_rule(g: LayoutGraph) -> bool:
    """A sum or max over every axis of a reshape (a loss's mean over batch and tokens of rows
    split back into (B, T, D)) is the same over every axis of the reshaped value."""
    for j in g.live():
        n = g.nodes[j]
        if n.op not in ("reduce_sum", "reduce_max") or n.shape:
            continue
        r = g.nodes[n.args[0]]
        if r.op != "reshape" or tuple(n.param("axes")) != tuple(range(len(r.shape))):
            continue
        x = r.args[0]
        params = dict(n.params)
        params["axes"] = tuple(range(len(g.nodes[x].shape)))
        g.replace(j, g.add(Node(n.op, (x,), n.shape, n.dtype, make_params(**params))))
        return True
    return False


def _regrouped_broadcast(
    src: Sequence[int], dst: Sequence[int], operand: Sequence[int]
) -> tuple[int, ...] | None:
    """The shape, laid out as `src`, of an operand broadcast against `dst` (a reshape of
    `src`), where on each regrouped block it is whole or all units; else None."""
    if len(operand) > len(dst):
        return None
    full = (1,) * (len(dst) - len(operand)) + tuple(operand)
    if any(o not in (1, d) for o, d in zip(full, dst)):
        return None
    blocks = _reshape_blocks(src, dst)
    if blocks is None:
        return None
    out = [1] * len(src)
    for ins, outs in blocks:
        kept = [full[o] != 1 for o in outs]
        if any(kept) != all(kept):
            return None
        if all(kept):
            for k in ins:
                out[k] = src[k]
    return tuple(out)


def _broadcast_rule(g: LayoutGraph) -> bool:
    """A broadcast that only inserts unit axes (a rank-1 gain or bias made a row) is a reshape,
    which the input and unit rules then move to the interface."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "broadcast_in_dim":
            continue
        src = g.nodes[n.args[0]].shape
        dims = tuple(n.param("broadcast_dimensions"))
        if not src or list(dims) != sorted(dims) or unit_positions(src, n.shape) is None:
            continue
        if any(n.shape[d] != s for d, s in zip(dims, src)):
            continue
        g.replace(j, g.add(Node("reshape", n.args, n.shape, n.dtype, make_params())))
        return True
    return False


def _raised(src: Sequence[int], n: Node) -> list[int] | None:
    """The shape of a broadcast's operand at the broadcast's rank (1 on the new axes), if the
    broadcast keeps the operand's axes in order; else None."""
    dims = tuple(n.param("broadcast_dimensions"))
    if list(dims) != sorted(dims) or any(s not in (1, n.shape[d]) for d, s in zip(dims, src)):
        return None
    kept = [1] * len(n.shape)
    for d, s in zip(dims, src):
        kept[d] = s
    return kept


def _reshape_blocks(
    src: Sequence[int], dst: Sequence[int]
) -> list[tuple[list[int], list[int]]] | None:
    """A reshape of `src` to `dst` as blocks (its axes, the result's axes) whose sizes
    multiply to the same product, unit axes left out; None where they do not line up."""
    ins = [k for k, d in enumerate(src) if d != 1]
    outs = [k for k, d in enumerate(dst) if d != 1]
    blocks, i, o = [], 0, 0
    while i < len(ins) and o < len(outs):
        gi, go = [ins[i]], [outs[o]]
        pi, po = src[ins[i]], dst[outs[o]]
        i, o = i + 1, o + 1
        while pi != po:
            if pi < po and i < len(ins):
                gi.append(ins[i])
                pi, i = pi * src[ins[i]], i + 1
            elif po < pi and o < len(outs):
                go.append(outs[o])
                po, o = po * dst[outs[o]], o + 1
            else:
                return None
        blocks.append((gi, go))
    return blocks if i == len(ins) and o == len(outs) else None


def _grouped_broadcast_rule(g: LayoutGraph) -> bool:
    """A broadcast of an input reshaped after (Llama nnx's [1, 1, 1, T] mask widened over
    the heads, then the heads grouped for GQA: (1, 32, 1, T) -> (8, 4, T)): where the reshape
    splits or merges widened axes only among themselves, it is taken first, on the small
    input (a free reshape at the interface), and the broadcast after it only widens size-1
    axes, which µGraph ops read as they are (`_rank_rule`). The kernel then reads the mask's
    T values, not a broadcast copy XLA writes on every call (1.9 µs at Llama-7B b=1 on the
    H100, 2026-11-27, beside an attention of 11-14 µs)."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "broadcast_in_dim" or n.args[0] not in g.inputs:
            continue
        users = g.users(j)
        if len(users) != 1 or g.nodes[users[0]].op != "reshape":
            continue
        x, r = n.args[0], g.nodes[users[0]]
        kept = _raised(g.nodes[x].shape, n)
        blocks = None if kept is None else _reshape_blocks(n.shape, r.shape)
        if blocks is None:
            continue
        widened = {k for k, (a, b) in enumerate(zip(kept, n.shape)) if a == 1 and b != 1}
        small = [1] * len(r.shape)
        for ins, outs in blocks:
            if any(k in widened for k in ins) != all(k in widened for k in ins):
                small = None
                break
            for o in outs:
                small[o] = 1 if ins[0] in widened else r.shape[o]
        if small is None or tuple(small) == tuple(r.shape):
            continue
        like = Node("reshape", (x,), tuple(small), g.nodes[x].dtype, make_params())
        new = g.new_input(like, x, layout_step(like))
        dims = tuple(range(len(small)))
        wide = Node(n.op, (new,), r.shape, n.dtype, make_params(broadcast_dimensions=dims))
        g.replace(users[0], g.add(wide))
        return True
    return False


def _rank_rule(g: LayoutGraph) -> bool:
    """A broadcast of an input (a causal mask's [T, T] bias over batch and heads). Read by
    elementwise ops, the input is taken at the broadcast's rank, 1 on the new axes (a reshape
    at the interface), and the broadcast only widens size-1 axes: µGraph ops broadcast size-1
    dims but never add axes, so the search reads the small input, not a broadcast copy XLA
    would write to memory. Reshaped further (heads grouped for GQA), the broadcast itself moves
    to the interface, where XLA makes it, as it would without the region."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "broadcast_in_dim" or n.args[0] not in g.inputs:
            continue
        x = n.args[0]
        src = g.nodes[x].shape
        kept = _raised(src, n)
        if kept is None or math.prod(kept) <= 1 or tuple(kept) == tuple(n.shape):
            continue
        direct = all(g.nodes[u].op in ELEMENTWISE for u in g.users(j))
        if direct and len(src) == len(n.shape):
            continue
        new = x
        if tuple(kept) != tuple(src):
            like = Node("reshape", (x,), tuple(kept), g.nodes[x].dtype, make_params())
            new = g.new_input(like, x, layout_step(like))
        if direct:
            dims = tuple(range(len(kept)))
            wide = Node(n.op, (new,), n.shape, n.dtype, make_params(broadcast_dimensions=dims))
            g.replace(j, g.add(wide))
        else:
            like = Node("broadcast", (new,), n.shape, n.dtype, make_params())
            g.replace(j, g.new_input(like, new, ("broadcast", tuple(n.shape))))
        return True
    return False


def _scale_rule(g: LayoutGraph) -> bool:
    for j in g.live():
        n = g.nodes[j]
        if n.op != "mul":
            continue
        m, c = n.args
        if g.nodes[c].op != "constant":
            m, c = c, m
        mn, cn = g.nodes[m], g.nodes[c]
        if mn.op != "matmul" or cn.op != "constant" or cn.shape or len(g.users(m)) != 1:
            continue
        a = mn.args[0]
        if a not in g.inputs:
            continue
        scale = ("scale", float(np.asarray(cn.param("value").array)))
        new = g.new_input(g.nodes[a], a, scale)
        prod = g.add(Node("matmul", (new, mn.args[1]), mn.shape, mn.dtype, mn.params))
        g.replace(j, prod)
        return True
    return False


def _shifted_input(nodes: Sequence[Node], inputs: Sequence[int], n: Node) -> tuple | None:
    """(input id, c) where n is `x + c`, `c + x` or `x − c` of an input x and a scalar constant c,
    with x's shape and dtype; else None."""
    if n.op not in ("add", "sub") or len(n.args) != 2:
        return None
    x, c = n.args
    if n.op == "add" and nodes[x].op == "constant":
        x, c = c, x
    xn, cn = nodes[x], nodes[c]
    if x not in inputs or cn.op != "constant" or cn.shape:
        return None
    if tuple(xn.shape) != tuple(n.shape) or xn.dtype != n.dtype:
        return None
    value = float(np.asarray(cn.param("value").array))
    return x, (value if n.op == "add" else -value)


def _shift_rule(g: LayoutGraph) -> bool:
    for j in g.live():
        got = _shifted_input(g.nodes, g.inputs, g.nodes[j])
        if got is None or j in g.inputs:
            continue
        x, c = got
        g.replace(j, g.new_input(g.nodes[j], x, ("shift", c)))
        return True
    return False


def _row_broadcast(program: Program, n: Node) -> bool:
    """Is n a vector made a row (`[N] -> [1, N]`: a rank-1 gain or bias), which only the
    interface can take? (Broadcasts of reductions, `[M] -> [M, 1]`, the search reads as they
    are; they alone do not start the rewrite, so the paper's benchmarks keep their regions.)"""
    if n.op != "broadcast_in_dim" or not n.args:
        return False
    src = program.nodes[n.args[0]]
    pos = unit_positions(src.shape, n.shape) if src.op != "constant" else None
    return pos is not None and max(src.shape, default=1) > 1 and pos == list(range(len(pos)))


def hoist_layouts(program: Program) -> Program:
    """`program` with its transposes and unit-dim reshapes moved to its interface, where the
    rules above apply; unchanged if none does."""
    if "interface" not in program.meta and not any(
        n.op in ("reshape", "transpose")
        or _row_broadcast(program, n)
        or _shifted_input(program.nodes, program.inputs, n) is not None
        or (
            n.op == "broadcast_in_dim"
            and program.nodes[n.args[0]].op == "input"
            and _raised(program.nodes[n.args[0]].shape, n) is not None
        )
        for n in program.nodes
    ):
        return program
    g = LayoutGraph(program)
    changed = False
    for _ in range(MAX_STEPS):
        rules = (
            _collapse_rule, T.compose_rule, T.raise_transpose_rule, T.operand_rule, T.column_rule, _unit_rule, _sink_rule,
            _sink_regroup_rule, T.unit_transpose_rule, _input_rule,
            _output_rule, _scale_rule, _shift_rule, _broadcast_rule, T.transposed_operand_rule, T.product_rule, T.lift_rule,
            T.sink_transpose_rule, _grouped_broadcast_rule, _rank_rule, flatten_rows_rule,
            transposed_rows_rule, _scalar_operand_rule, _reduce_all_rule,
        )  # fmt: skip
        if not any(rule(g) for rule in rules):
            break
        changed = True
    return g.build() if changed else program
