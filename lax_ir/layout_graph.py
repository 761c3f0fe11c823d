"""The mutable graph the layout rules (`lax_ir.layouts`) rewrite: a Program's nodes with its
interface, new inputs made from old ones by interface steps, rebuilt into a Program at the end."""

from __future__ import annotations

from typing import Any

from lax_ir.interface import identity_interface, merged
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
