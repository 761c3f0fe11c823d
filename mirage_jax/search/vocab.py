"""The block-op vocabulary of a region: which block ops (with which params) the search tries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    """The block-op vocabulary of a region: the ops its own ops suggest.

    A block `reduce_sum` is offered only over dimensions the program sums over other than the
    last axis of its operand (a last-axis sum is an `accum_*_last`, or inside `rms_norm`), and
    `reduce_max` only over the dimensions the program's softmax shifts are taken over.
    """
    ops = set(program.op_counts())
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
    unary: list[tuple[str, tuple]] = []
    has_square = any(
        (n.op == "mul" and n.args[0] == n.args[1]) or (n.op == "integer_pow" and n.param("y") == 2)
        for _, n in program.ops()
    )
    if "exp" in ops:
        unary.append(("exp", ()))
    if has_square:
        unary.append(("square", ()))
    if "sqrt" in ops:
        unary.append(("sqrt", ()))
    if "logistic" in ops:
        unary += [("sigmoid", ()), ("silu", ())]
    for s in scalars["mul"]:
        unary.append(("mul_scalar", (("scalar", s),)))
    for s in scalars["add"]:
        unary.append(("add_scalar", (("scalar", s),)))
    # the 1/n of a mean over a non-last axis (exact when n is a power of two)
    counted = {k for classes, _ in dims.counts.values() for k in classes}
    for k in sorted(reduce_dims & counted):
        if dims.sizes[k] & (dims.sizes[k] - 1) == 0:
            unary.append(("mul_scalar", (("scalar", ("inv_size", k)),)))
    eps_values = [None] + [s for s in scalars["add"] if 0 < s < 1e-2]
    if "sqrt" in ops and has_square and "reduce_sum" in ops:
        for eps in eps_values:
            unary.append(("rms_norm", (("eps", eps),) if eps else ()))
    binary = tuple(
        b for b in ("mul", "div", "add", "sub") if b in ops or (b == "sub" and "neg" in ops)
    )
    accs: list[tuple[str, tuple]] = [("accum_sum", ())]
    if "reduce_sum" in ops or "matmul" in ops:
        accs.append(("accum_sum_last", ()))
    if "reduce_sum" in ops and "div" in ops:
        accs.append(("accum_mean_last", ()))
    if "sqrt" in ops and has_square:
        for eps in eps_values:
            accs.append(("accum_rms_last", (("eps", eps),) if eps else ()))
    shifts = "reduce_max" in ops
    if shifts:
        accs += [("accum_max", ())]
    if combine:
        accs = [("accum_sum", ()), ("accum_sum_last", ()), ("accum_sum_todimx", ())]
        if shifts:
            accs.append(("accum_max", ()))
    return Vocabulary(
        unary=tuple(unary),
        binary=binary,
        reduce_dims=frozenset(reduce_dims),
        shift_dims=frozenset(shift_dims),
        shifts=shifts,
        accumulators=tuple(accs),
        concat_matmul=_adds_matmuls(program),
        matmul="matmul" in ops,
    )


def _adds_matmuls(program: Any) -> bool:
    """Does the program add two matmul results (what concat_matmul fuses, as in LoRA)?"""
    nodes = program.nodes

    def from_matmul(i: int) -> bool:
        while nodes[i].op in ("convert", "broadcast_in_dim", "reshape"):
            i = nodes[i].args[0]
        return nodes[i].op == "matmul"

    return any(n.op == "add" and all(from_matmul(a) for a in n.args) for _, n in program.ops())
