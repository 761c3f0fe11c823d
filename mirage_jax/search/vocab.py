"""The block-op vocabulary of a region: which block ops (with which params) the search tries.

The op records decide (`SearchProps.offer` in `mugraph/ops.py`); this module gathers the
region's facts and asks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mirage_jax.mugraph.opdef import Facts
from mirage_jax.mugraph.ops import NARROW_FLOATS as NARROW
from mirage_jax.mugraph.ops import OPS


@dataclass(frozen=True)
class Vocabulary:
    """The block ops (with params) to try, derived from the region's own ops."""

    unary: tuple[tuple[str, tuple], ...]
    binary: tuple[str, ...]
    reduce_dims: frozenset  # dimensions a block reduce_sum may sum (non-last axes only)
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


def build_vocabulary(
    program: Any, dims: Any, scalars: dict[str, list[float]], combine: bool = False
) -> Vocabulary:
    """The block-op vocabulary of a region: what the op records offer for its facts.

    The region's facts (`Facts`: its ops, whether it squares a value and in which dtype, its
    scalar constants, the epsilons its norms may add, the 1/n of its means over non-last axes)
    are offered to every record (`SearchProps.offer`). A block `reduce_sum` is offered only
    over dimensions the program sums over other than the last axis of its operand (a last-axis
    sum is an `accum_*_last`, or inside `rms_norm`), and `reduce_max` only over the dimensions
    the program's softmax shifts are taken over.
    """
    reduce_dims, shift_dims = set(), set()
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
    features = set(program.op_counts())
    squares = [
        n
        for _, n in program.ops()
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
    facts = Facts(
        features=frozenset(features),
        mul_scalars=tuple(scalars["mul"]),
        add_scalars=tuple(scalars["add"]),
        inv_sizes=inv_sizes,
        eps=(None, *(s for s in scalars["add"] if 0 < s < 1e-2)),
        square_dtypes=square_dtypes,
        combine=combine,
    )
    unary: list[tuple[str, tuple]] = []
    binary: list[str] = []
    accs: list[tuple[str, tuple]] = []
    for op in OPS.values():
        if op.search.offer is None:
            continue
        offers = [(op.name, params) for params in op.search.offer(facts)]
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
        shift_dims=frozenset(shift_dims),
        shifts="reduce_max" in features,
        accumulators=tuple(accs),
        concat_matmul=_adds_matmuls(program),
        matmul="matmul" in features,
    )


def _adds_matmuls(program: Any) -> bool:
    """Does the program add two matmul results (what concat_matmul fuses, as in LoRA)?"""
    nodes = program.nodes

    def from_matmul(i: int) -> bool:
        while nodes[i].op in ("convert", "broadcast_in_dim", "reshape"):
            i = nodes[i].args[0]
        return nodes[i].op == "matmul"

    return any(n.op == "add" and all(from_matmul(a) for a in n.args) for _, n in program.ops())
