"""The block-op vocabulary of a region: which block ops (with which params) the search tries.

The op records decide (`SearchProps.offer` in `mugraph/ops.py`); this module gathers the
region's facts and asks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage_jax.mugraph.opdef import Facts
from mirage_jax.mugraph.ops import NARROW_FLOATS as NARROW
from mirage_jax.mugraph.ops import OPS
from mirage_jax.search import expr as E


@dataclass(frozen=True)
class Vocabulary:
    """The block ops (with params) to try, derived from the region's own ops."""

    unary: tuple[tuple[str, tuple], ...]
    binary: tuple[str, ...]
    reduce_dims: frozenset  # dimensions a block reduce_sum may sum
    row_sum_dims: frozenset  # ... of them, those it may sum along a tile's last axis too
    shift_dims: frozenset  # dimensions a softmax shift (reduce_max) is taken over
    shifts: bool
    accumulators: tuple[tuple[str, tuple], ...]
    concat_matmul: bool
    matmul: bool

    @property
    def square(self) -> bool:
        return any(name == "square" for name, _ in self.unary)

    @property
    def max_arity(self) -> int:
        if self.concat_matmul:
            return 4
        return 3 if self.shifts else 2


def fused_cover(program: Any, terms: Sequence[Any], facts: Facts) -> frozenset[int]:
    """The nodes that only compute the pattern of a fused op (`SearchProps.fused`: gelu's erf,
    its ½ and 1/√2, its 1 − ·; silu's logistic): where an offered fused op applied to node a's
    term is node b's term, the nodes strictly between a and b whose users all lie between them
    or are b. The vocabulary leaves them out: the fused op says them in one block op."""
    nodes, users = program.nodes, program.users
    first: dict[Any, int] = {}
    for i, n in enumerate(nodes):
        if terms[i] is not None and n.op != "constant":
            first.setdefault(terms[i], i)
    covered: set[int] = set()
    for op in OPS.values():
        if not op.search.fused or op.search.offer is None:
            continue
        for params in op.search.offer(facts):
            for a, n in enumerate(nodes):
                if terms[a] is None or n.op == "constant":
                    continue
                b = first.get(E.elementwise(op.name, terms[a], dict(params)))
                if b is None or b <= a:
                    continue
                inner = _between(nodes, a, b)
                if inner and all(set(users[j]) <= inner | {b} for j in inner):
                    covered |= inner
    return frozenset(covered)


def _between(nodes: Sequence[Any], a: int, b: int) -> set[int] | None:
    """The non-constant nodes b depends on through paths that start at a (a and b excluded),
    or None where b also depends on another value (not a fused op of a alone)."""
    inner: set[int] = set()
    stack = list(nodes[b].args)
    while stack:
        i = stack.pop()
        if i == a or i in inner or nodes[i].op == "constant":
            continue
        if nodes[i].op == "input":
            return None
        inner.add(i)
        stack.extend(nodes[i].args)
    return inner


def build_vocabulary(
    program: Any,
    dims: Any,
    scalars: dict[str, list[float]],
    combine: bool = False,
    terms: Sequence[Any] | None = None,
) -> Vocabulary:
    """The block-op vocabulary of a region: what the op records offer for its facts.

    The region's facts (`Facts`: its ops, whether it squares a value and in which dtype, its
    scalar constants, the epsilons its norms may add, the 1/n of its means over non-last axes)
    are offered to every record (`SearchProps.offer`). A block `reduce_sum` is offered only
    over dimensions the program sums over other than the last axis of its operand (a last-axis
    sum is an `accum_*_last`, or inside `rms_norm`), along the last axis too over dimensions no
    matmul of the region contracts (a softmax or a centring on its own or after a matmul, as an
    LM head's: no fused op says those), and `reduce_max` only over the dimensions the
    program's softmax shifts are taken over. With the program's `terms`, the nodes a fused
    op covers (`fused_cover`) add nothing but that op: Gemma's gelu no longer brings `sub`,
    `layer_norm` and its constants, which multiplied the search's enumeration.
    """
    reduce_dims, row_sum_dims, shift_dims = _reduced_dims(program, dims)
    facts = _facts(program, dims, scalars, combine, reduce_dims)
    skip = fused_cover(program, terms, facts) if terms is not None else frozenset()
    trimmed = (
        _facts(program, dims, E.scalar_constants(program, dims, skip), combine, reduce_dims, skip)
        if skip
        else facts
    )
    unary: list[tuple[str, tuple]] = []
    binary: list[str] = []
    accs: list[tuple[str, tuple]] = []
    for op in OPS.values():
        if op.search.offer is None:
            continue
        offered = op.search.offer(facts if op.search.fused else trimmed)
        offers = [(op.name, params) for params in offered]
        if op.kind == "accum":
            accs += offers
        elif op.arity == 2:
            binary += [name for name, _ in offers]
        else:
            unary += offers
    return Vocabulary(
        unary=tuple(unary),
        binary=tuple(binary),
        reduce_dims=frozenset(reduce_dims),
        row_sum_dims=frozenset(row_sum_dims),
        shift_dims=frozenset(shift_dims),
        shifts="reduce_max" in facts.features,
        accumulators=tuple(accs),
        concat_matmul=_adds_matmuls(program),
        matmul="matmul" in facts.features,
    )


def _reduced_dims(program: Any, dims: Any) -> tuple[set, set, set]:
    """(dimensions a block `reduce_sum` may sum, those of them it may sum along a tile's last
    axis, softmax shift dimensions). A sum over an operand's last axis counts only where no
    matmul of the program contracts its dimension: a contracted dimension's row sums are the
    norms' (`accum_*_last`, `rms_norm`), and offering them multiplies a norm + GEMM region's
    enumeration; a softmax or centring over a matmul's columns (an LM head's) has no other
    way to be said."""
    contracted = {dims.axes[n.args[0]][-1] for _, n in program.ops() if n.op == "matmul"}
    reduce_dims, row_sum_dims, shift_dims = set(), set(), set()
    for _, n in program.ops():
        if n.op in ("reduce_sum", "reduce_max"):
            src = dims.axes[n.args[0]]
            for ax in n.param("axes"):
                if src[ax] is None:
                    continue
                if n.op == "reduce_max":
                    shift_dims.add(src[ax])
                elif ax != len(src) - 1:
                    reduce_dims.add(src[ax])
                elif src[ax] not in contracted:
                    reduce_dims.add(src[ax])
                    row_sum_dims.add(src[ax])
    return reduce_dims, row_sum_dims, shift_dims


def _facts(
    program: Any,
    dims: Any,
    scalars: dict[str, list[float]],
    combine: bool,
    reduce_dims: set,
    skip: frozenset[int] = frozenset(),
) -> Facts:
    """The region's facts for the op records' offers, from its nodes not in `skip`
    (`reduce_dims`: `_reduced_dims`' first)."""
    ops = [(i, n) for i, n in program.ops() if i not in skip]
    features = {n.op for _, n in ops}
    squares = [
        n
        for _, n in ops
        if (n.op == "mul" and n.args[0] == n.args[1])
        or (n.op == "integer_pow" and n.param("y") == 2)
    ]
    if squares:
        features.add("square")
    # a norm squares as the program does: rounded to a 16-bit float where it squares in one
    square_dtypes = tuple(sorted({n.dtype if n.dtype in NARROW else None for n in squares},
                                 key=str)) or (None,)  # fmt: skip
    # the 1/n of a mean over a non-last axis (exact when n is a power of two)
    counted = {k for classes, _ in dims.counts.values() for k in classes}
    inv_sizes = tuple(
        k for k in sorted(reduce_dims & counted) if dims.sizes[k] & (dims.sizes[k] - 1) == 0
    )
    narrow = {n.dtype for _, n in ops if n.dtype in NARROW}
    return Facts(
        features=frozenset(features),
        mul_scalars=tuple(scalars["mul"]),
        wide_scalars=tuple(
            x for x in scalars["mul"] if any(float(np.asarray(x, dtype=d)) != x for d in narrow)
        ),
        add_scalars=tuple(scalars["add"]),
        inv_sizes=inv_sizes,
        eps=(None, *(s for s in scalars["add"] if 0 < s < 1e-2)),
        square_dtypes=square_dtypes,
        combine=combine,
    )


def _adds_matmuls(program: Any) -> bool:
    """Does the program add two matmul results (what concat_matmul fuses, as in LoRA)?"""
    nodes = program.nodes

    def from_matmul(i: int) -> bool:
        while nodes[i].op in ("convert", "broadcast_in_dim", "reshape"):
            i = nodes[i].args[0]
        return nodes[i].op == "matmul"

    return any(n.op == "add" and all(from_matmul(a) for a in n.args) for _, n in program.ops())
