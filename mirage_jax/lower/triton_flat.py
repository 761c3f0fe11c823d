"""A combining loop lowered flat (Triton backend): every step's tile loaded at once along a new
leading axis, and the accumulators reduced over that axis, instead of a `for` loop whose steps
each wait on their own loads and on the running max.

The combining kernel of a split attention walks S partials (a max, a sum and an output row per
split) in a loop of S steps. On the H100 (2026-11-27, Llama-7B b=1 decode attention, grid
(8, 4), `experiments/results/split_parts_probe_h100_2026-11-27.txt`) that loop took 1.9 µs at
S=16, 4.4 at S=32 and 8.0-8.2 at S=64: its time was the steps' latency, not their bytes.
Flat, it took 2.0-2.1, 2.2 and 2.3 µs; unrolled with every step's loads first (a form tried
and dropped) 2.3, 2.9 and 6.1 µs.

`flat_loop` says which loops are lowered flat: every loop value is an input read directly by
accumulators that are maxima, sums or sums rescaled by such a max (a combine), the step count
is a power of two from `FLAT_MIN_STEPS` to `FLAT_MAX_STEPS`, and the stacked tiles fit
`PRELOAD_PER_THREAD` elements a thread. `emit_flat` writes them:

- a max: `tl.max` of the stacked tiles over the steps' axis;
- a sum: `tl.sum` over it;
- a rescaled sum: `tl.sum` of each step's tile times `exp(m_j - M)`, with M the max's value
  over all steps, which is what the online form's running rescaling comes to.

The µGraph and its meaning are unchanged; only the order of the fp32 operations differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.triton_hoist import PRELOAD_PER_THREAD
from mirage_jax.lower.triton_rules import LOG2E

FLAT_MIN_STEPS = 32
"""The shortest loop lowered flat: at 16 steps the loop took 1.9 µs and the flat form 2.0-2.1
(the H100 run above, four numberings of the split)."""

FLAT_MAX_STEPS = 64
"""The longest loop lowered flat (the longest measured)."""

FLAT_ACCUMULATORS = frozenset({"accum_max", "accum_sum", "accum_rescale_sum"})
"""Accumulators `emit_flat` reduces over the steps' axis (elementwise in the tile)."""


def flat_loop(plan: KernelPlan, steps: int, num_warps: int) -> bool:
    """Whether `plan`'s loop of `steps` steps is lowered flat (see the module docstring)."""
    if not FLAT_MIN_STEPS <= steps <= FLAT_MAX_STEPS or steps & (steps - 1):
        return False
    n = plan.n_in + len(plan.bg.ops)
    if any(plan.phases[t] == "loop" for t in range(plan.n_in, n)):
        return False  # an op computed per step: not a combine
    for t in plan.accumulators:
        if plan.op(t).op not in FLAT_ACCUMULATORS:
            return False
        if any(plan.phases[a] != "loop" for a in plan.op(t).args[:2]):  # a rescale's 3rd: its max
            return False
    loop_ins = [k for k in range(plan.n_in) if plan.phases[k] == "loop"]
    elements = sum(math.prod(plan.pads[k]) for k in loop_ins) * steps
    return bool(loop_ins) and elements <= PRELOAD_PER_THREAD * 32 * num_warps


def emit_flat(
    plan: KernelPlan,
    steps: int,
    emit: Callable[[str], Any],
    p: str,
    ind: str,
    access: dict[int, tuple[Callable[[str], str], str | None]],
    is_f32: dict[int, bool],
) -> None:
    """Emit `plan`'s loop flat into the accumulators `{p}acc{t}` (see the module docstring).

    `access[k]` is input k's pointer offset at a step (a function of the step's expression) and
    lane mask, as `_body` computed them.
    """
    loop_ins = [k for k in range(plan.n_in) if plan.phases[k] == "loop"]
    emit(f"{ind}# the loop's {steps} steps flat: each input's tiles of every step at once")
    emit(f"{ind}{p}steps = tl.arange(0, {steps})")
    for k in loop_ins:
        at_step, mask = access[k]
        rank = len(plan.pads[k])
        lead = "[None, " + ", ".join([":"] * rank) + "]"
        along = "[:, " + ", ".join(["None"] * rank) + "]"
        ptr = f"{p}in{k}_ptrs{lead} + {at_step(f'{p}steps{along}')}"
        m = f", mask={p}in{k}_mask{lead}, other=0.0" if mask else ""
        cast = "" if plan.bg.inputs[k].dtype == "float32" else ".to(tl.float32)"
        emit(f"{ind}{p}s{k} = tl.load({ptr}{m}){cast}")
    order = sorted(plan.accumulators, key=lambda t: plan.op(t).op != "accum_max")
    for t in order:
        op = plan.op(t)
        x = f"{p}s{op.args[0]}"
        if op.op == "accum_max":
            expr = f"tl.max({x}, axis=0)"
        elif op.op == "accum_sum":
            expr = f"tl.sum({x}, axis=0)"
        else:  # accum_rescale_sum: each step against the max over all steps
            m, big = f"{p}s{op.args[1]}", plan.shifts[t]
            lead = "[None, " + ", ".join([":"] * len(plan.pads[big])) + "]"
            factor = f"tl.math.exp2(({m} - {p}acc{big}{lead}) * {LOG2E!r})"
            expr = f"tl.sum({x} * {factor}, axis=0)"
        emit(f"{ind}{p}acc{t} = {expr}  # {op.op}")
        is_f32[t] = True
