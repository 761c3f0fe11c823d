"""`lower`: a µGraph to one jittable JAX function; pre-defined kernel ops become jax.numpy.

Each pre-defined kernel op has a "jnp" rule (computing in fp32 where the µGraph semantics
accumulate, then casting back to the tensor dtype); each graph-defined kernel becomes one GPU
kernel built by the chosen backend ("pallas" or "triton"). Everything is checked before
anything is built: a missing rule or an unsupported block graph raises LoweringError naming
the op and the rule, so a wrong kernel is never produced silently.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mirage_jax.lower import registry
from mirage_jax.lower.plan import MIN_DOT, KernelPlan, SharedMemoryError, plan_kernel
from mirage_jax.lower.registry import BACKENDS, LoweringError
from mirage_jax.lower.retile import retile
from mirage_jax.mugraph import BlockGraph, MuGraph, MuGraphError, validate

F32 = jnp.float32


def _f32(x: jax.Array) -> jax.Array:
    return x.astype(F32)


def _unary(fn: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    def rule(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
        return fn(_f32(x)).astype(dtype)

    return rule


def _binary(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    def rule(params: dict, dtype: Any, a: jax.Array, b: jax.Array) -> jax.Array:
        return fn(_f32(a), _f32(b)).astype(dtype)

    return rule


def erf(x: jax.Array, exp: Callable[[jax.Array], jax.Array] = jnp.exp) -> jax.Array:
    """erf by Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7): Pallas-Triton has no erf rule."""
    t = 1.0 / (1.0 + 0.3275911 * jnp.abs(x))
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    y = 1.0 - poly * exp(-x * x)
    return jnp.where(x < 0, -y, y)


def sigmoid(x: jax.Array, exp: Callable[[jax.Array], jax.Array] = jnp.exp) -> jax.Array:
    return 1.0 / (1.0 + exp(-x))


def gelu(x: jax.Array) -> jax.Array:
    """0.5·x·(1 − erf(−x/√2)), the µGraph op's (erf) form."""
    return 0.5 * x * (1.0 - erf(-x * np.float32(1.0 / math.sqrt(2.0))))


for _name, _fn in {
    "exp": jnp.exp,
    "square": lambda x: x * x,
    "sqrt": jnp.sqrt,
    "sigmoid": jax.nn.sigmoid,
    "silu": lambda x: x * jax.nn.sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1.0 - jax.lax.erf(-x * np.float32(1.0 / math.sqrt(2.0)))),
}.items():
    registry.add("jnp", _name, _unary(_fn))
for _name, _fn in {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "div": jnp.divide,
}.items():
    registry.add("jnp", _name, _binary(_fn))


@registry.register("jnp", "mul_scalar")
def _mul_scalar(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
    return (_f32(x) * np.float32(params["scalar"])).astype(dtype)


@registry.register("jnp", "add_scalar")
def _add_scalar(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
    return (_f32(x) + np.float32(params["scalar"])).astype(dtype)


@registry.register("jnp", "matmul")
def _matmul(params: dict, dtype: Any, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, preferred_element_type=F32).astype(dtype)


@registry.register("jnp", "reduce_sum")
def _reduce_sum(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
    return jnp.sum(_f32(x), axis=params["dim"], keepdims=True).astype(dtype)


@registry.register("jnp", "reduce_max")
def _reduce_max(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
    return jnp.max(x, axis=params["dim"], keepdims=True).astype(dtype)


@registry.register("jnp", "rms_norm")
def _rms_norm(params: dict, dtype: Any, x: jax.Array) -> jax.Array:
    x = _f32(x)
    ms = jnp.mean(x * x, axis=-1, keepdims=True) + np.float32(params.get("eps") or 0.0)
    return (x / jnp.sqrt(ms)).astype(dtype)


@registry.register("jnp", "concat")
def _concat(params: dict, dtype: Any, *xs: jax.Array) -> jax.Array:
    return jnp.concatenate(xs, axis=params["dim"]).astype(dtype)


# ---------------------------------------------------------------------------- the driver
def _backend_module(backend: str):
    if backend == "pallas":
        from mirage_jax.lower import pallas

        return pallas
    if backend == "triton":
        from mirage_jax.lower import triton

        return triton
    raise LoweringError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


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
            registry.rule("jnp", op.op, f"kernel op {i}")
            continue
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
) -> Callable[..., tuple[jax.Array, ...]]:
    """Lower a µGraph to a jitted JAX function of its inputs returning a tuple of its outputs.

    Arguments:
        mugraph: the µGraph (validated first).
        backend: "pallas" (pl.pallas_call, Triton lowering) or "triton" (jax-triton).
        config: the backend's config (`PallasConfig` / `TritonConfig`); None for defaults.
        interpret: run Pallas kernels in interpret mode; None means "when jax's default backend
            is the CPU". The triton backend has no interpret mode here (GPU only).

    Raises LoweringError naming the op and rule for an invalid or unsupported µGraph.
    """
    mod = _backend_module(backend)
    config = mod.default_config() if config is None else config
    plans = plan(mugraph, getattr(config, "min_dot", MIN_DOT))
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    kernels = {
        i: mod.build_kernel(p, config, interpret=interpret, where=f"kernel op {i} (graph_defined)")
        for i, p in plans.items()
    }
    shapes = mugraph.shapes
    ops = mugraph.ops
    inputs = mugraph.inputs
    outputs = mugraph.outputs
    avals = mugraph.input_avals

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        if len(args) != len(inputs):
            raise TypeError(f"{mugraph!r} takes {len(args)} inputs, got {len(args)}")
        env: dict[tuple[int, int], jax.Array] = {}
        for pos, i in enumerate(inputs):
            x = jnp.asarray(args[pos])
            if tuple(x.shape) != tuple(avals[pos][0]):
                raise TypeError(f"input {pos}: shape {x.shape}, expected {avals[pos][0]}")
            env[(i, 0)] = x.astype(avals[pos][1])
        for i, op in enumerate(ops):
            if op.op == "input":
                continue
            xs = [env[a] for a in op.args]
            if i in kernels:
                for j, y in enumerate(kernels[i](*xs)):
                    env[(i, j)] = y
            else:
                dtype = shapes[(i, 0)][1]
                env[(i, 0)] = registry.rule("jnp", op.op)(dict(op.params), dtype, *xs)
        return tuple(env[r] for r in outputs)

    run.__name__ = f"mugraph_{mugraph.canonical_hash[:12]}_{backend}"
    return jax.jit(run)


def lowered_ops(mugraph: MuGraph) -> Sequence[str]:
    """The op names a µGraph uses (kernel ops, then block ops), for reports."""
    names = []
    for op in mugraph.ops:
        if op.op != "input":
            names.append(op.op)
        if op.block_graph is not None:
            names.extend(b.op for b in op.block_graph.ops)
    return names
