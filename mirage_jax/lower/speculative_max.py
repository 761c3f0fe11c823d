"""The online softmax with its first step's max as the reference for every step (Triton).

A kernel's online softmax (`running_max`) finds each step's tile max, a reduction over every
score, and rescales its sums when the running max grows. On the H100 (2026-11-27,
`experiments/stable_split_probe.py`) that max is what stable attention costs over unstable:
gqa_stable's split kernel took 15.8 µs against 13.6 µs without it. With
`TritonConfig.speculative_max` the kernel takes the row max of its first step only and
computes every later step's exps against it, with no max and no rescale. Every exp term is at
most its row's sum (all terms are positive), and the first step's largest term is 1, so:

- where every row's sum stays at most `limit` (the keys the block walks, at most 2**15), no
  term exceeded what the running max's form can hold (there each term is at most 1 and the sum
  at most the number of keys), the terms that matter are normal numbers, and the products
  with the values have the same bound: the result is the online softmax's to rounding;
- otherwise (a later key's score far above the first step's, a first step masked whole, a
  NaN) the block computes its rows again with the running max (`main_loop` of
  `triton_body`), in a loop with no pipelining buffers of its own.

The µGraph is unchanged (its verification holds); only where its rows are shifted differs.
`select` times the form against the running max's for its fastest µGraph
(`tuning.speculative_variant`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.running_max import RESCALED, running_shifts
from mirage_jax.lower.triton_hoist import hoisted_statistics

MAX_LIMIT = 1 << 15
"""The largest row sum the fast path keeps: each term then fits float16 (at most 65504)."""


@dataclass(frozen=True)
class Speculation:
    """A kernel's speculative online softmax: the accumulators whose row sums bound every
    exp term (`guards`) and the sum each may reach (`limit`)."""

    guards: tuple[int, ...]
    limit: int


def speculation(
    plan: KernelPlan, running: dict[int, int], steps: int, hoisted: Sequence[int] = ()
) -> Speculation | str:
    """The speculative form of `plan`'s online softmax (`running`: tile max -> running max, from
    `running_shifts`) over `steps` loop steps, or why it has none."""
    bg, n_in = plan.bg, plan.n_in
    if not running:
        return "it has no online softmax with a running max"
    if steps < 2 or hoisted:
        return "its loop has one step" if steps < 2 else "it sums statistics in a loop of its own"
    accs = plan.accumulators
    for t in accs:
        op = plan.op(t)
        if op.op == "accum_max" and t not in running.values():
            return "it keeps a max of its own (not the softmax's)"
        if op.op in RESCALED and op.args[1] not in running:
            return "a rescaled sum is computed with its step's own max"
    users: dict[int, list[int]] = {t: [] for t in range(n_in + len(bg.ops))}
    for j, op in enumerate(bg.ops):
        for a in op.args:
            users[a].append(n_in + j)
    guards, keys = [], 1
    for m in running:
        exps = [e for s in users[m] if plan.op(s).op == "sub" for e in users[s]]
        for e in exps:
            sums = [
                u
                for u in users[e]
                if plan.op(u).op == "accum_rescale_sum_last" and plan.op(u).args[:2] == (e, m)
            ]
            if not sums:
                return "an exp tile of its softmax has no row sum to bound its terms"
            for u in users[e]:
                if u in sums or _bounded_product(plan, u, e, m, users):
                    continue
                return f"an exp tile feeds {plan.op(u).op}, not a sum or a product with values"
            guards.append(sums[0])
            keys = max(keys, plan.tile(e)[-1] * steps)
    return Speculation(tuple(sorted(set(guards))), min(keys, MAX_LIMIT))


def for_plan(plan: KernelPlan) -> Speculation | str:
    """The speculative form of `plan`'s kernel, unsplit over all its steps, or why it has none:
    the one decision that `triton_body` lowers and `tuning.speculative_variant` offers."""
    hoisted = hoisted_statistics(plan)[0]
    return speculation(plan, running_shifts(plan, hoisted), plan.forloop_range, hoisted)


def _bounded_product(plan: KernelPlan, u: int, e: int, m: int, users: dict[int, list[int]]) -> bool:
    """Is u a matmul of the exps e with values, summed only by accumulators rescaled by m?
    (Its entries are then at most the row sum times the values' largest, as with the running
    max.)"""
    op = plan.op(u)
    if op.op != "matmul" or op.args.count(e) != 1 or op.args[0] != e:
        return False
    return all(
        plan.op(w).op == "accum_rescale_sum" and plan.op(w).args[:2] == (u, m) for w in users[u]
    )
