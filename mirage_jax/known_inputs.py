"""A region's inputs whose values are known before any call, and what the lowering learns
from them: which loop steps a mask hides whole (`lower.masked_steps`).

Two kinds: constants of the program (a causal mask the capture folded), and values XLA
computes from constants alone on every call (jax's causal bias where the capture does not
fold the mask: `dot_product_attention(is_causal=True)` at 2048 tokens and more). The second
are `Computed`: the nodes that make them, evaluated under `jax.jit` on the default device
only where a kernel asks, so a bias of half a billion entries never reaches the host.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from lax_ir.dtypes import is_float
from lax_ir.interface import apply_ops
from lax_ir.interpret import FloatAlgebra, eval_node
from mirage_jax.lower.computed import Computed
from mirage_jax.lower.masked_steps import MASKED, MAX_ELEMENTS
from mirage_jax.mugraph.load_steps import split_load_steps

MAX_CONSTANT_ELEMENTS = MAX_ELEMENTS
"""Constant inputs larger than this (elements, as the kernel reads them) are not inspected: it
is done on the host (the masked steps' own bound, `masked_steps.MAX_ELEMENTS`)."""

MAX_COMPUTED_ELEMENTS = 1 << 33
"""Computed inputs larger than this (elements, as the kernel reads them) are not inspected; at
most this, on the device, reduced to one entry per tile there under one jit, which fuses the
value into the reduction. jax's causal bias as sdpa_causal's kernel reads it at Llama-7B size,
batch 8, is 8 × 8 × 16384 × 4096 (2^32) elements: 17 GB in float32 even where XLA keeps it
whole. A failure there (the device's memory) is said once and the kernel walks every step."""

MAX_CONE_NODES = 64
"""A value made by more nodes than this is not evaluated (jax's causal bias takes about 20)."""

PURE_PRIMITIVES = frozenset(
    {
        "iota",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "not",
        "xor",
        "select_n",
        "convert_element_type",
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "add",
        "sub",
        "mul",
        "max",
        "min",
        "neg",
        "abs",
        "sign",
        "clamp",
        "rem",
        "div",
        "shift_left",
        "shift_right_logical",
        "shift_right_arithmetic",
        "slice",
        "concatenate",
        "pad",
    }
)
"""The primitives of opaque nodes a computed input may be made with: pure, deterministic and
cheap (masks are iotas, comparisons and selects)."""

FLOATS = ("float16", "bfloat16", "float32", "float64")


def constant_inputs(program: Any, region: Any) -> dict[int, np.ndarray | Computed]:
    """The region's inputs whose values depend on no input of the partitioned `program`, by
    the region's input position, as the region receives them: a constant's value, or, for a
    float value XLA computes from constants (`input_free_cone`), a `Computed`."""
    out: dict[int, np.ndarray | Computed] = {}
    for pos, i in enumerate(region.inputs):
        node = program.nodes[i]
        if not node.shape:
            continue
        if node.op == "constant":
            out[pos] = np.asarray(node.param("value").array)
        elif node.dtype in FLOATS and (value := computed(program, i)) is not None:
            out[pos] = value
    return out


def computed(program: Any, i: int) -> Computed | None:
    """Node i of `program` as a `Computed` where it depends on no input (`input_free_cone`)."""
    cone = input_free_cone(program, i)
    if cone is None:
        return None
    node = program.nodes[i]
    return Computed(_Evaluate(program, tuple(cone), i), tuple(node.shape), node.dtype)


def input_free_cone(program: Any, i: int) -> list[int] | None:
    """The nodes that compute node i, in program order, where none is an input of `program`,
    each opaque one is of `PURE_PRIMITIVES`, and they are at most `MAX_CONE_NODES`; else None."""
    seen: set[int] = set()
    todo = [i]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        node = program.nodes[n]
        if node.op == "input" or len(seen) > MAX_CONE_NODES:
            return None
        if node.op == "opaque":
            payload = node.param("payload")
            if payload is None or payload.primitive.name not in PURE_PRIMITIVES:
                return None
        todo.extend(node.args)
    return sorted(seen)


@dataclass(frozen=True)
class _Evaluate:
    """Node i's value from its `cone` (jnp, each node in its own dtype: as XLA computes it);
    equal for the same node of equal programs (`Program` compares by content), so
    `constant_inputs` called twice for one region (its selection, its kernel) gives equal
    `Computed` values."""

    program: Any
    cone: tuple[int, ...]
    i: int

    def __call__(self) -> Any:
        algebra = FloatAlgebra()
        env: dict[int, Any] = {}
        for n in self.cone:
            node = self.program.nodes[n]
            env[n] = eval_node(algebra, node, [env[a] for a in node.args])
        return env[self.i]


def canonical_constants(
    program: Any, known: Mapping[int, np.ndarray | Computed]
) -> dict[int, np.ndarray | Computed]:
    """The region's known inputs `known` (by its input position) as the µGraph's inputs
    (canonical, without the steps kernels apply on load): constants that mask (hold entries
    at most `lower.masked_steps.MASKED`) of at most `MAX_CONSTANT_ELEMENTS`, and computed
    values of at most `MAX_COMPUTED_ELEMENTS` (what they mask is asked on the device)."""
    interface = program.meta.get("interface")
    n = len(program.input_avals)
    inputs = interface["inputs"] if interface else tuple((k, ()) for k in range(n))
    out: dict[int, np.ndarray | Computed] = {}
    for k, (pos, ops) in enumerate(inputs):
        value, shape = known.get(pos), tuple(program.input_avals[k][0])
        if value is None:
            continue
        steps = split_load_steps(ops)[0]  # the µGraph takes it without the load steps
        if isinstance(value, Computed):
            if math.prod(shape) <= MAX_COMPUTED_ELEMENTS:
                out[k] = value.then(_Canonical(steps, shape), shape)
        elif is_float(value.dtype) and math.prod(shape) <= MAX_CONSTANT_ELEMENTS and _masks(value):
            out[k] = np.asarray(_Canonical(steps, shape)(value))
    return out


@dataclass(frozen=True)
class _Canonical:
    """A known input's value as the µGraph takes it: the layout `steps`, then `shape`."""

    steps: Any
    shape: tuple[int, ...]

    def __call__(self, value: Any) -> Any:
        return apply_ops(value, self.steps).reshape(self.shape)


def _masks(value: np.ndarray) -> bool:
    """Does a float constant hold an entry that masks a score (`masked_steps.MASKED`)?"""
    with np.errstate(invalid="ignore", over="ignore"):
        return bool((value <= MASKED).any())


def with_values(
    draw: Callable[[int], Sequence[Any]], values: Mapping[int, Any]
) -> Callable[[int], list[Any]]:
    """`draw(seed)` with the inputs at the positions of `values` replaced by their values (a
    constant, or a `Computed` evaluated once, on the default device)."""
    if not values:
        return lambda seed: list(draw(seed))

    @functools.cache
    def value(k: int) -> Any:
        v = values[k]
        if isinstance(v, Computed):
            with jax.ensure_compile_time_eval():
                return jax.jit(v.fn)()
        return v

    return lambda seed: [value(k) if k in values else x for k, x in enumerate(draw(seed))]
