"""The mutable graph the layout rules (`lax_ir.layouts`, `lax_ir.transpose_layouts`,
`lax_ir.row_layouts`) rewrite: a Program's nodes with its interface, new inputs made from old
ones by interface steps, rebuilt into a Program at the end; and the small steps the rules
share (swaps, bitcasts, an elementwise op moved before a layout op)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lax_ir.interface import identity_interface, merged
from lax_ir.ops import ELEMENTWISE
from lax_ir.program import Node, Program, make_params


class LayoutGraph:
    """A mutable copy of a Program with its interface, rebuilt into a Program at the end."""

    def __init__(self, program: Program):
        self.nodes = list(program.nodes)
        self.inputs = list(program.inputs)
        self.outputs = list(program.outputs)
        iface = program.meta.get("interface") or identity_interface(program)
        self.in_ops = {i: iface["inputs"][k] for k, i in enumerate(self.inputs)}
        self.out_ops = list(iface["outputs"])
        self.shapes = iface["shapes"]
        self.name = program.meta.get("name", "region")

    def live(self) -> list[int]:
        """Node ids the outputs depend on, ascending."""
        seen = set(self.outputs)
        stack = list(self.outputs)
        while stack:
            for a in self.nodes[stack.pop()].args:
                if a not in seen:
                    seen.add(a)
                    stack.append(a)
        return sorted(seen)

    def matmuls(self) -> list[tuple[int, Node, tuple[int, Node], tuple[int, Node]]]:
        """Each live matmul: its id, its node, and (id, node) of its two operands."""
        out = []
        for j in self.live():
            n = self.nodes[j]
            if n.op == "matmul":
                a, b = n.args
                out.append((j, n, (a, self.nodes[a]), (b, self.nodes[b])))
        return out

    def users(self, i: int) -> list[int]:
        return [j for j in self.live() if i in self.nodes[j].args]

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def new_input(self, like: Node, source: int, step: tuple[str, Any]) -> int:
        """A new input shaped as `like`: region input `source`'s value with `step` applied."""
        new = self.add(
            Node("input", (), like.shape, like.dtype, make_params(index=len(self.inputs)))
        )
        self.inputs.append(new)
        pos, ops = self.in_ops[source]
        self.in_ops[new] = (pos, merged((*ops, step)))
        return new

    def replace(self, old: int, new: int) -> None:
        for j, n in enumerate(self.nodes):
            if old in n.args and j != new:
                args = tuple(new if a == old else a for a in n.args)
                self.nodes[j] = Node(n.op, args, n.shape, n.dtype, n.params)
        self.outputs = [new if o == old else o for o in self.outputs]

    def build(self) -> Program:
        """The Program (topologically re-sorted, dead inputs dropped) with its interface."""
        live = set(self.live())
        inputs = [i for i in self.inputs if i in live]
        order: list[int] = []
        placed: set[int] = set()

        def visit(i: int) -> None:
            if i in placed:
                return
            for a in self.nodes[i].args:
                visit(a)
            placed.add(i)
            order.append(i)

        for i in inputs:
            visit(i)
        for o in self.outputs:
            visit(o)
        index = {old: k for k, old in enumerate(order)}
        nodes = [
            Node(n.op, tuple(index[a] for a in n.args), n.shape, n.dtype, n.params)
            for n in (self.nodes[i] for i in order)
        ]
        meta = {
            "name": self.name,
            "interface": {
                "inputs": tuple(self.in_ops[i] for i in inputs),
                "outputs": tuple(self.out_ops),
                "shapes": self.shapes,
            },
        }
        return Program.build(
            nodes, [index[i] for i in inputs], [index[o] for o in self.outputs], meta
        )


def layout_step(n: Node) -> tuple[str, tuple[int, ...]]:
    """The interface step a reshape or transpose node applies."""
    if n.op == "reshape":
        return ("reshape", tuple(n.shape))
    return ("transpose", tuple(n.param("permutation")))


def swapped(shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` with its last two axes exchanged."""
    return (*shape[:-2], shape[-1], shape[-2])


def swap_perm(rank: int) -> tuple[int, ...]:
    """The permutation exchanging the last two of `rank` axes."""
    return (*range(rank - 2), rank - 1, rank - 2)


def is_bitcast(src: Sequence[int], dst: Sequence[int]) -> bool:
    """Is a reshape from src to dst a bitcast (the same non-unit sizes in the same order)?"""
    return [d for d in src if d > 1] == [d for d in dst if d > 1]


def is_swap(src: Node, n: Node) -> bool:
    """Is n (a reshape or transpose of src) src with its last two axes exchanged?"""
    if len(src.shape) < 2 or len(n.shape) != len(src.shape):
        return False
    if n.op == "transpose":
        return tuple(n.param("permutation")) == swap_perm(len(n.shape))
    return n.op == "reshape" and tuple(n.shape) == swapped(src.shape) and 1 in src.shape[-2:]


def unit_positions(src: Sequence[int], dst: Sequence[int]) -> list[int] | None:
    """Positions of dst that are inserted size-1 axes, if dst is src with unit axes inserted."""
    pos, j = [], 0
    for k, d in enumerate(dst):
        if j < len(src) and src[j] == d:
            j += 1
        elif d == 1:
            pos.append(k)
        else:
            return None
    return pos if j == len(src) and pos else None


def perm_params(perm: Sequence[int]) -> tuple[tuple[str, Any], ...]:
    """A transpose node's params for `perm`."""
    return make_params(permutation=tuple(perm))


def input_chain(g: LayoutGraph, a: int) -> list[int] | None:
    """Node a as an input and the one-operand elementwise ops over it, input first (a bias or
    gain converted to the compute dtype: flax's `Dense(dtype=bfloat16)` over float32
    parameters); None where a is computed otherwise."""
    chain = [a]
    while g.nodes[chain[0]].op != "input":
        n = g.nodes[chain[0]]
        if n.op not in ELEMENTWISE or len(n.args) != 1:
            return None
        chain.insert(0, n.args[0])
    return chain


def chain_input(g: LayoutGraph, a: int, shape: tuple[int, ...], step: tuple[str, Any]) -> int:
    """Node a (an `input_chain`) at `shape`: its input taken at the interface through `step`,
    then the chain's ops again at that shape."""
    chain = input_chain(g, a)
    assert chain is not None, a
    v = g.new_input(Node("input", (), shape, g.nodes[chain[0]].dtype), chain[0], step)
    for c in chain[1:]:
        n = g.nodes[c]
        v = g.add(Node(n.op, (v,), shape, n.dtype, n.params))
    return v


def op_before(
    g: LayoutGraph,
    j: int,
    moved: Sequence[int],
    shape: tuple[int, ...],
    in_step: tuple[str, Any],
    after: tuple[str, Any],
    in_shapes: dict[int, tuple[int, ...]] | None = None,
) -> None:
    """Replace elementwise node j by its op on the sources of its `moved` layout operands
    (`shape`), its other shaped operands (inputs, or an `input_chain` over one) taken at the
    interface through `in_step` (or, for those in `in_shapes`, reshaped to the shape given
    there), then the layout op `after` (op name, params) back to j's shape."""
    n = g.nodes[j]
    args = []
    for a in n.args:
        if a in moved:
            args.append(g.nodes[a].args[0])
        elif in_shapes and a in in_shapes:
            args.append(chain_input(g, a, in_shapes[a], ("reshape", in_shapes[a])))
        elif g.nodes[a].shape:
            args.append(chain_input(g, a, shape, in_step))
        else:
            args.append(a)
    inner = g.add(Node(n.op, tuple(args), shape, n.dtype, n.params))
    g.replace(j, g.add(Node(after[0], (inner,), n.shape, n.dtype, after[1])))


def swap_like(n: Node) -> Node:
    """n with its last two axes exchanged in its shape (an input's node for its transpose)."""
    return Node(n.op, n.args, swapped(n.shape), n.dtype, n.params)
