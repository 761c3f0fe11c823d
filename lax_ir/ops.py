"""The normalised op set of lax_ir and each op's place in the Lax fragment.

Every op a Program may contain is listed in `OPS`. An op's `kind` says how the partitioner
and the verifier treat it:

- "lax": multilinear ops, division, non-nested exp, and the shape ops between them; inside a
  region, with an exact field meaning.
- "uninterpreted": sqrt, logistic, tanh, erf. Not polynomial, but harmless inside norms and
  activations: inside a region, verified as keyed random functions shared by both sides.
- "shift": reduce_max and max, which are Lax only when they form a softmax's stabilising
  shift (decided per node by `lax_ir.partition.classify`); otherwise residual.
- "structural": inputs and constants; they belong to no region (constants are copied into
  every region that uses them).
- "residual": everything else (opaque JAX primitives and the tuple projections of
  multi-result ones); left to XLA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OpInfo:
    name: str
    kind: str
    arity: int | None  # None: variadic
    doc: str


_TABLE = [
    OpInfo("input", "structural", 0, "a positional input"),
    OpInfo("constant", "structural", 0, "an exact constant (param value: Const)"),
    OpInfo("matmul", "lax", 2, "batched 2-D matmul a[...,M,K] @ b[...,K,N]"),
    OpInfo("add", "lax", 2, "elementwise a + b (numpy broadcasting)"),
    OpInfo("sub", "lax", 2, "elementwise a - b"),
    OpInfo("mul", "lax", 2, "elementwise a * b"),
    OpInfo("div", "lax", 2, "elementwise a / b"),
    OpInfo("neg", "lax", 1, "elementwise -a"),
    OpInfo("exp", "lax", 1, "elementwise e**a (Lax unless nested inside another exp)"),
    OpInfo("integer_pow", "lax", 1, "a ** y for an integer y (param y)"),
    OpInfo("reduce_sum", "lax", 1, "sum over axes (param axes)"),
    OpInfo(
        "broadcast_in_dim", "lax", 1, "lax.broadcast_in_dim (params shape, broadcast_dimensions)"
    ),
    OpInfo("reshape", "lax", 1, "row-major reshape (param shape)"),
    OpInfo("transpose", "lax", 1, "axis permutation (param permutation)"),
    OpInfo("concatenate", "lax", None, "concatenation along param axis"),
    OpInfo("convert", "lax", 1, "dtype conversion (param dtype)"),
    OpInfo("sqrt", "uninterpreted", 1, "elementwise square root"),
    OpInfo("logistic", "uninterpreted", 1, "elementwise 1 / (1 + e**-a)"),
    OpInfo("tanh", "uninterpreted", 1, "elementwise tanh"),
    OpInfo("erf", "uninterpreted", 1, "elementwise error function"),
    OpInfo("reduce_max", "shift", 1, "max over axes (param axes); Lax only as a softmax shift"),
    OpInfo("max", "shift", 2, "elementwise maximum; Lax only inside a softmax shift"),
    OpInfo("opaque", "residual", None, "any other JAX primitive (param payload: Opaque)"),
    OpInfo("get", "residual", 1, "element (param index) of a multi-result opaque op"),
]

OPS: dict[str, OpInfo] = {o.name: o for o in _TABLE}
UNARY_ELEMENTWISE = ("neg", "exp", "sqrt", "logistic", "tanh", "erf", "integer_pow", "convert")
BINARY_ELEMENTWISE = ("add", "sub", "mul", "div", "max")
SHAPE_OPS = ("broadcast_in_dim", "reshape", "transpose", "convert")

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
