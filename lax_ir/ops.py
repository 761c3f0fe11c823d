"""The normalised op set of lax_ir: one table that capture, interpretation, both algebras and
the search read.

Every op a Program may contain is listed in `OPS`, with the JAX primitive it captures 1:1
(`primitive`; other primitives are normalised by rules in `capture.py`), whether it is
elementwise, and for an uninterpreted unary its float meaning (numpy and jax). Adding an
uninterpreted unary (say `cos`) is one line here. An op's `kind` says how the partitioner and
the verifier treat it:

- "lax": multilinear ops, division, non-nested exp, and the shape ops between them; inside a
  region, with an exact field meaning.
- "uninterpreted": sqrt, logistic, tanh, erf, relu. Not polynomial, but harmless inside norms and
  activations: inside a region, verified as keyed random functions shared by both sides.
- "shift": reduce_max and max, which are Lax only when they form a softmax's stabilising
  shift (decided per node by `lax_ir.partition.classify`); otherwise residual.
- "structural": inputs and constants; they belong to no region (constants are copied into
  every region that uses them).
- "residual": everything else (opaque JAX primitives and the tuple projections of
  multi-result ones); left to XLA.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class OpInfo:
    """One op of the normalised set.

    Arguments:
        name, kind, arity (None: variadic), doc: as in the module docstring.
        primitive: the JAX primitive captured as this op one to one ("" if none).
        elementwise: acts element by element (with numpy broadcasting).
        numpy, jax: an uninterpreted unary's float meaning on numpy and on jax arrays.
        nonnegative: its float meaning is real only for operands >= 0 (sqrt): random inputs
            that reach it are drawn so (`lax_ir.domain`).
    """

    name: str
    kind: str
    arity: int | None
    doc: str
    primitive: str = ""
    elementwise: bool = False
    numpy: Callable[[Any], Any] | None = None
    jax: Callable[[Any], Any] | None = None
    nonnegative: bool = False


def _lax(name: str) -> Callable[[Any], Any]:
    """jax.lax.<name>, imported on first use (lax_ir imports jax lazily)."""
    return lambda a: getattr(importlib.import_module("jax.lax"), name)(a)


def _relu(a: Any) -> Any:
    return importlib.import_module("jax.numpy").maximum(a, 0)


def _np_erf(a: Any) -> Any:
    from scipy.special import erf

    return erf(a)


def _unary(
    name: str, doc: str, numpy_fn: Callable[[Any], Any], nonnegative: bool = False
) -> OpInfo:
    """An uninterpreted elementwise unary: its primitive has its name, its float meaning is
    `numpy_fn` on numpy arrays and jax.lax.<name> on jax arrays."""
    return OpInfo(name, "uninterpreted", 1, doc, name, True, numpy_fn, _lax(name), nonnegative)


_TABLE = [
    OpInfo("input", "structural", 0, "a positional input"),
    OpInfo("constant", "structural", 0, "an exact constant (param value: Const)"),
    OpInfo("matmul", "lax", 2, "batched 2-D matmul a[...,M,K] @ b[...,K,N]"),
    OpInfo("add", "lax", 2, "elementwise a + b (numpy broadcasting)", "add", True),
    OpInfo("sub", "lax", 2, "elementwise a - b", "sub", True),
    OpInfo("mul", "lax", 2, "elementwise a * b", "mul", True),
    OpInfo("div", "lax", 2, "elementwise a / b", "div", True),
    OpInfo("neg", "lax", 1, "elementwise -a", "neg", True),
    OpInfo("exp", "lax", 1, "elementwise e**a (Lax unless nested inside another exp)", "exp", True),
    OpInfo("integer_pow", "lax", 1, "a ** y for an integer y (param y)", "", True),
    OpInfo("reduce_sum", "lax", 1, "sum over axes (param axes)"),
    OpInfo(
        "broadcast_in_dim", "lax", 1, "lax.broadcast_in_dim (params shape, broadcast_dimensions)"
    ),
    OpInfo("reshape", "lax", 1, "row-major reshape (param shape)"),
    OpInfo("transpose", "lax", 1, "axis permutation (param permutation)"),
    OpInfo("concatenate", "lax", None, "concatenation along param axis"),
    OpInfo("convert", "lax", 1, "dtype conversion (param dtype)", "", True),
    _unary("sqrt", "elementwise square root", np.sqrt, nonnegative=True),
    _unary("logistic", "elementwise 1 / (1 + e**-a)", lambda a: 1.0 / (1.0 + np.exp(-a))),
    _unary("tanh", "elementwise tanh", np.tanh),
    _unary("erf", "elementwise error function", _np_erf),
    OpInfo(
        "relu",
        "uninterpreted",
        1,
        "elementwise max(a, 0) (captured from `max` with a zero)",
        "",
        True,
        lambda a: np.maximum(a, 0),
        _relu,
    ),
    OpInfo("reduce_max", "shift", 1, "max over axes (param axes); Lax only as a softmax shift"),
    OpInfo("max", "shift", 2, "elementwise maximum; Lax only inside a softmax shift", "max", True),
    OpInfo("opaque", "residual", None, "any other JAX primitive (param payload: Opaque)"),
    OpInfo("get", "residual", 1, "element (param index) of a multi-result opaque op"),
]

OPS: dict[str, OpInfo] = {o.name: o for o in _TABLE}
UNINTERPRETED = tuple(o.name for o in _TABLE if o.kind == "uninterpreted")
"""The uninterpreted unaries (keyed random functions in the field)."""
ELEMENTWISE = tuple(o.name for o in _TABLE if o.elementwise)
UNARY_ELEMENTWISE = tuple(o.name for o in _TABLE if o.elementwise and o.arity == 1)
BINARY_ELEMENTWISE = tuple(o.name for o in _TABLE if o.elementwise and o.arity == 2)
SHAPE_OPS = ("broadcast_in_dim", "reshape", "transpose", "convert")
PRIMITIVES: dict[str, str] = {o.primitive: o.name for o in _TABLE if o.primitive}
"""JAX primitive name -> the op it captures as, one to one."""

_SHORT = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint32": "u32",
    "bool": "bool",
}


def short_dtype(dtype: str) -> str:
    return _SHORT.get(dtype, dtype)


def dtype_name(dtype: object) -> str:
    """The numpy name of a dtype-like; extended dtypes (PRNG keys) keep their printed name."""
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(*shapes))


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Result shape of a batched 2-D matmul, or ValueError naming the mismatch."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul needs rank >= 2 operands, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ValueError(f"matmul contraction mismatch: {a} @ {b}")
    batch = broadcast_shapes(a[:-2], b[:-2])
    return (*batch, a[-2], b[-1])
