"""Rows merged before a projection, moved to the region's interface (`lax_ir.layouts`' rule).

A norm over a batch of sequences computes on (B, T, D) and its projection reads it as rows,
(B·T, D): the capture writes a reshape that merges the leading axes between them (flax linen's
`Dense` after `RMSNorm`, nnx's `Einsum`), which the µGraph cannot express. Every op before it
treats rows alike (elementwise ops, reductions over the last axis, gains broadcast along it), so
the same ops on (B·T, D) mean the same: `flatten_rows_rule` rewrites the reshape's operand in
row form, its inputs merged at the interface (a free reshape). Values that go on in their
(B, T, D) shape elsewhere in the region are not recomputed: the rule then leaves the reshape.
`canonical.flatten_rows` merges a whole region's rows where every op agrees (GPT-2); these
rules are its local form, for a region that also holds an op no row form expresses (a head
split at one of its outputs).
"""

from __future__ import annotations

import math

from lax_ir.layout_graph import LayoutGraph, chain_input, input_chain
from lax_ir.ops import ELEMENTWISE
from lax_ir.program import Node, make_params


class _NotRows(Exception):
    """The value is not computed row by row (the rewrite does not apply)."""


def flatten_rows_rule(g: LayoutGraph) -> bool:
    """A reshape of a computed value that merges its leading axes into rows, `(a.., D) ->
    (prod(a), D)`, is that value computed on rows (see the module's docstring)."""
    for j in g.live():
        n = g.nodes[j]
        if n.op != "reshape" or g.nodes[n.args[0]].op in ("input", "constant"):
            continue
        src, dst = tuple(g.nodes[n.args[0]].shape), tuple(n.shape)
        if len(src) < 3 or dst != (math.prod(src[:-1]), src[-1]):
            continue
        cone = _Rows(g, src[:-1])
        try:
            rows = cone.flat(n.args[0])
        except _NotRows:
            continue  # what it added is dead: `LayoutGraph.build` keeps only live nodes
        inside = cone.recomputed | {j}
        outside = any(u not in inside for c in cone.recomputed for u in g.users(c))
        if outside or not cone.recomputed.isdisjoint(g.outputs):
            continue  # a value that goes on in its own shape would be computed twice
        g.replace(j, rows)
        return True
    return False


class _Rows:
    """The values of one reshape's cone in row form: (lead.., k) as (m, k), (lead..) as (m,)."""

    def __init__(self, g: LayoutGraph, lead: tuple[int, ...]):
        self.g, self.lead, self.m = g, lead, math.prod(lead)
        self.done: dict[int, int] = {}
        self.recomputed: set[int] = set()  # the cone's values computed again in row form

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The row form of a value of `shape` in the cone."""
        k = len(self.lead)
        if shape[:k] == self.lead and len(shape) in (k, k + 1):
            return (self.m, *shape[k:])
        raise _NotRows

    def flat(self, v: int) -> int:
        if v not in self.done:
            self.done[v] = self._flat(v)
        return self.done[v]

    def _flat(self, v: int) -> int:
        g, n = self.g, self.g.nodes[v]
        shape = tuple(n.shape)
        if n.op == "constant" and not shape:
            return v
        if n.op == "input":
            return self._input(v)
        if n.op == "reshape" and tuple(g.nodes[n.args[0]].shape) == self.shape(shape):
            return n.args[0]  # rows split back into (lead.., k): the rows themselves
        want = self.shape(shape)
        self.recomputed.add(v)
        if n.op in ELEMENTWISE:
            args = tuple(self._operand(a) for a in n.args)
            return g.add(Node(n.op, args, want, n.dtype, n.params))
        if n.op in ("reduce_sum", "reduce_max"):
            (a,) = n.args
            if tuple(n.param("axes")) != (len(g.nodes[a].shape) - 1,) or len(want) != 1:
                raise _NotRows
            params = dict(n.params)
            params["axes"] = (1,)
            return g.add(Node(n.op, (self.flat(a),), want, n.dtype, make_params(**params)))
        if n.op == "reshape":  # (lead..) <-> (lead.., 1)
            a = self.flat(n.args[0])
            if math.prod(g.nodes[a].shape) != math.prod(want):
                raise _NotRows
            return g.add(Node("reshape", (a,), want, n.dtype, make_params()))
        if n.op == "broadcast_in_dim":
            (a,) = n.args
            an = g.nodes[a]
            if not an.shape and an.op == "constant":
                return g.add(Node(n.op, (a,), want, n.dtype, make_params(broadcast_dimensions=())))
            dims = tuple(n.param("broadcast_dimensions"))
            if tuple(an.shape) == self.lead and dims == tuple(range(len(self.lead))):
                dims = (0,)
                return g.add(
                    Node(
                        n.op, (self.flat(a),), want, n.dtype, make_params(broadcast_dimensions=dims)
                    )
                )
        raise _NotRows

    def _operand(self, a: int) -> int:
        """An elementwise op's operand in row form: a cone value, or an input broadcast along
        the rows (a gain or bias of shape (D,) or (1.., D), or one converted: an
        `input_chain`) taken as it broadcasts."""
        an = self.g.nodes[a]
        shape = tuple(an.shape)
        if not shape:
            return a
        k = len(self.lead)
        broadcast = len(shape) <= k + 1 and all(d == 1 for d in shape[:-1])
        if broadcast and input_chain(self.g, a) is not None:
            if len(shape) <= 2:
                return a
            return chain_input(self.g, a, (1, shape[-1]), ("reshape", (1, shape[-1])))
        return self.flat(a)

    def _input(self, v: int) -> int:
        n = self.g.nodes[v]
        want = self.shape(tuple(n.shape))
        like = Node("reshape", (v,), want, n.dtype, make_params())
        return self.g.new_input(like, v, ("reshape", want))


def transposed_rows_rule(g: LayoutGraph) -> bool:
    """Rows merged after the last axis moved to the front, `(a.., D) -> (D, a..) -> (D, m)`
    (nnx's `Einsum` putting the weight first: `W @ hᵀ`), are the rows' transpose: `(a.., D) ->
    (m, D) -> (D, m)`, whose merge `flatten_rows_rule` then takes into the cone and whose
    swap `W @ hᵀ` moves to the weight."""
    for j in g.live():
        n = g.nodes[j]
        t = n.args[0] if n.op == "reshape" else None
        if t is None or g.nodes[t].op != "transpose" or len(g.users(t)) != 1:
            continue
        x = g.nodes[t].args[0]
        src = tuple(g.nodes[x].shape)
        k = len(src) - 1
        if k < 2 or tuple(g.nodes[t].param("permutation")) != (k, *range(k)):
            continue
        m = math.prod(src[:-1])
        if tuple(n.shape) != (src[-1], m):
            continue
        xn = g.nodes[x]
        rows = g.add(Node("reshape", (x,), (m, src[-1]), xn.dtype, make_params()))
        g.replace(
            j, g.add(Node("transpose", (rows,), n.shape, n.dtype, make_params(permutation=(1, 0))))
        )
        return True
    return False
