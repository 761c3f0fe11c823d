"""Runner-ups: µGraphs that lost their region narrowly, tried in the whole function.

A region is selected on its own: XLA's code for it is timed against the µGraphs, in the
layout the function gives its inputs (`select.InContext`). In the whole function XLA
compiles the region together with its neighbours and can choose other fusions and layouts
there, slower ones too. On the H100 (2026-11-26, Llama-7B-size nnx block, b=1) XLA ran the
attention region alone in 13.09 µs, against 13.60 µs for the best µGraph; in the whole
function its attention fusions took about 45 µs (the transposed cache read by reductions).
With the two kernels that won their regions the block took 220.3 µs (jax.jit: 237.3); with
the o-projection's runner-up added, 195.6; with the attention's too, 178.5.

So where XLA keeps a region and the best verified µGraph came within `select.RUNNER_UP_WITHIN`
of it, the cache keeps that µGraph as the region's runner-up, and after the whole-function check
of the kernels that won their regions (before any of them is left out), up to
`RUNNER_UP_TRIES` runner-ups (`order`) are each added to the function and kept where
the function gets faster by `KEEP_ALL_TIE` (and beats jax.jit).
Each try is one whole-function check (cached like the others, so a later call recalls it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax.function_check import KEEP_ALL_TIE, FunctionCheck

RUNNER_UP_TRIES = 2
"""At most this many runner-ups are tried per signature: each try compiles and times the
whole function (about 3 s for a Llama-7B-size block on the H100)."""


@dataclass(frozen=True)
class Tried:
    """The outcome of `try_runner_ups`: the decisions (runner-ups kept turned to kernels),
    the kernels' regions, and the check of the kept set (None where none was measured)."""

    decisions: tuple[Any, ...]
    kept: frozenset[int]
    check: FunctionCheck | None
    changed: bool


def closeness(decision: Any) -> float:
    """How much slower the runner-up was than XLA on its region alone (a fraction)."""
    t = decision.timings or {}
    mine, xla = t.get("runner_up_us") or t.get("mugraph_us"), t.get("xla_us")
    if mine is None or not xla:
        return float("inf")
    return float(mine) / float(xla) - 1.0


def in_context(decision: Any) -> bool:
    """The region was timed with the layout steps around it (`select.IN_CONTEXT`): XLA fuses
    those steps differently in the whole function, where its code for the region can be
    far slower than alone (the attention regions, whose cache reads are transposed)."""
    return "in context" in str((decision.timings or {}).get("method", ""))


def order(decisions: Sequence[Any]) -> list[Any]:
    """The runner-ups in the order they are tried: those timed in context first (Gemma-style
    7B block, b=1, on the H100, 2026-11-26: the attention's runner-up, 8.9% slower alone,
    came third by closeness behind two GEMM regions and was never tried), each group
    closest first."""
    runners = [d for d in decisions if d.status == "xla" and d.runner_up is not None]
    return sorted(runners, key=lambda d: (not in_context(d), closeness(d)))


def try_runner_ups(
    decisions: Sequence[Any],
    base: FunctionCheck | None,
    check: Callable[[frozenset[int], Mapping[int, Any]], FunctionCheck | None],
    tries: int = RUNNER_UP_TRIES,
) -> Tried:
    """Add each runner-up (`order`, at most `tries`) to the kept kernels; keep it where
    the whole function gets faster than the best so far by `KEEP_ALL_TIE` and beats jax.jit.

    `decisions`: the regions' decisions (status "kernel": the kernels that won their
    regions). `base`: the whole-function check of those kernels; where they lost, a
    runner-up is kept only if the function with it beats jax.jit (None where no kernel runs:
    jax.jit is the base, measured by the first try; nothing is tried where the kernels'
    check could not run or their values differ). `check(subset, as_kernels)` measures the function with the kernels of
    `subset`, where `as_kernels` maps a runner-up's region to its decision as a kernel; None:
    it could not run. A set whose values differ from jax.jit's is passed over.
    """
    by_index = {d.index: d for d in decisions}
    kept = frozenset(d.index for d in decisions if d.status == "kernel")
    runners = order(decisions)[: max(0, tries)]
    best = base if base is not None and base.choice == "kernels" and kept else None
    best_us = None if best is None else best.kernels_us
    xla_us = None if base is None else base.xla_us
    if kept and (base is None or base.mismatch is not None):  # unchecked, or values differ
        return Tried(tuple(decisions), kept, base, False)
    changed = False
    for d in runners:
        as_kernel = dataclasses.replace(d, status="kernel", mugraph=d.runner_up, runner_up=None)
        subset = kept | {d.index}
        got = check(subset, {d.index: as_kernel})
        if got is None or got.mismatch is not None or got.kernels_us is None:
            continue
        xla_us = got.xla_us if got.xla_us is not None else xla_us
        bar = best_us if best_us is not None else xla_us
        if got.choice != "kernels" or bar is None or got.kernels_us >= bar * (1.0 - KEEP_ALL_TIE):
            continue
        why = (
            f"runner-up kept by the whole-function check: the function {got.kernels_us:.2f} µs "
            f"with it against {bar:.2f} µs without ({d.reason})"
        )
        by_index[d.index] = dataclasses.replace(as_kernel, reason=why)
        kept, best, best_us, changed = subset, got, got.kernels_us, True
    ordered = tuple(by_index[d.index] for d in decisions)
    return Tried(ordered, kept, best if changed else base, changed)
