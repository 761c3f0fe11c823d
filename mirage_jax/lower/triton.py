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
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from lax_ir.interface import View, view_stored_shape
from mirage_jax.lower import registry
from mirage_jax.lower.plan import KernelConfig, KernelPlan
from mirage_jax.lower.registry import AccumRule, LoweringError
from mirage_jax.lower.running_max import running_shifts
from mirage_jax.lower.squeeze import squeezed
from mirage_jax.lower.triton_access import tile_access
from mirage_jax.lower.triton_flat import emit_flat, flat_loop
from mirage_jax.lower.triton_hoist import hoisted_statistics, main_loop_values, preloaded
from mirage_jax.lower.triton_rules import BACKEND, TL_DTYPES, OpCtx
from mirage_jax.lower.triton_runtime import compile_for as compile_for
from mirage_jax.lower.triton_runtime import launcher
from mirage_jax.lower.triton_split import (
    LoopPart,
    flat_block,
    partial_shapes,
    split_refusal,
    store_partials,
    sum_partials,
)
from mirage_jax.mugraph.ops import OPS


@dataclass(frozen=True)
class TritonConfig(KernelConfig):
    """Knobs of the generated Triton kernels.

    Arguments:
        num_warps: warps per program.
        num_stages: software-pipelining depth of the for-loop (passed to the compiler).
        loop_unroll: `tl.range(..., loop_unroll_factor=)` of the for-loop (1: none).
        min_dot: smallest M/N/K handed to tl.dot (a power of two >= 16).
        loop_split: S > 1 runs a kernel as two launches, its loop split over S times the
            blocks, then a launch that sums the parts (`triton_split`); `lower` applies it to
            the kernels launched alone whose plan allows it (`split_refusal`).
        squeeze: tiles drop the leading dims each holds once (`squeeze`); False keeps the
            block graph's rank (`select` times both where they differ).
    """

    loop_split: int = 1
    squeeze: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.loop_split < 1:
            raise ValueError(f"loop_split must be >= 1, got {self.loop_split}")


def default_config() -> TritonConfig:
    return TritonConfig()


# ---------------------------------------------------------------------------- the generator
def _axis_pids(grid: Sequence[int], emit: Callable[[str], Any]) -> list[str]:
    """Emit a block's grid position as one program id per axis (`pid{a}`); their names."""
    for a, g in enumerate(grid):
        emit(f"    pid{a} = tl.program_id({a})  # grid axis {a}: {g} blocks")
    return [f"pid{a}" for a in range(len(grid))]


def _flat_pids(
    grid: Sequence[int], flat: str, emit: Callable[[str], Any], ind: str, prefix: str = ""
) -> list[str]:
    """Emit the grid position of the block whose row-major index in `grid` is the expression
    `flat` (`{prefix}pid{a}`, a launch of one axis running several grids' blocks); their
    names."""
    pids = []
    for a, g in enumerate(grid):
        inner = math.prod(grid[a + 1 :])
        expr = f"{flat} // {inner}" if inner > 1 else flat
        emit(f"{ind}{prefix}pid{a} = ({expr}) % {g}")
        pids.append(f"{prefix}pid{a}")
    return pids


def _source(comments: Sequence[str], lines: Sequence[str]) -> str:
    """A generated module: its comment lines, Triton's imports, then the kernel's lines."""
    head = [*comments, "import triton", "import triton.language as tl", "", ""]
    return "\n".join(head + list(lines)) + "\n"


def generate_source(
    plan: KernelPlan,
    config: TritonConfig,
    name: str,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    bounded: bool = False,
) -> str:
    """The readable `@triton.jit` source of one planned kernel (inputs, then outputs); inputs
    in `views` are read as stored (`triton_access.tile_access`), and outputs in `out_views`
    written as stored (the array written is the one `out_views[j]`, a permutation or a
    `SplitView`, reads as the output); outputs in `out_dtypes` are stored in that dtype
    (`lower(out_dtypes=)`). `bounded`: after the inputs, a table of the blocks in launch order,
    each row its grid position (row-major) and its loop's steps [first, end), int32
    (`masked_steps.step_bounds`); the kernel is then launched over one axis of that many."""
    lines: list[str] = []
    emit = lines.append
    ins = [f"in{k}" for k in range(plan.n_in)] + (["steps"] if bounded else [])
    outs = [f"out{j}" for j in range(len(plan.bg.outputs))]
    emit("@triton.jit")
    emit(f"def {name}({', '.join(ins + outs)}):")
    if bounded:
        emit("    # this block's row of the table: its grid position, its steps (masked_steps)")
        emit("    row = 3 * tl.program_id(0)")
        emit("    block = tl.load(steps + row)")
        emit("    first = tl.load(steps + row + 1)")
        emit("    end = tl.load(steps + row + 2)")
        pids = _flat_pids(plan.grid, "block", emit, "    ")
    else:
        pids = _axis_pids(plan.grid, emit)
    _body(
        plan, config, views or {}, emit, "", pids, "    ", out_views or {}, out_dtypes,
        bounded=bounded,
    )  # fmt: skip
    comments = [
        "# Generated by mirage_jax.lower.triton from one graph-defined µGraph kernel; do not edit.",
        f"# grid {plan.grid}, forloop_range {plan.forloop_range}; {config}",
    ]
    return _source(comments, lines)


def generate_split_sources(
    plan: KernelPlan,
    config: TritonConfig,
    name: str,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
) -> tuple[str, str]:
    """The sources of a kernel run as two launches (`triton_split`): `{name}_part` (inputs,
    then the partial accumulators it writes) over S times the plan's blocks, and
    `{name}_finish` (inputs, the partials, then the outputs) over the plan's own grid."""
    S = config.loop_split
    parts = [f"part{j}" for j in range(len(plan.accumulators))]
    ins = [f"in{k}" for k in range(plan.n_in)]
    outs = [f"out{j}" for j in range(len(plan.bg.outputs))]
    comments = [
        "# Generated by mirage_jax.lower.triton from one graph-defined µGraph kernel, its loop",
        f"# split in {S} parts; grid {plan.grid}, forloop_range {plan.forloop_range}; {config}",
        "# do not edit.",
    ]
    lines: list[str] = []
    emit = lines.append
    emit("@triton.jit")
    emit(f"def {name}_part({', '.join(ins + parts)}):")
    n = math.prod(plan.grid)
    emit(f"    pid = tl.program_id(0)  # {n} blocks x {S} parts of the loop")
    emit(f"    split = pid % {S}")
    emit(f"    block = pid // {S}")
    pids = _flat_pids(plan.grid, "block", emit, "    ")
    part = LoopPart("partial", S, "split", "block")
    _body(plan, config, views or {}, emit, "", pids, "    ", part=part)
    partial = _source(comments, lines)
    lines.clear()
    emit("@triton.jit")
    emit(f"def {name}_finish({', '.join(ins + parts + outs)}):")
    pids = _axis_pids(plan.grid, emit)
    part = LoopPart("finish", S, "", flat_block(plan.grid, pids))
    _body(plan, config, views or {}, emit, "", pids, "    ", out_views or {}, out_dtypes, part)
    return partial, _source(comments, lines)


def generate_group_source(
    plans: Sequence[KernelPlan],
    config: TritonConfig,
    name: str,
    views: Sequence[Mapping[int, View]] | None = None,
    mode: str | None = None,
) -> str:
    """The `@triton.jit` source of several independent planned kernels launched as one: a 1-D
    grid of all their blocks, one after another; each block runs the kernel its index falls
    in, with that kernel's own grid position (`mugraph.ONE_LAUNCH`). Arguments: every
    kernel's inputs, kernel after kernel, then every kernel's outputs (jax-triton's order);
    names prefixed `k{i}_` per kernel. With `mode` "partial" or "finish", one of the two
    launches of the group with every loop split `config.loop_split` ways (`triton_split`):
    the partial launch writes each kernel's partials (`k{i}_part{j}`) over S times its blocks,
    the finishing one reads them after the inputs."""
    views = list(views or [{}] * len(plans))
    S = config.loop_split if mode else 1
    lines: list[str] = []
    emit = lines.append
    args = [f"k{i}_in{k}" for i, plan in enumerate(plans) for k in range(plan.n_in)]
    if mode:
        args += [f"k{i}_part{j}" for i, p in enumerate(plans) for j in range(len(p.accumulators))]
    if mode != "partial":
        args += [f"k{i}_out{j}" for i, p in enumerate(plans) for j in range(len(p.bg.outputs))]
    emit("@triton.jit")
    emit(f"def {name}({', '.join(args)}):")
    emit("    pid = tl.program_id(0)")
    start = 0
    for i, plan in enumerate(plans):
        n = math.prod(plan.grid) * (S if mode == "partial" else 1)
        test = (
            "else" if i == len(plans) - 1 else ("if" if i == 0 else "elif") + f" pid < {start + n}"
        )
        emit(f"    {test}:  # kernel {i}: grid {plan.grid}, blocks {start}..{start + n - 1}")
        emit(f"        k{i}_local = pid - {start}")
        part = None
        if mode == "partial":  # S consecutive blocks walk the S parts of one block's loop
            emit(f"        k{i}_split = k{i}_local % {S}")
            emit(f"        k{i}_block = k{i}_local // {S}")
            pids = _flat_pids(plan.grid, f"k{i}_block", emit, "        ", f"k{i}_")
            part = LoopPart("partial", S, f"k{i}_split", f"k{i}_block")
        else:
            pids = _flat_pids(plan.grid, f"k{i}_local", emit, "        ", f"k{i}_")
            if mode == "finish":
                part = LoopPart("finish", S, "", f"k{i}_local")
        _body(plan, config, views[i], emit, f"k{i}_", pids, "        ", part=part)
        start += n
    split = f", loops split in {S} parts ({mode} launch)" if mode else ""
    comments = [
        "# Generated by mirage_jax.lower.triton from independent graph-defined µGraph kernels",
        f"# launched as one{split}; grids {[p.grid for p in plans]}; {config}; do not edit.",
    ]
    return _source(comments, lines)


def _body(
    plan: KernelPlan,
    config: TritonConfig,
    views: Mapping[int, View],
    emit: Callable[[str], Any],
    p: str,
    pids: list[str],
    ind: str,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    part: LoopPart | None = None,
    bounded: bool = False,
) -> None:
    """Emit the statements of one planned kernel, its names prefixed with `p`, its grid
    position in the expressions `pids`, indented by `ind`; outputs in `out_views` are written
    permuted, outputs in `out_dtypes` in that dtype. With `part`, one of the two launches of a
    kernel whose loop is split over the grid (`triton_split`). Tiles drop the leading dims
    each holds once (`squeeze`). `bounded`: each block walks the steps `first`..`end`, read
    from its row of the table `steps` (`generate_source`, `masked_steps`)."""
    plan, drop = squeezed(plan) if config.squeeze else (plan, 0)
    bg, n_in = plan.bg, plan.n_in
    access = {}
    for k, dims in enumerate(plan.inputs):
        b = bg.inputs[k]
        emit(
            f"{ind}# {p}in{k}: {b.dtype}{list(b.shape)}, imap {b.imap}, forloop_dim "
            f"{b.forloop_dim}, tile {list(plan.tile(k))} (padded {list(plan.pads[k])})"
        )
        if k in views:
            emit(f"{ind}# {p}in{k} is stored as the array it is a view of: {views[k]}")
        base, at_step, offs, mask = tile_access(dims, pids, views.get(k), drop)
        emit(f"{ind}{p}in{k}_ptrs = {p}in{k} + {base} + {offs}")
        if mask:
            emit(f"{ind}{p}in{k}_mask = {mask}")
        access[k] = (at_step, mask)
    is_f32: dict[int, bool] = {}
    it = f"{p}it"

    def load(k: int, indent: str, at: str | None = None, name: str | None = None) -> None:
        """Load input k's tile of step `at` (default: the loop's `it`) into `name`."""
        at_step, mask = access[k]
        offset = at_step(at or it)
        ptr = f"{p}in{k}_ptrs" if offset == "0" else f"{p}in{k}_ptrs + {offset}"
        m = f", mask={p}in{k}_mask, other=0.0" if mask else ""
        emit(f"{indent}{name or f'{p}t{k}'} = tl.load({ptr}{m})")
        is_f32[k] = bg.inputs[k].dtype == "float32"

    def ctx_of(t: int) -> OpCtx:
        op = plan.op(t)
        return OpCtx(plan, t, op.args, dict(op.params), is_f32, prefix=p)

    def compute(t: int, indent: str) -> None:
        op = plan.op(t)
        expr = registry.rule(BACKEND, op.op)(ctx_of(t), *[f"{p}t{a}" for a in op.args])
        emit(f"{indent}{p}t{t} = {expr}  # {op.op} -> {list(plan.tile(t))}")
        is_f32[t] = True

    op_ids = range(n_in, n_in + len(bg.ops))
    accs = plan.accumulators
    emit(f"{ind}# before the for-loop: loop-invariant tiles")
    for k in range(n_in):
        if plan.phases[k] == "pre":
            load(k, ind)
    for t in op_ids:
        if plan.phases[t] == "pre" and t not in accs:
            compute(t, ind)
    for t in _narrowed_before_loop(plan):  # rounded once, not by each step's dot
        emit(f"{ind}{p}t{t} = {p}t{t}.to({TL_DTYPES[plan.dtype(t)]})  # as the loop's dots read it")
        is_f32[t] = False
    for t in accs:
        emit(f"{ind}{p}acc{t} = {registry.rule(BACKEND, plan.op(t).op).init(ctx_of(t))}")
    if part is not None and part.mode == "finish":
        sum_partials(plan, accs, emit, p, part, ind)
        _epilogue(
            plan, drop, accs, emit, p, pids, ind, out_views, out_dtypes, is_f32, ctx_of, compute
        )
        return
    F = plan.forloop_range
    hoisted, need = hoisted_statistics(plan)
    main = main_loop_values(plan, hoisted, need)
    running = running_shifts(plan, hoisted)
    steps = F if part is None else F // part.splits
    # a split kernel's block walks steps first..first+steps-1 (`it` from a loop of its own)
    loop_var = it if part is None else f"{p}step"
    first = None if part is None else f"{part.split} * {steps}"

    if bounded:
        why = bounds_refusal(plan, config) if part is None else "its loop is split"
        if why is not None:
            raise LoweringError(f"no table of loop steps: {why}")
    lo, hi = ("first", "end") if bounded else ("0", str(steps))

    def loop_head(indent: str, unroll: int = 1) -> None:
        rng = (
            f"tl.range({lo}, {hi}, loop_unroll_factor={unroll})"
            if unroll > 1
            else f"tl.range({lo}, {hi})"  # runtime bounds (Triton's interpreter too)
            if bounded
            else f"range({lo}, {hi})"
        )
        emit(f"{indent}for {loop_var} in {rng}:")
        if first is not None:
            emit(f"{indent}    {it} = {first} + {loop_var}")

    if part is None and flat_loop(plan, F, config.num_warps):
        emit_flat(plan, F, emit, p, ind, access, is_f32)
        _epilogue(
            plan, drop, accs, emit, p, pids, ind, out_views, out_dtypes, is_f32, ctx_of, compute
        )
        return
    preload = bool(hoisted) and preloaded(plan, need, steps, config.num_warps)
    stats_inputs = [k for k in range(n_in) if k in need]
    if preload:
        emit(f"{ind}# the statistics' input tiles of every step, loaded before the main loop")
        for j in range(steps):
            for k in stats_inputs:
                load(k, ind, str(j) if first is None else f"{first} + {j}", f"{p}pre{k}_{j}")
    if F == 1:
        inner = ind
        emit(f"{ind}{it} = 0  # forloop_range 1: no loop")
    else:
        inner = ind + "    "
        if part is not None:
            emit(f"{ind}# this block's part of the loop: {steps} of its {F} steps")
        loop_head(ind, min(config.loop_unroll, steps))
    for k in range(n_in):
        if plan.phases[k] == "loop" and k in main:
            load(k, inner)
    for t in op_ids:
        if plan.phases[t] == "loop" and t in main:
            compute(t, inner)
            if t in running:
                emit(f"{inner}{p}t{t} = tl.maximum({p}acc{running[t]}, {p}t{t})  # running max")
    order = sorted(
        (t for t in accs if t not in hoisted), key=lambda t: plan.op(t).op != "accum_max"
    )

    def updated(t: int) -> str:
        """Accumulator t's update expression (rescaled ones read the running max's)."""
        args = [f"{p}t{a}" for a in plan.op(t).args]
        if t in plan.shifts:
            big = plan.shifts[t]
            m = None if plan.op(t).args[1] in running else args[1]
            args = [args[0], m, f"{p}acc{big}", f"{p}new{big}"]
        return registry.rule(BACKEND, plan.op(t).op).update(ctx_of(t), f"{p}acc{t}", *args)

    for t in order:
        emit(f"{inner}{p}new{t} = {updated(t)}  # {plan.op(t).op}")
    for t in order:
        emit(f"{inner}{p}acc{t} = {p}new{t}")
    if F == 1 and not accs:
        emit(f"{ind}pass")
    if preload:  # summed after the dots' loop, from the tiles loaded before it
        emit(f"{ind}# the statistics of small inputs, out of the dots' loop")
        for j in range(steps):
            for k in stats_inputs:
                emit(f"{ind}{p}t{k} = {p}pre{k}_{j}")
            for t in op_ids:
                if t in need:
                    compute(t, ind)
            for t in hoisted:
                emit(f"{ind}{p}acc{t} = {updated(t)}  # {plan.op(t).op}")
    elif hoisted:  # after the dots' loop: its input tiles are in L2 by then
        emit(f"{ind}# a loop of its own for the statistics of small inputs (out of the dots' loop)")
        loop_head(ind)
        for k in stats_inputs:
            load(k, ind + "    ")
        for t in op_ids:
            if t in need:
                compute(t, ind + "    ")
        for t in hoisted:
            emit(f"{ind}    {p}acc{t} = {updated(t)}  # {plan.op(t).op}")
    if part is not None:  # "partial": the raw accumulators, for the finishing launch
        store_partials(plan, accs, emit, p, part, ind)
        return
    _epilogue(plan, drop, accs, emit, p, pids, ind, out_views, out_dtypes, is_f32, ctx_of, compute)


def _narrowed_before_loop(plan: KernelPlan) -> list[int]:
    """The loop-invariant op results of a 16-bit dtype that a dot in the loop reads (Q scaled on
    load, in attention): held in their own dtype, which the dot rounds them to anyway."""
    dots = [
        t
        for t in range(plan.n_in, plan.n_in + len(plan.bg.ops))
        if plan.phases[t] == "loop" and plan.op(t).op in ("matmul", "concat_matmul")
    ]
    read = {a for t in dots for a in plan.op(t).args}
    return [
        t
        for t in sorted(read)
        if t >= plan.n_in
        and plan.phases[t] == "pre"
        and plan.dtype(t) in ("float16", "bfloat16")
        and t not in plan.accumulators
    ]


def _epilogue(
    plan: KernelPlan,
    drop: int,
    accs: Sequence[int],
    emit: Callable[[str], Any],
    p: str,
    pids: list[str],
    ind: str,
    out_views: Mapping[int, View] | None,
    out_dtypes: Mapping[int, str] | None,
    is_f32: dict[int, bool],
    ctx_of: Callable[[int], OpCtx],
    compute: Callable[[int, str], None],
) -> None:
    """Emit what follows the loop: the accumulators finalised, the post-loop ops, the stores."""
    bg = plan.bg
    emit(f"{ind}# after the loop: finalise the accumulators, the epilogue, the stores")
    for t in accs:
        fin = registry.rule(BACKEND, plan.op(t).op).finalise(ctx_of(t), f"{p}acc{t}")
        emit(f"{ind}{p}t{t} = {fin}")
        is_f32[t] = True
    for t in range(plan.n_in, plan.n_in + len(bg.ops)):
        if plan.phases[t] == "post" and t not in accs:
            compute(t, ind)
    for j, o in enumerate(bg.outputs):
        dims = plan.outputs[j]
        perm = (out_views or {}).get(j)
        base, _, offs, mask = tile_access(dims, pids, perm, drop)
        dt = TL_DTYPES[(out_dtypes or {}).get(j) or plan.dtype(o.arg)]
        m = f", mask={mask}" if mask else ""
        emit(f"{ind}# {p}out{j}: {list(plan.output_shapes[j])}, omap {o.omap}")
        if perm is not None:
            emit(f"{ind}# {p}out{j} is written as the array it is a view of: {perm}")
        emit(f"{ind}tl.store({p}out{j} + {base} + {offs}, {p}t{o.arg}.to({dt}){m})")


# ---------------------------------------------------------------------------- the source
def kernel_name(
    plan: KernelPlan,
    config: TritonConfig,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    bounded: bool = False,
) -> str:
    """The name of a plan's kernel: the hash of the block graph + config (+ the inputs read
    and the outputs written as permuted views, + narrowed outputs, + a table of loop steps)."""
    views, out_views, out_dtypes = views or {}, out_views or {}, out_dtypes or {}
    key = (plan.bg, plan.pads, config, tuple(sorted(views.items())))
    if bounded:
        key = (*key, "bounded")
    if out_views:
        key = (*key, ("out", tuple(sorted(out_views.items()))))
    if out_dtypes:
        key = (*key, ("dtypes", tuple(sorted(out_dtypes.items()))))
    plain = not (views or out_views or out_dtypes or bounded)
    digest = hashlib.sha256(repr(key[:3] if plain else key).encode()).hexdigest()
    return f"mugraph_kernel_{digest[:16]}"


def kernel_source(
    plan: KernelPlan,
    config: TritonConfig,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    bounded: bool = False,
) -> tuple[str, str]:
    """(kernel name, source) of a plan run as one launch (`kernel_name`)."""
    name = kernel_name(plan, config, views, out_views, out_dtypes, bounded)
    return name, generate_source(plan, config, name, views, out_views, out_dtypes, bounded)


def check_rules(plan: KernelPlan, where: str) -> None:
    for k, op in enumerate(plan.bg.ops):
        rule = registry.rule(BACKEND, op.op, f"{where}: block op {k}")
        if (OPS[op.op].kind == "accum") != isinstance(rule, AccumRule):
            raise LoweringError(f"{where}: block op {k} ({op.op}): rule and op kind disagree")


VIEWS = True
"""This backend reads inputs stored permuted in place (`build_kernel(views=...)`)."""

NARROW_STORES = True
"""`build_kernel(out_dtypes=)`: a kernel stores an output in a narrower float dtype itself."""

SPLIT_REFUSAL = split_refusal
"""`lower` splits the loop of a kernel launched alone (`TritonConfig.loop_split`) where this
finds nothing against it, and a one-launch group's where it finds nothing against any of its
kernels (`build_group`: then two launches, partial and finishing, for the whole group)."""


def build_kernel(
    plan: KernelPlan,
    config: TritonConfig,
    *,
    interpret: bool,
    where: str,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    steps: np.ndarray | None = None,
) -> Callable[..., list[jax.Array]]:
    """A function of the kernel's arguments launching the generated kernel (jax-triton);
    argument k in `views` comes as the array the plan reads through `views[k]` (a
    permutation or `lax_ir.interface.SplitView`),
    output j in `out_views` is returned as the array that `out_views[j]` reads as it, and
    output j in `out_dtypes` is stored in that dtype. `steps`: each block's [first, end) of
    its loop (`masked_steps.step_bounds`; only where `bounds_refusal` finds nothing)."""
    if not isinstance(config, TritonConfig):
        raise LoweringError(f"{where}: the triton backend takes a TritonConfig, got {config!r}")
    check_rules(plan, where)
    if len(plan.grid) > 3:
        raise LoweringError(f"{where}: grid {plan.grid} has more than 3 axes (Triton's limit)")
    try:
        stages = plan.stages(config.num_stages)
    except LoweringError as e:
        raise LoweringError(f"{where}: {e}") from None
    out_shape = [
        jax.ShapeDtypeStruct(
            view_stored_shape(s, (out_views or {})[j]) if j in (out_views or {}) else s,
            (out_dtypes or {}).get(j) or plan.dtype(o.arg),
        )
        for j, (s, o) in enumerate(zip(plan.output_shapes, plan.bg.outputs))
    ]
    S, warps = config.loop_split, config.num_warps
    if steps is not None:
        why = bounds_refusal(plan, config)
        if why is not None:
            raise LoweringError(f"{where}: no table of loop steps: {why}")
        name, source = kernel_source(plan, config, views, out_views, out_dtypes, bounded=True)
        blocks = (math.prod(plan.grid),)
        run = launcher(name, source, out_shape, blocks, warps, stages, interpret, where)
        table = np.ascontiguousarray(steps, dtype=np.int32)
        return lambda *xs: run(*xs, table)
    if S == 1:
        name, source = kernel_source(plan, config, views, out_views, out_dtypes)
        return launcher(name, source, out_shape, plan.grid, warps, stages, interpret, where)
    why = split_refusal(plan, S)
    if why is not None:
        raise LoweringError(f"{where}: cannot split its loop: {why}")
    name = kernel_name(plan, config, views, out_views, out_dtypes)
    part_src, finish_src = generate_split_sources(plan, config, name, views, out_views, out_dtypes)
    blocks = (math.prod(plan.grid) * S,)
    part = launcher(
        f"{name}_part", part_src, partial_shapes(plan, S), blocks, warps, stages, interpret, where
    )
    finish = launcher(
        f"{name}_finish", finish_src, out_shape, plan.grid, warps, stages, interpret, where
    )
    return lambda *xs: finish(*xs, *part(*xs))


def bounds_refusal(plan: KernelPlan, config: TritonConfig) -> str | None:
    """Why the kernel cannot walk a per-block range of its loop's steps, or None."""
    if config.loop_split != 1:
        return "its loop is split over the grid"
    if plan.forloop_range == 1:
        return "it has no loop"
    if flat_loop(plan, plan.forloop_range, config.num_warps):
        return "its loop is flattened"
    if hoisted_statistics(plan)[0]:
        return "it sums statistics in a loop of their own"
    return None


def build_group(
    plans: Sequence[KernelPlan],
    config: TritonConfig,
    *,
    interpret: bool,
    where: str,
    views: Sequence[Mapping[int, View]] | None = None,
) -> Callable[..., list[jax.Array]]:
    """One launch of several independent planned kernels (`generate_group_source`): a function
    of every kernel's arguments, kernel after kernel, returning every kernel's outputs."""
    if not isinstance(config, TritonConfig):
        raise LoweringError(f"{where}: the triton backend takes a TritonConfig, got {config!r}")
    views = list(views or [{}] * len(plans))
    for plan in plans:
        check_rules(plan, where)
        if len(plan.grid) > 3:
            raise LoweringError(f"{where}: grid {plan.grid} has more than 3 axes (Triton's limit)")
    try:
        stages = min(plan.stages(config.num_stages) for plan in plans)
    except LoweringError as e:
        raise LoweringError(f"{where}: {e}") from None
    key = tuple((p.bg, p.pads, tuple(sorted(v.items()))) for p, v in zip(plans, views))
    name = "mugraph_group_" + hashlib.sha256(repr((key, config)).encode()).hexdigest()[:16]
    out_shape = [
        jax.ShapeDtypeStruct(s, plan.dtype(o.arg))
        for plan in plans
        for s, o in zip(plan.output_shapes, plan.bg.outputs)
    ]
    blocks = sum(math.prod(plan.grid) for plan in plans)
    S, warps = config.loop_split, config.num_warps
    if S == 1:
        source = generate_group_source(plans, config, name, views)
        return launcher(name, source, out_shape, (blocks,), warps, stages, interpret, where)
    for k, plan in enumerate(plans):
        why = split_refusal(plan, S)
        if why is not None:
            raise LoweringError(f"{where}: cannot split the loop of its kernel {k}: {why}")
    parts = [shape for plan in plans for shape in partial_shapes(plan, S)]
    part_src = generate_group_source(plans, config, f"{name}_part", views, "partial")
    finish_src = generate_group_source(plans, config, f"{name}_finish", views, "finish")
    part = launcher(f"{name}_part", part_src, parts, (blocks * S,), warps, stages, interpret, where)
    finish = launcher(
        f"{name}_finish", finish_src, out_shape, (blocks,), warps, stages, interpret, where
    )
    return lambda *xs: finish(*xs, *part(*xs))


def source_of(plan: KernelPlan, config: TritonConfig | None = None) -> str:
    """The generated source for a plan (for reading; nothing is compiled)."""
    return kernel_source(plan, config or default_config())[1]
