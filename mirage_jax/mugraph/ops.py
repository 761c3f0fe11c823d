"""The µGraph op registry: each op's shape rule and its one executable meaning over an Algebra.

Every kernel-level pre-defined op and every block-level op is one `OpDef` entry: arity, the
levels it may appear at, a shape rule over tile (or tensor) shapes, and `apply`, its meaning
over the `lax_ir.Algebra` protocol on values that carry `ctx.nb` leading batch dims (0 for a
kernel op; grid axes and the loop axis inside a block graph; see `evaluate.py`). The field and
float semantics are therefore the same code. Shape rules raise `ShapeError` with the rule
broken; validation turns it into a `MuGraphError` naming the op.

Mirage-specific meanings (chosen to equal how the benchmark functions capture, op for op):
- silu(x) = x · logistic(x) (jax.nn.silu); sigmoid = logistic;
- gelu(x) = (0.5·x) · (1 − erf(−x · c)), c = 1/√2 rounded to the tensor's dtype, which is how
  `jax.nn.gelu(x, approximate=False)` captures (erfc(y) normalised into 1 − erf(y));
- rms_norm(x) = x / sqrt(sum(x·x, last) / n) with NO eps (the original's), computed in fp32;
  an optional `eps` param (rms_norm, accum_rms_last) adds it under the sqrt: our benchmarks'
  rms_norm has one, and `add_scalar` (x + scalar) spells it where the mean is separate;
- accumulators and norms compute in fp32 (`convert`), like the generated kernels; in the field
  `convert` is the identity. Counts n are exact fp32 constants, so a mean is sum / n.
- reduce_max and accum_max exist only as stabilising shifts (Algebra.shift_max): the float
  meaning is the max, the field meaning a fresh random value, so only shift-invariant graphs
  verify.
- accum_rescale_sum(x, m, M) = Σ_i x_i · exp(m_i − M): the closed form of the online-softmax
  rescaled sum, with m_i the per-iteration shift x_i was computed with and M = accum_max(m)
  the final one. A kernel realises it with a running max; in exact arithmetic they agree, and
  in the field the m_i and M are independent random values, so the test checks exactly that
  the result does not depend on the shifts. Mirage's own 2-input RESCALE ops hide the running
  max; making M an explicit tensor lets two accumulators share it (numerator and denominator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ACC_DTYPE = "float32"


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

    def const(self, value: float, dtype: str | None = None) -> Any:
        dt = dtype or self.dtype
        return self.alg.constant(np.asarray(value, dtype=dt), dt)

    def tile_axis(self, dim: int, rank: int) -> int:
        return self.nb + (dim % rank)


@dataclass(frozen=True)
class OpDef:
    """One op: arity (None = variadic), levels, kind, shape rule, meaning, Mirage names."""

    name: str
    arity: int | None
    levels: frozenset[str]
    kind: str
    shape: Callable[[Sequence[tuple[int, ...]], dict], tuple[int, ...]]
    apply: Callable[[Ctx, list[Any]], Any]
    doc: str
    params: tuple[str, ...] = ()


# ---------------------------------------------------------------------------- shape rules
def broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Equal ranks; each dim equal or 1 on one side (Mirage broadcasts only size-1 dims)."""
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ShapeError(f"operand ranks differ: {list(shapes)}")
    out = []
    for dims in zip(*shapes):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ShapeError(f"cannot broadcast {list(shapes)}: only size-1 dims broadcast")
        out.append(big.pop() if big else 1)
    return tuple(out)


def _same(shapes, params):
    return tuple(shapes[0])


def _binary(shapes, params):
    return broadcast(shapes)


def _matmul_shape(shapes, params):
    a, b = shapes
    if len(a) < 2 or len(b) < 2 or len(a) != len(b):
        raise ShapeError(f"matmul needs equal ranks >= 2, got {a} and {b}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul contraction mismatch: {a} @ {b}")
    return (*broadcast([a[:-2], b[:-2]]), a[-2], b[-1])


def _check_dim(shape, dim):
    if not -len(shape) <= dim < len(shape):
        raise ShapeError(f"dim {dim} out of range for rank {len(shape)}")
    return dim % len(shape)


def _reduce_shape(shapes, params):
    (s,) = shapes
    d = _check_dim(s, params["dim"])
    return (*s[:d], 1, *s[d + 1 :])


def _concat_shape(shapes, params):
    d = _check_dim(shapes[0], params["dim"])
    rank = len(shapes[0])
    for s in shapes:
        if len(s) != rank or any(s[i] != shapes[0][i] for i in range(rank) if i != d):
            raise ShapeError(f"concat along dim {d} needs equal other dims: {list(shapes)}")
    return (*shapes[0][:d], sum(s[d] for s in shapes), *shapes[0][d + 1 :])


def _concat_matmul_shape(shapes, params):
    a, b, c, d = shapes
    left = _concat_shape([a, b], {"dim": -1})
    right = _concat_shape([c, d], {"dim": -2})
    return _matmul_shape([left, right], params)


def _last_to(n):
    def rule(shapes, params):
        (s,) = shapes
        if not s:
            raise ShapeError("needs rank >= 1")
        return (*s[:-1], n(s[-1], params))

    return rule


def _todimx(last, params):
    dimx = params["dimx"]
    if last % dimx:
        raise ShapeError(f"uneven split: last dim {last} is not a multiple of dimx={dimx}")
    return dimx


def _rescale_shape(reduce_last):
    def rule(shapes, params):
        x, m, big_m = shapes
        broadcast([x, m])
        if tuple(big_m) != tuple(m):
            raise ShapeError(f"the final shift {big_m} must have the shift's shape {m}")
        return (*x[:-1], 1) if reduce_last else tuple(x)

    return rule


# ---------------------------------------------------------------------------- meanings
def _to_acc(ctx, x):
    return ctx.alg.convert(x, ACC_DTYPE)


def _from_acc(ctx, x):
    return ctx.alg.convert(x, ctx.dtype)


def _sum_keep(ctx, x, axes, shape):
    """Sum over `axes` of a value whose full shape is `shape`, keeping them as size 1."""
    out = ctx.alg.reduce_sum(x, tuple(axes))
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return ctx.alg.reshape(out, kept)


def _broadcast_to(ctx, x, shape, target):
    if tuple(shape) == tuple(target):
        return x
    return ctx.alg.broadcast_in_dim(x, tuple(target), tuple(range(len(target))))


def _exp(ctx, a):
    return ctx.alg.exp(a[0])


def _square(ctx, a):
    return ctx.alg.mul(a[0], a[0])


def _sqrt(ctx, a):
    return ctx.alg.unary("sqrt", a[0])


def _sigmoid(ctx, a):
    return ctx.alg.unary("logistic", a[0])


def _silu(ctx, a):
    return ctx.alg.mul(a[0], ctx.alg.unary("logistic", a[0]))


def _gelu(ctx, a):
    alg, x = ctx.alg, a[0]
    half_x = alg.mul(ctx.const(0.5), x)
    y = alg.mul(alg.neg(x), ctx.const(1.0 / np.sqrt(2.0)))
    return alg.mul(half_x, alg.sub(ctx.const(1.0), alg.unary("erf", y)))


def _mul_scalar(ctx, a):
    return ctx.alg.mul(a[0], ctx.const(ctx.params["scalar"]))


def _add_scalar(ctx, a):
    return ctx.alg.add(a[0], ctx.const(ctx.params["scalar"]))


def _plus_eps(ctx, ms):
    """mean(x²) + eps where the op has an `eps` param (the rms of rms_norm with an epsilon)."""
    eps = ctx.params.get("eps")
    return ms if not eps else ctx.alg.add(ms, ctx.const(eps, ACC_DTYPE))


def _bin(name):
    def apply(ctx, a):
        return getattr(ctx.alg, name)(a[0], a[1])

    return apply


def _matmul(ctx, a):
    return fold_matmul(ctx.alg, a[0], a[1], ctx.arg_shapes[0], ctx.arg_shapes[1], ctx.dtype)


def fold_matmul(alg, x, y, xs: tuple[int, ...], ys: tuple[int, ...], dtype: str) -> Any:
    """x[..., M, K] @ y[..., K, N] with size-1 broadcasting of the leading dims.

    Leading dims where only x varies are folded into M, those where only y varies into N, so
    a replicated weight times per-block tiles is one large matmul, not many small ones (the
    vectorised block semantics would otherwise issue one tiny matmul per block and iteration).
    """
    lead = len(xs) - 2
    shared = [i for i in range(lead) if xs[i] > 1 and ys[i] > 1]
    x_only = [i for i in range(lead) if xs[i] > 1 and ys[i] == 1]
    y_only = [i for i in range(lead) if ys[i] > 1 and xs[i] == 1]
    if not x_only and not y_only:
        return alg.matmul(x, y, dtype)
    ones = [i for i in range(lead) if xs[i] == 1 and ys[i] == 1]
    m, k, n = xs[-2], xs[-1], ys[-1]
    s = math.prod(xs[i] for i in shared)
    xo = math.prod(xs[i] for i in x_only)
    yo = math.prod(ys[i] for i in y_only)
    x = alg.transpose(x, (*shared, *x_only, *ones, *y_only, lead, lead + 1))
    x = alg.reshape(x, (s, xo * m, k))
    y = alg.transpose(y, (*shared, *ones, *x_only, lead, *y_only, lead + 1))
    y = alg.reshape(y, (s, k, yo * n))
    z = alg.matmul(x, y, dtype)
    labels = [*shared, *x_only, lead, *y_only, lead + 1]
    sizes = [xs[i] for i in shared] + [xs[i] for i in x_only] + [m]
    sizes += [ys[i] for i in y_only] + [n]
    z = alg.reshape(z, tuple(sizes))
    perm = tuple(sorted(range(len(labels)), key=lambda j: labels[j]))
    if perm != tuple(range(len(perm))):
        z = alg.transpose(z, perm)
    out = (*(max(xs[i], ys[i]) for i in range(lead)), m, n)
    return alg.reshape(z, out)


def _reduce_sum(ctx, a):
    shape = ctx.arg_shapes[0]
    axis = ctx.tile_axis(ctx.params["dim"], len(shape) - ctx.nb)
    return _from_acc(ctx, _sum_keep(ctx, _to_acc(ctx, a[0]), (axis,), shape))


def _reduce_max(ctx, a):
    shape = ctx.arg_shapes[0]
    axis = ctx.tile_axis(ctx.params["dim"], len(shape) - ctx.nb)
    out = ctx.alg.shift_max(a[0], (axis,))
    return ctx.alg.reshape(out, ctx.out_shape)


def _rms_norm(ctx, a):
    alg, shape = ctx.alg, ctx.arg_shapes[0]
    x = _to_acc(ctx, a[0])
    ss = _sum_keep(ctx, alg.mul(x, x), (len(shape) - 1,), shape)
    rms = alg.unary("sqrt", _plus_eps(ctx, alg.div(ss, ctx.const(shape[-1], ACC_DTYPE))))
    return _from_acc(ctx, alg.div(x, rms))


def _batch_target(ctx, shapes, axis):
    """Common shape of concat operands: broadcast batch dims, keep each tile."""
    nb = ctx.nb
    batch = tuple(max(s[i] for s in shapes) for i in range(nb))
    return [(*batch, *s[nb:]) for s in shapes]


def _concat(ctx, a):
    rank = len(ctx.arg_shapes[0]) - ctx.nb
    axis = ctx.tile_axis(ctx.params["dim"], rank)
    targets = _batch_target(ctx, ctx.arg_shapes, axis)
    xs = [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a, ctx.arg_shapes, targets)]
    return ctx.alg.concatenate(xs, axis)


def _concat_matmul(ctx, a):
    shapes = ctx.arg_shapes
    rank = len(shapes[0]) - ctx.nb
    left_t = _batch_target(ctx, shapes[:2], None)
    right_t = _batch_target(ctx, shapes[2:], None)
    left = ctx.alg.concatenate(
        [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a[:2], shapes[:2], left_t)],
        ctx.tile_axis(-1, rank),
    )
    right = ctx.alg.concatenate(
        [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a[2:], shapes[2:], right_t)],
        ctx.tile_axis(-2, rank),
    )
    return ctx.alg.matmul(left, right, ctx.dtype)


# Accumulators: the argument has loop batch dims (grid..., F) at axes [0, nb); F is axis
# nb - 1. Its size may be 1 when the value does not depend on the iteration: it is first
# broadcast to F, since the loop adds it F times.
def _full_loop(ctx, x, shape):
    target = (*shape[: ctx.nb - 1], ctx.forloop_range, *shape[ctx.nb :])
    return _broadcast_to(ctx, x, shape, target), target


def _accum(reduce_last: bool, finish: Callable | None = None, square: bool = False):
    def apply(ctx, a):
        alg = ctx.alg
        x, shape = _full_loop(ctx, _to_acc(ctx, a[0]), ctx.arg_shapes[0])
        axes = (ctx.nb - 1, len(shape) - 1) if reduce_last else (ctx.nb - 1,)
        if square:
            x = alg.mul(x, x)
        s = alg.reshape(alg.reduce_sum(x, axes), ctx.out_shape)
        if finish is not None:
            n = ctx.forloop_range * (shape[-1] if reduce_last else 1)
            s = finish(ctx, s, n)
        return _from_acc(ctx, s)

    return apply


def mean(ctx, s, n):
    return ctx.alg.div(s, ctx.const(n, ACC_DTYPE))


def rms(ctx, s, n):
    return ctx.alg.unary("sqrt", _plus_eps(ctx, mean(ctx, s, n)))


def _accum_todimx(ctx, a):
    alg, dimx = ctx.alg, ctx.params["dimx"]
    x, shape = _full_loop(ctx, _to_acc(ctx, a[0]), ctx.arg_shapes[0])
    split = (*shape[:-1], shape[-1] // dimx, dimx)
    x = alg.reshape(x, split)
    s = alg.reduce_sum(x, (ctx.nb - 1, len(split) - 2))
    return _from_acc(ctx, alg.reshape(s, ctx.out_shape))


def _accum_max(ctx, a):
    x, _ = _full_loop(ctx, a[0], ctx.arg_shapes[0])
    return ctx.alg.shift_max(x, (ctx.nb - 1,))


def _accum_rescale(reduce_last: bool):
    def apply(ctx, a):
        alg = ctx.alg
        x_shape, m_shape, big_shape = ctx.arg_shapes
        nb = ctx.nb
        # M has post-loop batch dims: give it back a size-1 loop axis to broadcast against m.
        big = alg.reshape(a[2], (*big_shape[: nb - 1], 1, *big_shape[nb - 1 :]))
        scale = alg.exp(alg.sub(_to_acc(ctx, a[1]), _to_acc(ctx, big)))
        y = alg.mul(_to_acc(ctx, a[0]), scale)
        shape = broadcast_full(x_shape, m_shape)
        y, shape = _full_loop(ctx, y, shape)
        axes = (nb - 1, len(shape) - 1) if reduce_last else (nb - 1,)
        return _from_acc(ctx, alg.reshape(alg.reduce_sum(y, axes), ctx.out_shape))

    return apply


def broadcast_full(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(ds) if min(ds) == 1 else ds[0] for ds in zip(*shapes))


# ---------------------------------------------------------------------------- the table
_KB = frozenset({"kernel", "block"})
_B = frozenset({"block"})

_TABLE = [
    OpDef("exp", 1, _KB, "elementwise", _same, _exp, "e**x"),
    OpDef("square", 1, _KB, "elementwise", _same, _square, "x·x"),
    OpDef("sqrt", 1, _KB, "elementwise", _same, _sqrt, "square root (uninterpreted in the field)"),
    OpDef("sigmoid", 1, _KB, "elementwise", _same, _sigmoid, "logistic(x)"),
    OpDef("silu", 1, _KB, "elementwise", _same, _silu, "x·logistic(x)"),
    OpDef("gelu", 1, _KB, "elementwise", _same, _gelu, "0.5x·(1 − erf(−x/√2)) (erf form)"),
    OpDef("mul_scalar", 1, _KB, "elementwise", _same, _mul_scalar, "x·scalar", ("scalar",)),
    OpDef("add_scalar", 1, _KB, "elementwise", _same, _add_scalar, "x + scalar", ("scalar",)),
    OpDef("add", 2, _KB, "elementwise", _binary, _bin("add"), "a + b (size-1 broadcasting)"),
    OpDef("sub", 2, _KB, "elementwise", _binary, _bin("sub"), "a − b (size-1 broadcasting)"),
    OpDef("mul", 2, _KB, "elementwise", _binary, _bin("mul"), "a · b (size-1 broadcasting)"),
    OpDef("div", 2, _KB, "elementwise", _binary, _bin("div"), "a / b (size-1 broadcasting)"),
    OpDef("matmul", 2, _KB, "matmul", _matmul_shape, _matmul, "batched a[..,M,K] @ b[..,K,N]"),
    OpDef(
        "reduce_sum",
        1,
        _KB,
        "reduce",
        _reduce_shape,
        _reduce_sum,
        "sum over dim, kept as 1",
        ("dim",),
    ),
    OpDef(
        "reduce_max",
        1,
        _KB,
        "reduce",
        _reduce_shape,
        _reduce_max,
        "max over dim, kept as 1; only as a softmax shift",
        ("dim",),
    ),
    OpDef("rms_norm", 1, _KB, "norm", _same, _rms_norm, "x / sqrt(mean(x², last) + eps?)"),
    OpDef("concat", None, _KB, "concat", _concat_shape, _concat, "concatenate along dim", ("dim",)),
    OpDef(
        "concat_matmul",
        4,
        _B,
        "matmul",
        _concat_matmul_shape,
        _concat_matmul,
        "(a|b) @ (c;d) = a@c + b@d",
    ),
    # For-loop accumulators (block level only; loop tensor in, post-loop tensor out).
    OpDef("accum_sum", 1, _B, "accum", _same, _accum(False), "Σ over iterations (NO_RED)"),
    OpDef(
        "accum_sum_last",
        1,
        _B,
        "accum",
        _last_to(lambda n, p: 1),
        _accum(True),
        "Σ over iterations and the last dim (RED_LD_SUM)",
    ),
    OpDef(
        "accum_mean_last",
        1,
        _B,
        "accum",
        _last_to(lambda n, p: 1),
        _accum(True, mean),
        "mean over iterations and the last dim (RED_LD_MEAN)",
    ),
    OpDef(
        "accum_rms_last",
        1,
        _B,
        "accum",
        _last_to(lambda n, p: 1),
        _accum(True, rms, square=True),
        "sqrt(mean(x²) + eps) over iterations and the last dim (RED_LD_RMS); eps optional",
    ),
    OpDef(
        "accum_sum_todimx",
        1,
        _B,
        "accum",
        _last_to(_todimx),
        _accum_todimx,
        "Σ over iterations, last dim strided to dimx: out[j] = Σ_k x[j + dimx·k] (REDTOX)",
        ("dimx",),
    ),
    OpDef("accum_max", 1, _B, "accum", _same, _accum_max, "max over iterations; only as a shift"),
    OpDef(
        "accum_rescale_sum",
        3,
        _B,
        "accum",
        _rescale_shape(False),
        _accum_rescale(False),
        "Σ_i x_i·exp(m_i − M): online-softmax rescaled sum (M = accum_max(m))",
    ),
    OpDef(
        "accum_rescale_sum_last",
        3,
        _B,
        "accum",
        _rescale_shape(True),
        _accum_rescale(True),
        "Σ_i Σ_last x_i·exp(m_i − M): online-softmax rescaled row sum",
    ),
]

OPS: dict[str, OpDef] = {o.name: o for o in _TABLE}
ACCUMULATORS = tuple(o.name for o in _TABLE if o.kind == "accum")
# Ops whose block-level argument positions are post-loop tensors (the rest are loop tensors).
POST_LOOP_ARGS = {"accum_rescale_sum": (2,), "accum_rescale_sum_last": (2,)}
