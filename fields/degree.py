"""Degree bounds of a program's field semantics, for the false-accept bound of a verification.

`degree_bound(program)` interprets the program over `DegreeAlgebra`. Every tensor element is a
rational function num/den of the random inputs, where exp outputs, uninterpreted outputs (sqrt,
logistic, tanh, erf) and softmax shifts count as fresh variables of degree 1; an abstract value
records the degrees of num and den, and the axes along which the element's expression (`var`)
and its denominator (`den_var`) may change. Rules, all upper bounds:

- a ± b: (max(na + db, nb + da), da + db), or (max(na, nb), 0) for polynomials;
- a · b: (na + nb, da + db); a / b: (na + db, da + nb); a^y likewise, y times;
- a sum of K terms (reduce_sum, the contraction of matmul): if the denominator does not change
  along the summed axis (a norm broadcast along it: x / rms(x) summed over x's row) the sum
  keeps it, (n, d); otherwise the K denominators multiply, (n + (K − 1)·d, K·d).

So rms_norm(X) @ W has degree 3 and attention's (E / ΣE) @ V degree 3, not thousands. The
report also gives the largest (num + den) degree of any exp argument (exponent collisions
mod q) and of any uninterpreted argument (collisions of distinct arguments mod p).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fields.numbers import FieldSemanticsError
from lax_ir.ops import broadcast_shapes, matmul_shape

Axes = frozenset[int]
NONE: Axes = frozenset()


@dataclass(frozen=True)
class Deg:
    """An abstract tensor: shape, numerator/denominator degrees, and the axes they vary along."""

    shape: tuple[int, ...]
    num: int
    den: int = 0
    var: Axes = NONE
    den_var: Axes = NONE

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
    constants: tuple[float, ...] = ()
    """Distinct constant values the program uses (at most `MAX_CONSTANTS`; see `many_constants`)."""
    many_constants: bool = False


MAX_CONSTANTS = 64
"""Distinct constants tracked per program for the aliasing term of the bound."""


def _all(shape: Sequence[int]) -> Axes:
    return frozenset(i for i, d in enumerate(shape) if d > 1)


def _aligned(x: Deg, shape: tuple[int, ...]) -> tuple[Axes, Axes]:
    """x's var and den_var as axes of the (numpy-broadcast) result shape."""
    off = len(shape) - len(x.shape)

    def move(axes: Axes) -> Axes:
        return frozenset(i + off for i in axes if x.shape[i] > 1)

    return move(x.var), move(x.den_var)


def _sum(x: Deg, summed: Axes, count: int) -> tuple[int, int]:
    """(num, den) of a sum of `count` elements of x along the axes `summed`."""
    if x.den == 0 or count <= 1 or not (x.den_var & summed):
        return x.num, x.den
    return x.num + (count - 1) * x.den, count * x.den


def _drop(axes: Axes, removed: Axes) -> Axes:
    return frozenset(i - sum(r < i for r in removed) for i in axes if i not in removed)


def _reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs (old axes, new axes) of a row-major reshape whose sizes multiply alike."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [], []
        po = pn = 1
        while True:
            if po <= pn and i < len(old):
                po *= old[i]
                gi.append(i)
                i += 1
            elif j < len(new):
                pn *= new[j]
                gj.append(j)
                j += 1
            else:
                break
            if po == pn and (i == len(old) or old[i] != 1) and (j == len(new) or new[j] != 1):
                break
        groups.append((gi, gj))
    return groups


def _reshaped(axes: Axes, old: Sequence[int], new: Sequence[int]) -> Axes:
    out: set[int] = set()
    for gi, gj in _reshape_groups(old, new):
        if axes & set(gi):
            out.update(j for j in gj if new[j] > 1)
    return frozenset(out)


class DegreeAlgebra:
    """The `lax_ir.Algebra` of degree bounds (see the module docstring)."""

    def __init__(self) -> None:
        self.constants: set[float] = set()
        self.exponent = 0
        self.uninterpreted = 0

    def constant(self, value: Any, dtype: str) -> Deg:
        arr = np.asarray(value)
        if arr.dtype.kind in "fiu" and len(self.constants) <= MAX_CONSTANTS:
            self.constants.update(
                float(v) for v in np.unique(arr.astype(np.float64))[: MAX_CONSTANTS + 1]
            )
        varies = frozenset(
            i for i in range(arr.ndim) if arr.shape[i] > 1 and not (arr == arr.take([0], i)).all()
        )
        return Deg(arr.shape, 0, 0, varies)

    def _binary(self, a: Deg, b: Deg, num: int, den: int, den_from_b: bool) -> Deg:
        shape = broadcast_shapes(a.shape, b.shape)
        av, ad = _aligned(a, shape)
        bv, bd = _aligned(b, shape)
        den_var = (ad | bv) if den_from_b else (ad | bd)
        return Deg(shape, num, den, av | bv, den_var if den else NONE)

    def add(self, a: Deg, b: Deg) -> Deg:
        if a.den == 0 and b.den == 0:
            return self._binary(a, b, max(a.num, b.num), 0, False)
        return self._binary(a, b, max(a.num + b.den, b.num + a.den), a.den + b.den, False)

    sub = add

    def mul(self, a: Deg, b: Deg) -> Deg:
        return self._binary(a, b, a.num + b.num, a.den + b.den, False)

    def div(self, a: Deg, b: Deg) -> Deg:
        # the new denominator is a.den · b.num, which varies where a.den or b (if not constant) does
        return self._binary(a, b, a.num + b.den, a.den + b.num, b.num > 0)

    def neg(self, a: Deg) -> Deg:
        return a

    def _fresh(self, shape: tuple[int, ...], var: Axes) -> Deg:
        return Deg(shape, 1, 0, var)

    def exp(self, a: Deg) -> Deg:
        self.exponent = max(self.exponent, a.total)
        return self._fresh(a.shape, a.var)

    def unary(self, name: str, a: Deg) -> Deg:
        self.uninterpreted = max(self.uninterpreted, a.total)
        return self._fresh(a.shape, a.var)

    def integer_pow(self, a: Deg, y: int) -> Deg:
        if y >= 0:
            return Deg(a.shape, y * a.num, y * a.den, a.var, a.den_var)
        return Deg(a.shape, -y * a.den, -y * a.num, a.var, a.var if a.num else NONE)

    def max(self, a: Deg, b: Deg) -> Deg:
        raise FieldSemanticsError("max has no field meaning")

    def matmul(self, a: Deg, b: Deg, dtype: str) -> Deg:
        shape = matmul_shape(a.shape, b.shape)
        # the products a[..., M, K, 1] · b[..., 1, K, N] live on [..., M, K, N]; sum over K
        k_axis = len(shape) - 1
        prod_shape = (*shape[:-2], a.shape[-2], a.shape[-1], b.shape[-1])
        a3 = Deg((*a.shape, 1), a.num, a.den, a.var, a.den_var)
        at = len(b.shape) - 2
        b3 = Deg(
            (*b.shape[:-2], 1, *b.shape[-2:]),
            b.num,
            b.den,
            _insert(b.var, at),
            _insert(b.den_var, at),
        )
        av, ad = _aligned(a3, prod_shape)
        bv, bd = _aligned(b3, prod_shape)
        term = Deg(prod_shape, a.num + b.num, a.den + b.den, av | bv, ad | bd)
        num, den = _sum(term, frozenset({k_axis}), a.shape[-1])
        k = frozenset({k_axis})
        return Deg(shape, num, den, _drop(term.var, k), _drop(term.den_var, k) if den else NONE)

    def reduce_sum(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        summed = frozenset(ax % len(a.shape) for ax in axes)
        shape = tuple(d for i, d in enumerate(a.shape) if i not in summed)
        num, den = _sum(a, summed, math.prod(a.shape[i] for i in summed))
        return Deg(shape, num, den, _drop(a.var, summed), _drop(a.den_var, summed) if den else NONE)

    def reduce_max(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        raise FieldSemanticsError("reduce_max has no field meaning unless it is a softmax shift")

    def shift_max(self, a: Deg, axes: tuple[int, ...]) -> Deg:
        summed = frozenset(ax % len(a.shape) for ax in axes)
        shape = tuple(d for i, d in enumerate(a.shape) if i not in summed)
        return self._fresh(shape, _all(shape))

    def broadcast_in_dim(
        self, a: Deg, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
    ) -> Deg:
        def move(axes: Axes) -> Axes:
            return frozenset(broadcast_dimensions[i] for i in axes if a.shape[i] > 1)

        return Deg(tuple(shape), a.num, a.den, move(a.var), move(a.den_var))

    def reshape(self, a: Deg, shape: tuple[int, ...]) -> Deg:
        shape = tuple(shape)
        return Deg(
            shape,
            a.num,
            a.den,
            _reshaped(a.var, a.shape, shape),
            _reshaped(a.den_var, a.shape, shape),
        )

    def transpose(self, a: Deg, permutation: tuple[int, ...]) -> Deg:
        inverse = {src: dst for dst, src in enumerate(permutation)}
        return Deg(
            tuple(a.shape[i] for i in permutation),
            a.num,
            a.den,
            frozenset(inverse[i] for i in a.var),
            frozenset(inverse[i] for i in a.den_var),
        )

    def concatenate(self, xs: Sequence[Deg], axis: int) -> Deg:
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        den = max(x.den for x in xs)
        var = frozenset().union(*(x.var for x in xs)) | {axis}
        den_var = frozenset().union(*(x.den_var for x in xs)) | {axis} if den else NONE
        return Deg(tuple(shape), max(x.num for x in xs), den, var, den_var)

    def convert(self, a: Deg, dtype: str) -> Deg:
        return a

    def opaque(self, node: Any, args: Sequence[Any]) -> Any:
        payload = node.param("payload") if hasattr(node, "param") else None
        name = getattr(getattr(payload, "primitive", None), "name", repr(payload))
        raise FieldSemanticsError(f"opaque primitive {name!r} has no field meaning")


def _insert(axes: Axes, at: int) -> Axes:
    """Axes after inserting a new axis at position `at`."""
    return frozenset(i + 1 if i >= at else i for i in axes)


def degree_bound(program: Any) -> DegreeReport:
    """Degree bounds of anything with `input_avals` and `interpret(inputs, algebra)`."""
    algebra = DegreeAlgebra()
    inputs = [Deg(tuple(shape), 1, 0, _all(shape)) for shape, _ in program.input_avals]
    outputs = program.interpret(inputs, algebra)
    consts = sorted(algebra.constants)
    return DegreeReport(
        output=max((o.total for o in outputs), default=0),
        exponent=algebra.exponent,
        uninterpreted=algebra.uninterpreted,
        constants=tuple(consts[:MAX_CONSTANTS]),
        many_constants=len(consts) > MAX_CONSTANTS,
    )
