"""Logical dimensions of a Program (axes that must share a size) and shrinking it to small shapes.

Every axis of every node of a region Program belongs to a *logical dimension* (a class of a
union-find over (node, axis) pairs): elementwise ops unify aligned axes of equal size, a matmul
unifies its batch axes, M with M, N with N and the two contraction axes, a reduction maps the
kept axes, shape ops map the axes they carry. Size-1 axes belong to no class. The search speaks
about classes only: which class a grid axis splits, which class the for-loop walks, which class
a block op reduces. That is what makes a structure independent of the numbers, and what lets
`shrink` rebuild the Program at small sizes (every class shrunk consistently, and every constant
that is the count of a mean rescaled with it) so one small representative per mapping class
can be verified in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import DisjointSet

from lax_ir.ops import ELEMENTWISE
from lax_ir.program import Const, Node, Program, make_params

PASS_THROUGH = ("broadcast_in_dim", "convert", "reshape")
SMALL = 16


class ShrinkError(ValueError):
    """The program cannot be rebuilt at smaller sizes (the message says why)."""


@dataclass(frozen=True)
class Dims:
    """Logical dimensions of a Program.

    Arguments:
        axes: per node, per axis, the class id of that axis (None for a size-1 axis).
        sizes: per class, its size.
        reduced: classes some op sums or maxes over (matmul contractions, reductions).
        outputs: classes on the axes of the program's outputs.
        fixed: classes whose size cannot change (concatenations, real reshapes, constants).
        counts: constant node -> the classes whose size product it is (the n of a mean), and
            whether it is n (True) or 1/n (False).
    """

    axes: tuple[tuple[int | None, ...], ...]
    sizes: tuple[int, ...]
    reduced: frozenset[int]
    outputs: frozenset[int]
    fixed: frozenset[int]
    counts: Mapping[int, tuple[tuple[int, ...], bool]]

    def name(self, c: int) -> str:
        return f"d{c}"

    def classes_of(self, node: int) -> tuple[int | None, ...]:
        return self.axes[node]

    def batch_like(self) -> list[int]:
        """The classes the program is a map along: of size 2 or more, and neither reduced,
        fixed nor counted (a mean's n), in class order."""
        counted = {c for classes, _ in self.counts.values() for c in classes}
        return [
            c
            for c, size in enumerate(self.sizes)
            if size >= 2 and c not in self.reduced and c not in self.fixed and c not in counted
        ]


def analyse(program: Program) -> Dims:
    """The logical dimensions of `program` (see the module docstring)."""
    uf = DisjointSet()  # raw axis ids; classes are renumbered densely below
    ids: list[list[int | None]] = []  # per node, per axis: a raw union-find id
    reduced_raw: list[int] = []
    fixed_raw: list[int] = []
    nodes = program.nodes

    def fresh(shape: tuple[int, ...]) -> list[int | None]:
        out: list[int | None] = []
        for s in shape:
            out.append(len(uf) if s > 1 else None)
            if s > 1:
                uf.add(len(uf))
        return out

    def unite(a: int | None, b: int | None) -> None:
        if a is not None and b is not None:
            uf.merge(a, b)

    for n in nodes:
        out = fresh(n.shape)
        ids.append(out)
        args = [nodes[a] for a in n.args]
        if n.op in ("input",):
            continue
        if n.op == "constant":
            fixed_raw.extend(x for x in out if x is not None)
        elif n.op in ELEMENTWISE:
            for a, an in zip(n.args, args):
                off = len(n.shape) - len(an.shape)
                for ax, s in enumerate(an.shape):
                    if s == n.shape[ax + off] and s > 1:
                        unite(ids[a][ax], out[ax + off])
        elif n.op == "matmul":
            a, b = n.args
            sa, sb = args[0].shape, args[1].shape
            r = len(n.shape)
            for ax in range(r - 2):
                for src, s in ((a, sa), (b, sb)):
                    off = (r - 2) - (len(s) - 2)
                    if ax - off >= 0 and s[ax - off] == n.shape[ax] and n.shape[ax] > 1:
                        unite(ids[src][ax - off], out[ax])
            unite(ids[a][-2], out[-2])
            unite(ids[b][-1], out[-1])
            unite(ids[a][-1], ids[b][-2])
            if ids[a][-1] is not None:
                reduced_raw.append(ids[a][-1])
        elif n.op in ("reduce_sum", "reduce_max"):
            axes = tuple(n.param("axes"))
            kept = [ax for ax in range(len(args[0].shape)) if ax not in axes]
            for k, ax in enumerate(kept):
                unite(ids[n.args[0]][ax], out[k])
            reduced_raw.extend(ids[n.args[0]][ax] for ax in axes if ids[n.args[0]][ax] is not None)
        elif n.op == "broadcast_in_dim":
            src = args[0].shape
            for ax, dst in enumerate(n.param("broadcast_dimensions")):
                if src[ax] == n.shape[dst] and src[ax] > 1:
                    unite(ids[n.args[0]][ax], out[dst])
        elif n.op == "transpose":
            for k, ax in enumerate(n.param("permutation")):
                unite(ids[n.args[0]][ax], out[k])
        elif n.op == "reshape":
            src = [x for x, s in zip(ids[n.args[0]], args[0].shape) if s > 1]
            dst = [x for x, s in zip(out, n.shape) if s > 1]
            src_sizes = [s for s in args[0].shape if s > 1]
            dst_sizes = [s for s in n.shape if s > 1]
            if src_sizes == dst_sizes:
                for x, y in zip(src, dst):
                    unite(x, y)
            else:  # a real split or merge: these sizes stay as they are
                fixed_raw.extend(x for x in src + dst if x is not None)
        elif n.op == "concatenate":
            axis = n.param("axis")
            for a in n.args:
                for ax in range(len(n.shape)):
                    if ax != axis:
                        unite(ids[a][ax], out[ax])
                    elif ids[a][ax] is not None:
                        fixed_raw.append(ids[a][ax])
            if out[axis] is not None:
                fixed_raw.append(out[axis])
        else:  # anything else: keep its sizes
            fixed_raw.extend(x for x in out if x is not None)
            for a in n.args:
                fixed_raw.extend(x for x in ids[a] if x is not None)

    # Renumber classes densely: first the inputs' axes (positional order), then the outputs',
    # then the rest in node order, so a Program and its shrunk copy number classes alike.
    number: dict[int, int] = {}
    sizes: list[int] = []
    scan = [*program.inputs, *program.outputs, *range(len(nodes))]
    for i in scan:
        for x, s in zip(ids[i], nodes[i].shape):
            if x is not None and uf[x] not in number:
                number[uf[x]] = len(sizes)
                sizes.append(s)
    axes = [tuple(None if x is None else number[uf[x]] for x in row) for row in ids]

    def cls(raw: list[int]) -> frozenset[int]:
        return frozenset(number[uf[x]] for x in raw)

    outputs = frozenset(c for o in program.outputs for c in axes[o] if c is not None)
    dims = Dims(tuple(axes), tuple(sizes), cls(reduced_raw), outputs, cls(fixed_raw), {})
    return Dims(
        dims.axes, dims.sizes, dims.reduced, dims.outputs, dims.fixed, _counts(program, dims)
    )


def _source_reduction(program: Program, i: int, dims: Dims) -> tuple[int, ...] | None:
    """The classes reduced by the reduce_sum that `i` is (through broadcasts/converts)."""
    nodes = program.nodes
    while nodes[i].op in PASS_THROUGH:
        i = nodes[i].args[0]
    n = nodes[i]
    if n.op != "reduce_sum":
        return None
    src = dims.axes[n.args[0]]
    classes = tuple(src[ax] for ax in n.param("axes") if src[ax] is not None)
    return classes or None


def _counts(program: Program, dims: Dims) -> dict[int, tuple[tuple[int, ...], bool]]:
    """Scalar constants that are the n (or 1/n) of a mean over reduced classes."""
    out: dict[int, tuple[tuple[int, ...], bool]] = {}
    nodes = program.nodes
    for _, n in program.ops():
        if n.op not in ("div", "mul") or len(n.args) != 2:
            continue
        for pos in (1, 0) if n.op == "mul" else (1,):
            c, x = n.args[pos], n.args[1 - pos]
            cn = nodes[c]
            if cn.op != "constant" or cn.size != 1:
                continue
            classes = _source_reduction(program, x, dims)
            if classes is None:
                continue
            value = float(np.asarray(cn.param("value").array).reshape(()))
            count = math.prod(dims.sizes[k] for k in classes)
            if n.op == "div" and value == count:
                out[c] = (classes, True)
            elif n.op == "mul" and value == np.asarray(1.0 / count, dtype=cn.dtype):
                out[c] = (classes, False)
    return out


def small_sizes(dims: Dims, small: int = SMALL) -> dict[int, int]:
    """A small size per class, kept even so that the representative can split it over a grid
    axis of 2 (`schedule.grid_expansions`): the largest even divisor of the size in
    [4, `small`]; an odd size (25 heads) becomes 4 (2 for 3), which need not divide it (a
    grid over it at full size has tiles of 1: `schedule._grid_choices`).

    Even classes at or below `small`, classes of size 1 and fixed classes keep their size; so
    does an even size with no even divisor in [4, `small`] (2·17).
    """
    out = {}
    for c, s in enumerate(dims.sizes):
        if c in dims.fixed or s <= 2 or (s <= small and s % 2 == 0):
            out[c] = s
        elif s % 2:
            out[c] = 4 if s > 4 else 2
        else:
            even = [d for d in range(4, small + 1, 2) if s % d == 0]
            out[c] = max(even) if even else s
    return out


def shrink(program: Program, sizes: Mapping[int, int], dims: Dims | None = None) -> Program:
    """`program` rebuilt with class c at size `sizes[c]`; mean counts follow their classes.

    Raises ShrinkError where a fixed class would change size.
    """
    dims = dims or analyse(program)
    for c, s in sizes.items():
        if c in dims.fixed and s != dims.sizes[c]:
            raise ShrinkError(f"dimension d{c} (size {dims.sizes[c]}) cannot be resized")
    nodes = []
    for i, n in enumerate(program.nodes):
        shape = tuple(1 if c is None else int(sizes.get(c, dims.sizes[c])) for c in dims.axes[i])
        params = n.params
        if i in dims.counts:
            classes, is_n = dims.counts[i]
            count = math.prod(int(sizes.get(k, dims.sizes[k])) for k in classes)
            value = np.asarray(count if is_n else 1.0 / count, dtype=n.dtype)
            params = make_params(**{**dict(n.params), "value": Const(value)})
        nodes.append(Node(n.op, n.args, shape, n.dtype, params))
    meta = {**dict(program.meta), "shrunk_from": program.canonical_hash[:12]}
    return Program.build(nodes, program.inputs, program.outputs, meta)
