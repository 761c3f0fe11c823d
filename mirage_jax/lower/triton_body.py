"""The statements of one planned kernel in the generated Triton source (`triton`): its tiles'
pointers, the loads before and in the loop, the ops, the accumulators' updates, the stores.

`triton` wraps them into a whole kernel (one launch, a loop split in two launches, or several
kernels in one launch). Tiles drop the leading dims each holds once (`squeeze`); the online
softmax uses its running max directly (`running_max`), or its first step's max with a guard
(`speculative_max`); a kernel told its loop bounds walks only the steps a constant mask leaves
(`masked_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lax_ir.interface import View
from mirage_jax.lower import registry
from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.registry import LoweringError
from mirage_jax.lower.running_max import running_shifts
from mirage_jax.lower.speculative_max import Speculation, for_plan
from mirage_jax.lower.squeeze import squeezed
from mirage_jax.lower.triton_access import tile_access
from mirage_jax.lower.triton_config import TritonConfig
from mirage_jax.lower.triton_flat import emit_flat, flat_loop
from mirage_jax.lower.triton_hoist import hoisted_statistics, main_loop_values, preloaded
from mirage_jax.lower.triton_rules import BACKEND, TL_DTYPES, OpCtx
from mirage_jax.lower.triton_split import LoopPart, store_partials, sum_partials


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


def body(
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
    mask_input: int | None = None,
) -> None:
    """Emit the statements of one planned kernel, its names prefixed with `p`, its grid
    position in the expressions `pids`, indented by `ind`; outputs in `out_views` are written
    permuted, outputs in `out_dtypes` in that dtype. With `part`, one of the two launches of a
    kernel whose loop is split over the grid (`triton_split`). Tiles drop the leading dims
    each holds once (`squeeze`). `mask_input`: the block input that is a constant mask; each block
    walks the steps `first`..`end` of its row of the table `steps`, not reading the mask
    before `mid` (`generate_source`, `masked_steps`)."""
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
    for t in narrowed_before_loop(plan):  # rounded once, not by each step's dot
        emit(f"{ind}{p}t{t} = {p}t{t}.to({TL_DTYPES[plan.dtype(t)]})  # as the loop's dots read it")
        is_f32[t] = False
    for t in accs:
        emit(f"{ind}{p}acc{t} = {registry.rule(BACKEND, plan.op(t).op).init(ctx_of(t))}")
    if part is not None and part.mode == "finish":
        sum_partials(plan, accs, emit, p, part, ind, ctx_of)
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

    if mask_input is not None:
        why = bounds_refusal(plan, config) if part is None else "its loop is split"
        if why is not None:
            raise LoweringError(f"no table of loop steps: {why}")

    def loop_head(
        indent: str, unroll: int = 1, lo: str = "0", hi: str = str(steps), stages: int = 0
    ) -> None:
        rng = (
            f"tl.range({lo}, {hi}, loop_unroll_factor={unroll})"
            if unroll > 1
            else f"tl.range({lo}, {hi}, num_stages={stages})"
            if stages
            else f"tl.range({lo}, {hi})"  # runtime bounds (Triton's interpreter too)
            if mask_input is not None
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
    order = sorted(
        (t for t in accs if t not in hoisted), key=lambda t: plan.op(t).op != "accum_max"
    )

    spec: Speculation | str = "not asked for"
    if getattr(config, "speculative_max", False) and part is None:
        spec = for_plan(plan)
        if isinstance(spec, str):
            emit(f"{ind}# the first step's max as reference: not applied ({spec})")

    def updated(t: int, fixed: bool = False) -> str:
        """Accumulator t's update expression (rescaled ones read the running max's; `fixed`:
        the reference max does not change, so they are not rescaled)."""
        args = [f"{p}t{a}" for a in plan.op(t).args]
        if t in plan.shifts:
            big = plan.shifts[t]
            m = None if plan.op(t).args[1] in running else args[1]
            args = [args[0], m, f"{p}acc{big}", f"{p}acc{big}" if fixed else f"{p}new{big}"]
        return registry.rule(BACKEND, plan.op(t).op).update(ctx_of(t), f"{p}acc{t}", *args)

    def main_loop(
        lo: str = "0",
        hi: str = str(steps),
        zero: int | None = None,
        fixed: str | None = None,
        ind: str = ind,
        stages: int = 0,
    ) -> None:
        """The loop over steps lo..hi: its loads, ops and accumulator updates; input `zero`
        is not read but +0, as its tile is throughout in those steps (`masked_steps`); `fixed`:
        the block's first step (an expression), whose tile max is every step's reference
        (`speculative_max`); `stages`: the loop's own pipelining depth (0: the kernel's)."""
        if F == 1:
            inner = ind
            emit(f"{ind}{it} = 0  # forloop_range 1: no loop")
        else:
            inner = ind + "    "
            if part is not None:
                emit(f"{ind}# this block's part of the loop: {steps} of its {F} steps")
            loop_head(ind, min(config.loop_unroll, steps), lo, hi, stages)
        for k in range(n_in):
            if plan.phases[k] == "loop" and k in main and k == zero:
                dt = bg.inputs[k].dtype
                emit(f"{inner}{p}t{k} = tl.zeros({tuple(plan.pads[k])}, dtype={TL_DTYPES[dt]})")
                is_f32[k] = dt == "float32"
            elif plan.phases[k] == "loop" and k in main:
                load(k, inner)
        for t in op_ids:
            if plan.phases[t] == "loop" and t in main and fixed is not None and t in running:
                emit(f"{inner}{p}t{t} = {p}acc{running[t]}  # the first step's max, every step's")
                emit(f"{inner}if {loop_var} == {fixed}:")
                compute(t, inner + "    ")
                emit(f"{inner}    {p}acc{running[t]} = {p}t{t}")
            elif plan.phases[t] == "loop" and t in main:
                compute(t, inner)
                if t in running:
                    emit(f"{inner}{p}t{t} = tl.maximum({p}acc{running[t]}, {p}t{t})  # running max")
        kept = [t for t in order if not (fixed is not None and t in running.values())]
        for t in kept:
            emit(f"{inner}{p}new{t} = {updated(t, fixed is not None)}  # {plan.op(t).op}")
        for t in kept:
            emit(f"{inner}{p}acc{t} = {p}new{t}")

    def walk(fixed: str | None = None, ind: str = ind, stages: int = 0) -> None:
        """Every step the block walks: all of them, or with a known mask (`masked_steps`) those
        before `mid` without reading it, then those up to `end` reading it."""
        if mask_input is None:
            main_loop(fixed=fixed, ind=ind, stages=stages)
            return
        emit(f"{ind}# the steps whose tile of the mask (in{mask_input}) is +0 throughout: not read")
        main_loop("first", "mid", zero=mask_input, fixed=fixed, ind=ind, stages=stages)
        emit(f"{ind}# the steps that read the mask, up to the last it does not hide whole")
        main_loop("mid", "end", fixed=fixed, ind=ind, stages=stages)

    if isinstance(spec, Speculation):
        emit(f"{ind}# the online softmax against its first step's max (`speculative_max`)")
        walk(fixed="0" if mask_input is None else "first")
        over = " + ".join(  # each guard's rows apart: their tiles may differ
            f"tl.max(tl.where(({p}acc{g} > {spec.limit}) | ({p}acc{g} != {p}acc{g}), 1, 0))"
            for g in spec.guards
        )
        emit(f"{ind}# a row sum above {spec.limit} (or NaN): some term may have outgrown its form;")
        emit(f"{ind}# the block's rows again with the running max")
        emit(f"{ind}if {over} > 0:")
        for t in accs:
            emit(f"{ind}    {p}acc{t} = {registry.rule(BACKEND, plan.op(t).op).init(ctx_of(t))}")
        walk(ind=ind + "    ", stages=1)
    else:
        walk()
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
        store_partials(plan, accs, emit, p, part, ind, ctx_of)
        return
    _epilogue(plan, drop, accs, emit, p, pids, ind, out_views, out_dtypes, is_f32, ctx_of, compute)


def narrowed_before_loop(plan: KernelPlan) -> list[int]:
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
