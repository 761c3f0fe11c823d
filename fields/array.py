"""`FieldArray`: a tensor over Z_p × Z_q whose two components are computed on demand.

Both components are lazy: each is a `Cell` (a value, or a thunk with the cells it depends on),
forced iteratively when read. Only what is read is computed: outputs read their p-component,
exp reads its argument's q-component, and nothing else is evaluated. For attention, whose
scores Q·K feed nothing but exp, that skips the p-side of the largest matmul; for programs
without exp it skips every q-side computation. `q_valid` is known eagerly (it is False for
values that depend on an exp output), so "exp of exp" is reported when the program is built,
while errors of values (a zero denominator: `VoidTrial`) arise when the value is forced.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fields.numbers import Field, FieldSemanticsError, default_field, to_residues

NESTED_EXP = (
    "exp nested inside exp has no field meaning (this value depends on an exp output and its "
    "exponent component was needed)"
)


class Cell:
    """A value, or a thunk computing it once the cells in `deps` have values."""

    __slots__ = ("deps", "fn", "value")

    def __init__(
        self,
        fn: Callable[[], np.ndarray] | None = None,
        deps: tuple[Cell, ...] = (),
        value: np.ndarray | None = None,
    ):
        self.fn, self.deps, self.value = fn, deps, value

    def force(self) -> np.ndarray:
        """The value, computing every pending dependency first (no recursion)."""
        stack = [self]
        while stack:
            cell = stack[-1]
            if cell.value is not None:
                stack.pop()
                continue
            pending = [d for d in cell.deps if d.value is None]
            if pending:
                stack.extend(pending)
                continue
            assert cell.fn is not None
            cell.value = cell.fn()
            cell.fn, cell.deps = None, ()
            stack.pop()
        assert self.value is not None
        return self.value


class FieldArray:
    """A tensor over Z_p × Z_q: p-residues, q-residues (exponents), a shape and a dtype.

    Arguments:
        p: residues mod p (int64, or exact integer-valued float64), or a `Cell`.
        q: residues mod q (int64), a `Cell`, or None when invalid (the value depends on exp).
        dtype: the numpy dtype name of the value this stands for.
        bound: an exclusive upper bound on the p-residues when below p (random inputs: 2^30),
            which lets matmul use wider limbs.
        shape: required when `p` is a Cell.
    """

    __slots__ = ("_p_float", "_p_int", "_pc", "_qc", "bound", "dtype", "shape")

    def __init__(
        self,
        p: np.ndarray | Cell,
        q: np.ndarray | Cell | None,
        dtype: str = "float32",
        bound: int | None = None,
        shape: tuple[int, ...] | None = None,
    ):
        if not isinstance(p, Cell):
            p = np.asarray(p)
            shape = tuple(p.shape)
            p = Cell(value=p if p.dtype == np.float64 else p.astype(np.int64, copy=False))
        if shape is None:
            raise ValueError("a lazy FieldArray needs its shape")
        if q is not None and not isinstance(q, Cell):
            q = Cell(value=np.asarray(q).astype(np.int64, copy=False))
        self._pc, self._qc = p, q
        self._p_int: np.ndarray | None = None
        self._p_float: np.ndarray | None = None
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.bound = bound

    # ---- reading
    def p_raw(self) -> np.ndarray:
        """The p-residues as held (int64, or float64 for random inputs)."""
        return self._pc.force()

    @property
    def p(self) -> np.ndarray:
        """The p-residues as int64 (computed on first read)."""
        if self._p_int is None:
            raw = self._pc.force()
            self._p_int = raw if raw.dtype == np.int64 else raw.astype(np.int64)
        return self._p_int

    def p_float(self) -> np.ndarray:
        """The p-residues as exact float64 (cached: inputs feed several matmuls)."""
        if self._p_float is None:
            raw = self._pc.force()
            self._p_float = raw if raw.dtype == np.float64 else raw.astype(np.float64)
        return self._p_float

    @property
    def q(self) -> np.ndarray:
        """The q-residues (exponents); FieldSemanticsError when invalid."""
        if self._qc is None:
            raise FieldSemanticsError(NESTED_EXP)
        return self._qc.force()

    @property
    def q_valid(self) -> bool:
        return self._qc is not None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"FieldArray({self.dtype}{list(self.shape)}, q_valid={self.q_valid})"

    # ---- building (used by FieldAlgebra)
    def retyped(self, dtype: str) -> FieldArray:
        """The same value under another dtype name (shares the cells)."""
        out = FieldArray(self._pc, self._qc, dtype, self.bound, self.shape)
        out._p_int, out._p_float = self._p_int, self._p_float
        return out

    @staticmethod
    def from_ints(values: Any, field: Field | None = None, dtype: str | None = None) -> FieldArray:
        """Exact numbers (ints, floats as dyadic rationals) mapped into both components."""
        field = field or default_field()
        arr = np.asarray(values)
        return FieldArray(
            to_residues(arr, field.p), to_residues(arr, field.q), dtype or arr.dtype.name
        )


def p_cell(fn: Callable[..., np.ndarray], *xs: FieldArray) -> Cell:
    """fn of the xs' int64 p-residues, on demand."""
    return Cell(lambda: fn(*(x.p for x in xs)), tuple(x._pc for x in xs))


def raw_p_cell(fn: Callable[[np.ndarray], np.ndarray], x: FieldArray) -> Cell:
    """fn of x's p-residues as held (shape ops keep random inputs in float64)."""
    return Cell(lambda: fn(x.p_raw()), (x._pc,))


def q_cell(fn: Callable[..., np.ndarray], *xs: FieldArray) -> Cell | None:
    """fn of the xs' q-residues, on demand; None (invalid) if any is invalid."""
    if any(x._qc is None for x in xs):
        return None
    return Cell(lambda: fn(*(x.q for x in xs)), tuple(x._qc for x in xs))  # type: ignore[misc]
