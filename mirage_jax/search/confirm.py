"""The search's last phases in its worker pool: jobs with the problem, and the full-size check.

`call` runs `fn(problem, *args)` for many args in the pool (numbers, verification); `confirm`
picks the µGraphs the search returns and verifies at full size the ones `select` will time.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mirage_jax.mugraph import MuGraph
from mirage_jax.search import dims as dims_mod
from mirage_jax.search.order import return_order, timing_order
from mirage_jax.search.reduced import reduced_instance
from mirage_jax.search.structure import Numbers, Structure
from mirage_jax.search.tasks import Problem, call_keyed
from mirage_jax.search.workers import problem_blob

if TYPE_CHECKING:
    from mirage_jax.search.budget import Budget


def call(raw: Any, problem: Problem, fn: Callable[..., Any], args: list[tuple]) -> list:
    """`[fn(problem, *a) for a in args]`, in the pool `raw` where there is one and more than
    one job (`fn` a module-level function: it runs in the workers)."""
    if raw is None or len(args) < 2:
        return [fn(problem, *a) for a in args]
    key, blob = problem_blob(problem)
    return list(raw.map(functools.partial(call_keyed, key, blob, fn), *zip(*args)))


def trial_full(problem: Problem, g: MuGraph, sizes: dict | None, attempt: int) -> Any:
    """One attempt of the full-size verification of `g` against the region (a pool job), or,
    with `sizes`, against the region shrunk to them (`reduced`: `g` is the reduced candidate)."""
    import fields

    program = problem.program
    if sizes is not None:
        program = dims_mod.shrink(program, sizes, problem.dims)
    return fields.run_trial(g, program, problem.seed, attempt)


Recipes = Mapping[str, tuple[Structure, Numbers]]
"""µGraph hash -> the structure and numbers it was instantiated from (the search's own)."""


def check_pair(problem: Problem, g: MuGraph, recipes: Recipes | None) -> tuple:
    """What verifies `g` at full size: (µGraph, program, reduced sizes or None, `Reduced` or
    None); the reduced instance (`reduced`) where `g` has a recipe that allows one."""
    recipe = (recipes or {}).get(g.canonical_hash)
    r = reduced_instance(problem.program, problem.dims, *recipe) if recipe else None
    if r is None:
        return g, problem.program, None, None
    small = {c: b for c, (_, b) in r.sizes.items()}
    return r.mugraph, r.program, small, r


def verify_full(
    raw: Any,
    problem: Problem,
    graphs: list[MuGraph],
    trials: int | None,
    recipes: Recipes | None = None,
    pairs: list[tuple] | None = None,
) -> list:
    """`fields.verify` of each of `graphs` against the region at full size, with every planned
    trial of every graph a job of its own in the pool `raw` (8 jobs for 4 graphs of 2 trials:
    twice the parallelism of a job per graph). A graph with a recipe is verified on its
    reduced instance where it has one (`reduced`: GPT-2 prefill at b=8, 32 times fewer
    elements), and that verdict answers the full-size question in this process's memo
    (`fields.remember`), where `select` asks it. The trials run in waves that fit in the
    machine's memory together (`fields.memory`: at GPT-2 XL size, batch 8, 17 GB a trial).
    `pairs`: each graph's `check_pair`, where the caller has them already."""
    import fields
    from fields import memory

    pairs = pairs or [check_pair(problem, g, recipes) for g in graphs]
    jobs = [
        (k, attempt)
        for k, (a, b, _, _) in enumerate(pairs)
        for attempt in range(max(fields.verify_plan(a, b, trials), fields.verify_plan(a, b)))
    ]
    need = max((memory.trial_bytes(b, b) for _, b, _, _ in pairs), default=1)
    wave = max(1, memory.room() // max(1, need))
    args = [(pairs[k][0], pairs[k][2], attempt) for k, attempt in jobs]
    done = []
    for start in range(0, len(jobs), wave):  # as many trials at once as the memory holds
        done += call(raw, problem, trial_full, args[start : start + wave])
    outcomes: dict[int, dict[int, Any]] = {}
    for (k, attempt), got in zip(jobs, done):
        outcomes.setdefault(k, {})[attempt] = got
    verdicts = []
    for k, (g, (a, b, _, r)) in enumerate(zip(graphs, pairs)):
        # the trials that reach the trusted bound (their outcomes are all in `outcomes`)
        v = fields.verify_to_bound(a, b, trials=trials, seed=problem.seed, outcomes=outcomes.get(k))
        if r is not None:
            v = dataclasses.replace(v, instance="reduced: " + r.describe())
        # the stronger verdict answers the weaker question too: `select` asks both
        for t in {trials, None}:
            fields.remember(g, problem.program, v, trials=t, seed=problem.seed)
        verdicts.append(v)
    return verdicts


def confirm(
    problem: Problem,
    instances,
    budget: Budget,
    deadline: float = float("inf"),
    raw: Any = None,
    recipes: Recipes | None = None,
) -> tuple[list[MuGraph], int, dict[str, Any]]:
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
    verified at full size here, unless its reduced instance (`recipes`, `reduced`) is small
    enough: `select` times its µGraphs first and verifies the fastest. Returns the µGraphs,
    the number that failed, and the verdicts of those verified (µGraph hash -> `Verdict`), which
    the result carries to `select` in whatever process it runs."""
    firsts: dict[str, int] = {}
    for i, (_, _, _, key) in enumerate(instances):
        firsts.setdefault(key, i)
    primary = sorted(firsts.values())
    taken = set(primary)
    pool = primary + [i for i in range(len(instances)) if i not in taken]
    chosen = pool[: budget.results]
    pool = pool[budget.results :]
    checked: dict[int, dict] = {}  # index -> the full verification's record
    verdicts: dict[str, Any] = {}
    failed, last = 0, 0.0
    bad_keys: set[str] = set()
    from fields import memory

    room = min(memory.room(), memory.LARGE_TRIAL)
    pairs: dict[int, tuple] = {}  # index -> what verifies it (`check_pair`)

    def fits(i: int) -> bool:  # else `select` verifies it if it is the fastest it times
        if i not in pairs:
            pairs[i] = check_pair(problem, instances[i][2], recipes)
        b = pairs[i][1]
        return memory.trial_bytes(b, b) <= room

    skipped: set[int] = set()
    order = return_order([(i, instances[i][2]) for i in sorted(chosen)])
    while True:
        timed = timing_order([instances[i][2] for i in order], budget.confirm)
        todo = [order[k] for k, _ in timed if order[k] not in checked and order[k] not in skipped]
        skipped.update(i for i in todo if not fits(i))
        todo = [i for i in todo if i not in skipped]
        if not todo or (checked and time.monotonic() + last > deadline):
            break
        t0 = time.monotonic()
        graphs = [instances[i][2] for i in todo]
        got = verify_full(raw, problem, graphs, budget.trials, recipes, [pairs[i] for i in todo])
        last = time.monotonic() - t0
        for i, v in zip(todo, got):
            if v:
                checked[i] = dict(verified="full", bound=v.bound, trials=v.trials)
                if v.instance:
                    checked[i]["instance"] = v.instance
                verdicts[instances[i][2].canonical_hash] = v
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
    return kept, failed, verdicts
