"""Tasks of the search: the prepared problem, one enumeration subtree, its verification."""

from __future__ import annotations

import dataclasses
import math
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lax_ir.ops import OPS as LAX_OPS
from lax_ir.program import Program
from mirage_jax.mugraph import MuGraph, MuGraphError
from mirage_jax.search import dims as dims_mod
from mirage_jax.search import expr as E
from mirage_jax.search.enumerate import BlockEnumerator, Counters, Goal
from mirage_jax.search.schedule import grid_expansions, schedule_classes
from mirage_jax.search.structure import (
    KernelSpec,
    KTensor,
    MappingClass,
    Structure,
    instantiate,
    omap_of,
    output_tensor,
    representative,
    representative_numbers,
)
from mirage_jax.search.targets import Targets
from mirage_jax.search.vocab import build_vocabulary

SUPPORTED = frozenset(name for name, o in LAX_OPS.items() if o.kind != "residual") - {"max"}
"""The Lax ops a searched region may contain (`lax_ir.ops`)."""


class SearchError(ValueError):
    """The region cannot be searched (the message names the op or the rule)."""


# ---------------------------------------------------------------------------- problem
def _export_inputs(state: dict) -> dict:
    """A picklable copy of `state`: term ids are per process, so send the input terms."""
    state = dict(state)
    state["inputs"] = tuple((t, E.export(t.term)) for t in state["inputs"])
    return state


def _import_inputs(state: dict) -> dict:
    """`_export_inputs` undone in this process (terms re-interned)."""
    state = dict(state)
    state["inputs"] = tuple(
        dataclasses.replace(t, term=E.import_(term)) for t, term in state["inputs"]
    )
    return state


@dataclass
class Problem:
    """Everything a task needs (pickled once per worker)."""

    program: Program
    small_program: Program
    dims: dims_mod.Dims
    small: dict[int, int]
    sizes: dict[int, int]
    inputs: tuple[KTensor, ...]
    targets: Targets
    output_labels: tuple
    vocab: Any
    combine_vocab: Any
    trials: int
    seed: int
    max_outputs: int
    shrunk: bool
    reread: bool = False

    def __getstate__(self):
        return _export_inputs(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(_import_inputs(state))


@dataclass(frozen=True)
class Task:
    """One independent subtree: a mapping class of the region's first graph-defined kernel.

    Arguments:
        index: the task's number (memo tables are per task).
        mapping: the mapping class.
        prefix: pre-defined kernels before it (`predefined.Prefix`); their outputs are refs
            ("k", j, 0) and the graph-defined kernel(s) follow them.
        inputs: the kernel's inputs (empty: the region's inputs).
        epilogue: positions in `inputs` that are pre-defined outputs.
        group: tasks of one prefix share a group (the depth policy is per group).
        shard: (k, n): the k-th of n tasks that split the class by the first block op
            (`BlockEnumerator.run`), so that more workers than classes have work.
        parent: the index of the class's first shard (the depth policy is per class).
    """

    index: int
    mapping: MappingClass
    prefix: tuple[KernelSpec, ...] = ()
    inputs: tuple[KTensor, ...] = ()
    epilogue: frozenset = frozenset()
    group: int = 0
    shard: tuple[int, int] = (0, 1)
    parent: int = -1

    @property
    def cls(self) -> int:
        """The class's number: its first shard's index."""
        return self.index if self.parent < 0 else self.parent

    def __getstate__(self):
        return _export_inputs(self.__dict__)

    def __setstate__(self, state):
        for k, v in _import_inputs(state).items():
            object.__setattr__(self, k, v)


@dataclass
class TaskOutcome:
    index: int
    depth: int
    accepted: list = field(default_factory=list)  # (structure, key)
    roots: list = field(default_factory=list)  # per accepted: its first op's root candidate
    verdicts: dict = field(default_factory=dict)  # key -> bool
    counters: Counters = field(default_factory=Counters)
    verified: int = 0
    rejected: int = 0
    invalid: int = 0
    duplicates: int = 0
    inherited: int = 0
    enumerate_s: float = 0.0
    verify_s: float = 0.0
    stopped: str = ""
    saturation: dict = field(default_factory=dict)


def check_fragment(program: Program) -> None:
    """Raise SearchError naming the first op outside what the search handles."""
    for i, n in program.ops():
        if n.op not in SUPPORTED:
            what = n.op
            if n.op == "opaque":
                what = f"opaque primitive `{n.param('payload').primitive.name}`"
            raise SearchError(
                f"the region is outside the Lax fragment: op `{what}` (node %{i}) has no µGraph "
                "form; partition the program (lax_ir.partition) and search its Lax regions"
            )
        if n.op == "reduce_max" and not n.param("shift"):
            raise SearchError(
                f"the region is outside the Lax fragment: op `reduce_max` (node %{i}) is not a "
                "softmax shift"
            )
        if n.dtype not in ("float16", "bfloat16", "float32", "float64"):
            raise SearchError(f"op `{n.op}` (node %{i}) works on {n.dtype}, not a float dtype")
    if not program.outputs:
        raise SearchError("the region has no outputs")


def prepare(program: Program, *, seed: int, budget: Any) -> Problem:
    """Dimensions, the shrunk representative program, targets, vocabulary."""
    check_fragment(program)
    dims = dims_mod.analyse(program)
    small = dims_mod.small_sizes(dims)
    try:
        small_program = dims_mod.shrink(program, small, dims)
        shrunk = True
    except dims_mod.ShrinkError:
        small_program, small, shrunk = program, dict(enumerate(dims.sizes)), False
    sdims = dims_mod.analyse(small_program)
    try:
        terms = E.program_terms(small_program, sdims)
    except ValueError as e:
        raise SearchError(str(e)) from None
    inputs = tuple(
        KTensor(("in", k), terms[n], sdims.axes[n], small_program.nodes[n].dtype)
        for k, n in enumerate(small_program.inputs)
    )
    var_dims = {
        f"x{k}": frozenset(c for c in sdims.axes[n] if c is not None)
        for k, n in enumerate(small_program.inputs)
    }
    # no wall-clock limit on the saturation either when the search has none (reproducible)
    limit = {} if math.isfinite(budget.time_s) else {"max_seconds": math.inf}
    targets = Targets([terms[o] for o in small_program.outputs], var_dims, **limit)
    scalars = E.scalar_constants(small_program, sdims)
    return Problem(
        program=program,
        small_program=small_program,
        dims=dims,
        small=small,
        sizes=dict(enumerate(dims.sizes)),
        inputs=inputs,
        targets=targets,
        output_labels=tuple(sdims.axes[o] for o in small_program.outputs),
        vocab=build_vocabulary(small_program, sdims, scalars, terms=terms),
        combine_vocab=build_vocabulary(small_program, sdims, scalars, combine=True, terms=terms),
        trials=budget.trials,
        seed=seed,
        max_outputs=budget.max_outputs,
        reread=budget.reread,
        shrunk=shrunk,
    )


def parallel_dims(problem: Problem) -> list[int]:
    """The output dimensions, in output-axis order (grid axes split these)."""
    out = []
    for labels in problem.output_labels:
        for c in labels:
            if c is not None and c not in out:
                out.append(c)
    return out


def tasks_of(problem: Problem, budget: Any, prefix=None, first: int = 0, group: int = 0):
    """`budget.shards` tasks per schedule class of the (first) graph-defined kernel, numbered
    from `first` (class-major).

    With a `predefined.Prefix`, the kernel reads the prefix's chosen inputs.
    """
    inputs = prefix.rest if prefix is not None else problem.inputs
    n_pre = len(prefix.kernels) if prefix is not None else 0
    present = {c for t in inputs for c in t.labels if isinstance(c, int)}
    reduced = sorted(c for c in problem.dims.reduced if c in present)
    split = budget.split and budget.max_kernels >= 2 + n_pre
    classes = schedule_classes(reduced, problem.sizes, problem.small, split=split)
    n = max(1, int(getattr(budget, "shards", 1)))
    pre = (
        (prefix.kernels, prefix.rest, prefix.epilogue)
        if prefix is not None
        else ((), (), frozenset())
    )
    return [
        Task(first + i * n + k, m, *pre, group, (k, n), first + i * n)
        for i, m in enumerate(classes)
        for k in range(n)
    ]


# ---------------------------------------------------------------------------- tasks
_WORKER: dict[str, Any] = {}  # a pool worker's own: the problems its jobs named


def problem_of(key: str, blob: bytes) -> Problem:
    """In a pool worker, the problem a job names: it arrives pickled with its key, and the
    worker keeps the last few it has seen, with what their tasks built lazily (targets)."""
    problems = _WORKER.setdefault("problems", {})
    problem = problems.get(key)
    if problem is None:
        problem = problems[key] = pickle.loads(blob)
        while len(problems) > 4:
            problems.pop(next(iter(problems)))
    return problem


def run_keyed(key: str, blob: bytes, *args: Any) -> TaskOutcome:
    """`run_task` in a pool worker."""
    return run_task(*args, problem=problem_of(key, blob))


def call_keyed(key: str, blob: bytes, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(problem, *args)` in a pool worker (`fn` a module-level function)."""
    return fn(problem_of(key, blob), *args)


def _structure_key(problem: Problem, s: Structure) -> tuple[str, MuGraph | None]:
    try:
        g = instantiate(
            s,
            problem.small_program.input_avals,
            problem.small,
            representative_numbers(s, problem.small),
        )
        g.shapes  # noqa: B018 (validate)
        return g.canonical_hash, g
    except MuGraphError as e:
        return "invalid:" + str(e), None


def run_task(
    task: Task, depth: int, deadline: float, max_candidates: int, known: dict, *, problem: Problem
) -> TaskOutcome:
    """Enumerate graphs of `task` of `problem` with at most `depth` block ops; verify the new
    ones."""
    import fields

    out = TaskOutcome(task.index, depth)
    m = task.mapping
    inputs = task.inputs or problem.inputs
    base = len(task.prefix)  # kernel index of the graph-defined kernel
    rep_grid, rep_loop = representative(m, problem.small)
    targets = tuple(range(len(problem.output_labels)))
    if m.split:
        goal = Goal(split=next(iter(m.split)), max_outputs=problem.max_outputs)
    else:
        goal = Goal(targets=targets, output_labels=problem.output_labels)
    examined = 0

    def stop() -> bool:
        if time.monotonic() > deadline:
            out.stopped = "time"
            return True
        if examined >= max_candidates:
            out.stopped = "candidates"
            return True
        return False

    t_start = time.perf_counter()
    problem.targets.egraph  # noqa: B018 (saturate once per process)
    out.saturation = problem.targets.stats()
    # a split kernel may leave to its combining kernel the inputs that do not carry the split
    # reduction (the residual of a GEMM: partial sums cannot take it)
    optional = frozenset(
        i for i, t in enumerate(inputs) if m.split and not (m.split & set(t.labels))
    )
    en = BlockEnumerator(
        inputs, m, problem.small, rep_grid, rep_loop, problem.vocab, problem.targets,
        goal, out.counters, stop, task.epilogue, optional,
    )  # fmt: skip
    parallel = parallel_dims(problem)
    for closed in en.run(depth, task.shard):
        by_omaps: dict[tuple, list] = {}  # the combining kernels per stacking of the partials
        passed: list[frozenset] = []  # grids that verified: their subsets need no test
        used, ops, outs = _used_inputs(len(inputs), closed)
        left = tuple(inputs[i] for i in range(len(inputs)) if i not in used)
        reread = ()
        if m.split and problem.reread and takes_rms(problem):
            reread = _rereadable(problem, m, [inputs[i] for i in used])
        for mm in grid_expansions(m, parallel, problem.sizes, problem.small):
            omaps = [omap_of(mm, closed.tensors[t].labels) for t, _ in closed.outputs]
            if any(o is None for o in omaps):
                continue
            if m.split and tuple(omaps) not in by_omaps:
                by_omaps[tuple(omaps)] = list(
                    _combine(problem, mm, closed, omaps, out, stop, base, left, reread)
                )
            combines = by_omaps[tuple(omaps)] if m.split else [None]
            spec = KernelSpec(
                tuple(inputs[i].ref for i in used), mm, ops,
                tuple((t, o) for (t, _), o in zip(outs, omaps)),
                input_labels=tuple(inputs[i].labels for i in used),
            )  # fmt: skip
            for second in combines:
                if second is None:
                    s = Structure(
                        (*task.prefix, spec), tuple(("k", base, j) for j in range(len(omaps)))
                    )
                else:
                    s = Structure(
                        (*task.prefix, spec, second),
                        tuple(("k", base + 1, j) for j in range(len(second.outputs))),
                    )
                examined += 1
                t0 = time.perf_counter()
                key, g = _structure_key(problem, s)
                grid = frozenset(mm.grid)
                if key in known or key in out.verdicts:
                    out.duplicates += 1
                    if known.get(key, out.verdicts.get(key)):
                        passed.append(grid)
                elif any(grid <= p for p in passed):
                    out.inherited += 1  # a smaller grid of a verified one: its numbers cover it
                elif g is None:
                    out.invalid += 1
                    out.verdicts[key] = False
                else:
                    try:
                        ok = bool(
                            fields.verify(
                                g, problem.small_program, trials=problem.trials, seed=problem.seed
                            )
                        )
                    except fields.FieldSemanticsError:  # outside the field fragment: no proof
                        ok = False
                    out.verified += 1
                    out.verdicts[key] = ok
                    if ok:
                        out.accepted.append((s, key))
                        out.roots.append(en.root)
                        passed.append(grid)
                    else:
                        out.rejected += 1
                out.verify_s += time.perf_counter() - t0
        if stop():
            break
    out.enumerate_s = time.perf_counter() - t_start - out.verify_s
    return out


def _used_inputs(n_in: int, closed) -> tuple[list[int], tuple, tuple]:
    """The inputs a closed graph reads, and its ops and outputs renumbered for a kernel that
    takes only those (block tensor ids count the inputs first)."""
    used = sorted({a for _, args, _ in closed.ops for a in args if a < n_in})
    if len(used) == n_in:
        return used, closed.ops, closed.outputs
    new = {k: j for j, k in enumerate(used)}
    shift = n_in - len(used)

    def ref(t: int) -> int:
        return new[t] if t < n_in else t - shift

    ops = tuple((name, tuple(ref(a) for a in args), params) for name, args, params in closed.ops)
    return used, ops, tuple((ref(t), o) for t, o in closed.outputs)


REREAD_SHARE = 8
"""A split kernel's input its combining kernel may read again is at most this fraction of the
largest input the split kernel reads (a row against a weight, `_rereadable`)."""


def takes_rms(problem: Problem) -> bool:
    """Can a combining kernel of this region take an rms (its vocabulary offers
    `accum_rms_last`)? Only then is a row worth reading again (`_rereadable`); elsewhere the
    inputs read again would only add to the combining kernels' enumeration."""
    return any(name == "accum_rms_last" for name, _ in problem.combine_vocab.accumulators)


def _rereadable(problem: Problem, m: MappingClass, used: Sequence[KTensor]) -> tuple:
    """The region inputs a split-K kernel of mapping `m` reads that carry the split dimension
    and are small beside its largest (at most 1/`REREAD_SHARE`): the combining kernel may read
    them again, along its loop over the split (`Budget.reread`). A norm's statistic needs the
    whole row, so a norm + projection splits only if its combining kernel takes the rms."""
    split = next(iter(m.split))

    def size(t: KTensor) -> int:
        return math.prod(problem.sizes[c] for c in t.labels if isinstance(c, int))

    inputs = [t for t in used if t.ref[0] == "in"]
    if not inputs:
        return ()
    largest = max(size(t) for t in inputs)
    return tuple(t for t in inputs if split in t.labels and size(t) * REREAD_SHARE <= largest)


def _combine(
    problem: Problem,
    m: MappingClass,
    closed,
    omaps: Sequence[tuple],
    out: TaskOutcome,
    stop,
    base: int = 0,
    left: Sequence[KTensor] = (),
    reread: Sequence[KTensor] = (),
):
    """Combining kernels for the partial results of a split-K kernel of grid `m` whose
    outputs concatenate along `omaps` (the partial results stack along the last axis no other
    grid axis splits: `structure.omap_of`), the inputs `left` the split kernel did not read
    (a residual, a bias: the combining kernel adds them), and the small inputs `reread` it read
    that the combining kernel may read again along the split (`_rereadable`: the row of a
    norm + projection, whose rms the combining kernel takes while it sums the partials).

    Grid: every output dimension that every partial result has as a plain axis. Either no loop
    (the stacked partial sums are reduced by `accum_sum_todimx`/`accum_sum_last`) or a loop
    over the blocks' partial results: summed (`accum_sum`), or, when a partial max came along
    (online softmax), rescaled to the running max (`accum_max`, `accum_rescale_sum`); an input
    left over is read after that loop (`accum_keep`).
    """
    index = {t: j for j, (t, _) in enumerate(closed.outputs)}
    partials = []
    for j, ((t, _), omap) in enumerate(zip(closed.outputs, omaps)):
        bt = closed.tensors[t]
        by = None if bt.rescaled is None else index.get(bt.rescaled)
        partials.append(output_tensor(bt, m, ("k", base, j), omap, by))
    partials = tuple(partials)
    parallel = [c for c in parallel_dims(problem) if all(c in t.labels for t in partials)]
    base = grid_expansions(MappingClass((), None), parallel, problem.sizes, problem.small)[0]
    split = next(iter(m.split))
    loops = [None, split]  # one reduction of the stacked results, or a loop over them
    goal = Goal(
        targets=tuple(range(len(problem.output_labels))), output_labels=problem.output_labels
    )
    for loop in loops:
        # the row is read again only along the loop over the split: a loop-free combine
        # would hold it whole (Gemma's norm + Q/K/V closed as one such block, 70 µs on the H200)
        rows = reread if loop is not None else ()
        ins = (*partials, *rows, *left)
        epilogue = frozenset(range(len(partials) + len(rows), len(ins)))
        optional = frozenset(range(len(partials), len(partials) + len(rows)))  # may stay unread
        cm = MappingClass(base.grid, loop)
        rep_grid, rep_loop = representative(cm, problem.small)
        en = BlockEnumerator(
            ins, cm, problem.small, rep_grid, rep_loop, problem.combine_vocab,
            problem.targets, goal, out.counters, stop, epilogue, optional,
        )  # fmt: skip
        for c in en.run(4 + len(left) + len(rows)):
            used, ops, outs = _used_inputs(len(ins), c)  # a row read again may stay unread
            yield KernelSpec(
                tuple(ins[i].ref for i in used), cm, ops, outs,
                input_labels=tuple(ins[i].labels for i in used),
            )  # fmt: skip
