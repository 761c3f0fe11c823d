"""`lower`: a µGraph to one jittable JAX function; pre-defined kernel ops become jax.numpy.

Each pre-defined kernel op runs as its one meaning (`OpDef.apply` over jax.numpy: fp32 compute,
result in the tensor's dtype; XLA fuses them); each graph-defined kernel becomes one GPU kernel
built by the chosen backend (`backends.py`). Everything is checked before anything is built: a
missing rule or an unsupported block graph raises LoweringError naming the op and the rule, so
a wrong kernel is never produced silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lax_ir import FloatAlgebra
from lax_ir.interface import SplitView, View, Views, read_view, view_stored_shape, write_view
from lax_ir.layout_graph import swap_perm
from mirage_jax.lower import backends
from mirage_jax.lower.computed import Computed
from mirage_jax.lower.masked_steps import StepBounds, skippable, step_bounds
from mirage_jax.lower.plan import MIN_DOT, KernelPlan, SharedMemoryError, plan_kernel
from mirage_jax.lower.registry import LoweringError
from mirage_jax.lower.retile import retile
from mirage_jax.mugraph import BlockGraph, MuGraph, MuGraphError, evaluate, validate
from mirage_jax.mugraph.evaluate import apply_kernel_op

WARPS = "num_warps"
"""µGraph meta key: warps per block for kernels lowered with no config (`select` times them)."""

LOOP_SPLIT = "loop_split"
"""µGraph meta key: the parts a kernel's loop is split into over the grid, for kernels lowered
with no config by a backend that can (`TritonConfig.loop_split`; `select` times them)."""


FULL_RANK = "full_rank"
"""µGraph meta key: True where kernels keep their block graphs' tile rank, for kernels lowered
with no config by a backend that would drop unit leading dims (`TritonConfig.squeeze`; `select`
times both)."""

SPECULATIVE_MAX = "speculative_max"
"""µGraph meta key: True where kernels' online softmax takes its first step's max as reference,
for kernels lowered with no config by a backend that can (`TritonConfig.speculative_max`;
`select` times both)."""


ROW_MAJOR = "row_major"
"""µGraph meta key: True where kernels launch their blocks in row-major order of their grid
(the last axis fastest), for kernels lowered with no config by a backend that can
(`TritonConfig.row_major`; `select` times both for large kernels)."""


def kernel_warps(mugraph: MuGraph, plans: Mapping[int, Any]) -> dict[int, int]:
    """Kernel op index -> the warps per block that `select` measured best (the meta's `WARPS`:
    one number for every kernel, or one per graph-defined kernel in op order; a kernel of a
    one-launch group takes the first of its group's)."""
    warps = mugraph.meta.get(WARPS)
    if not warps:
        return {}
    order = sorted(plans)
    if isinstance(warps, (int, float, str)):
        return {i: int(warps) for i in order}
    if len(warps) != len(order):
        raise LoweringError(
            f"{mugraph!r}: meta {WARPS}={list(warps)} names {len(warps)} kernels, the µGraph has "
            f"{len(order)} graph-defined ones; select it again (clear its cache entry)"
        )
    out = {i: int(w) for i, w in zip(order, warps)}
    for lv in mugraph.launch_levels():
        for i in lv:
            out[i] = out[lv[0]]
    return out


def plan(mugraph: MuGraph, min_dot: int = MIN_DOT) -> dict[int, KernelPlan]:
    """Validate `mugraph` and plan each graph-defined kernel (kernel op index -> plan)."""
    try:
        validate(mugraph)
    except MuGraphError as e:
        raise LoweringError(f"invalid µGraph {mugraph!r}: {e}") from None
    plans = {}
    for i, op in enumerate(mugraph.ops):
        if op.op == "input":
            continue
        if op.block_graph is None:
            continue  # its meaning (validated) is its jnp lowering
        plans[i] = _fitting_plan(op.block_graph, f"kernel op {i} (graph_defined)", min_dot)
    return plans


def _fitting_plan(bg: BlockGraph, where: str, min_dot: int) -> KernelPlan:
    """Plan `bg`; if its tiles overflow shared memory, re-tile the loop (`retile`) to fit."""
    p = plan_kernel(bg, where, min_dot)
    try:
        p.stages(1)
        return p
    except SharedMemoryError as e:
        first = e
    fitting = None
    for factor in (2, 4, 8, 16, 32, 64):  # the first that fits 3 pipeline stages, else 1
        new = retile(bg, factor)
        if new is None:
            continue
        q = plan_kernel(new, where, min_dot)
        try:
            stages = q.stages(3)
        except SharedMemoryError:
            continue
        fitting = fitting or q
        if stages == 3:
            fitting = q
            break
    if fitting is None:
        raise LoweringError(f"{where}: {first} (and no valid re-tiling of the loop fits)")
    return dataclasses.replace(fitting, retiled_from=bg)


def lower(
    mugraph: MuGraph,
    backend: str = "pallas",
    config: Any = None,
    interpret: bool | None = None,
    views: Views | Collection[int] = frozenset(),
    out_views: Views | None = None,
    out_dtypes: Mapping[int, str] | None = None,
    known: Mapping[int, np.ndarray | Computed] | None = None,
) -> Callable[..., tuple[jax.Array, ...]]:
    """Lower a µGraph to a jitted JAX function of its inputs returning a tuple of its outputs.

    Inputs at the positions in `views` arrive as stored: the µGraph's input is
    `stored.transpose(views[pos])` (a weight kept as W where the µGraph reads Wᵀ, a KV cache
    kept (B, S, heads, D) read as Kᵀ per head; a bare collection of positions means the last two
    axes exchanged), or the stored array read through a `SplitView`. Kernels of a backend that
    can (`VIEWS`) read them in place; every other reader gets them laid out by XLA. Outputs at
    the positions in `out_views` are returned as stored: the array whose
    `transpose(out_views[pos])` is the output (or that a `SplitView` reads as it), written so in
    place by a kernel of such a backend that produces it alone (`triton`), else laid out by
    XLA. Outputs at the positions in `out_dtypes` of another float dtype are returned in that
    dtype (the region's own: a µGraph may keep an fp32 accumulator as its output, or keep the
    float16 of its inputs where the region upcasts and returns fp32), stored so by the kernel
    that produces it alone where the backend can (`CAST_STORES`), else converted by XLA.
    Inputs at the positions in `known` always have that value (a constant of the program, or a
    `Computed` one XLA makes from constants: a causal mask); a kernel of a backend that can
    (`bounds_refusal`) skips the loop steps it masks whole (`masked_steps`). The function must
    then be called with those values.

    Arguments:
        mugraph: the µGraph (validated first).
        backend: a name of `backends.BACKENDS` ("pallas", "triton", "pallas-interpret",
            "reference").
        config: the backend's config (`PallasConfig` / `TritonConfig`); None for defaults.
        interpret: run kernels in interpret mode; None means the backend's own flag, or "when
            jax's default backend is the CPU". The triton backend interprets with Triton's own
            interpreter (needs the `triton` package).

    Raises LoweringError naming the op and rule for an invalid or unsupported µGraph.
    """
    try:
        b = backends.get(backend)
    except backends.UnknownBackend as e:
        raise LoweringError(str(e)) from None
    if b.module is None:  # the µGraph's own evaluator
        plan(mugraph)
        cast = dict(out_dtypes or {})

        def evaluated(*args: jax.Array) -> tuple[jax.Array, ...]:
            return tuple(
                _as_dtype(y, cast.get(pos)) for pos, y in enumerate(evaluate(mugraph, *args))
            )

        return jax.jit(evaluated)
    mod = b.load()
    tuned = config is None  # then the warps `select` measured best apply (the meta's)
    if config is None:
        config = mod.default_config()
    plans = plan(mugraph, getattr(config, "min_dot", MIN_DOT))
    configs = {  # kernel op index -> its own config
        i: dataclasses.replace(config, num_warps=w)
        for i, w in (kernel_warps(mugraph, plans) if tuned else {}).items()
    }
    split = mugraph.meta.get(LOOP_SPLIT, 1) if tuned else getattr(config, "loop_split", 1)
    if tuned and mugraph.meta.get(FULL_RANK) and hasattr(config, "squeeze"):
        for i in plans:
            configs[i] = dataclasses.replace(configs.get(i, config), squeeze=False)
    if tuned and mugraph.meta.get(SPECULATIVE_MAX) and hasattr(config, "speculative_max"):
        for i in plans:
            configs[i] = dataclasses.replace(configs.get(i, config), speculative_max=True)
    if tuned and mugraph.meta.get(ROW_MAJOR) and hasattr(config, "row_major"):
        for i in plans:
            configs[i] = dataclasses.replace(configs.get(i, config), row_major=True)
    refusal = getattr(mod, "SPLIT_REFUSAL", None)
    if refusal is not None and split > 1:  # a split loop where the plan allows it
        for i, p in plans.items():
            s = split if refusal(p, split) is None else 1
            configs[i] = dataclasses.replace(configs.get(i, config), loop_split=s)
    if interpret is None:
        interpret = b.interpret or jax.default_backend() == "cpu"
    avals = mugraph.input_avals
    if not isinstance(views, Mapping):
        views = {pos: swap_perm(len(avals[pos][0])) for pos in views}
    viewed = {mugraph.inputs[pos]: perm for pos, perm in views.items()}  # kernel op id -> perm
    in_place = getattr(mod, "VIEWS", False)
    kernel_views = {
        i: {
            k: viewed[a[0]]
            for k, a in enumerate(mugraph.ops[i].args)
            if in_place and a[0] in viewed
        }
        for i in plans
    }
    kernels = {}
    # the kernels launched as one: each dependency level of two or more (`launch_levels`)
    levels = mugraph.launch_levels() if hasattr(mod, "build_group") else ()
    group = mugraph.grouped_kernels() if levels else frozenset()
    out_views = dict(out_views or {})
    written = _written_in_place(mugraph, out_views, plans, group) if in_place else {}
    cast_to = _stored_dtypes(mugraph, out_dtypes or {}, plans, group, mod)
    narrowed = _narrowed_stores(mugraph, plans, group, mod, cast_to)
    for i, p in plans.items():
        if i in group:
            continue
        extra = {"views": kernel_views[i]} if kernel_views[i] else {}
        if written.get(i):
            extra["out_views"] = written[i]
        if cast_to.get(i):
            extra["out_dtypes"] = cast_to[i]
        where = f"kernel op {i} (graph_defined)"
        cfg = configs.get(i, config)
        table = _step_bounds(mugraph, i, p, cfg, mod, known or {})
        if table is not None:
            extra["steps"] = table
        kernels[i] = mod.build_kernel(p, cfg, interpret=interpret, where=where, **extra)
    launches = {}  # first kernel of a level -> (the level, its kernels launched as one)
    for lv in mugraph.launch_groups() if levels else ():
        where = f"kernel ops {list(lv)} (graph_defined, one launch)"
        launches[lv[0]] = lv, mod.build_group(
            [plans[i] for i in lv], _group_config(lv, plans, configs, config, split, refusal),
            interpret=interpret,
            where=where,
            views=[kernel_views[i] for i in lv],
        )  # fmt: skip
    # kernels level by level where levels launch together (a level's kernels read only what
    # lower levels made), else in op order
    order = [i for lv in levels for i in lv] or range(len(mugraph.ops))
    shapes = mugraph.shapes
    ops = mugraph.ops
    inputs = mugraph.inputs
    outputs = mugraph.outputs
    jnp_algebra = FloatAlgebra()

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        if len(args) != len(inputs):
            raise TypeError(f"{mugraph!r} takes {len(inputs)} inputs, got {len(args)}")
        env: dict[tuple[int, int], jax.Array] = {}
        stored: dict[tuple[int, int], jax.Array] = {}  # inputs as they arrived, transposed
        for pos, i in enumerate(inputs):
            x = jnp.asarray(args[pos])
            want = tuple(avals[pos][0])
            if pos in views:
                want = view_stored_shape(want, views[pos])
            if tuple(x.shape) != want:
                raise TypeError(f"input {pos}: shape {x.shape}, expected {want}")
            x = x.astype(avals[pos][1])
            if pos in views:
                stored[(i, 0)] = x
                x = read_view(x, views[pos])  # for readers that cannot read it in place
            env[(i, 0)] = x
        for i in order:
            op = ops[i]
            if op.op == "input" or (i in group and i not in launches):
                continue
            if i in launches:  # its level's kernels, launched as one: their args are ready
                lv, launch = launches[i]
                args_of = [
                    stored[a] if k in kernel_views[g] else env[a]
                    for g in lv
                    for k, a in enumerate(ops[g].args)
                ]
                ys = iter(launch(*args_of))
                for g in lv:
                    for j in range(len(ops[g].block_graph.outputs)):
                        env[(g, j)] = next(ys)
                    for j, dtype in narrowed.get(g, {}).items():
                        env[(g, j)] = _as_dtype(env[(g, j)], dtype)
                continue
            xs = [
                stored[a] if k in kernel_views.get(i, ()) else env[a] for k, a in enumerate(op.args)
            ]
            if i in kernels:
                for j, y in enumerate(kernels[i](*xs)):
                    env[(i, j)] = y
                for j, dtype in narrowed.get(i, {}).items():  # a store the kernel cannot narrow
                    env[(i, j)] = _as_dtype(env[(i, j)], dtype)
            else:
                env[(i, 0)] = apply_kernel_op(jnp_algebra, op, xs, shapes, i)
        outs = [
            env[r]
            if pos not in out_views or r[1] in written.get(r[0], {})
            else write_view(env[r], out_views[pos])
            for pos, r in enumerate(outputs)
        ]
        return tuple(_as_dtype(y, (out_dtypes or {}).get(pos)) for pos, y in enumerate(outs))

    run.__name__ = f"mugraph_{mugraph.canonical_hash[:12]}_{backend}"
    return jax.jit(run)


def other_float(have: Any, want: Any) -> bool:
    """Are `have` and `want` two different float dtypes (bfloat16 included)?"""
    have, want = jnp.dtype(have), jnp.dtype(want)
    floats = jnp.issubdtype(have, jnp.floating) and jnp.issubdtype(want, jnp.floating)
    return bool(floats and want != have)


def _as_dtype(x: jax.Array, dtype: str | None) -> jax.Array:
    """x converted to float `dtype` where that is another float dtype than its own."""
    return x.astype(dtype) if dtype is not None and other_float(x.dtype, dtype) else x


def _stored_dtypes(
    mugraph: MuGraph, out_dtypes: Mapping[int, str], plans: Mapping[int, Any], group, mod: Any
) -> dict[int, dict[int, str]]:
    """kernel op id -> {its output j: dtype} for the µGraph outputs in `out_dtypes` of another
    float dtype than the kernel's own that a kernel launched alone produces, nothing else in
    the µGraph reads, and the backend stores in any float dtype itself (`CAST_STORES`): the
    kernel computes in fp32, so a wider store keeps what a narrower one would round."""
    if not getattr(mod, "CAST_STORES", False):
        return {}
    shapes = mugraph.shapes
    out: dict[int, dict[int, str]] = {}
    for pos, (i, j) in _sole_outputs(mugraph, out_dtypes, plans, group):
        if other_float(shapes[(i, j)][1], out_dtypes[pos]):
            out.setdefault(i, {})[j] = str(jnp.dtype(out_dtypes[pos]))
    return out


def _step_bounds(
    mugraph: MuGraph,
    i: int,
    p: Any,
    config: Any,
    mod: Any,
    known: Mapping[int, np.ndarray | Computed],
) -> StepBounds | None:
    """The table of loop steps kernel op i may walk (`masked_steps.step_bounds`) from the first
    of its inputs with a known value that masks steps whole; None where none does, or the
    backend cannot (`bounds_refusal`)."""
    refusal = getattr(mod, "bounds_refusal", None)
    if not known or refusal is None or refusal(p, config) is not None:
        return None
    at = {mugraph.inputs[pos]: value for pos, value in known.items()}
    for k, a in enumerate(mugraph.ops[i].args):
        if a[0] in at and skippable(p, k):
            table = step_bounds(p, k, at[a[0]])
            if table is not None:
                return table
    return None


def _written_in_place(
    mugraph: MuGraph, out_views: Views, plans: Mapping[int, Any], group: Collection[int]
) -> dict[int, dict[int, View]]:
    """kernel op id -> {its output j: view} for the µGraph outputs in `out_views` that a kernel
    launched alone produces and nothing else in the µGraph reads."""
    out: dict[int, dict[int, View]] = {}
    for pos, (i, j) in _sole_outputs(mugraph, out_views, plans, group):
        v = out_views[pos]
        out.setdefault(i, {})[j] = v if isinstance(v, SplitView) else tuple(v)
    return out


def _narrowed_stores(
    mugraph: MuGraph, plans: Mapping[int, Any], group, mod: Any, cast_to: dict[int, dict[int, str]]
) -> dict[int, dict[int, str]]:
    """The block outputs stored in a narrower float dtype (`BlockOutput.dtype`): added to
    `cast_to` (the stores each kernel launched alone makes itself, where the backend stores in
    any float dtype, `CAST_STORES`); returned, kernel op id -> {output j: dtype}, are those the
    kernel cannot store so (in a one-launch group, or on a backend that does not), which the
    run rounds after the kernel."""
    after: dict[int, dict[int, str]] = {}
    for i in plans:
        for j, o in enumerate(mugraph.ops[i].block_graph.outputs):
            if not o.dtype:
                continue
            if i not in group and getattr(mod, "CAST_STORES", False):
                cast_to.setdefault(i, {})[j] = o.dtype
            else:
                after.setdefault(i, {})[j] = o.dtype
    return after


def _sole_outputs(
    mugraph: MuGraph, positions: Collection[int], plans: Mapping[int, Any], group: Collection[int]
) -> list[tuple[int, tuple[int, int]]]:
    """(position, (kernel op id, output j)) for the µGraph outputs at `positions` that a kernel
    launched alone produces, that are that output once, and that nothing in the µGraph reads:
    the kernel may store them as it likes (permuted, in another dtype)."""
    read = {a for op in mugraph.ops for a in op.args}
    out = []
    for pos in positions:
        i, j = mugraph.outputs[pos]
        alone = (i, j) not in read and mugraph.outputs.count((i, j)) == 1
        if i in plans and i not in group and alone:
            out.append((pos, (i, j)))
    return out


def lowered_ops(mugraph: MuGraph) -> Sequence[str]:
    """The op names a µGraph uses (kernel ops, then block ops), for reports."""
    names = []
    for op in mugraph.ops:
        if op.op != "input":
            names.append(op.op)
        if op.block_graph is not None:
            names.extend(b.op for b in op.block_graph.ops)
    return names


def _group_config(
    group: Sequence[int], plans: Mapping[int, Any], configs: Mapping[int, Any], config: Any,
    split: int, refusal: Callable[..., str | None] | None,
) -> Any:  # fmt: skip
    """The config of a one-launch group: its first kernel's, its loops split `split` ways
    where the backend splits a group and none of its kernels' plans refuses it, else whole."""
    cfg = configs.get(group[0], config)
    if not hasattr(cfg, "loop_split"):
        return cfg
    whole = refusal is None or split < 2 or any(refusal(plans[i], split) for i in group)
    return dataclasses.replace(cfg, loop_split=1 if whole else split)
