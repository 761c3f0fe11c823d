"""What one µGraph op record holds, and the shape rules the records share.

An `OpDef` owns everything about an op that is not a GPU lowering: its arity and levels, a
shape rule, its one meaning over the `lax_ir.Algebra` protocol (float, field, degree and the
search's abstract expressions are algebras, so they are the same code), how the search treats
it (`SearchProps`: when the region offers it, whether a constant scale may follow it, its
special-function cost; its canonical rank is its place in the table) and the original Mirage's
names for it (`imports`). Each GPU backend registers one rule per op against the op's name
(`mirage_jax.lower.registry`); a test checks that every backend has every rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ACC_DTYPE = "float32"
"""Where µGraph ops compute (the generated kernels' precision); results round to the tensor's dtype."""


def matmul_operand_dtype(dtypes: Sequence[str]) -> str | None:
    """The dtype a mixed-precision matmul rounds its operands to, or None (no rounding).

    Where a matmul's operands differ in width (an fp32 normalised activation times fp16
    weights), the program converts the wide one before the GEMM, as every framework's Linear
    does: the operands are rounded to the narrow dtype and the product accumulates in fp32,
    on tensor cores. Operands of one dtype, or of two 16-bit dtypes (fp16 with bf16), are not
    rounded.
    """
    kinds = {str(d) for d in dtypes}
    if len(kinds) < 2 or not kinds <= _FLOAT_BYTES.keys():
        return None
    narrow = min(kinds, key=_FLOAT_BYTES.__getitem__)
    same = [d for d in kinds if _FLOAT_BYTES[d] == _FLOAT_BYTES[narrow]]
    return narrow if len(same) == 1 else None


_FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


class ShapeError(ValueError):
    """A shape rule is broken (the message says which)."""


@dataclass(frozen=True)
class Ctx:
    """What `apply` sees: the algebra, the dtype, static full shapes (batch dims + tile)."""

    alg: Any
    dtype: str
    nb: int
    arg_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    params: dict
    forloop_range: int = 1
    arg_dtypes: tuple[str, ...] = ()

    def const(self, value: float, dtype: str | None = None) -> Any:
        """An exact constant: `value` rounded to `dtype` (default: the tensor's dtype)."""
        dt = dtype or self.dtype
        return self.alg.constant(np.asarray(value, dtype=dt), dt)

    def tile_axis(self, dim: int, rank: int) -> int:
        return self.nb + (dim % rank)


@dataclass(frozen=True)
class Facts:
    """What a region offers the search's vocabulary (built by `search.vocab` from its Program).

    Arguments:
        features: the region's Lax op names, plus "square" where it multiplies a value by itself.
        mul_scalars, add_scalars: scalar constants it multiplies or adds by.
        wide_scalars: the mul scalars it holds in float32 that its 16-bit floats cannot hold
            (a user's `np.sqrt(d)` promotes bfloat16 scores): their `mul_scalar` keeps them in
            float32 (`cdtype`), not rounded to the tile's dtype.
        inv_sizes: dimensions whose 1/n a mean over a non-last axis multiplies by.
        eps: the epsilons a norm may add under its square root (None: none).
        square_dtypes: the 16-bit float dtypes the region squares values in without upcasting
            first (None: it squares in fp32 or wider), for the norms' `sq_dtype`.
        combine: the vocabulary of a split's combining kernel (partial sums in, results out).
    """

    features: frozenset[str]
    mul_scalars: tuple[float, ...] = ()
    add_scalars: tuple[float, ...] = ()
    wide_scalars: tuple[float, ...] = ()
    inv_sizes: tuple[int, ...] = ()
    eps: tuple[float | None, ...] = (None,)
    square_dtypes: tuple[str | None, ...] = (None,)
    combine: bool = False

    def has(self, *features: str) -> bool:
        return all(f in self.features for f in features)


Offer = Callable[[Facts], Sequence[tuple]]
"""The params (each a tuple of (name, value) pairs) an op is tried with in a region."""


def when(*features: str) -> Offer:
    """Offer the op once (no params) where the region has all of `features`."""
    return lambda facts: [()] if facts.has(*features) else []


def eps_params(facts: Facts) -> list[tuple]:
    """One params tuple per epsilon the region's norms may use."""
    return [(("eps", e),) if e else () for e in facts.eps]


def square_params(facts: Facts) -> list[tuple]:
    """One params tuple per dtype the region squares in: `sq_dtype` where a 16-bit float (the
    square rounds there, and overflows to inf where the program's does), none for fp32."""
    return [(("sq_dtype", d),) if d else () for d in facts.square_dtypes]


def norm_params(facts: Facts) -> list[tuple]:
    """The params a norm is tried with: each epsilon with each square dtype."""
    return [tuple(sorted(e + q)) for e in eps_params(facts) for q in square_params(facts)]


@dataclass(frozen=True)
class SearchProps:
    """How the search treats an op (read by `mirage_jax.search`, written only here).

    Arguments:
        offer: the params to try in a region (None: the op is never a vocabulary choice; the
            search places matmuls, reductions and shifts itself).
        scale_result: a constant scale may be put on the op's result (False for products,
            quotients and functions of a scaled value: the scale belongs on a factor, where
            commutativity would otherwise put it on every factor in turn).
        sfu: special-function-unit operations per output element (exp2, rsqrt, rcp), for the
            cost model.
        fused: one op for a pattern of several Lax ops (silu, gelu): offered from all of the
            region's facts, while the nodes its pattern covers add nothing else to the
            vocabulary (`search.vocab.fused_cover`).
    """

    offer: Offer | None = None
    scale_result: bool = True
    sfu: int = 0
    fused: bool = False


@dataclass(frozen=True)
class OpDef:
    """One op: arity (None = variadic), levels, kind, shape rule, meaning, search, Mirage names."""

    name: str
    arity: int | None
    levels: frozenset[str]
    kind: str
    shape: Callable[[Sequence[tuple[int, ...]], dict], tuple[int, ...]]
    apply: Callable[[Ctx, list[Any]], Any]
    doc: str
    params: tuple[str, ...] = ()
    search: SearchProps = field(default_factory=SearchProps)
    imports: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The original's op types for this op (`kn_*` kernel, `tb_*` block) and their params."""


# ---------------------------------------------------------------------------- shape rules
def broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Each dim equal or 1 on one side (Mirage broadcasts only size-1 dims); ranks aligned from
    the right as numpy's, a missing leading dim a unit one (a canonical region drops leading
    unit dims, so a bias or a mask may have fewer than what it meets)."""
    first = shapes[0]
    if all(s == first for s in shapes):  # the common case (the search asks it ~10^5 times)
        return tuple(first)
    rank = max(len(s) for s in shapes)
    shapes = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*shapes):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ShapeError(f"cannot broadcast {list(shapes)}: only size-1 dims broadcast")
        out.append(big.pop() if big else 1)
    return tuple(out)


def broadcast_full(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(ds) if min(ds) == 1 else ds[0] for ds in zip(*shapes))


def same(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    return tuple(shapes[0])


def binary(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    return broadcast(shapes)


def matmul_shape(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    a, b = shapes
    if len(a) < 2 or len(b) < 2 or len(a) != len(b):
        raise ShapeError(f"matmul needs equal ranks >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul contraction mismatch: {a} @ {b}")
    return (*broadcast([a[:-2], b[:-2]]), a[-2], b[-1])


def check_dim(shape: tuple[int, ...], dim: int) -> int:
    if not -len(shape) <= dim < len(shape):
        raise ShapeError(f"dim {dim} out of range for rank {len(shape)}")
    return dim % len(shape)


def reduce_shape(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    (s,) = shapes
    d = check_dim(s, params["dim"])
    return (*s[:d], 1, *s[d + 1 :])


def concat_shape(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    d = check_dim(shapes[0], params["dim"])
    rank = len(shapes[0])
    for s in shapes:
        if len(s) != rank or any(s[i] != shapes[0][i] for i in range(rank) if i != d):
            raise ShapeError(f"concat along dim {d} needs equal other dims: {list(shapes)}")
    return (*shapes[0][:d], sum(s[d] for s in shapes), *shapes[0][d + 1 :])


def concat_matmul_shape(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
    a, b, c, d = shapes
    left = concat_shape([a, b], {"dim": -1})
    right = concat_shape([c, d], {"dim": -2})
    return matmul_shape([left, right], params)


def last_to(n: Callable[[int, dict], int]) -> Callable[..., tuple[int, ...]]:
    """The shape rule of an op that maps the last dim to `n(last, params)`."""

    def rule(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
        (s,) = shapes
        if not s:
            raise ShapeError("needs rank >= 1")
        return (*s[:-1], n(s[-1], params))

    return rule


def todimx(last: int, params: dict) -> int:
    dimx = params["dimx"]
    if last % dimx:
        raise ShapeError(f"uneven split: last dim {last} is not a multiple of dimx={dimx}")
    return dimx


def rescale_shape(reduce_last: bool) -> Callable[..., tuple[int, ...]]:
    def rule(shapes: Sequence[tuple[int, ...]], params: dict) -> tuple[int, ...]:
        x, m, big_m = shapes
        broadcast([x, m])
        if tuple(big_m) != tuple(m):
            raise ShapeError(f"the final shift {big_m} must have the shift's shape {m}")
        return (*x[:-1], 1) if reduce_last else tuple(x)

    return rule
