"""The µGraph op records: each op's shape rule, meaning, search properties and Mirage names.

Every kernel-level pre-defined op and every block-level op is one `OpDef` (`opdef.py`) in the
table below: arity, levels, a shape rule over tile (or tensor) shapes, `apply`, its meaning
over the `lax_ir.Algebra` protocol on values that carry `ctx.nb` leading batch dims (0 for a
kernel op; grid axes and the loop axis inside a block graph; see `evaluate.py`), how the
search treats it, and the original's op types. The float, field, degree and abstract-expression
semantics are the same code; `lower()` runs pre-defined kernel ops through this meaning too.
The table's order is the search's canonical op order. Adding an op: its record here, and one
rule in each GPU backend (`lower/pallas.py`, `lower/triton.py`); see docs/design.md.

Float meaning: an op computes in fp32 (`ACC_DTYPE`, as the generated kernels do) on its
arguments converted from their dtype, with constants rounded to the tensor's dtype first, and
rounds its result to the tensor's dtype. A matmul of operands of mixed width (fp32 activation,
fp16 weight) first rounds them to the narrow dtype (`opdef.matmul_operand_dtype`), as the
program's convert before the GEMM does. In the field `convert` is the identity.

Mirage-specific meanings (chosen to equal how the benchmark functions capture, op for op):
- silu(x) = x · logistic(x) (jax.nn.silu); sigmoid = logistic;
- gelu(x) = (0.5·x) · (1 − erf(−x · c)), which is how `jax.nn.gelu(x, approximate=False)`
  captures (erfc(y) normalised into 1 − erf(y)); c is 1/√2 as the region has it (rounded to
  its dtype by jax), a param, so the terms match whatever the dtype (default: 1/√2);
- gelu_tanh(x) = x · (0.5 · (1 + tanh(c · (x + a · x·x·x)))), how `jax.nn.gelu(x)` captures,
  with c = √(2/π) and a = 0.044715 params as the region has them;
- rms_norm(x) = x / sqrt(sum(x·x, last) / n) with NO eps (the original's); an optional `eps`
  param (rms_norm, accum_rms_last) adds it under the sqrt: our benchmarks' rms_norm has one,
  and `add_scalar` (x + scalar) spells it where the mean is separate;
- an optional `sq_dtype` param (square, rms_norm, layer_norm, accum_rms_last) rounds x·x to
  that 16-bit float, as a program that squares without upcasting does: where its square
  overflows to inf (|x| > 256 in float16), so does the op's, and the norm of that row is 0;
- layer_norm(x) = c / sqrt(sum(c·c, last) / n + eps?), c = x − sum(x, last) / n: LayerNorm's
  centring and scaling (gain and bias are separate mul/add ops);
- counts n are exact fp32 constants, so a mean is sum / n.
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
from collections.abc import Callable
from typing import Any

from mirage_jax.mugraph.opdef import ACC_DTYPE as ACC_DTYPE
from mirage_jax.mugraph.opdef import Ctx as Ctx
from mirage_jax.mugraph.opdef import Facts, matmul_operand_dtype, norm_params, square_params, when
from mirage_jax.mugraph.opdef import OpDef as OpDef
from mirage_jax.mugraph.opdef import SearchProps as S
from mirage_jax.mugraph.opdef import ShapeError as ShapeError
from mirage_jax.mugraph.opdef import binary as _binary
from mirage_jax.mugraph.opdef import broadcast as broadcast
from mirage_jax.mugraph.opdef import broadcast_full as broadcast_full
from mirage_jax.mugraph.opdef import concat_matmul_shape as _concat_matmul_shape
from mirage_jax.mugraph.opdef import concat_shape as _concat_shape
from mirage_jax.mugraph.opdef import last_to as _last_to
from mirage_jax.mugraph.opdef import matmul_shape as _matmul_shape
from mirage_jax.mugraph.opdef import reduce_shape as _reduce_shape
from mirage_jax.mugraph.opdef import rescale_shape as _rescale_shape
from mirage_jax.mugraph.opdef import same as _same
from mirage_jax.mugraph.opdef import todimx as _todimx


# ---------------------------------------------------------------------------- meanings
def _to_acc(ctx: Ctx, x: Any) -> Any:
    return ctx.alg.convert(x, ACC_DTYPE)


def _from_acc(ctx: Ctx, x: Any) -> Any:
    return ctx.alg.convert(x, ctx.dtype)


def const32(ctx: Ctx, value: float) -> Any:
    """A constant of the op: rounded to the tensor's dtype (or the op's `cdtype`: a float32
    constant of the program on a 16-bit tile), then used in fp32, as the backends'
    `dtype_const` has it."""
    return _to_acc(ctx, ctx.const(value, ctx.params.get("cdtype")))


def elementwise(fn: Callable[..., Any]) -> Callable[[Ctx, list[Any]], Any]:
    """The meaning of an elementwise op `fn(ctx, *args)`: computed in fp32, rounded back."""

    def apply(ctx: Ctx, a: list[Any]) -> Any:
        a = _same_rank(ctx, a)
        return _from_acc(ctx, fn(ctx, *[_to_acc(ctx, x) for x in a]))

    return apply


def _same_rank(ctx: Ctx, a: list[Any]) -> list[Any]:
    """Operands of fewer tile dims than the result's get unit dims before their tile (numpy's
    alignment from the right, kept clear of a block tensor's leading batch dims)."""
    rank = len(ctx.out_shape)
    if len(a) < 2 or all(len(s) == rank for s in ctx.arg_shapes):
        return a
    out = []
    for x, s in zip(a, ctx.arg_shapes):
        pad = rank - len(s)
        shape = (*s[: ctx.nb], *(1,) * pad, *s[ctx.nb :])
        out.append(ctx.alg.reshape(x, shape) if pad > 0 else x)
    return out


def _sum_keep(ctx, x, axes, shape):
    """Sum over `axes` of a value whose full shape is `shape`, keeping them as size 1."""
    out = ctx.alg.reduce_sum(x, tuple(axes))
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return ctx.alg.reshape(out, kept)


def _broadcast_to(ctx, x, shape, target):
    if tuple(shape) == tuple(target):
        return x
    return ctx.alg.broadcast_in_dim(x, tuple(target), tuple(range(len(target))))


SQRT_HALF = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715


def _gelu(ctx: Ctx, x: Any) -> Any:
    alg = ctx.alg
    half_x = alg.mul(const32(ctx, 0.5), x)
    y = alg.mul(alg.neg(x), const32(ctx, ctx.params.get("c", SQRT_HALF)))
    return alg.mul(half_x, alg.sub(const32(ctx, 1.0), alg.unary("erf", y)))


def _gelu_tanh(ctx: Ctx, x: Any) -> Any:
    alg = ctx.alg
    cube = alg.mul(alg.mul(x, x), x)
    inner = alg.add(x, alg.mul(const32(ctx, ctx.params.get("a", GELU_CUBIC)), cube))
    t = alg.unary("tanh", alg.mul(const32(ctx, ctx.params.get("c", SQRT_2_OVER_PI)), inner))
    return alg.mul(x, alg.mul(const32(ctx, 0.5), alg.add(const32(ctx, 1.0), t)))


def _near(values: tuple[float, ...], target: float, tol: float = 2e-3) -> list[float]:
    """The region's scalars that are `target` rounded to some float dtype (as captured)."""
    return [v for v in values if abs(v - target) <= tol * abs(target)]


def _gelu_offer(f: Facts) -> list[tuple]:
    return [(("c", c),) for c in _near(f.mul_scalars, SQRT_HALF)] if f.has("erf") else []


def _gelu_tanh_offer(f: Facts) -> list[tuple]:
    if not f.has("tanh", "integer_pow"):
        return []
    return [
        (("a", a), ("c", c))
        for a in _near(f.mul_scalars, GELU_CUBIC)
        for c in _near(f.mul_scalars, SQRT_2_OVER_PI)
    ]


def _mul_scalar(ctx: Ctx, x: Any) -> Any:
    s = ctx.params["scalar"]
    if isinstance(s, tuple):  # ("inv_size", k): a mean's 1/n before sizes are fixed (search terms)
        return ctx.alg.div(x, ctx.alg.count(s[1]))
    return ctx.alg.mul(x, const32(ctx, s))


def squared(ctx, x):
    """x·x of an fp32 value, rounded to the op's `sq_dtype` where it has one (the 16-bit float
    the program squares in: inf where the program's square overflows), back in fp32."""
    sq = ctx.alg.mul(x, x)
    dtype = ctx.params.get("sq_dtype")
    return sq if not dtype else _to_acc(ctx, ctx.alg.convert(sq, dtype))


def _plus_eps(ctx, ms):
    """mean(x²) + eps where the op has an `eps` param (the rms of rms_norm with an epsilon)."""
    eps = ctx.params.get("eps")
    return ms if not eps else ctx.alg.add(ms, ctx.const(eps, ACC_DTYPE))


NARROW_FLOATS = ("float16", "bfloat16")


def _operands(ctx, a):
    """A matmul's operands, first rounded where their dtypes mix (`matmul_operand_dtype`), then
    in fp32; or, both 16-bit floats of one kind and an algebra that multiplies them into an
    fp32 accumulator itself (`FloatAlgebra` over jax: a tensor-core GEMM), as they are. The
    products are exact in fp32 either way, so the sums are the same; an fp32 GEMM of converted
    operands ran GPT-2's pre-defined QKV projection at 28.2 µs against 9.8 (H100)."""
    narrow = matmul_operand_dtype(ctx.arg_dtypes)
    xs = [ctx.alg.convert(v, narrow) if narrow else v for v in a]
    kinds = {narrow} if narrow else set(ctx.arg_dtypes)
    if getattr(ctx.alg, "narrow_dot", False) and len(kinds) == 1 and kinds <= {*NARROW_FLOATS}:
        return xs
    return [_to_acc(ctx, v) for v in xs]


def _matmul(ctx, a):
    x, y = _operands(ctx, a)
    xs, ys = ctx.arg_shapes
    return _from_acc(ctx, fold_matmul(ctx.alg, x, y, xs, ys, ACC_DTYPE))


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
    ss = _sum_keep(ctx, squared(ctx, x), (len(shape) - 1,), shape)
    rms = alg.unary("sqrt", _plus_eps(ctx, alg.div(ss, ctx.const(shape[-1], ACC_DTYPE))))
    return _from_acc(ctx, alg.div(x, rms))


def _layer_norm(ctx, a):
    alg, shape = ctx.alg, ctx.arg_shapes[0]
    x = _to_acc(ctx, a[0])
    n = ctx.const(shape[-1], ACC_DTYPE)
    c = alg.sub(x, alg.div(_sum_keep(ctx, x, (len(shape) - 1,), shape), n))
    ss = _sum_keep(ctx, squared(ctx, c), (len(shape) - 1,), shape)
    return _from_acc(ctx, alg.div(c, alg.unary("sqrt", _plus_eps(ctx, alg.div(ss, n)))))


def _batch_target(ctx, shapes):
    """Common shape of concat operands: broadcast batch dims, keep each tile."""
    nb = ctx.nb
    batch = tuple(max(s[i] for s in shapes) for i in range(nb))
    return [(*batch, *s[nb:]) for s in shapes]


def _concat(ctx, a):
    rank = len(ctx.arg_shapes[0]) - ctx.nb
    axis = ctx.tile_axis(ctx.params["dim"], rank)
    targets = _batch_target(ctx, ctx.arg_shapes)
    xs = [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a, ctx.arg_shapes, targets)]
    return ctx.alg.concatenate(xs, axis)


def _concat_matmul(ctx, a):
    a = _operands(ctx, a)
    shapes = ctx.arg_shapes
    rank = len(shapes[0]) - ctx.nb
    left_t = _batch_target(ctx, shapes[:2])
    right_t = _batch_target(ctx, shapes[2:])
    left = ctx.alg.concatenate(
        [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a[:2], shapes[:2], left_t)],
        ctx.tile_axis(-1, rank),
    )
    right = ctx.alg.concatenate(
        [_broadcast_to(ctx, v, s, t) for v, s, t in zip(a[2:], shapes[2:], right_t)],
        ctx.tile_axis(-2, rank),
    )
    return _from_acc(ctx, ctx.alg.matmul(left, right, ACC_DTYPE))


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
            x = squared(ctx, x)
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


def _accum_keep(ctx, a):
    # a loop-invariant tile (batch F = 1: `validate` checks it) carried past the loop as it is
    return ctx.alg.reshape(a[0], ctx.out_shape)


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


# ---------------------------------------------------------------------------- vocabulary offers
def _mul_scalars(f: Facts) -> list[tuple]:
    wide = (("cdtype", "float32"),)
    return [(("scalar", s), *(wide if s in f.wide_scalars else ())) for s in f.mul_scalars] + [
        (("scalar", ("inv_size", k)),) for k in f.inv_sizes
    ]


def _add_scalars(f: Facts) -> list[tuple]:
    return [(("scalar", s),) for s in f.add_scalars]


def _norm_offer(f: Facts) -> list[tuple]:
    return norm_params(f) if f.has("sqrt", "square", "reduce_sum") else []


def _layer_norm_offer(f: Facts) -> list[tuple]:
    return norm_params(f) if f.has("sqrt", "square", "reduce_sum", "sub") else []


def _sum_last_offer(f: Facts) -> list[tuple]:
    return [()] if f.combine or f.has("reduce_sum") or f.has("matmul") else []


def _mean_last_offer(f: Facts) -> list[tuple]:
    return [()] if not f.combine and f.has("reduce_sum", "div") else []


def _rms_last_offer(f: Facts) -> list[tuple]:
    # in a combining kernel too: the rms of a row it reads again (`tasks._combine`'s reread)
    return norm_params(f) if f.has("sqrt", "square") else []


def _sub_offer(f: Facts) -> list[tuple]:
    return [()] if f.has("sub") or f.has("neg") else []


# ---------------------------------------------------------------------------- the table
_KB = frozenset({"kernel", "block"})
_B = frozenset({"block"})
_EW = "elementwise"


def _names(*types: str, **params: Any) -> dict[str, dict[str, Any]]:
    return {t: dict(params) for t in types}


# The order is the search's canonical op order (`RANK`).
_TABLE = [
    OpDef(
        "matmul", 2, _KB, "matmul", _matmul_shape, _matmul, "batched a[..,M,K] @ b[..,K,N]",
        imports=_names("kn_matmul_op", "tb_matmul_op"),
    ),
    OpDef(
        "concat_matmul", 4, _B, "matmul", _concat_matmul_shape, _concat_matmul,
        "(a|b) @ (c;d) = a@c + b@d", imports=_names("tb_concat_then_matmul_op"),
    ),
    OpDef(
        "mul", 2, _KB, _EW, _binary, elementwise(lambda c, a, b: c.alg.mul(a, b)),
        "a · b (size-1 broadcasting)", search=S(when("mul"), scale_result=False),
        imports=_names("kn_mul_op", "tb_mul_op"),
    ),
    OpDef(
        "div", 2, _KB, _EW, _binary, elementwise(lambda c, a, b: c.alg.div(a, b)),
        "a / b (size-1 broadcasting)", search=S(when("div"), scale_result=False, sfu=1),
        imports=_names("kn_div_op", "tb_div_op"),
    ),
    OpDef(
        "add", 2, _KB, _EW, _binary, elementwise(lambda c, a, b: c.alg.add(a, b)),
        "a + b (size-1 broadcasting)", search=S(when("add")),
        imports=_names("kn_add_op", "tb_add_op"),
    ),
    OpDef(
        "sub", 2, _KB, _EW, _binary, elementwise(lambda c, a, b: c.alg.sub(a, b)),
        "a − b (size-1 broadcasting)", search=S(_sub_offer),
        imports=_names("kn_sub_op", "tb_sub_op"),
    ),
    OpDef(
        "exp", 1, _KB, _EW, _same, elementwise(lambda c, x: c.alg.exp(x)), "e**x",
        search=S(when("exp"), sfu=1), imports=_names("kn_exp_op", "tb_exp_op"),
    ),
    OpDef(
        "square", 1, _KB, _EW, _same, elementwise(squared), "x·x (rounded to sq_dtype?)",
        search=S(lambda f: square_params(f) if f.has("square") else [], scale_result=False),
        imports=_names("kn_square_op", "tb_square_op"),
    ),
    OpDef(
        "sqrt", 1, _KB, _EW, _same, elementwise(lambda c, x: c.alg.unary("sqrt", x)),
        "square root (uninterpreted in the field)",
        search=S(when("sqrt"), scale_result=False, sfu=1),
        imports=_names("kn_sqrt_op", "tb_sqrt_op"),
    ),
    OpDef(
        "sigmoid", 1, _KB, _EW, _same, elementwise(lambda c, x: c.alg.unary("logistic", x)),
        "logistic(x)", search=S(when("logistic"), scale_result=False, sfu=2),
        imports=_names("kn_sigmoid_op", "tb_sigmoid_op"),
    ),
    OpDef(
        "silu", 1, _KB, _EW, _same,
        elementwise(lambda c, x: c.alg.mul(x, c.alg.unary("logistic", x))), "x·logistic(x)",
        search=S(when("logistic"), scale_result=False, sfu=2, fused=True),
        imports=_names("kn_silu_op", "tb_silu_op"),
    ),
    OpDef(
        "tanh", 1, _KB, _EW, _same, elementwise(lambda c, x: c.alg.unary("tanh", x)),
        "tanh(x) (uninterpreted in the field)",
        # a scale on tanh's result has no other place (Gemma-2's soft cap, c·tanh(s/c))
        search=S(when("tanh"), sfu=2),
    ),
    OpDef(
        "relu", 1, _KB, _EW, _same, elementwise(lambda c, x: c.alg.unary("relu", x)),
        "max(x, 0) (uninterpreted in the field)", search=S(when("relu"), scale_result=False),
    ),
    OpDef(
        "gelu", 1, _KB, _EW, _same, elementwise(_gelu),
        "0.5x·(1 − erf(−x·c)), c = 1/√2 as the region has it (erf form; optional param c)",
        search=S(_gelu_offer, scale_result=False, sfu=2, fused=True),
        imports=_names("kn_gelu_op", "tb_gelu_op"),
    ),
    OpDef(
        "gelu_tanh", 1, _KB, _EW, _same, elementwise(_gelu_tanh),
        "x·0.5·(1 + tanh(c·(x + a·x³))), c = √(2/π), a = 0.044715 as the region has them "
        "(optional params a, c)",
        search=S(_gelu_tanh_offer, scale_result=False, sfu=2, fused=True),
    ),
    OpDef(
        "mul_scalar", 1, _KB, _EW, _same, elementwise(_mul_scalar),
        "x·scalar (the scalar rounded to the tile's dtype, or to the optional param cdtype)",
        ("scalar",),
        search=S(_mul_scalars, scale_result=False),
    ),
    OpDef(
        "add_scalar", 1, _KB, _EW, _same,
        elementwise(lambda c, x: c.alg.add(x, const32(c, c.params["scalar"]))), "x + scalar",
        ("scalar",), search=S(_add_scalars, scale_result=False),
    ),
    OpDef(
        "reduce_sum", 1, _KB, "reduce", _reduce_shape, _reduce_sum, "sum over dim, kept as 1",
        ("dim",),
        imports={f"{p}_reduction_{d}_op": {"dim": d} for p in ("kn", "tb") for d in range(3)},
    ),
    OpDef(
        "reduce_max", 1, _KB, "reduce", _reduce_shape, _reduce_max,
        "max over dim, kept as 1; only as a softmax shift", ("dim",),
    ),
    OpDef(
        "rms_norm", 1, _KB, "norm", _same, _rms_norm, "x / sqrt(mean(x², last) + eps?)",
        search=S(_norm_offer, scale_result=False),
        imports=_names("kn_rms_norm_op", "tb_rms_norm_op"),
    ),
    OpDef(
        "layer_norm", 1, _KB, "norm", _same, _layer_norm,
        "c / sqrt(mean(c², last) + eps?), c = x − mean(x, last) (LayerNorm without gain, bias)",
        search=S(_layer_norm_offer, scale_result=False),
    ),
    OpDef(
        "concat", None, _KB, "concat", _concat_shape, _concat, "concatenate along dim", ("dim",),
        imports={f"{p}_concat_{d}_op": {"dim": d} for p in ("kn", "tb") for d in range(3)},
    ),
    # For-loop accumulators (block level only; loop tensor in, post-loop tensor out).
    OpDef(
        "accum_sum", 1, _B, "accum", _same, _accum(False), "Σ over iterations (NO_RED)",
        search=S(lambda f: [()]),
        imports=_names(
            "tb_forloop_accum_nored_op", "tb_forloop_accum_no_red_op", "tb_accum_nored_op"
        ),
    ),
    OpDef(
        "accum_sum_last", 1, _B, "accum", _last_to(lambda n, p: 1), _accum(True),
        "Σ over iterations and the last dim (RED_LD_SUM)", search=S(_sum_last_offer),
        imports=_names("tb_forloop_accum_red_ld_sum_op", "tb_accum_red_ld_sum_op"),
    ),
    OpDef(
        "accum_mean_last", 1, _B, "accum", _last_to(lambda n, p: 1), _accum(True, mean),
        "mean over iterations and the last dim (RED_LD_MEAN)", search=S(_mean_last_offer),
        imports=_names("tb_forloop_accum_red_ld_mean_op", "tb_accum_red_ld_mean_op"),
    ),
    OpDef(
        "accum_rms_last", 1, _B, "accum", _last_to(lambda n, p: 1),
        _accum(True, rms, square=True),
        "sqrt(mean(x²) + eps) over iterations and the last dim (RED_LD_RMS); eps optional",
        search=S(_rms_last_offer),
        imports=_names("tb_forloop_accum_red_ld_rms_op", "tb_accum_red_ld_rms_op"),
    ),
    OpDef(
        "accum_sum_todimx", 1, _B, "accum", _last_to(_todimx), _accum_todimx,
        "Σ over iterations, last dim strided to dimx: out[j] = Σ_k x[j + dimx·k] (REDTOX)",
        ("dimx",), search=S(lambda f: [()] if f.combine else []),
        imports=_names(
            "tb_forloop_accum_redtox_ld_sum_op", "tb_accum_redtox_ld_sum_op", dimx=None
        ),
    ),
    OpDef(
        "accum_max", 1, _B, "accum", _same, _accum_max, "max over iterations; only as a shift",
        search=S(when("reduce_max")),
    ),
    OpDef(
        "accum_rescale_sum", 3, _B, "accum", _rescale_shape(False), _accum_rescale(False),
        "Σ_i x_i·exp(m_i − M): online-softmax rescaled sum (M = accum_max(m))", search=S(sfu=2),
    ),
    OpDef(
        "accum_rescale_sum_last", 3, _B, "accum", _rescale_shape(True), _accum_rescale(True),
        "Σ_i Σ_last x_i·exp(m_i − M): online-softmax rescaled row sum", search=S(sfu=2),
    ),
    OpDef(
        "accum_keep", 1, _B, "accum", _same, _accum_keep,
        "a loop-invariant tile after the loop, as it is (an epilogue's residual or bias read "
        "by a kernel that loops)", search=S(lambda f: [()]),
    ),
]  # fmt: skip

OPS: dict[str, OpDef] = {o.name: o for o in _TABLE}
RANK: dict[str, int] = {o.name: i for i, o in enumerate(_TABLE)}
"""The canonical op order of the search (the table's order)."""
ACCUMULATORS = tuple(o.name for o in _TABLE if o.kind == "accum")
# Ops whose block-level argument positions are post-loop tensors (the rest are loop tensors).
POST_LOOP_ARGS = {"accum_rescale_sum": (2,), "accum_rescale_sum_last": (2,)}
