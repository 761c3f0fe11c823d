"""Degree bounds of a program's field semantics, for the false-accept bound of a verification.

`degree_bound(program)` interprets the program over `DegreeAlgebra`, whose values are
(shape, numerator degree, denominator degree): every tensor element is a rational function of
the random inputs, where exp outputs, uninterpreted outputs (sqrt, logistic, tanh, erf) and
softmax shifts count as fresh variables of degree 1. Rules, all upper bounds:

- a ± b: (max(na + db, nb + da), da + db), or (max(na, nb), 0) for polynomials;
- a · b: (na + nb, da + db); a / b: (na + db, da + nb); a^y likewise, y times;
- a sum of K terms (reduce_sum, the contraction of matmul): polynomials keep their degree; for
  rational terms the common denominator is not assumed, so (n + (K − 1)·d, K·d).

The report also gives the largest (num + den) degree of any exp argument (exponent collisions
mod q) and of any uninterpreted argument (collisions of distinct arguments mod p).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fields.numbers import FieldSemanticsError
from lax_ir.ops import broadcast_shapes, matmul_shape


@dataclass(frozen=True)
class Deg:
    """An abstract tensor: its shape and the degrees of its elements' numerator/denominator."""

    shape: tuple[int, ...]
    num: int
    den: int = 0

    @property
    def total(self) -> int:
        return self.num + self.den


@dataclass(frozen=True)
class DegreeReport:
    """Degree bounds of one program.

    Arguments:
        output: largest (num + den) degree over all outputs.
        exponent: largest (num + den) degree of an exp argument (0 without exp).
        uninterpreted: largest (num + den) degree of an uninterpreted function's argument.
    """

    output: int
    exponent: int = 0
    uninterpreted: int = 0


def _add(a: Deg, b: Deg, shape: tuple[int, ...]) -> Deg:
    if a.den == 0 and b.den == 0:
        return Deg(shape, max(a.num, b.num))
    return Deg(shape, max(a.num + b.den, b.num + a.den), a.den + b.den)


def _sum(x: Deg, count: int, shape: tuple[int, ...]) -> Deg:
    if x.den == 0 or count <= 1:
        return Deg(shape, x.num, x.den)
    return Deg(shape, x.num + (count - 1) * x.den, count * x.den)


class DegreeAlgebra:
    """The `lax_ir.Algebra` of degree bounds (see the module docstring)."""

    def __init__(self) -> None:
        self.exponent = 0
        self.uninterpreted = 0

    def constant(self, value: Any, dtype: str) -> Deg:
        return Deg(tuple(getattr(value, "shape", ())), 0)

    def add(self, a: Deg, b: Deg) -> Deg:
        return _add(a, b, broadcast_shapes(a.shape, b.shape))

    sub = add

    def mul(self, a: Deg, b: Deg) -> Deg:
        return Deg(broadcast_shapes(a.shape, b.shape), a.num + b.num, a.den + b.den)

    def div(self, a: Deg, b: Deg) -> Deg:
        return Deg(broadcast_shapes(a.shape, b.shape), a.num + b.den, a.den + b.num)

    def neg(self, a: Deg) -> Deg:
        return a

    def exp(self, a: Deg) -> Deg:
        self.exponent = max(self.exponent, a.total)
        return Deg(a.shape, 1)

    def unary(self, name: str, a: Deg) -> Deg:
        self.uninterpreted = max(self.uninterpreted, a.total)
        return Deg(a.shape, 1)

    def integer_pow(self, a: Deg, y: int) -> Deg:
        if y >= 0:
            return Deg(a.shape, y * a.num, y * a.den)
        return Deg(a.shape, -y * a.den, -y * a.num)

    def max(self, a: Deg, b: Deg) -> Deg:
        raise FieldSemanticsError("max has no field meaning")

    def matmul(self, a: Deg, b: Deg, dtype: str) -> Deg:
        shape = matmul_shape(a.shape, b.shape)
        term = Deg(shape, a.num + b.num, a.den + b.den)
        return _sum(term, a.shape[-1], shape)

    def reduce_sum(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        axes_set = {ax % len(a.shape) for ax in axes}
        shape = tuple(d for i, d in enumerate(a.shape) if i not in axes_set)
        return _sum(a, math.prod(a.shape[i] for i in axes_set), shape)

    def reduce_max(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        raise FieldSemanticsError("reduce_max has no field meaning unless it is a softmax shift")

    def shift_max(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        axes_set = {ax % len(a.shape) for ax in axes}
        return Deg(tuple(d for i, d in enumerate(a.shape) if i not in axes_set), 1)

    def broadcast_in_dim(
        self, a: Deg, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
    ) -> Deg:
        return Deg(tuple(shape), a.num, a.den)

    def reshape(self, a: Deg, shape: tuple[int, ...]) -> Deg:
        return Deg(tuple(shape), a.num, a.den)

    def transpose(self, a: Deg, permutation: tuple[int, ...]) -> Deg:
        return Deg(tuple(a.shape[i] for i in permutation), a.num, a.den)

    def concatenate(self, xs: Sequence[Deg], axis: int) -> Deg:
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return Deg(tuple(shape), max(x.num for x in xs), max(x.den for x in xs))

    def convert(self, a: Deg, dtype: str) -> Deg:
        return a

    def opaque(self, node: Any, args: Sequence[Any]) -> Any:
        payload = node.param("payload") if hasattr(node, "param") else None
        name = getattr(getattr(payload, "primitive", None), "name", repr(payload))
        raise FieldSemanticsError(f"opaque primitive {name!r} has no field meaning")


def degree_bound(program: Any) -> DegreeReport:
    """Degree bounds of anything with `input_avals` and `interpret(inputs, algebra)`."""
    algebra = DegreeAlgebra()
    inputs = [Deg(tuple(shape), 1) for shape, _ in program.input_avals]
    outputs = program.interpret(inputs, algebra)
    return DegreeReport(
        output=max((o.total for o in outputs), default=0),
        exponent=algebra.exponent,
        uninterpreted=algebra.uninterpreted,
    )
