"""The layout rules for transposes (`lax_ir.layouts.hoist_layouts` runs them with the others):
a swapped operand or result moved to the interface, transposes composed, moved to inputs or
past elementwise ops, a transpose of unit axes made a reshape.
"""

from __future__ import annotations

from lax_ir.interface import inverse
from lax_ir.layout_graph import (
    LayoutGraph,
    input_chain,
    is_swap,
    layout_step,
    op_before,
    perm_params,
    swap_like,
    swap_perm,
    swapped,
    unit_positions,
)
from lax_ir.ops import ELEMENTWISE
from lax_ir.program import Node, make_params


def operand_rule(g: LayoutGraph) -> bool:
    for j, n, (a, an), (_, bn) in g.matmuls():
        from_input = an.op == "input" or (
            an.op in ("reshape", "transpose") and g.nodes[an.args[0]].op == "input"
        )
        if not from_input or bn.op not in ("reshape", "transpose"):
            continue
        if j not in g.outputs or g.users(j):  # the swap back must leave through the interface
            continue
        p = bn.args[0]
        pn = g.nodes[p]
        if pn.op == "input" or not is_swap(pn, bn):
            continue
        rank = len(an.shape)
        a_t = g.add(
            Node(
                "transpose",
                (a,),
                swapped(an.shape),
                an.dtype,
                make_params(permutation=swap_perm(rank)),
            )
        )
        prod = g.add(Node("matmul", (p, a_t), swapped(n.shape), n.dtype, n.params))
        back = g.add(
            Node(
                "transpose",
                (prod,),
                n.shape,
                n.dtype,
                make_params(permutation=swap_perm(len(n.shape))),
            )
        )
        g.replace(j, back)
        return True
    return False


def compose_rule(g: LayoutGraph) -> bool:
    """A transpose of a transpose of a computed value is one transpose (flax's V plus its bias,
    `bqhd -> bhdq -> bhqd`); one that restores its source's order is the source. (Of an input,
    the two become interface steps as they are.)"""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "transpose" or g.nodes[n.args[0]].op != "transpose":
            continue
        inner = g.nodes[n.args[0]]
        if g.nodes[inner.args[0]].op == "input":
            continue
        first = inner.param("permutation")
        perm = tuple(first[p] for p in n.param("permutation"))
        x = inner.args[0]
        if perm == tuple(range(len(perm))):
            g.replace(j, x)
        else:
            g.replace(j, g.add(Node("transpose", (x,), n.shape, n.dtype, perm_params(perm))))
        return True
    return False


def raise_transpose_rule(g: LayoutGraph) -> bool:
    """A transpose of an elementwise op on inputs (V plus its heads' bias, then laid out for
    P V: flax's attention) is the op on the inputs transposed at the interface; an input of
    lower rank (the bias, broadcast from the right) first gets leading unit axes."""
    for j in g.live():
        n = g.nodes[j]
        e = n.args[0] if n.op == "transpose" else None
        if e is None or g.nodes[e].op not in ELEMENTWISE or g.users(e) != [j]:
            continue
        en, perm = g.nodes[e], tuple(n.param("permutation"))
        shaped = [a for a in en.args if g.nodes[a].shape]
        if not shaped or any(a not in g.inputs for a in shaped):
            continue
        args = []
        for a in en.args:
            an = g.nodes[a]
            if not an.shape:
                args.append(a)
                continue
            src = a
            if len(an.shape) < len(en.shape):
                full = (1,) * (len(en.shape) - len(an.shape)) + tuple(an.shape)
                like = Node("reshape", (a,), full, an.dtype, make_params())
                src = g.new_input(like, a, layout_step(like))
            shape = tuple(g.nodes[src].shape[p] for p in perm)
            like = Node("transpose", (src,), shape, an.dtype, perm_params(perm))
            args.append(g.new_input(like, src, layout_step(like)))
        g.replace(j, g.add(Node(en.op, tuple(args), n.shape, en.dtype, en.params)))
        return True
    return False


def column_rule(g: LayoutGraph) -> bool:
    """`W @ v` with v a column (`[.., K, 1]`, equinox's `weight @ x`) and W an input is
    `(vᵀ Wᵀ)ᵀ`: the transposes of the column and of the result are bitcasts, and Wᵀ is the
    input W transposed before the call, so the matmul reads a row."""
    for j, n, (a, an), (b, bn) in g.matmuls():
        if a not in g.inputs or len(bn.shape) < 2 or bn.shape[-1] != 1 or bn.shape[-2] == 1:
            continue
        if len(an.shape) != len(bn.shape) or an.shape[-2] == 1:
            continue
        rank = len(an.shape)
        at = g.new_input(swap_like(an), a, ("transpose", swap_perm(rank)))
        row = g.add(Node("reshape", (b,), swapped(bn.shape), bn.dtype, make_params()))
        prod = g.add(Node("matmul", (row, at), swapped(n.shape), n.dtype, n.params))
        g.replace(j, g.add(Node("reshape", (prod,), n.shape, n.dtype, make_params())))
        return True
    return False


def transposed_operand_rule(g: LayoutGraph) -> bool:
    """`W @ xᵀ`, W an input and xᵀ the last-two swap of a computed value (equinox's
    `weight @ x` vmapped over rows), is `(x Wᵀ)ᵀ`: Wᵀ is W transposed before the call, and
    the swap of the result moves on towards the outputs (`lift_rule`, `sink_transpose_rule`)."""
    for j, n, (a, an), (_, bn) in g.matmuls():
        if a not in g.inputs or bn.op != "transpose" or len(an.shape) != len(bn.shape):
            continue
        x = bn.args[0]
        if g.nodes[x].op == "input" or not is_swap(g.nodes[x], bn):
            continue
        swap = swap_perm(len(an.shape))
        at = g.new_input(swap_like(an), a, ("transpose", swap))
        prod = g.add(Node("matmul", (x, at), swapped(n.shape), n.dtype, n.params))
        g.replace(j, g.add(Node("transpose", (prod,), n.shape, n.dtype, perm_params(swap))))
        return True
    return False


def product_rule(g: LayoutGraph) -> bool:
    """The swap of `a @ b` (seen through reshapes that insert unit axes), both inputs, read
    only by the swap, is `bᵀ aᵀ` with both swaps interface steps: equinox's `weight @ x`
    vmapped over a sequence or a batch whose activation enters the region laid out for it
    (`W xᵀ`, swapped back to rows) reads x as stored and Wᵀ as a view, and the product comes
    out in the order its readers want."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "transpose":
            continue
        m = n.args[0]
        while g.nodes[m].op == "reshape" and len(g.users(m)) == 1:
            if unit_positions(g.nodes[g.nodes[m].args[0]].shape, g.nodes[m].shape) is None:
                break
            m = g.nodes[m].args[0]
        mn = g.nodes[m]
        if mn.op != "matmul" or len(mn.shape) != 2 or 1 in mn.shape or len(g.users(m)) != 1:
            continue
        a, b = mn.args
        src = g.nodes[n.args[0]].shape
        order = [p for p in n.param("permutation") if src[p] > 1]
        if order != sorted(order, reverse=True) or a not in g.inputs or b not in g.inputs:
            continue
        swap = ("transpose", swap_perm(2))
        bt = g.new_input(swap_like(g.nodes[b]), b, swap)
        at = g.new_input(swap_like(g.nodes[a]), a, swap)
        prod = g.add(Node("matmul", (bt, at), swapped(mn.shape), n.dtype, mn.params))
        if tuple(n.shape) != swapped(mn.shape):
            prod = g.add(Node("reshape", (prod,), n.shape, n.dtype, make_params()))
        g.replace(j, prod)
        return True
    return False


def lift_rule(g: LayoutGraph) -> bool:
    """A reshape that only inserts unit axes into a transpose of a computed value is a
    transpose of that value with leading units: the transpose moves towards the outputs."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "reshape" or g.nodes[n.args[0]].op != "transpose":
            continue
        tn = g.nodes[n.args[0]]
        x = tn.args[0]
        pos = unit_positions(tn.shape, n.shape)
        if pos is None or g.nodes[x].op == "input":
            continue
        xn, perm = g.nodes[x], iter(p + len(pos) for p in tn.param("permutation"))
        units = iter(range(len(pos)))  # leading units, which the squeeze then drops
        new_perm = [next(units) if i in pos else next(perm) for i in range(len(n.shape))]
        xu = g.add(Node("reshape", (x,), (*[1] * len(pos), *xn.shape), xn.dtype, make_params()))
        g.replace(j, g.add(Node("transpose", (xu,), n.shape, n.dtype, perm_params(new_perm))))
        return True
    return False


def sink_transpose_rule(g: LayoutGraph) -> bool:
    """An elementwise op on transposes (one permutation) of computed values is the op on those
    values, transposed after; an input operand of the op's shape is transposed back at the
    interface."""
    for j in g.live():
        n = g.nodes[j]
        if n.op not in ELEMENTWISE:
            continue
        shaped = [a for a in n.args if g.nodes[a].shape]
        moved = [a for a in shaped if g.nodes[a].op == "transpose"]
        perms = {tuple(g.nodes[a].param("permutation")) for a in moved}
        if len(perms) != 1 or any(tuple(g.nodes[a].shape) != tuple(n.shape) for a in shaped):
            continue
        if any(a not in moved and input_chain(g, a) is None for a in shaped):
            continue
        if all(g.nodes[g.nodes[a].args[0]].op == "input" for a in moved):
            continue
        (perm,) = perms
        inner_shape = tuple(n.shape[k] for k in inverse(perm))
        op_before(
            g, j, moved, inner_shape, ("transpose", inverse(perm)), ("transpose", perm_params(perm))
        )
        return True
    return False


def unit_transpose_rule(g: LayoutGraph) -> bool:
    """A transpose that moves only unit axes (the non-unit ones keep their order: flax nnx's
    attention, vmapped over heads, transposes [1, 8, 1, 1, 512] to [1, 1, 8, 1, 512]) is a
    reshape: the same elements in the same row-major order."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "transpose":
            continue
        src = g.nodes[n.args[0]].shape
        kept = [p for p in n.param("permutation") if src[p] > 1]
        if kept != sorted(kept):
            continue
        g.replace(j, g.add(Node("reshape", (n.args[0],), n.shape, n.dtype, make_params())))
        return True
    return False
