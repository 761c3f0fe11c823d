"""A norm's statistics in a loop of their own, after a kernel's main loop (Triton backend).

A norm fused into the GEMM after it sums the squares of its input in the GEMM's loop, beside
the dot that reads the same input; in the dots' loop those squares keep Triton's loads from
pipelining. `hoisted_statistics` says which accumulators the generator computes in a second
loop instead, and `main_loop_values` what the main loop still computes. Where the statistics'
input tiles of every step fit in registers (`preloaded`), they are all loaded before the main
loop and summed after it: their loads wait beside the main loop's instead of after them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mirage_jax.lower.plan import KernelPlan

HOISTED = ("accum_sum_last", "accum_mean_last", "accum_rms_last")
"""Accumulators of a norm's statistics, computed in a loop of their own after the main loop
(`hoisted_statistics`)."""


def hoisted_statistics(plan: KernelPlan) -> tuple[tuple[int, ...], frozenset[int]]:
    """The accumulators (`HOISTED`) a kernel computes in a loop of their own after its main
    loop, and the loop values (inputs, ops) that loop needs.

    A norm fused into the GEMM after it sums the squares of its input in the GEMM's loop,
    beside the dot that reads the same input. On the H100 (2026-11-26, Llama nnx b=8, norm +
    gate/up, 88 blocks of 4 steps) that kernel took 10.75 µs, 6.43 without the squares, and
    7.17 µs with them summed in a loop of their own before the main one, which reads the
    input again (it is small and every block reads it). After the main loop, where the input
    is in L2, the same kernel took 7.34 µs, and the norm + QKV kernel of that block 7.82
    against 11.22 before it (its blocks read little, so each dependent load counts). So an
    accumulator is hoisted where the main loop has a matmul, no matmul feeds the accumulator,
    and the inputs it reads are at most an eighth of the kernel's input bytes.
    """
    if plan.forloop_range == 1 or not plan.matmuls:
        return (), frozenset()
    bg, n_in = plan.bg, plan.n_in
    total = sum(_whole_bytes(b) for b in bg.inputs)
    hoisted, need = [], set()
    for t in plan.accumulators:
        if plan.op(t).op not in HOISTED or t in plan.shifts:
            continue
        values = _loop_closure(plan, plan.op(t).args)
        if any(u in plan.matmuls for u in values):
            continue
        read = sum(_whole_bytes(bg.inputs[k]) for k in values if k < n_in)
        if read * 8 > total:
            continue
        hoisted.append(t)
        need |= values
    return tuple(hoisted), frozenset(need)


def _whole_bytes(b: Any) -> int:
    return math.prod(b.shape) * np.dtype(b.dtype).itemsize


def _loop_closure(plan: KernelPlan, args: Sequence[int]) -> set[int]:
    """The per-iteration values (inputs and ops in the loop phase) `args` depend on."""
    seen: set[int] = set()
    stack = [a for a in args if plan.phases[a] == "loop"]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u >= plan.n_in:
            stack += [a for a in plan.op(u).args if plan.phases[a] == "loop"]
    return seen


def main_loop_values(
    plan: KernelPlan, hoisted: Sequence[int], need: frozenset[int]
) -> frozenset[int]:
    """The loop values the main loop computes: all, less those only the hoisted accumulators
    use."""
    n = plan.n_in + len(plan.bg.ops)
    if not hoisted:
        return frozenset(range(n))
    users = [u for u in range(plan.n_in, n) if u not in hoisted and u not in need]
    kept = _loop_closure(plan, [a for u in users for a in plan.op(u).args])
    return frozenset(u for u in range(n) if u not in need or u in kept)


PRELOAD_PER_THREAD = 128
"""`preloaded`: the most elements of the statistics' input tiles, over all steps, that a thread
holds through the main loop (H100, 2026-11-26, Llama nnx b=8: the norm + gate/up kernel, 88
blocks of 4 steps, 7.30 µs with its statistics' loop after the main loop, 6.85 with their tiles
loaded before it (128 elements a thread at 4 warps); the norm + QKV kernel 10.90 and 10.06)."""


def preloaded(plan: KernelPlan, need: frozenset[int], steps: int, num_warps: int) -> bool:
    """Whether the hoisted statistics' input tiles of all `steps` are loaded before the main
    loop (they fit `PRELOAD_PER_THREAD` elements a thread)."""
    elements = sum(math.prod(plan.pads[k]) for k in need if k < plan.n_in) * steps
    return elements <= PRELOAD_PER_THREAD * 32 * num_warps
