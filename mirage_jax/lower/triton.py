"""jax-triton backend: one graph-defined kernel becomes generated `@triton.jit` source.

Keeps a Triton path for when the Pallas Triton lowering is removed upstream. The generator
emits one readable kernel per planned block graph (the same `KernelPlan` as the Pallas
backend: padded power-of-two tiles, masks, fp32 accumulators, loop-invariant hoisting) with
pointer arithmetic from `tl.program_id` and static strides, a `for it in range(F)` loop, and
masked `tl.store`s through the omaps. Source files are cached on disk (by content hash, under
`$MIRAGE_JAX_TRITON_CACHE`, else `$XDG_CACHE_HOME/mirage_jax/triton`) and in memory
(`triton_runtime`). On a GPU,
`jax_triton.triton_call` (0.3.1, for triton 3.6; imported lazily) launches them; on the CPU,
`interpret=True` runs them in Triton's own interpreter through `jax.pure_callback`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from lax_ir.layouts import stored_shape
from mirage_jax.lower import registry
from mirage_jax.lower.plan import KernelConfig, KernelPlan
from mirage_jax.lower.registry import AccumRule, LoweringError
from mirage_jax.lower.triton_runtime import interpret_kernel, load_kernel
from mirage_jax.mugraph.opdef import matmul_operand_dtype
from mirage_jax.mugraph.ops import GELU_CUBIC, OPS, SQRT_2_OVER_PI, SQRT_HALF

BACKEND = "triton"
TL_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}


@dataclass(frozen=True)
class TritonConfig(KernelConfig):
    """Knobs of the generated Triton kernels.

    Arguments:
        num_warps: warps per program.
        num_stages: software-pipelining depth of the for-loop (passed to the compiler).
        loop_unroll: `tl.range(..., loop_unroll_factor=)` of the for-loop (1: none).
        min_dot: smallest M/N/K handed to tl.dot (a power of two >= 16).
    """


def default_config() -> TritonConfig:
    return TritonConfig()


# ---------------------------------------------------------------------------- emitter context
@dataclass
class OpCtx:
    """What a source rule sees: the plan, its tensor id, args, params and value dtypes."""

    plan: KernelPlan
    t: int
    args: tuple[int, ...]
    params: dict
    is_f32: dict[int, bool]

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
def _unary(template: str) -> Callable[..., str]:
    return lambda c, x: template.format(x=f"({c.f32(x, 0)})")


def _binary(op: str) -> Callable[..., str]:
    return lambda c, a, b: f"{c.f32(a, 0)} {op} {c.f32(b, 1)}"


def dtype_const(c: OpCtx, value: float) -> str:
    """A constant of the op as its meaning has it: rounded to the tensor's dtype, used in fp32."""
    return repr(float(np.float32(np.asarray(value, dtype=c.dtype))))


for _name, _tpl in {
    "exp": "tl.exp({x})",
    "square": "{x} * {x}",
    "sqrt": "tl.sqrt({x})",
    "sigmoid": "tl.sigmoid({x})",
    "silu": "{x} * tl.sigmoid({x})",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)",
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
    a2 = f"tl.reshape({c.masked(a, ia, (-1,), '0.0')}, ({m}, {k}))"
    b2 = f"tl.reshape({c.masked(b, ib, (-2,), '0.0')}, ({k}, {n}))"
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
    return f"tl.reshape({out}, {_shape(c.pad)})"


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
    d = c.params["dim"] % len(c.pad)
    m = f"tl.max({c.masked(c.f32(x, 0), 0, (d,), 'float("-inf")')}, axis={d}, keep_dims=True)"
    return f"tl.maximum({m}, {float(np.finfo(np.float32).min)!r})"  # masked whole: exp(-inf)


@registry.register(BACKEND, "rms_norm")
def _rms_norm(c: OpCtx, x: str) -> str:
    x32 = c.f32(x, 0)
    last = len(c.pad) - 1
    ss = f"tl.sum({c.masked(f'{x32} * {x32}', 0, (-1,), '0.0')}, axis={last}, keep_dims=True)"
    return f"{x32} / tl.sqrt({ss} / {float(c.arg_tile(0)[-1])!r} + {c.eps})"


@registry.register(BACKEND, "layer_norm")
def _layer_norm(c: OpCtx, x: str) -> str:
    x32 = c.f32(x, 0)
    last = len(c.pad) - 1
    n = float(c.arg_tile(0)[-1])
    mean = f"tl.sum({c.masked(x32, 0, (-1,), '0.0')}, axis={last}, keep_dims=True) / {n!r}"
    cen = f"({x32} - {mean})"
    ss = f"tl.sum({c.masked(f'{cen} * {cen}', 0, (-1,), '0.0')}, axis={last}, keep_dims=True)"
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


def _count(c: OpCtx) -> str:
    return repr(float(c.plan.forloop_range * c.arg_tile(0)[-1]))


def _todimx(c: OpCtx, x: str) -> str:
    pads = c.plan.pads[c.args[0]]
    dimx = c.params["dimx"]
    split = (*pads[:-1], pads[-1] // dimx, dimx)
    return f"tl.sum(tl.reshape({c.f32(x, 0)}, {_shape(split)}), axis={len(pads) - 1})"


def _sq(c: OpCtx, x: str) -> str:
    x32 = c.f32(x, 0)
    return f"{x32} * {x32}"


def _same(c: OpCtx, s: str) -> str:
    return s


registry.add(BACKEND, "accum_sum", AccumRule(_zeros, lambda c, s, x: f"{s} + {c.f32(x, 0)}", _same))
registry.add(
    BACKEND,
    "accum_sum_last",
    AccumRule(_zeros, lambda c, s, x: f"{s} + {_sum_last(c, c.f32(x, 0))}", _same),
)
registry.add(
    BACKEND,
    "accum_mean_last",
    AccumRule(
        _zeros,
        lambda c, s, x: f"{s} + {_sum_last(c, c.f32(x, 0))}",
        lambda c, s: f"{s} / {_count(c)}",
    ),
)
registry.add(
    BACKEND,
    "accum_rms_last",
    AccumRule(
        _zeros,
        lambda c, s, x: f"{s} + {_sum_last(c, _sq(c, x))}",
        lambda c, s: f"tl.sqrt({s} / {_count(c)} + {c.eps})",
    ),
)
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
    def update(c: OpCtx, s: str, x: str, m: str, old: str, new: str) -> str:
        y = f"{c.f32(x, 0)} * tl.exp({c.f32(m, 1)} - {new})"
        if last:
            y = _sum_last(c, y)
        return f"{s} * tl.exp({old} - {new}) + {y}"

    return update


registry.add(BACKEND, "accum_rescale_sum", AccumRule(_zeros, _rescale(False), _same))
registry.add(BACKEND, "accum_rescale_sum_last", AccumRule(_zeros, _rescale(True), _same))


# ---------------------------------------------------------------------------- the generator
def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _tile_access(
    dims, pids: list[str], perm: tuple[int, ...] | None = None
) -> tuple[str, str, str, str | None]:
    """(block base offset, per-iteration loop step, lane offsets, mask) source of one tile.

    An input with a `perm` is stored as the array whose `transpose(perm)` the µGraph reads (a
    weight read as Wᵀ, a cache stored (B, S, heads, D) read as Kᵀ per head): the same logical
    tile, read through the stored array's strides."""
    sizes = tuple(d.size for d in dims)
    if perm is not None:
        stored = _strides(stored_shape(sizes, perm))
        strides = tuple(stored[q] for q in perm)
    else:
        strides = _strides(sizes)
    pads = tuple(d.pad for d in dims)
    base = [f"{pids[d.axis]} * {d.extent * s}" for d, s in zip(dims, strides) if d.axis is not None]
    step = [f"{d.tile * s}" for d, s in zip(dims, strides) if d.loop]
    offs = [f"{lane(pads, k)} * {s}" for k, s in enumerate(strides)]
    masks = [f"({lane(pads, k)} < {d.tile})" for k, d in enumerate(dims) if d.masked]
    return (
        " + ".join(base) or "0",
        " + ".join(step) or "0",
        " + ".join(offs) or "0",
        " & ".join(masks) if masks else None,
    )


def generate_source(
    plan: KernelPlan, config: TritonConfig, name: str, views: Mapping[int, tuple] | None = None
) -> str:
    """The readable `@triton.jit` source of one planned kernel (inputs, then outputs); inputs
    in `views` are stored permuted (`_tile_access`)."""
    views = views or {}
    bg, n_in = plan.bg, plan.n_in
    lines: list[str] = []
    emit = lines.append
    ins = [f"in{k}" for k in range(n_in)]
    outs = [f"out{j}" for j in range(len(bg.outputs))]
    emit("@triton.jit")
    emit(f"def {name}({', '.join(ins + outs)}):")
    pids = [f"pid{a}" for a in range(len(plan.grid))]
    for a, g in enumerate(plan.grid):
        emit(f"    pid{a} = tl.program_id({a})  # grid axis {a}: {g} blocks")
    access = {}
    for k, dims in enumerate(plan.inputs):
        b = bg.inputs[k]
        emit(
            f"    # in{k}: {b.dtype}{list(b.shape)}, imap {b.imap}, forloop_dim {b.forloop_dim}, "
            f"tile {list(plan.tile(k))} (padded {list(plan.pads[k])})"
        )
        if k in views:
            emit(f"    # in{k} is stored as the array whose transpose {views[k]} it is: a view")
        base, step, offs, mask = _tile_access(dims, pids, views.get(k))
        emit(f"    in{k}_ptrs = in{k} + {base} + {offs}")
        if mask:
            emit(f"    in{k}_mask = {mask}")
        access[k] = (step, mask)
    is_f32: dict[int, bool] = {}

    def load(k: int, indent: str) -> None:
        step, mask = access[k]
        ptr = f"in{k}_ptrs" if step == "0" else f"in{k}_ptrs + it * {step}"
        m = f", mask=in{k}_mask, other=0.0" if mask else ""
        emit(f"{indent}t{k} = tl.load({ptr}{m})")
        is_f32[k] = bg.inputs[k].dtype == "float32"

    def ctx_of(t: int) -> OpCtx:
        op = plan.op(t)
        return OpCtx(plan, t, op.args, dict(op.params), is_f32)

    def compute(t: int, indent: str) -> None:
        op = plan.op(t)
        expr = registry.rule(BACKEND, op.op)(ctx_of(t), *[f"t{a}" for a in op.args])
        emit(f"{indent}t{t} = {expr}  # {op.op} -> {list(plan.tile(t))}")
        is_f32[t] = True

    op_ids = range(n_in, n_in + len(bg.ops))
    accs = plan.accumulators
    emit("    # before the for-loop: loop-invariant tiles")
    for k in range(n_in):
        if plan.phases[k] == "pre":
            load(k, "    ")
    for t in op_ids:
        if plan.phases[t] == "pre" and t not in accs:
            compute(t, "    ")
    for t in accs:
        emit(f"    acc{t} = {registry.rule(BACKEND, plan.op(t).op).init(ctx_of(t))}")
    F = plan.forloop_range
    if F == 1:
        indent = "    "
        emit("    it = 0  # forloop_range 1: no loop")
    else:
        indent = "        "
        unroll = min(config.loop_unroll, F)
        rng = f"tl.range(0, {F}, loop_unroll_factor={unroll})" if unroll > 1 else f"range(0, {F})"
        emit(f"    for it in {rng}:")
    for k in range(n_in):
        if plan.phases[k] == "loop":
            load(k, indent)
    for t in op_ids:
        if plan.phases[t] == "loop":
            compute(t, indent)
    order = sorted(accs, key=lambda t: plan.op(t).op != "accum_max")
    for t in order:
        op = plan.op(t)
        args = [f"t{a}" for a in op.args]
        if t in plan.shifts:
            big = plan.shifts[t]
            args = [args[0], args[1], f"acc{big}", f"new{big}"]
        expr = registry.rule(BACKEND, op.op).update(ctx_of(t), f"acc{t}", *args)
        emit(f"{indent}new{t} = {expr}  # {op.op}")
    for t in accs:
        emit(f"{indent}acc{t} = new{t}")
    if F == 1 and not accs:
        emit("    pass")
    emit("    # after the loop: finalise the accumulators, the epilogue, the stores")
    for t in accs:
        emit(f"    t{t} = {registry.rule(BACKEND, plan.op(t).op).finalise(ctx_of(t), f'acc{t}')}")
        is_f32[t] = True
    for t in op_ids:
        if plan.phases[t] == "post" and t not in accs:
            compute(t, "    ")
    for j, o in enumerate(bg.outputs):
        dims = plan.outputs[j]
        base, _, offs, mask = _tile_access(dims, pids)
        dt = TL_DTYPES[plan.dtype(o.arg)]
        m = f", mask={mask}" if mask else ""
        emit(f"    # out{j}: {list(plan.output_shapes[j])}, omap {o.omap}")
        emit(f"    tl.store(out{j} + {base} + {offs}, t{o.arg}.to({dt}){m})")
    head = [
        "# Generated by mirage_jax.lower.triton from one graph-defined µGraph kernel; do not edit.",
        f"# grid {plan.grid}, forloop_range {F}; {config}",
        "import triton",
        "import triton.language as tl",
        "",
        "",
    ]
    return "\n".join(head + lines) + "\n"


# ---------------------------------------------------------------------------- the source
def kernel_source(
    plan: KernelPlan, config: TritonConfig, views: Mapping[int, tuple] | None = None
) -> tuple[str, str]:
    """(kernel name, source) of a plan; the name carries the hash of the block graph + config
    (+ the inputs read as permuted views)."""
    views = views or {}
    key = (plan.bg, plan.pads, config, tuple(sorted(views.items())))
    digest = hashlib.sha256(repr(key if views else key[:3]).encode()).hexdigest()[:16]
    name = f"mugraph_kernel_{digest}"
    return name, generate_source(plan, config, name, views)


def check_rules(plan: KernelPlan, where: str) -> None:
    for k, op in enumerate(plan.bg.ops):
        rule = registry.rule(BACKEND, op.op, f"{where}: block op {k}")
        if (OPS[op.op].kind == "accum") != isinstance(rule, AccumRule):
            raise LoweringError(f"{where}: block op {k} ({op.op}): rule and op kind disagree")


VIEWS = True
"""This backend reads inputs stored permuted in place (`build_kernel(views=...)`)."""


def build_kernel(
    plan: KernelPlan,
    config: TritonConfig,
    *,
    interpret: bool,
    where: str,
    views: Mapping[int, tuple] | None = None,
) -> Callable[..., list[jax.Array]]:
    """A function of the kernel's arguments launching the generated kernel (jax-triton);
    argument k in `views` comes as the array whose `transpose(views[k])` the plan reads."""
    if not isinstance(config, TritonConfig):
        raise LoweringError(f"{where}: the triton backend takes a TritonConfig, got {config!r}")
    check_rules(plan, where)
    if len(plan.grid) > 3:
        raise LoweringError(f"{where}: grid {plan.grid} has more than 3 axes (Triton's limit)")
    try:
        stages = plan.stages(config.num_stages)
    except LoweringError as e:
        raise LoweringError(f"{where}: {e}") from None
    name, source = kernel_source(plan, config, views)
    try:
        fn = load_kernel(name, source)
    except ImportError as e:
        raise LoweringError(
            f"{where}: the triton backend needs the `triton` package: {e}"
        ) from None
    out_shape = [
        jax.ShapeDtypeStruct(s, plan.dtype(o.arg))
        for s, o in zip(plan.output_shapes, plan.bg.outputs)
    ]
    if interpret:

        def host(*xs: np.ndarray) -> list[np.ndarray]:
            ins = [np.ascontiguousarray(np.asarray(x)) for x in xs]
            outs = [np.full(o.shape, np.nan, o.dtype) for o in out_shape]
            interpret_kernel(fn, plan.grid, *ins, *outs)
            return outs

        def kernel(*xs: jax.Array) -> list[jax.Array]:
            return list(jax.pure_callback(host, out_shape, *xs))

        return sequential_batching(kernel)
    try:
        import jax_triton as jt
    except ImportError as e:
        raise LoweringError(
            f"{where}: the triton backend needs jax-triton 0.3.1 (with triton 3.6) on a GPU: {e}"
        ) from None

    def kernel(*xs: jax.Array) -> list[jax.Array]:
        return list(
            jt.triton_call(
                *xs,
                kernel=fn,
                out_shape=out_shape,
                grid=plan.grid,
                num_warps=config.num_warps,
                num_stages=stages,
                name=name,
            )
        )

    return sequential_batching(kernel)  # jax-triton's custom call has no batching rule


def sequential_batching(kernel: Callable[..., Sequence[jax.Array]]) -> Callable[..., list]:
    """`kernel` with a vmap rule that runs it once per batch element (`lax.map`).

    For kernels whose primitive cannot be batched (jax-triton's `triton_call`): under `vmap`
    the kernel still runs, element by element, over the batched arguments; the unbatched ones
    are closed over, not broadcast.
    """

    @jax.custom_batching.custom_vmap
    def call(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(kernel(*xs))

    @call.def_vmap
    def rule(axis_size: int, in_batched: Sequence[bool], *xs: jax.Array):
        batched = tuple(x for x, b in zip(xs, in_batched) if b)

        def one(row: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
            it = iter(row)
            return call(*[next(it) if b else x for x, b in zip(xs, in_batched)])

        outs = jax.lax.map(one, batched)
        return outs, tuple(True for _ in outs)

    return lambda *xs: list(call(*xs))


def source_of(plan: KernelPlan, config: TritonConfig | None = None) -> str:
    """The generated source for a plan (for reading; nothing is compiled)."""
    return kernel_source(plan, config or default_config())[1]


def compile_for(
    source_fn: Any, dtypes: list[str], config: TritonConfig | None = None, cc: int = 90
) -> Any:
    """Compile a generated kernel for CUDA compute capability `cc` without a GPU (CPU check).

    Returns Triton's compiled kernel (its `.asm` has ttir/ttgir/ptx/cubin, `.metadata.shared`
    the shared memory in bytes); raises the compiler's error otherwise.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    sig = {a: f"*{_TRITON_TY[dt]}" for a, dt in zip(source_fn.arg_names, dtypes)}
    src = triton.compiler.ASTSource(fn=source_fn, signature=sig, constexprs={})
    config = config or default_config()
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


_TRITON_TY = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
