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


def verify_full(problem: Problem, g: MuGraph, trials: int | None) -> Any:
    import fields

    return fields.verify(g, problem.program, trials=trials, seed=problem.seed)


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
    process's memo (`fields.remember`), where `select` asks the same questions."""
    import fields

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
    while True:
        order = return_order([(i, instances[i][2]) for i in sorted(chosen)])
        timed = timing_order([instances[i][2] for i in order], budget.confirm)
        todo = [order[k] for k, _ in timed if order[k] not in checked]
        if not todo or (checked and time.monotonic() + last > deadline):
            break
        t0 = time.monotonic()
        graphs = [instances[i][2] for i in todo]
        verdicts = call(raw, problem, verify_full, [(g, budget.trials) for g in graphs])
        last = time.monotonic() - t0
        for i, g, v in zip(todo, graphs, verdicts):
            fields.remember(g, problem.program, v, trials=budget.trials, seed=problem.seed)
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
    kept = []
    for i in order:
        g = instances[i][2]
        meta = dict(g.meta)
        if meta.get("verified") != "full":
            meta.update(checked.get(i, dict(verified="representative")))
        kept.append(MuGraph(g.ops, g.outputs, meta))
    return kept, failed
