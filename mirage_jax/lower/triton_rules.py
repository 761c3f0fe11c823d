"""The triton backend's block-op rules: per op, the `@triton.jit` source expression of its tile.

One rule per block op (`registry.add(BACKEND, op, rule)`), an `AccumRule` (init, update,
finalise) for an accumulator; `OpCtx` is what a rule sees (the plan, the tensor, its args'
tiles and dtypes). The generator that strings them into kernels is `triton.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage_jax.lower import registry
from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.registry import AccumRule
from mirage_jax.mugraph.opdef import matmul_operand_dtype
from mirage_jax.mugraph.ops import GELU_CUBIC, SQRT_2_OVER_PI, SQRT_HALF

BACKEND = "triton"
LOG2E = 1.4426950408889634
F32_MIN = float(np.finfo(np.float32).min)
TL_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}


# ---------------------------------------------------------------------------- emitter context
@dataclass
class OpCtx:
    """What a source rule sees: the plan, its tensor id, args, params and value dtypes."""

    plan: KernelPlan
    t: int
    args: tuple[int, ...]
    params: dict
    is_f32: dict[int, bool]
    prefix: str = ""

    @property
    def dtype(self) -> str:
        return self.plan.dtype(self.t)

    @property
    def pad(self) -> tuple[int, ...]:
        return self.plan.pads[self.t]

    def arg_tile(self, i: int) -> tuple[int, ...]:
        return self.plan.tile(self.args[i])

    def f32(self, expr: str, i: int) -> str:
        """Arg i's expression in fp32."""
        return expr if self.is_f32.get(self.args[i], False) else f"{expr}.to(tl.float32)"

    def mask(self, i: int, dims: tuple[int, ...]) -> str | None:
        a = self.args[i]
        pads, tiles = self.plan.pads[a], self.plan.tile(a)
        parts = []
        for d in dims:
            d %= len(pads)
            if pads[d] != tiles[d]:
                parts.append(f"({lane(pads, d)} < {tiles[d]})")
        return " & ".join(parts) if parts else None

    def masked(self, expr: str, i: int, dims: tuple[int, ...], fill: str) -> str:
        m = self.mask(i, dims)
        return expr if m is None else f"tl.where({m}, {expr}, {fill})"

    @property
    def eps(self) -> str:
        return repr(float(self.params.get("eps") or 0.0))

    def name(self, t: int) -> str:
        """The source name of tile `t` (an input or a block op of this kernel)."""
        return f"{self.prefix}t{t}"

    def value(self, t: int) -> str:
        """Tile `t`'s value in fp32."""
        return self.name(t) if self.is_f32.get(t, False) else f"{self.name(t)}.to(tl.float32)"

    def producer(self, t: int) -> Any | None:
        """The block op that makes tile `t`, if its own args can be read where this op is
        computed: a plain op (no accumulator) of the same phase (pre-loop, loop, post-loop)."""
        plan = self.plan
        if t < plan.n_in or t in plan.accumulators or plan.phases[t] != plan.phases[self.t]:
            return None
        return plan.op(t)


def lane(pads: tuple[int, ...], d: int) -> str:
    """tl.arange over dim d of a tile of padded shape `pads`, broadcastable to it."""
    rank = len(pads)
    r = f"tl.arange(0, {pads[d]})"
    if rank == 1:
        return r
    return r + "[" + ", ".join(":" if k == d else "None" for k in range(rank)) + "]"


def _shape(pads: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, pads)) + ("," if len(pads) == 1 else "") + ")"


# ---------------------------------------------------------------------------- block-op rules
def squared(c: OpCtx, v: str) -> str:
    """v·v of an fp32 value, rounded to the op's `sq_dtype` where it has one (as the op's
    meaning: inf where the program's 16-bit square overflows)."""
    dtype = c.params.get("sq_dtype")
    return f"({v} * {v})" if not dtype else f"({v} * {v}).to({TL_DTYPES[dtype]}).to(tl.float32)"


def _sq(c: OpCtx, x: str) -> str:
    return squared(c, c.f32(x, 0))


def _unary(template: str) -> Callable[..., str]:
    return lambda c, x: template.format(x=f"({c.f32(x, 0)})")


def _binary(op: str) -> Callable[..., str]:
    return lambda c, a, b: f"{c.f32(a, 0)} {op} {c.f32(b, 1)}"


def rounded(dtype: str, value: float) -> float:
    """`value` rounded to `dtype` (as the op's meaning has it), as an fp32 number."""
    return float(np.float32(np.asarray(value, dtype=dtype)))


def dtype_const(c: OpCtx, value: float) -> str:
    """A constant of the op as its meaning has it: rounded to the tensor's dtype (or the op's
    `cdtype`), used in fp32."""
    return repr(rounded(c.params.get("cdtype", c.dtype), value))


registry.add(BACKEND, "square", _sq)
for _name, _tpl in {
    "sqrt": "tl.sqrt({x})",
    "sigmoid": "tl.sigmoid({x})",
    "silu": "{x} * tl.sigmoid({x})",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)",
    "relu": "tl.maximum({x}, 0.0)",
}.items():
    registry.add(BACKEND, _name, _unary(_tpl))
for _name, _op in {"add": "+", "sub": "-", "mul": "*", "div": "/"}.items():
    registry.add(BACKEND, _name, _binary(_op))
registry.add(
    BACKEND,
    "gelu",
    lambda c, x: (
        f"{dtype_const(c, 0.5)} * {c.f32(x, 0)} * "
        f"(1.0 - tl.math.erf(-{c.f32(x, 0)} * "
        f"{dtype_const(c, c.params.get('c', SQRT_HALF))}))"
    ),
)


def _gelu_tanh(c: OpCtx, x: str) -> str:
    v = f"({c.f32(x, 0)})"
    a = dtype_const(c, c.params.get("a", GELU_CUBIC))
    inner = f"{dtype_const(c, c.params.get('c', SQRT_2_OVER_PI))} * ({v} + {a} * ({v} * {v} * {v}))"
    tanh = f"(2.0 * tl.sigmoid(2.0 * ({inner})) - 1.0)"
    return f"{v} * ({dtype_const(c, 0.5)} * (1.0 + {tanh}))"


registry.add(BACKEND, "gelu_tanh", _gelu_tanh)


def _scaled(c: OpCtx, t: int) -> tuple[str, float]:
    """Tile `t` as (fp32 expression, factor) with t = expression · factor: a mul_scalar by a
    positive constant is looked through (its own value is then left to dead-code removal)."""
    op = c.producer(t)
    if op is not None and op.op == "mul_scalar":
        k = rounded(op.param("cdtype") or c.plan.dtype(t), op.param("scalar"))
        if k > 0:
            return c.value(op.args[0]), k
    return c.value(t), 1.0


@registry.register(BACKEND, "exp")
def _exp(c: OpCtx, x: str) -> str:
    """exp as exp2(x·log2 e), as tl.exp does; for the softmax's shifted scores, x = a·k − m
    with m = max(a·k) in the same phase, one fused multiply-add: exp2(a·(k·log2 e) − m·log2 e).
    m·log2 e is taken on the (smaller) max tile, kept finite where m is the clamp of a tile
    masked whole (`_reduce_max`: −3.4e38·log2 e overflows to −inf, and −inf − −inf is NaN)."""
    op = c.producer(c.args[0])
    if op is not None and op.op == "sub" and _is_max_of(c, op.args[1], op.args[0]):
        a, k = _scaled(c, op.args[0])
        shift = f"tl.maximum({c.value(op.args[1])} * {LOG2E!r}, {F32_MIN!r})"
        return f"tl.math.exp2(tl.math.fma({a}, {k * LOG2E!r}, -{shift}))"
    a, k = _scaled(c, c.args[0])
    return f"tl.math.exp2({a} * {k * LOG2E!r})"


def _is_max_of(c: OpCtx, m: int, x: int) -> bool:
    """Is tile m the max of tile x over some dim (both of this phase)?"""
    op = c.producer(m)
    return op is not None and op.op == "reduce_max" and op.args[0] == x


registry.add(
    BACKEND, "mul_scalar", lambda c, x: f"{c.f32(x, 0)} * {dtype_const(c, c.params['scalar'])}"
)
registry.add(
    BACKEND, "add_scalar", lambda c, x: f"{c.f32(x, 0)} + {dtype_const(c, c.params['scalar'])}"
)


def _dot(c: OpCtx, a: str, b: str, ia: int, ib: int, path: str) -> str:
    pa, pb = c.plan.pads[c.args[ia]], c.plan.pads[c.args[ib]]
    m, k, n = pa[-2], pa[-1], pb[-1]
    narrow = matmul_operand_dtype([c.plan.dtype(x) for x in c.args])
    if narrow:  # mixed widths: operands rounded to the narrow dtype (the op's float meaning)
        a, b = (f"{x}.to({TL_DTYPES[narrow]})" for x in (a, b))
    a2, b2 = c.masked(a, ia, (-1,), "0.0"), c.masked(b, ib, (-2,), "0.0")
    flat = len(pa) == len(pb) == len(c.pad) == 2  # 2-D tiles (`squeeze`): no reshapes
    if not flat:
        a2, b2 = f"tl.reshape({a2}, ({m}, {k}))", f"tl.reshape({b2}, ({k}, {n}))"
    if path == "outer":  # K = 1: broadcast (.., M, 1) * (.., 1, N) at full rank, no reshape
        if narrow:
            return f"{a}.to(tl.float32) * {b}.to(tl.float32)"
        return f"{c.f32(a, ia)} * {c.f32(b, ib)}"
    if path == "fma":
        out = f"tl.sum({a2}.to(tl.float32)[:, :, None] * {b2}.to(tl.float32)[None, :, :], axis=1)"
    else:
        dt = narrow or c.dtype
        prec = ', input_precision="ieee"' if dt == "float32" else ""
        out = f"tl.dot({a2}.to({TL_DTYPES[dt]}), {b2}.to({TL_DTYPES[dt]}){prec})"
    return out if flat else f"tl.reshape({out}, {_shape(c.pad)})"


@registry.register(BACKEND, "matmul")
def _matmul(c: OpCtx, a: str, b: str) -> str:
    (mp,) = c.plan.matmuls[c.t]
    return _dot(c, a, b, 0, 1, mp.path)


@registry.register(BACKEND, "concat_matmul")
def _concat_matmul(c: OpCtx, a: str, b: str, x: str, y: str) -> str:
    p1, p2 = c.plan.matmuls[c.t]
    return f"{_dot(c, a, x, 0, 2, p1.path)} + {_dot(c, b, y, 1, 3, p2.path)}"


@registry.register(BACKEND, "reduce_sum")
def _reduce_sum(c: OpCtx, x: str) -> str:
    d = c.params["dim"] % len(c.pad)
    return f"tl.sum({c.masked(c.f32(x, 0), 0, (d,), '0.0')}, axis={d}, keep_dims=True)"


@registry.register(BACKEND, "reduce_max")
def _reduce_max(c: OpCtx, x: str) -> str:
    """max over a dim; max(a·k) = max(a)·k for k > 0 (exact: rounding is monotone), so a scaled
    tile's scale is applied to the reduced one."""
    d = c.params["dim"] % len(c.pad)
    a, k = _scaled(c, c.args[0])
    m = f"tl.max({c.masked(a, 0, (d,), 'float("-inf")')}, axis={d}, keep_dims=True)"
    if k != 1.0:
        m = f"({m} * {k!r})"
    return f"tl.maximum({m}, {F32_MIN!r})"  # masked whole: exp(-inf)


@registry.register(BACKEND, "rms_norm")
def _rms_norm(c: OpCtx, x: str) -> str:
    x32 = c.f32(x, 0)
    last = len(c.pad) - 1
    ss = f"tl.sum({c.masked(squared(c, x32), 0, (-1,), '0.0')}, axis={last}, keep_dims=True)"
    return f"{x32} / tl.sqrt({ss} / {float(c.arg_tile(0)[-1])!r} + {c.eps})"


@registry.register(BACKEND, "layer_norm")
def _layer_norm(c: OpCtx, x: str) -> str:
    x32 = c.f32(x, 0)
    last = len(c.pad) - 1
    n = float(c.arg_tile(0)[-1])
    mean = f"tl.sum({c.masked(x32, 0, (-1,), '0.0')}, axis={last}, keep_dims=True) / {n!r}"
    cen = f"({x32} - {mean})"
    ss = f"tl.sum({c.masked(squared(c, cen), 0, (-1,), '0.0')}, axis={last}, keep_dims=True)"
    return f"{cen} / tl.sqrt({ss} / {n!r} + {c.eps})"


@registry.register(BACKEND, "concat")
def _concat(c: OpCtx, a: str, b: str) -> str:
    rank = len(c.pad)
    d = c.params["dim"] % rank
    perm = (*range(d), rank, *range(d, rank))
    joined = f"tl.join({c.f32(a, 0)}, {c.f32(b, 1)})"
    return f"tl.reshape(tl.permute({joined}, {perm}), {_shape(c.pad)})"


# ---------------------------------------------------------------------------- accumulators
def _zeros(c: OpCtx) -> str:
    return f"tl.zeros({_shape(c.pad)}, dtype=tl.float32)"


def _sum_last(c: OpCtx, expr: str) -> str:
    return f"tl.sum({c.masked(expr, 0, (-1,), '0.0')}, axis={len(c.pad) - 1}, keep_dims=True)"


LANE_ELEMENTS = 4096
"""A sum over the loop and the last dim whose input tile has at most this many (padded)
elements keeps the tile's lanes across the loop and sums them once after it (`lanes`)."""


LANE_SUMS = frozenset({"accum_sum_last", "accum_mean_last", "accum_rms_last"})
"""The accumulators `lanes` applies to."""


def lanes(c: OpCtx) -> bool:
    """Does this accumulator over the loop and the last dim add its input tile lane by lane in
    the loop, and sum the lanes after it? A `tl.sum` each step is a block-wide reduction and a
    barrier: a combining kernel's rms of a 4096-wide row over 16 steps took 6.0 µs where the
    plain sum of the same partials took 1.1 (H200, 2026-11-28, `gemv_tilings --norm`)."""
    return (
        c.plan.op(c.t).op in LANE_SUMS
        and c.plan.forloop_range > 1
        and math.prod(c.plan.pads[c.args[0]]) <= LANE_ELEMENTS
    )


def lane_total(c: OpCtx, s: str) -> str:
    """The accumulator `s` summed over its lanes (`lanes`): the op's own tile."""
    return f"tl.sum({s}, axis={len(c.pad) - 1}, keep_dims=True)" if lanes(c) else s


def _last_init(c: OpCtx) -> str:
    if lanes(c):
        return f"tl.zeros({_shape(c.plan.pads[c.args[0]])}, dtype=tl.float32)"
    return _zeros(c)


def _last_add(c: OpCtx, s: str, expr: str) -> str:
    if lanes(c):
        return f"{s} + {c.masked(expr, 0, (-1,), '0.0')}"
    return f"{s} + {_sum_last(c, expr)}"


def _count(c: OpCtx) -> str:
    return repr(float(c.plan.forloop_range * c.arg_tile(0)[-1]))


def _todimx(c: OpCtx, x: str) -> str:
    pads = c.plan.pads[c.args[0]]
    dimx = c.params["dimx"]
    split = (*pads[:-1], pads[-1] // dimx, dimx)
    # padded groups (a split into a non-power-of-two number of parts) are masked to zero
    x32 = c.masked(c.f32(x, 0), 0, (-1,), "0.0")
    return f"tl.sum(tl.reshape({x32}, {_shape(split)}), axis={len(pads) - 1})"


def _same(c: OpCtx, s: str) -> str:
    return s


registry.add(BACKEND, "accum_sum", AccumRule(_zeros, lambda c, s, x: f"{s} + {c.f32(x, 0)}", _same))
registry.add(
    BACKEND,
    "accum_sum_last",
    AccumRule(_last_init, lambda c, s, x: _last_add(c, s, c.f32(x, 0)), lane_total),
)
registry.add(
    BACKEND,
    "accum_mean_last",
    AccumRule(
        _last_init,
        lambda c, s, x: _last_add(c, s, c.f32(x, 0)),
        lambda c, s: f"{lane_total(c, s)} / {_count(c)}",
    ),
)
registry.add(
    BACKEND,
    "accum_rms_last",
    AccumRule(
        _last_init,
        lambda c, s, x: _last_add(c, s, _sq(c, x)),
        lambda c, s: f"tl.sqrt({lane_total(c, s)} / {_count(c)} + {c.eps})",
    ),
)
# a loop-invariant tile (loaded before the loop): every iteration's value is the one kept
registry.add(BACKEND, "accum_keep", AccumRule(_zeros, lambda c, s, x: c.f32(x, 0), _same))
registry.add(
    BACKEND, "accum_sum_todimx", AccumRule(_zeros, lambda c, s, x: f"{s} + {_todimx(c, x)}", _same)
)
registry.add(
    BACKEND,
    "accum_max",
    AccumRule(
        lambda c: f'tl.full({_shape(c.pad)}, float("-inf"), tl.float32)',
        lambda c, s, x: f"tl.maximum({s}, {c.f32(x, 0)})",
        _same,
    ),
)


def _rescale(last: bool):
    def update(c: OpCtx, s: str, x: str, m: str | None, old: str, new: str) -> str:
        """m None: x was computed with the running max itself (`running_max`): factor 1;
        old == new: the reference max is fixed (`speculative_max`): no rescale."""
        y = _sum_last(c, c.f32(x, 0)) if last else c.f32(x, 0)
        if m is not None:  # last: the shift is constant along the summed dim: sum, then rescale
            y = f"{y} * tl.math.exp2(({c.f32(m, 1)} - {new}) * {LOG2E!r})"
        if old == new:
            return f"{s} + {y}"
        return f"{s} * tl.math.exp2(({old} - {new}) * {LOG2E!r}) + {y}"

    return update


registry.add(BACKEND, "accum_rescale_sum", AccumRule(_zeros, _rescale(False), _same))
registry.add(BACKEND, "accum_rescale_sum_last", AccumRule(_zeros, _rescale(True), _same))
