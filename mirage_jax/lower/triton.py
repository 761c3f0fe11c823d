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
from typing import Any

import jax
import numpy as np

from lax_ir.interface import View, view_stored_shape
from mirage_jax.lower import registry
from mirage_jax.lower.masked_steps import StepBounds
from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.registry import AccumRule, LoweringError
from mirage_jax.lower.triton_body import body
from mirage_jax.lower.triton_body import bounds_refusal as bounds_refusal
from mirage_jax.lower.triton_config import TritonConfig as TritonConfig
from mirage_jax.lower.triton_config import default_config as default_config
from mirage_jax.lower.triton_rules import BACKEND
from mirage_jax.lower.triton_runtime import compile_for as compile_for
from mirage_jax.lower.triton_runtime import launcher
from mirage_jax.lower.triton_split import (
    LoopPart,
    flat_block,
    partial_shapes,
    split_refusal,
)
from mirage_jax.mugraph.ops import OPS


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
    mask: int | None = None,
) -> str:
    """The readable `@triton.jit` source of one planned kernel (inputs, then outputs); inputs
    in `views` are read as stored (`triton_access.tile_access`), and outputs in `out_views`
    written as stored (the array written is the one `out_views[j]`, a permutation or a
    `SplitView`, reads as the output); outputs in `out_dtypes` are stored in that dtype
    (`lower(out_dtypes=)`). `mask`: block input `mask` is a constant mask, and after the inputs
    comes a table of the blocks in launch order, each row its grid position (row-major) and its
    loop's steps first, mid (the first that reads the mask), end, int32
    (`masked_steps.StepBounds`); the kernel is then launched over one axis of that many."""
    lines: list[str] = []
    emit = lines.append
    ins = [f"in{k}" for k in range(plan.n_in)] + (["steps"] if mask is not None else [])
    outs = [f"out{j}" for j in range(len(plan.bg.outputs))]
    emit("@triton.jit")
    emit(f"def {name}({', '.join(ins + outs)}):")
    if mask is not None:
        emit("    # this block's row of the table: its grid position, its steps (masked_steps)")
        emit("    row = 4 * tl.program_id(0)")
        emit("    block = tl.load(steps + row)")
        emit("    first = tl.load(steps + row + 1)")
        emit("    mid = tl.load(steps + row + 2)")
        emit("    end = tl.load(steps + row + 3)")
        pids = _flat_pids(plan.grid, "block", emit, "    ")
    elif config.row_major:
        emit(f"    block = tl.program_id(0)  # row-major in grid {plan.grid}")
        pids = _flat_pids(plan.grid, "block", emit, "    ")
    else:
        pids = _axis_pids(plan.grid, emit)
    body(
        plan, config, views or {}, emit, "", pids, "    ", out_views or {}, out_dtypes,
        mask_input=mask,
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
    body(plan, config, views or {}, emit, "", pids, "    ", part=part)
    partial = _source(comments, lines)
    lines.clear()
    emit("@triton.jit")
    emit(f"def {name}_finish({', '.join(ins + parts + outs)}):")
    pids = _axis_pids(plan.grid, emit)
    part = LoopPart("finish", S, "", flat_block(plan.grid, pids))
    body(plan, config, views or {}, emit, "", pids, "    ", out_views or {}, out_dtypes, part)
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
        body(plan, config, views[i], emit, f"k{i}_", pids, "        ", part=part)
        start += n
    split = f", loops split in {S} parts ({mode} launch)" if mode else ""
    comments = [
        "# Generated by mirage_jax.lower.triton from independent graph-defined µGraph kernels",
        f"# launched as one{split}; grids {[p.grid for p in plans]}; {config}; do not edit.",
    ]
    return _source(comments, lines)


# ---------------------------------------------------------------------------- the source
def kernel_name(
    plan: KernelPlan,
    config: TritonConfig,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    mask: int | None = None,
) -> str:
    """The name of a plan's kernel: the hash of the block graph + config (+ the inputs read
    and the outputs written as permuted views, + outputs stored in another dtype, + a table of
    loop steps)."""
    views, out_views, out_dtypes = views or {}, out_views or {}, out_dtypes or {}
    key = (plan.bg, plan.pads, config, tuple(sorted(views.items())))
    if mask is not None:
        key = (*key, ("mask", mask))
    if out_views:
        key = (*key, ("out", tuple(sorted(out_views.items()))))
    if out_dtypes:
        key = (*key, ("dtypes", tuple(sorted(out_dtypes.items()))))
    plain = not (views or out_views or out_dtypes or mask is not None)
    digest = hashlib.sha256(repr(key[:3] if plain else key).encode()).hexdigest()
    return f"mugraph_kernel_{digest[:16]}"


def kernel_source(
    plan: KernelPlan,
    config: TritonConfig,
    views: Mapping[int, View] | None = None,
    out_views: Mapping[int, View] | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    mask: int | None = None,
) -> tuple[str, str]:
    """(kernel name, source) of a plan run as one launch (`kernel_name`)."""
    name = kernel_name(plan, config, views, out_views, out_dtypes, mask)
    return name, generate_source(plan, config, name, views, out_views, out_dtypes, mask)


def check_rules(plan: KernelPlan, where: str) -> None:
    for k, op in enumerate(plan.bg.ops):
        rule = registry.rule(BACKEND, op.op, f"{where}: block op {k}")
        if (OPS[op.op].kind == "accum") != isinstance(rule, AccumRule):
            raise LoweringError(f"{where}: block op {k} ({op.op}): rule and op kind disagree")


VIEWS = True
"""This backend reads inputs stored permuted in place (`build_kernel(views=...)`)."""

CAST_STORES = True
"""`build_kernel(out_dtypes=)`: a kernel stores an output in another float dtype itself."""

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
    steps: StepBounds | None = None,
) -> Callable[..., list[jax.Array]]:
    """A function of the kernel's arguments launching the generated kernel (jax-triton);
    argument k in `views` comes as the array the plan reads through `views[k]` (a
    permutation or `lax_ir.interface.SplitView`),
    output j in `out_views` is returned as the array that `out_views[j]` reads as it, and
    output j in `out_dtypes` is stored in that dtype. `steps`: each block's range of its loop
    and the mask it need not read in part of it (`masked_steps.step_bounds`; only where
    `bounds_refusal` finds nothing)."""
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
    if steps is not None:  # (the generator refuses a plan `bounds_refusal` names)
        name, source = kernel_source(plan, config, views, out_views, out_dtypes, steps.mask)
        blocks = (math.prod(plan.grid),)
        run = launcher(name, source, out_shape, blocks, warps, stages, interpret, where)
        rows = (
            steps.rows[np.argsort(steps.rows[:, 0], kind="stable")]
            if config.row_major
            else steps.rows
        )
        table = np.ascontiguousarray(rows, dtype=np.int32)
        return lambda *xs: run(*xs, table)
    if S == 1:
        name, source = kernel_source(plan, config, views, out_views, out_dtypes)
        grid = (math.prod(plan.grid),) if config.row_major else plan.grid
        return launcher(name, source, out_shape, grid, warps, stages, interpret, where)
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
