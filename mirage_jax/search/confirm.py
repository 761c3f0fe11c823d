"""The search's last phases in its worker pool: jobs with the problem, and the full-size check.

`call` runs `fn(problem, *args)` for many args in the pool (numbers, verification); `confirm`
picks the µGraphs the search returns and verifies at full size the ones `select` will time.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mirage_jax.mugraph import MuGraph
from mirage_jax.search.order import return_order, timing_order
from mirage_jax.search.tasks import Problem, call_keyed
from mirage_jax.search.workers import problem_blob

if TYPE_CHECKING:
    from mirage_jax.search.driver import Budget


def call(raw: Any, problem: Problem, fn: Callable[..., Any], args: list[tuple]) -> list:
    """`[fn(problem, *a) for a in args]`, in the pool `raw` where there is one and more than
    one job (`fn` a module-level function: it runs in the workers)."""
    if raw is None or len(args) < 2:
        return [fn(problem, *a) for a in args]
    key, blob = problem_blob(problem)
    return list(raw.map(functools.partial(call_keyed, key, blob, fn), *zip(*args)))


def trial_full(problem: Problem, g: MuGraph, attempt: int) -> Any:
    """One attempt of the full-size verification of `g` against the region (a pool job)."""
    import fields

    return fields.run_trial(g, problem.program, problem.seed, attempt)


def verify_full(raw: Any, problem: Problem, graphs: list[MuGraph], trials: int | None) -> list:
    """`fields.verify` of each of `graphs` against the region at full size, with every planned
    trial of every graph a job of its own in the pool `raw` (8 jobs for 4 graphs of 2 trials:
    twice the parallelism of a job per graph). The verdicts are the ones `fields.verify` gives
    alone, and they enter this process's memo. The trials run in waves that fit in the
    machine's memory together (`fields.memory`: at GPT-2 XL size, batch 8, 17 GB a trial)."""
    import fields
    from fields import memory

    program = problem.program
    jobs = [
        (g, attempt) for g in graphs for attempt in range(fields.verify_plan(g, program, trials))
    ]
    wave = max(1, memory.room() // max(1, memory.trial_bytes(program, program)))
    done = []
    for start in range(0, len(jobs), wave):  # as many trials at once as the memory holds
        done += call(raw, problem, trial_full, jobs[start : start + wave])
    outcomes: dict[str, dict[int, Any]] = {}
    for (g, attempt), got in zip(jobs, done):
        outcomes.setdefault(g.canonical_hash, {})[attempt] = got
    return [
        fields.verify(g, program, trials=trials, seed=problem.seed,
                      outcomes=outcomes.get(g.canonical_hash, {}))
        for g in graphs
    ]  # fmt: skip


def confirm(
    problem: Problem, instances, budget: Budget, deadline: float = float("inf"), raw: Any = None
) -> tuple[list[MuGraph], int]:
    """Pick `budget.results` instances (the best of every structure first, then the next
    cheapest), order them as returned (`return_order`), verify at full size the first
    `budget.confirm` that `select` will time (`timing_order`), all at once in the pool `raw`
    (a failure drops its structure and the next moves up), return them.

    Once one is confirmed, no verification starts that would end past `deadline` (90% of
    the search's budget; judged by the last round's time): at prefill sizes each takes seconds
    (GPT-2 at b=8: 13 s). The rest stay verified on their small instance ("representative");
    `select` verifies whatever it times at full size again. The verdicts are kept in this
    process's memo (`fields.verify`'s), where `select` asks the same questions. A region whose
    trial is large (`fields.memory.LARGE_TRIAL`) or does not fit the machine's memory is not
    verified at full size here: `select` times its µGraphs first and verifies the fastest."""
    firsts: dict[str, int] = {}
    for i, (_, _, _, key) in enumerate(instances):
        firsts.setdefault(key, i)
    primary = sorted(firsts.values())
    taken = set(primary)
    pool = primary + [i for i in range(len(instances)) if i not in taken]
    chosen = pool[: budget.results]
    pool = pool[budget.results :]
    checked: dict[int, dict] = {}  # index -> the full verification's record
    failed, last = 0, 0.0
    bad_keys: set[str] = set()
    from fields import memory

    need = memory.trial_bytes(problem.program, problem.program)
    fits = need <= min(memory.room(), memory.LARGE_TRIAL)
    order = return_order([(i, instances[i][2]) for i in sorted(chosen)])
    while fits:  # else none is verified here: `select` verifies the fastest it times
        timed = timing_order([instances[i][2] for i in order], budget.confirm)
        todo = [order[k] for k, _ in timed if order[k] not in checked]
        if not todo or (checked and time.monotonic() + last > deadline):
            break
        t0 = time.monotonic()
        graphs = [instances[i][2] for i in todo]
        verdicts = verify_full(raw, problem, graphs, budget.trials)
        last = time.monotonic() - t0
        for i, v in zip(todo, verdicts):
            if v:
                checked[i] = dict(verified="full", bound=v.bound, trials=v.trials)
                continue
            failed += 1
            bad_keys.add(instances[i][3])
        if bad_keys:
            chosen = [i for i in chosen if instances[i][3] not in bad_keys]
            while pool and len(chosen) < budget.results:
                i = pool.pop(0)
                if instances[i][3] not in bad_keys:
                    chosen.append(i)
            order = return_order([(i, instances[i][2]) for i in sorted(chosen)])
    kept = []
    for i in order:
        g = instances[i][2]
        meta = dict(g.meta)
        if meta.get("verified") != "full":
            meta.update(checked.get(i, dict(verified="representative")))
        kept.append(MuGraph(g.ops, g.outputs, meta))
    return kept, failed
