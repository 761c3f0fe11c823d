"""Pallas backend: one graph-defined kernel becomes one `pl.pallas_call` (Triton lowering).

The grid is the block graph's grid; each argument's BlockSpec covers what one block reads over
all iterations (its tile, times F along the for-loop dim), and the for-loop is an in-kernel
`fori_loop` that slices the loop dim with `pl.ds`, carrying fp32 accumulator states. Dims whose
tile is not a power of two (or too small for tl.dot) take the whole dim as the block and are
read and written with masked `plt.load`/`plt.store` of the padded tile. Loop-invariant inputs
and ops are computed once before the loop; ops after the accumulators (the epilogue) run once
in registers before the masked stores. Runs on the CPU with `interpret=True`.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from mirage_jax.lower import registry
from mirage_jax.lower.plan import KernelConfig, KernelPlan
from mirage_jax.lower.registry import AccumRule, LoweringError
from mirage_jax.mugraph.opdef import matmul_operand_dtype
from mirage_jax.mugraph.ops import GELU_CUBIC, OPS, SQRT_2_OVER_PI, SQRT_HALF

F32 = jnp.float32
BACKEND = "pallas"


@dataclass(frozen=True)
class PallasConfig(KernelConfig):
    """Knobs of the Pallas (Triton) lowering.

    The µGraph fixes every tile (grid and forloop_range determine them), so the tile freedom
    left is how small dots are padded.

    Arguments:
        num_warps: warps per block (Triton's `num_warps`).
        num_stages: software-pipelining depth of the for-loop's loads (`num_stages`).
        loop_unroll: unroll factor of the in-kernel for-loop (1: no unrolling).
        min_dot: smallest M/N/K handed to tl.dot (a power of two >= 16).
    """


def default_config() -> PallasConfig:
    return PallasConfig()


# ---------------------------------------------------------------------------- op context
@dataclass(frozen=True)
class OpCtx:
    """What a block-op rule sees: the plan, its tensor id, args, params and the masks."""

    plan: KernelPlan
    t: int
    args: tuple[int, ...]
    params: dict
    config: PallasConfig
    drop: int = 0  # leading unit dims squeezed out of every tile in the kernel (`squeezed`)

    @property
    def dtype(self) -> Any:
        return jnp.dtype(self.plan.dtype(self.t))

    @property
    def pad(self) -> tuple[int, ...]:
        return self.plan.pads[self.t][self.drop :]

    @property
    def eps(self) -> np.float32:
        """The optional eps of rms_norm / accum_rms_last (0 when absent)."""
        return np.float32(self.params.get("eps") or 0.0)

    def arg_tile(self, i: int) -> tuple[int, ...]:
        return self.plan.tile(self.args[i])[self.drop :]

    def axis(self, dim: int) -> int:
        """A block op's `dim` param (over the full-rank tile) as an axis of the squeezed value."""
        return dim % len(self.plan.pads[self.t]) - self.drop

    def masked(self, x: jax.Array, i: int, dims: tuple[int, ...], fill: float) -> jax.Array:
        """`x` (the value of arg i) with its padded lanes along `dims` set to `fill`."""
        a = self.args[i]
        keep = None
        for d in dims:
            d %= len(x.shape)
            if self.plan.masked(a, d + self.drop):
                m = jax.lax.broadcasted_iota(jnp.int32, x.shape, d) < self.arg_tile(i)[d]
                keep = m if keep is None else keep & m
        return x if keep is None else jnp.where(keep, x, jnp.asarray(fill, x.dtype))


def _f32(x: jax.Array) -> jax.Array:
    return x.astype(F32)


LOG2E = np.float32(math.log2(math.e))


def fast_exp(x: jax.Array) -> jax.Array:
    """exp(x) as exp2(x·log2 e), what Triton's own tl.exp does.

    Pallas lowers an fp32 `jnp.exp` to libdevice's accurate `__nv_expf`, but `jnp.exp2` to
    `__nv_exp2f`, one MUFU.EX2 instruction: a few percent on the H100's attention kernels
    (7.5 -> 7.2 µs for gqa_bs1[25]'s first kernel; docs/perf_log.md). The extra rounding of
    x·log2 e is a relative error below |x|·2^-24, far under fp16's.
    """
    return jnp.exp2(x * LOG2E)


def _sigmoid(x: jax.Array) -> jax.Array:
    return 1.0 / (1.0 + fast_exp(-x))


def _erf(x: jax.Array) -> jax.Array:
    """erf by Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7): Pallas-Triton has no erf rule."""
    t = 1.0 / (1.0 + 0.3275911 * jnp.abs(x))
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    y = 1.0 - poly * fast_exp(-x * x)
    return jnp.where(x < 0, -y, y)


def dtype_const(ctx: OpCtx, value: float) -> np.float32:
    """A constant of the op as its meaning has it: rounded to the tensor's dtype (or the op's
    `cdtype`), used in fp32."""
    return np.float32(np.asarray(value, dtype=ctx.params.get("cdtype", ctx.dtype)))


# ---------------------------------------------------------------------------- block-op rules
def _unary(fn: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    return lambda ctx, x: fn(_f32(x))


def _binary(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    return lambda ctx, a, b: fn(_f32(a), _f32(b))


def squared(ctx: OpCtx, v: jax.Array) -> jax.Array:
    """v·v of an fp32 value, rounded to the op's `sq_dtype` where it has one (as the op's
    meaning: inf where the program's 16-bit square overflows)."""
    dtype = ctx.params.get("sq_dtype")
    return v * v if not dtype else (v * v).astype(dtype).astype(F32)


registry.add(BACKEND, "square", lambda ctx, x: squared(ctx, _f32(x)))
for _name, _fn in {
    "exp": fast_exp,
    "sqrt": jnp.sqrt,
    "sigmoid": _sigmoid,
    "silu": lambda x: x * _sigmoid(x),
    "tanh": jnp.tanh,
    "relu": lambda x: jnp.maximum(x, 0.0),
}.items():
    registry.add(BACKEND, _name, _unary(_fn))


@registry.register(BACKEND, "gelu")
def _gelu(ctx: OpCtx, x: jax.Array) -> jax.Array:
    x = _f32(x)
    c = dtype_const(ctx, ctx.params.get("c", SQRT_HALF))
    return dtype_const(ctx, 0.5) * x * (1.0 - _erf(-x * c))


@registry.register(BACKEND, "gelu_tanh")
def _gelu_tanh(ctx: OpCtx, x: jax.Array) -> jax.Array:
    x = _f32(x)
    a = dtype_const(ctx, ctx.params.get("a", GELU_CUBIC))
    c = dtype_const(ctx, ctx.params.get("c", SQRT_2_OVER_PI))
    return x * (dtype_const(ctx, 0.5) * (1.0 + jnp.tanh(c * (x + a * (x * x * x)))))


for _name, _fn in {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "div": jnp.divide,
}.items():
    registry.add(BACKEND, _name, _binary(_fn))


@registry.register(BACKEND, "mul_scalar")
def _mul_scalar(ctx: OpCtx, x: jax.Array) -> jax.Array:
    return _f32(x) * dtype_const(ctx, ctx.params["scalar"])


def _dot(ctx: OpCtx, a: jax.Array, b: jax.Array, ia: int, ib: int, path: str) -> jax.Array:
    """One 2-D block matmul of args ia, ib (batch tiles are 1), fp32 out, padded shape."""
    narrow = matmul_operand_dtype([ctx.plan.dtype(x) for x in ctx.args])
    if narrow:  # mixed widths: operands rounded to the narrow dtype (the op's float meaning)
        a, b = a.astype(narrow), b.astype(narrow)
    if path == "outer":  # K = 1: broadcast (.., M, 1) * (.., 1, N) at full rank, no reshape
        return _f32(a) * _f32(b)
    a = ctx.masked(a, ia, (-1,), 0)
    b = ctx.masked(b, ib, (-2,), 0)
    a2 = a.reshape(a.shape[-2:])
    b2 = b.reshape(b.shape[-2:])
    if path == "fma":
        out = jnp.sum(_f32(a2)[:, :, None] * _f32(b2)[None, :, :], axis=1)
    else:
        dt = jnp.dtype(narrow) if narrow else ctx.dtype
        prec = jax.lax.Precision.HIGHEST if dt == jnp.float32 else None
        out = jnp.dot(a2.astype(dt), b2.astype(dt), preferred_element_type=F32, precision=prec)
    return out.reshape((*(1,) * (len(ctx.pad) - 2), *out.shape))


@registry.register(BACKEND, "add_scalar")
def _add_scalar(ctx: OpCtx, x: jax.Array) -> jax.Array:
    return _f32(x) + dtype_const(ctx, ctx.params["scalar"])


@registry.register(BACKEND, "matmul")
def _matmul(ctx: OpCtx, a: jax.Array, b: jax.Array) -> jax.Array:
    (mp,) = ctx.plan.matmuls[ctx.t]
    return _dot(ctx, a, b, 0, 1, mp.path)


@registry.register(BACKEND, "concat_matmul")
def _concat_matmul(ctx: OpCtx, a, b, c, d) -> jax.Array:
    p1, p2 = ctx.plan.matmuls[ctx.t]
    return _dot(ctx, a, c, 0, 2, p1.path) + _dot(ctx, b, d, 1, 3, p2.path)


@registry.register(BACKEND, "reduce_sum")
def _reduce_sum(ctx: OpCtx, x: jax.Array) -> jax.Array:
    d = ctx.axis(ctx.params["dim"])
    return jnp.sum(ctx.masked(_f32(x), 0, (d,), 0), axis=d, keepdims=True)


@registry.register(BACKEND, "reduce_max")
def _reduce_max(ctx: OpCtx, x: jax.Array) -> jax.Array:
    d = ctx.axis(ctx.params["dim"])
    m = jnp.max(ctx.masked(_f32(x), 0, (d,), -jnp.inf), axis=d, keepdims=True)
    return jnp.maximum(m, jnp.finfo(F32).min)  # a block masked whole: exp(-inf - m) = 0


@registry.register(BACKEND, "rms_norm")
def _rms_norm(ctx: OpCtx, x: jax.Array) -> jax.Array:
    x = _f32(x)
    ss = jnp.sum(ctx.masked(squared(ctx, x), 0, (-1,), 0), axis=-1, keepdims=True)
    return x / jnp.sqrt(ss / np.float32(ctx.arg_tile(0)[-1]) + ctx.eps)


@registry.register(BACKEND, "layer_norm")
def _layer_norm(ctx: OpCtx, x: jax.Array) -> jax.Array:
    x = _f32(x)
    n = np.float32(ctx.arg_tile(0)[-1])
    c = x - jnp.sum(ctx.masked(x, 0, (-1,), 0), axis=-1, keepdims=True) / n
    ss = jnp.sum(ctx.masked(squared(ctx, c), 0, (-1,), 0), axis=-1, keepdims=True)
    return c / jnp.sqrt(ss / n + ctx.eps)


@registry.register(BACKEND, "concat")
def _concat(ctx: OpCtx, a: jax.Array, b: jax.Array) -> jax.Array:
    # Triton cannot concatenate register tiles; stack on a new last axis (tl.join), move it in
    # front of the concat dim and merge: out[.., s·n + j, ..] = (a, b)[s][.., j, ..].
    d = ctx.axis(ctx.params["dim"])
    s = jnp.stack([_f32(a), _f32(b)], axis=-1)
    perm = (*range(d), a.ndim, *range(d, a.ndim))
    s = jnp.transpose(s, perm)
    return s.reshape(ctx.pad)


# ---------------------------------------------------------------------------- accumulators
def _zeros(ctx: OpCtx) -> jax.Array:
    return jnp.zeros(ctx.pad, F32)


def _sum_last(ctx: OpCtx, x: jax.Array) -> jax.Array:
    return jnp.sum(ctx.masked(_f32(x), 0, (-1,), 0), axis=-1, keepdims=True)


def _count(ctx: OpCtx) -> np.float32:
    return np.float32(ctx.plan.forloop_range * ctx.arg_tile(0)[-1])


def _todimx(ctx: OpCtx, x: jax.Array) -> jax.Array:
    dimx = ctx.params["dimx"]
    x = ctx.masked(_f32(x), 0, (-1,), 0)  # padded groups (a non-power-of-two split) count 0
    return jnp.sum(x.reshape((*x.shape[:-1], x.shape[-1] // dimx, dimx)), axis=-2)


registry.add(BACKEND, "accum_sum", AccumRule(_zeros, lambda c, s, x: s + _f32(x), lambda c, s: s))
registry.add(
    BACKEND,
    "accum_sum_last",
    AccumRule(_zeros, lambda c, s, x: s + _sum_last(c, x), lambda c, s: s),
)
registry.add(
    BACKEND,
    "accum_mean_last",
    AccumRule(_zeros, lambda c, s, x: s + _sum_last(c, x), lambda c, s: s / _count(c)),
)
registry.add(
    BACKEND,
    "accum_rms_last",
    AccumRule(
        _zeros,
        lambda c, s, x: s + _sum_last(c, squared(c, _f32(x))),
        lambda c, s: jnp.sqrt(s / _count(c) + c.eps),
    ),
)
# a loop-invariant tile (loaded before the loop): every iteration's value is the one kept
registry.add(BACKEND, "accum_keep", AccumRule(_zeros, lambda c, s, x: _f32(x), lambda c, s: s))
registry.add(
    BACKEND,
    "accum_sum_todimx",
    AccumRule(_zeros, lambda c, s, x: s + _todimx(c, x), lambda c, s: s),
)
registry.add(
    BACKEND,
    "accum_max",
    AccumRule(
        lambda c: jnp.full(c.pad, -jnp.inf, F32),
        lambda c, s, x: jnp.maximum(s, _f32(x)),
        lambda c, s: s,
    ),
)


def _rescale_update(last: bool):
    # Online softmax: s ← s·exp(M_old − M_new) + Σ x·exp(m − M_new), M the running max.
    def update(ctx: OpCtx, s, x, m, shift_old, shift_new):
        y = _f32(x) * fast_exp(_f32(m) - shift_new)
        if last:
            y = jnp.sum(ctx.masked(y, 0, (-1,), 0), axis=-1, keepdims=True)
        return s * fast_exp(shift_old - shift_new) + y

    return update


registry.add(
    BACKEND, "accum_rescale_sum", AccumRule(_zeros, _rescale_update(False), lambda c, s: s)
)
registry.add(
    BACKEND, "accum_rescale_sum_last", AccumRule(_zeros, _rescale_update(True), lambda c, s: s)
)


# ---------------------------------------------------------------------------- the kernel
def squeezed(plan: KernelPlan) -> int:
    """How many leading dims are 1 in every tile of the kernel (kept to rank >= 2).

    Those dims are squeezed out of the kernel's view (BlockSpec `None`): on the GPU, tiles
    carried at full rank (1×64×64 accumulators fed by reshaped dots) cost layout conversions
    every loop step; the same kernel on 2-D tiles ran 1.5x faster (experiments/pallas_probe.py).
    """
    dims = [*plan.inputs, *plan.outputs]
    ranks = {len(p) for p in plan.pads} | {len(d) for d in dims}
    if len(ranks) != 1:
        return 0
    (rank,) = ranks
    k = 0
    while (
        k < rank - 2
        and all(p[k] == 1 for p in plan.pads)
        and not any(d[k].masked or d[k].loop or d[k].pad != 1 for d in dims)
    ):
        k += 1
    return k


def _index(dims, pids, it) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """Ref indexer of one tile (and the dims that need masks) at iteration `it`."""
    idx: list[Any] = []
    masked = []
    for d, dim in enumerate(dims):
        if dim.masked:
            start = pids[dim.axis] * dim.extent if dim.axis is not None else 0
            if dim.loop:
                start = start + it * dim.tile
            idx.append(pl.ds(start, dim.pad))
            masked.append(d)
        elif dim.loop:
            idx.append(pl.ds(it * dim.tile, dim.tile))
        else:
            idx.append(slice(None))
    return tuple(idx), tuple(masked)


def _mask(dims, masked) -> jax.Array | None:
    shape = tuple(d.pad for d in dims)  # `dims` and `masked` as the kernel sees them
    keep = None
    for d in masked:
        m = jax.lax.broadcasted_iota(jnp.int32, shape, d) < dims[d].tile
        keep = m if keep is None else keep & m
    return keep


def _kernel(*refs: Any, plan: KernelPlan, config: PallasConfig, drop: int) -> None:
    n_in = plan.n_in
    in_refs, out_refs = refs[:n_in], refs[n_in:]
    pids = [pl.program_id(a) for a in range(len(plan.grid))]
    bg = plan.bg

    def view(dims, it):
        idx, masked = _index(dims, pids, it)
        return idx[drop:], tuple(d - drop for d in masked), dims[drop:]

    def load(k: int, it) -> jax.Array:
        idx, masked, dims = view(plan.inputs[k], it)
        if masked:
            return plt.load(in_refs[k].at[idx], mask=_mask(dims, masked), other=0)
        return in_refs[k][idx]

    def ctx_of(t: int) -> OpCtx:
        op = plan.op(t)
        return OpCtx(plan, t, op.args, dict(op.params), config, drop)

    def compute(t: int, env: dict) -> None:
        op = plan.op(t)
        val = registry.rule(BACKEND, op.op)(ctx_of(t), *[env[a] for a in op.args])
        if tuple(val.shape) != plan.pads[t][drop:]:
            raise LoweringError(
                f"internal: block op {t - n_in} ({op.op}) produced {val.shape}, planned {plan.pads[t]}"
            )
        env[t] = val

    env: dict[int, jax.Array] = {}
    for k in range(n_in):
        if plan.phases[k] == "pre":
            env[k] = load(k, 0)
    op_ids = range(n_in, n_in + len(bg.ops))
    for t in op_ids:
        if plan.phases[t] == "pre" and t not in plan.accumulators:
            compute(t, env)
    accs = plan.accumulators
    # accum_max first: the rescaled sums read its old and new running max.
    acc_order = sorted(accs, key=lambda t: plan.op(t).op != "accum_max")
    init = tuple(registry.rule(BACKEND, plan.op(t).op).init(ctx_of(t)) for t in accs)

    def body(it, states):
        loop_env = dict(env)
        for k in range(n_in):
            if plan.phases[k] == "loop":
                loop_env[k] = load(k, it)
        for t in op_ids:
            if plan.phases[t] == "loop":
                compute(t, loop_env)
        old = dict(zip(accs, states))
        new: dict[int, Any] = {}
        for t in acc_order:
            op = plan.op(t)
            rule = registry.rule(BACKEND, op.op)
            if t in plan.shifts:  # (x, m, M): M is post-loop; use the running max instead
                big = plan.shifts[t]
                args = [loop_env[op.args[0]], loop_env[op.args[1]], old[big], new[big]]
            else:
                args = [loop_env[a] for a in op.args]
            new[t] = rule.update(ctx_of(t), old[t], *args)
        return tuple(new[t] for t in accs)

    if plan.forloop_range == 1:
        states = body(0, init)
    else:
        states = jax.lax.fori_loop(
            0, plan.forloop_range, body, init, unroll=min(config.loop_unroll, plan.forloop_range)
        )
    post = dict(env)
    for t, s in zip(accs, states):
        post[t] = registry.rule(BACKEND, plan.op(t).op).finalise(ctx_of(t), s)
    for t in op_ids:
        if plan.phases[t] == "post" and t not in accs:
            compute(t, post)
    for j, o in enumerate(bg.outputs):
        dims = plan.outputs[j]
        val = post[o.arg].astype(out_refs[j].dtype)
        idx, masked, dims = view(dims, 0)
        if masked:
            plt.store(out_refs[j].at[idx], val, mask=_mask(dims, masked))
        else:
            out_refs[j][idx] = val


def _block_spec(dims, n_axes: int, drop: int = 0) -> pl.BlockSpec:
    # A masked dim's block is the whole dim, extended so that the last tile's padded slice
    # (`pl.ds(start, pad)`, start <= size - tile) stays inside the block ref: jax >= 0.12 checks
    # static slice bounds against the ref. The lanes past the array are never unmasked.
    shape = tuple(d.size - d.tile + d.pad if d.masked else d.extent for d in dims)
    shape = (*(None,) * drop, *shape[drop:])  # squeezed: indexed by the grid, not in the kernel
    axes = tuple(None if d.masked else d.axis for d in dims)

    def index_map(*pids):
        return tuple(pids[a] if a is not None else 0 for a in axes)

    return pl.BlockSpec(shape, index_map)


def check_rules(plan: KernelPlan, where: str) -> None:
    """LoweringError naming the first block op with no pallas rule."""
    for k, op in enumerate(plan.bg.ops):
        rule = registry.rule(BACKEND, op.op, f"{where}: block op {k}")
        if (OPS[op.op].kind == "accum") != isinstance(rule, AccumRule):
            raise LoweringError(f"{where}: block op {k} ({op.op}): rule and op kind disagree")


VIEWS = False
"""Inputs stored transposed are transposed by XLA before the call (`kernel_graph.lower`)."""


CAST_STORES = True
"""`build_kernel(out_dtypes=)`: a kernel stores an output in another float dtype itself."""


def build_kernel(
    plan: KernelPlan,
    config: PallasConfig,
    *,
    interpret: bool,
    where: str,
    out_dtypes: Mapping[int, str] | None = None,
) -> Callable[..., list[jax.Array]]:
    """The pallas_call for one planned graph-defined kernel (a function of its arguments);
    output j in `out_dtypes` is stored in that dtype."""
    if not isinstance(config, PallasConfig):
        raise LoweringError(f"{where}: the pallas backend takes a PallasConfig, got {config!r}")
    check_rules(plan, where)
    if len(plan.grid) > 3:
        raise LoweringError(f"{where}: grid {plan.grid} has more than 3 axes (Triton's limit)")
    n_axes = len(plan.grid)
    try:
        stages = plan.stages(config.num_stages)
    except LoweringError as e:
        raise LoweringError(f"{where}: {e}") from None
    stored = [(out_dtypes or {}).get(j) or plan.dtype(o.arg) for j, o in enumerate(plan.bg.outputs)]
    drop = squeezed(plan)
    call = pl.pallas_call(
        functools.partial(_kernel, plan=plan, config=config, drop=drop),
        out_shape=[jax.ShapeDtypeStruct(s, dt) for s, dt in zip(plan.output_shapes, stored)],
        grid=plan.grid,
        in_specs=[_block_spec(dims, n_axes, drop) for dims in plan.inputs],
        out_specs=[_block_spec(dims, n_axes, drop) for dims in plan.outputs],
        compiler_params=plt.CompilerParams(num_warps=config.num_warps, num_stages=stages),
        interpret=interpret,
        name=f"mugraph_kernel_{hashlib.sha1(repr(plan.bg).encode()).hexdigest()[:10]}",
    )

    def kernel(*xs: jax.Array) -> list[jax.Array]:
        return list(call(*xs))

    return kernel


def export_for_gpu(fn: Callable[..., Any], *avals: Any, gpu: str = "H100") -> str:
    """Lower `fn` for a CUDA GPU without one (jax.export); returns the StableHLO text.

    Runs the Pallas→Triton lowering in Python (power-of-two shapes, primitive rules, dot
    shapes), so CPU tests catch what would fail on the GPU before Triton compiles it. Uses a
    private hook (`gpu_info.get_gpu_info`) to pretend a `gpu` is present during the call.
    """
    from jax import export
    from jax._src.pallas.triton import gpu_info, pallas_call_registration

    info = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion[gpu])
    saved = pallas_call_registration.gpu_info_lib.get_gpu_info
    pallas_call_registration.gpu_info_lib.get_gpu_info = lambda: info
    try:
        exported = export.export(
            jax.jit(fn),
            platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(plt.CUSTOM_CALL_TARGET_NAME)],
        )(*avals)
    finally:
        pallas_call_registration.gpu_info_lib.get_gpu_info = saved
    return exported.mlir_module()
