"""The online softmax's running max, used where each step's values are computed.

A µGraph's online softmax (`mugraph.ops`: `accum_rescale_sum(x, m, M)` = Σ_i x_i·exp(m_i − M),
`M = accum_max(m)`) computes each step's x_i with the step's own tile max m_i, and the kernel
rescales it to the running max: every step multiplies the whole x tile (attention's P·V,
64 × 128) by exp(m_i − M) beside the accumulator's own exp(M_old − M). Where x is linear in
exp(y − m) and depends on m in no other way, computing the step with the running max itself,
M_i = max(M_{i−1}, m_i), gives x_i·exp(m_i − M_i) directly, so the step's factor is 1 and only
the accumulator is rescaled: FlashAttention-2's form. Exact in real arithmetic, and the
exponents stay ≤ 0 as before.

`running_shifts` finds the tile maxes for which that holds; the Triton generator then rebinds
the tile max to the running max right after computing it and drops the step's factor.
"""

from __future__ import annotations

from collections.abc import Sequence

from mirage_jax.lower.plan import KernelPlan
from mirage_jax.mugraph.graph import BlockOp

_LINEAR_UNARY = frozenset({"mul_scalar"})
"""Ops of one argument linear in it (positive-homogeneous of degree 1)."""

RESCALED = frozenset({"accum_rescale_sum", "accum_rescale_sum_last"})


def running_shifts(plan: KernelPlan, hoisted: Sequence[int] = ()) -> dict[int, int]:
    """tile max m -> its running max accumulator M (`accum_max(m)`), for each m of the loop
    that only the online softmax reads: in `sub(y, m)` under an `exp` (y free of m), in M, and
    as the shift of accumulators `accum_rescale_sum(x, m, M)` whose x is linear in those
    exps. Accumulators in `hoisted` (computed in a loop of their own) exclude their m."""
    bg, n_in = plan.bg, plan.n_in
    n = n_in + len(bg.ops)
    users: dict[int, list[int]] = {t: [] for t in range(n)}
    for j, op in enumerate(bg.ops):
        for a in op.args:
            users[a].append(n_in + j)
    outputs = {o.arg for o in bg.outputs}
    out: dict[int, int] = {}
    for t, big in plan.shifts.items():
        m = plan.op(t).args[1]
        if m in out or m < n_in or plan.op(m).op != "reduce_max" or plan.phases[m] != "loop":
            continue
        if _only_softmax(plan, m, big, users, outputs, set(hoisted)):
            out[m] = big
    return out


def _only_softmax(
    plan: KernelPlan,
    m: int,
    big: int,
    users: dict[int, list[int]],
    outputs: set[int],
    hoisted: set[int],
) -> bool:
    """Does m reach nothing but M, exps of `y − m` and, through ops linear in those exps,
    the x of accumulators rescaled by (m, M)?"""
    if m in outputs or big in hoisted:
        return False
    linear: set[int] = set()  # tensors linear in the exps of y − m
    queue: list[int] = []
    for u in users[m]:
        op = plan.op(u)
        if u == big:
            continue
        if op.op in RESCALED and op.args[1] == m and op.args[0] != m:
            continue  # its x is checked where x is reached
        if op.op != "sub" or op.args != (op.args[0], m) or depends(plan, op.args[0], m):
            return False
        for e in users[u]:
            if plan.op(e).op != "exp":
                return False
            linear.add(e)
            queue.append(e)
    while queue:
        t = queue.pop()
        if t in outputs:
            return False
        for u in users[t]:
            op = plan.op(u)
            if op.op in RESCALED:
                if op.args[0] != t or op.args[1] != m or op.args[2] != big or u in hoisted:
                    return False
                continue
            if not _linear(plan, op, t, m):
                return False
            linear.add(u)
            queue.append(u)
    rescaled = [plan.op(u) for u in users[m] if plan.op(u).op in RESCALED]
    return bool(linear) and all(op.args[0] in linear for op in rescaled)


def _linear(plan: KernelPlan, op: BlockOp, t: int, m: int) -> bool:
    """Is `op`, reading tensor t (linear in the exps), linear in t with its other arguments
    free of m?"""
    others = [a for a in op.args if a != t]
    if any(depends(plan, a, m) for a in others):
        return False
    if op.op in _LINEAR_UNARY or op.op == "reduce_sum":
        return True
    if op.op in ("matmul", "mul"):
        return op.args.count(t) == 1
    if op.op == "div":
        return op.args[0] == t and op.args[1] != t
    return False


def depends(plan: KernelPlan, t: int, m: int) -> bool:
    """Does block tensor t depend on block tensor m?"""
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if u == m:
            return True
        if u < plan.n_in or u in seen:
            continue
        seen.add(u)
        stack.extend(plan.op(u).args)
    return False
