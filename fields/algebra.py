"""`FieldAlgebra`: the finite-field semantics of every lax_ir op (the `lax_ir.Algebra` protocol).

One instance is one trial: it carries the key of the uninterpreted functions (so both programs
of a verification see the same random sqrt, logistic, tanh, erf) and the RNG of the softmax
shifts (so each program's shifts are independent draws, and only shift-invariant results
agree). Values are `FieldArray`s whose components are computed on demand (`fields.array`).
Semantics per op:

- add, sub, mul, neg: componentwise in Z_p and Z_q. div: multiply by the inverse; a zero
  denominator, in the p-component or in a q-component that is needed, makes the trial void
  (`VoidTrial`). Division of integer dtypes truncates in JAX and has no field meaning.
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fields.array import Cell, FieldArray, p_cell, q_cell, raw_p_cell
from fields.numbers import (
    Field,
    FieldSemanticsError,
    add_mod,
    default_field,
    exp_mod,
    inv_mod,
    keyed_hash,
    matmul_mod,
    mul_mod,
    neg_mod,
    pow_mod,
    reduce_sum_mod,
    split_first,
    sub_mod,
    to_residues,
)
from lax_ir.dtypes import is_float
from lax_ir.ops import UNINTERPRETED, broadcast_shapes, matmul_shape

Mod = Callable[..., np.ndarray]


def _kind(dtype: str) -> str:
    """numpy's dtype kind, "f" for every float (bfloat16 and float8 included)."""
    return "f" if is_float(dtype) else np.dtype(dtype).kind


def _reduced(shape: tuple[int, ...], axes: Sequence[int]) -> tuple[int, ...]:
    drop = {ax % len(shape) for ax in axes}
    return tuple(d for i, d in enumerate(shape) if i not in drop)


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

    def _map(
        self, fn: Mod, xs: Sequence[FieldArray], shape: tuple[int, ...], dtype: str
    ) -> FieldArray:
        """fn(*residues, modulus) on both components, on demand."""
        f = self.field
        return FieldArray(
            p_cell(lambda *v: fn(*v, f.p), *xs),
            q_cell(lambda *v: fn(*v, f.q), *xs),
            dtype,
            shape=shape,
        )

    # ---- leaves
    def constant(self, value: np.ndarray, dtype: str) -> FieldArray:
        f = self.field
        arr = np.asarray(value)
        p = Cell(value=to_residues(arr, f.p))  # eager: inf/nan raise where the constant is
        return FieldArray(p, Cell(lambda: to_residues(arr, f.q)), dtype, shape=arr.shape)

    # ---- elementwise
    def _binary(self, fn: Mod, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._map(fn, (a, b), broadcast_shapes(a.shape, b.shape), a.dtype)

    def add(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(add_mod, a, b)

    def sub(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(sub_mod, a, b)

    def mul(self, a: FieldArray, b: FieldArray) -> FieldArray:
        return self._binary(mul_mod, a, b)

    def div(self, a: FieldArray, b: FieldArray) -> FieldArray:
        if _kind(a.dtype) in "iub" or _kind(b.dtype) in "iub":
            raise FieldSemanticsError(
                f"div of {a.dtype} by {b.dtype}: integer division truncates and has no "
                "field meaning"
            )
        return self._binary(lambda x, y, m: mul_mod(x, inv_mod(y, m), m), a, b)

    def neg(self, a: FieldArray) -> FieldArray:
        return self._map(neg_mod, (a,), a.shape, a.dtype)

    def exp(self, a: FieldArray) -> FieldArray:
        if not a.q_valid:
            raise FieldSemanticsError("exp nested inside exp has no field meaning")
        f = self.field
        return FieldArray(Cell(lambda: exp_mod(a.q, f), (a._qc,)), None, a.dtype, shape=a.shape)  # type: ignore[arg-type]

    def _name_key(self, name: str) -> int:
        tag = zlib.crc32(name.encode())
        return (self.key ^ (tag * 0x9E3779B97F4A7C15)) & (2**128 - 1)

    def unary(self, name: str, a: FieldArray) -> FieldArray:
        if name not in UNINTERPRETED:
            raise FieldSemanticsError(f"unary op {name!r} has no field meaning")
        f = self.field
        k = self._name_key(name)
        p = Cell(lambda: keyed_hash(a.p, k, f.p), (a._pc,))
        q = Cell(lambda: keyed_hash(a.p, k ^ 0x5BD1E995, f.q), (a._pc,))
        return FieldArray(p, q, a.dtype, shape=a.shape)

    def integer_pow(self, a: FieldArray, y: int) -> FieldArray:
        y = int(y)

        def power(x: np.ndarray, m: int) -> np.ndarray:
            return pow_mod(inv_mod(x, m), -y, m) if y < 0 else pow_mod(x, y, m)

        return self._map(power, (a,), a.shape, a.dtype)

    def max(self, a: FieldArray, b: FieldArray) -> FieldArray:
        raise FieldSemanticsError(
            "max has no field meaning (only a reduce_max used as a softmax shift does)"
        )

    # ---- contractions
    def matmul(self, a: FieldArray, b: FieldArray, dtype: str) -> FieldArray:
        f = self.field
        split_a = split_first(a.shape, b.shape)

        def p_side() -> np.ndarray:  # the split operand in int64, the other in float64
            pa, pb = (a.p, b.p_float()) if split_a else (a.p_float(), b.p)
            return matmul_mod(pa, pb, f.p, a_bound=a.bound, b_bound=b.bound)

        return FieldArray(
            Cell(p_side, (a._pc, b._pc)),
            q_cell(lambda x, y: matmul_mod(x, y, f.q), a, b),
            dtype,
            shape=matmul_shape(a.shape, b.shape),
        )

    def reduce_sum(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        axes = tuple(axes)
        return self._map(
            lambda x, m: reduce_sum_mod(x, axes, m), (a,), _reduced(a.shape, axes), a.dtype
        )

    def reduce_max(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        raise FieldSemanticsError(
            "reduce_max has no field meaning unless it is a softmax shift (shift=True)"
        )

    def shift_max(self, a: FieldArray, axes: tuple[int, ...]) -> FieldArray:
        f = self.field
        shape = _reduced(a.shape, axes)
        p = self.rng.integers(0, f.p, size=shape, dtype=np.int64)
        q = self.rng.integers(0, f.q, size=shape, dtype=np.int64)
        return FieldArray(p, q, a.dtype)

    # ---- shapes
    def _reshaped(self, a: FieldArray, fn: Callable[[np.ndarray], np.ndarray], shape) -> FieldArray:
        return FieldArray(raw_p_cell(fn, a), q_cell(fn, a), a.dtype, a.bound, tuple(shape))

    def broadcast_in_dim(
        self, a: FieldArray, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
    ) -> FieldArray:
        shape = tuple(shape)
        expanded = [1] * len(shape)
        for src, dst in enumerate(broadcast_dimensions):
            expanded[dst] = a.shape[src]
        return self._reshaped(a, lambda x: np.broadcast_to(np.reshape(x, expanded), shape), shape)

    def reshape(self, a: FieldArray, shape: tuple[int, ...]) -> FieldArray:
        shape = tuple(shape)
        return self._reshaped(a, lambda x: np.reshape(x, shape), shape)

    def transpose(self, a: FieldArray, permutation: tuple[int, ...]) -> FieldArray:
        perm = tuple(permutation)
        shape = tuple(a.shape[i] for i in perm)
        return self._reshaped(a, lambda x: np.transpose(x, perm), shape)

    def concatenate(self, xs: Sequence[FieldArray], axis: int) -> FieldArray:
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        bounds = [x.bound for x in xs]
        return FieldArray(
            p_cell(lambda *v: np.concatenate(v, axis=axis), *xs),
            q_cell(lambda *v: np.concatenate(v, axis=axis), *xs),
            xs[0].dtype,
            None if None in bounds else max(b for b in bounds if b is not None),
            tuple(shape),
        )

    def convert(self, a: FieldArray, dtype: str) -> FieldArray:
        src, dst = _kind(a.dtype), _kind(dtype)
        if src == "f" and dst in "iub":
            raise FieldSemanticsError(
                f"convert {a.dtype} -> {dtype} truncates and has no field meaning"
            )
        if src in "iu" and dst == "b":
            raise FieldSemanticsError(f"convert {a.dtype} -> bool has no field meaning")
        if src in "iu" and dst in "iu" and np.dtype(dtype).itemsize < np.dtype(a.dtype).itemsize:
            raise FieldSemanticsError(
                f"convert {a.dtype} -> {dtype} wraps around and has no field meaning"
            )
        return a.retyped(dtype)

    def opaque(self, node: Any, args: Sequence[Any]) -> Any:
        payload = node.param("payload") if hasattr(node, "param") else None
        name = getattr(getattr(payload, "primitive", None), "name", repr(payload))
        raise FieldSemanticsError(f"opaque primitive {name!r} has no field meaning")
