"""`FieldAlgebra`: the finite-field semantics of every lax_ir op (the `lax_ir.Algebra` protocol).

One instance is one trial: it carries the key of the uninterpreted functions (so both programs
of a verification see the same random sqrt, logistic, tanh, erf) and the RNG of the softmax
shifts (so each program's shifts are independent draws, and only shift-invariant results
agree). Semantics per op:

- add, sub, mul, neg: componentwise in Z_p and Z_q. div: multiply by the inverse; a zero
  p-denominator, or a zero q-denominator where q is valid, makes the trial void (`VoidTrial`).
  Division of integer dtypes truncates in JAX and has no field meaning.
- exp(x) = (ω^(x.q) mod p, invalid q): exponents add mod q, so exp(x+y) = exp(x)·exp(y).
- sqrt, logistic, tanh, erf: a keyed random function of the p-residue (fresh residues in both
  components), shared by both programs of a trial.
- shift_max (a max used only as a softmax shift): fresh random values per output element.
  reduce_max and max used otherwise, and opaque primitives, raise `FieldSemanticsError`.
- integer_pow: exact power; a negative power inverts (zero base: void).
- matmul, reduce_sum: exact mod p and mod q; shape ops act on both components.
- convert: the identity, except float→int/bool (truncation) and narrowing int conversions
  (wrap-around), which have no field meaning.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from fields.numbers import (
    Field,
    FieldArray,
    FieldSemanticsError,
    _Lazy,
    add_mod,
    default_field,
    exp_mod,
    inv_mod,
    keyed_hash,
    lazy,
    matmul_mod,
    mul_mod,
    neg_mod,
    pow_mod,
    reduce_sum_mod,
    split_first,
    sub_mod,
    to_residues,
)

UNINTERPRETED = ("sqrt", "logistic", "tanh", "erf")


def _kind(dtype: str) -> str:
    if dtype == "bfloat16":
        return "f"
    return np.dtype(dtype).kind


class FieldAlgebra:
    """Finite-field semantics for one trial.

    Arguments:
        field: the moduli (default: `fields.default_field()`).
        key: the key of the uninterpreted functions (shared by both programs of a trial).
        rng: the generator the softmax shifts are drawn from.
    """

    def __init__(
        self,
        field: Field | None = None,
        *,
        key: int = 0,
        rng: np.random.Generator | None = None,
    ):
        self.field = field or default_field()
        self.key = int(key)
        self.rng = rng if rng is not None else np.random.default_rng(self.key & (2**63 - 1))

    # ---- leaves
    def constant(self, value: np.ndarray, dtype: str) -> FieldArray:
        f = self.field
        arr = np.asarray(value)
        p = to_residues(arr, f.p)
        return FieldArray(p, _Lazy(lambda: to_residues(arr, f.q)), dtype)

    # ---- elementwise
    def _binary(self, a: FieldArray, b: FieldArray, fn: Any) -> FieldArray:
        f = self.field
        return FieldArray(fn(a.p, b.p, f.p), lazy(lambda x, y: fn(x, y, f.q), a, b), a.dtype)

    def add(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(a, b, add_mod)

    def sub(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(a, b, sub_mod)

    def mul(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(a, b, mul_mod)

    def div(self, a: FieldArray, b: FieldArray) -> FieldArray:
        if _kind(a.dtype) in "iub" or _kind(b.dtype) in "iub":
            raise FieldSemanticsError(
                f"div of {a.dtype} by {b.dtype}: integer division truncates and has no field meaning"
            )
        f = self.field
        p = mul_mod(a.p, inv_mod(b.p, f.p), f.p)
        # The q-denominator is checked (VoidTrial) when the quotient's q is needed, if ever.
        q = lazy(lambda x, y: mul_mod(x, inv_mod(y, f.q), f.q), a, b)
        return FieldArray(p, q, a.dtype)

    def neg(self, a: FieldArray) -> FieldArray:
        f = self.field
        return FieldArray(neg_mod(a.p, f.p), lazy(lambda x: neg_mod(x, f.q), a), a.dtype)

    def exp(self, a: FieldArray) -> FieldArray:
        if not a.q_valid:
            raise FieldSemanticsError("exp nested inside exp has no field meaning")
        return FieldArray(exp_mod(a.q, self.field), None, a.dtype)

    def _name_key(self, name: str) -> int:
        tag = zlib.crc32(name.encode())
        return (self.key ^ (tag * 0x9E3779B97F4A7C15)) & (2**128 - 1)

    def unary(self, name: str, a: FieldArray) -> FieldArray:
        if name not in UNINTERPRETED:
            raise FieldSemanticsError(f"unary op {name!r} has no field meaning")
        f = self.field
        k = self._name_key(name)
        x = a.p
        p = keyed_hash(x, k, f.p)
        q = _Lazy(lambda: keyed_hash(x, k ^ 0x5BD1E995, f.q))
        return FieldArray(p, q, a.dtype)

    def integer_pow(self, a: FieldArray, y: int) -> FieldArray:
        f = self.field
        y = int(y)

        def power(x: np.ndarray, m: int) -> np.ndarray:
            if y < 0:
                return pow_mod(inv_mod(x, m), -y, m)
            return pow_mod(x, y, m)

        return FieldArray(power(a.p, f.p), lazy(lambda x: power(x, f.q), a), a.dtype)

    def max(self, a: FieldArray, b: FieldArray) -> FieldArray:
        raise FieldSemanticsError(
            "max has no field meaning (only a reduce_max used as a softmax shift does)"
        )

    # ---- contractions
    def matmul(self, a: FieldArray, b: FieldArray, dtype: str) -> FieldArray:
        f = self.field
        if split_first(a.shape, b.shape):  # the split operand in int64, the other in float64
            pa, pb = a.p, b.p_float()
        else:
            pa, pb = a.p_float(), b.p
        p = matmul_mod(pa, pb, f.p, a_bound=a.bound, b_bound=b.bound)
        return FieldArray(p, lazy(lambda x, y: matmul_mod(x, y, f.q), a, b), dtype)

    def reduce_sum(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        f = self.field
        axes = tuple(axes)
        p = reduce_sum_mod(a.p, axes, f.p)
        return FieldArray(p, lazy(lambda x: reduce_sum_mod(x, axes, f.q), a), a.dtype)

    def reduce_max(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        raise FieldSemanticsError(
            "reduce_max has no field meaning unless it is a softmax shift (shift=True)"
        )

    def shift_max(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        f = self.field
        shape = tuple(
            d for i, d in enumerate(a.shape) if i not in {ax % len(a.shape) for ax in axes}
        )
        p = self.rng.integers(0, f.p, size=shape, dtype=np.int64)
        q = self.rng.integers(0, f.q, size=shape, dtype=np.int64)
        return FieldArray(p, q, a.dtype)

    # ---- shapes
    def broadcast_in_dim(
        self, a: FieldArray, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
    ) -> FieldArray:
        expanded = [1] * len(shape)
        for src, dst in enumerate(broadcast_dimensions):
            expanded[dst] = a.shape[src]
        shape = tuple(shape)

        def fn(x: np.ndarray) -> np.ndarray:
            return np.broadcast_to(np.reshape(x, expanded), shape)

        return FieldArray(a.map_p(fn), lazy(fn, a), a.dtype, a.bound)

    def reshape(self, a: FieldArray, shape: tuple[int, ...]) -> FieldArray:
        shape = tuple(shape)

        def fn(x: np.ndarray) -> np.ndarray:
            return np.reshape(x, shape)

        return FieldArray(a.map_p(fn), lazy(fn, a), a.dtype, a.bound)

    def transpose(self, a: FieldArray, permutation: tuple[int, ...]) -> FieldArray:
        perm = tuple(permutation)

        def fn(x: np.ndarray) -> np.ndarray:
            return np.transpose(x, perm)

        return FieldArray(a.map_p(fn), lazy(fn, a), a.dtype, a.bound)

    def concatenate(self, xs: Sequence[FieldArray], axis: int) -> FieldArray:
        p = np.concatenate([x.p for x in xs], axis=axis)
        q = lazy(lambda *qs: np.concatenate(qs, axis=axis), *xs)
        bounds = [x.bound for x in xs]
        return FieldArray(p, q, xs[0].dtype, None if None in bounds else max(bounds))

    def convert(self, a: FieldArray, dtype: str) -> FieldArray:
        src, dst = _kind(a.dtype), _kind(dtype)
        if src == "f" and dst in "iub":
            raise FieldSemanticsError(
                f"convert {a.dtype} -> {dtype} truncates and has no field meaning"
            )
        if src in "iu" and dst in "iub" and np.dtype(dtype).itemsize < np.dtype(a.dtype).itemsize:
            raise FieldSemanticsError(
                f"convert {a.dtype} -> {dtype} wraps around and has no field meaning"
            )
        if src in "iu" and dst == "b":
            raise FieldSemanticsError(f"convert {a.dtype} -> bool has no field meaning")
        out = FieldArray.__new__(FieldArray)
        out._p, out._pf, out._q, out.dtype, out.bound = a._p, a._pf, a._q, dtype, a.bound
        return out

    def opaque(self, node: Any, args: Sequence[Any]) -> Any:
        payload = node.param("payload") if hasattr(node, "param") else None
        name = getattr(getattr(payload, "primitive", None), "name", repr(payload))
        raise FieldSemanticsError(f"opaque primitive {name!r} has no field meaning")
