"""Zero clamps of variances: flax's fast variance, `max(0, E[x²] − E[x]²)`, captured as the
centred `E[(x − E[x])²]`, and a clamp of what is non-negative by construction dropped.

flax's `LayerNorm` (linen and nnx, `use_fast_variance=True` by default) computes its variance
as the mean of squares less the squared mean, clamped at zero against rounding. An elementwise
`max` is outside the Lax fragment, so the clamp cut every flax LayerNorm into a statistics
region that no µGraph computes (the search has no last-axis mean to centre with) and the rest.
The two forms are equal in exact arithmetic, and the centred one is never negative, so the
clamp has nothing to do: the capture writes the centred form (the one `layer_norm` and GPT-2's
LayerNorm use), which is also the more accurate in floating point. equinox's `LayerNorm` clamps
the centred variance itself (`jnp.var`); a mean of squares is non-negative in floating point
too, so that clamp is the identity and is dropped (`nonnegative`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

WRAPPERS = ("reshape", "broadcast_in_dim")
"""Layout steps a mean may carry (`keepdims`) between its sum and the variance."""


def centred_variance(b: Any, value: int) -> int | None:
    """The centred variance for `max(0, value)` where `value` is `mean(x²) − mean(x)²` over the
    same axes of the same x (each mean a sum scaled by 1/n, with its layout steps); None where
    it is not. `b` is the capture's builder."""
    n = b.nodes[value]
    if n.op != "sub":
        return None
    sq_mean, squared = n.args
    a = _mean(b, sq_mean)
    m_node = _square_of(b, squared)
    m = _mean(b, m_node) if m_node is not None else None
    if a is None or m is None:
        return None
    a_sum, a_chain = a
    m_sum, _ = m
    x = _square_of(b, b.nodes[a_sum].args[0])
    axes = b.nodes[a_sum].param("axes")
    if x is None or b.nodes[m_sum].args[0] != x or b.nodes[m_sum].param("axes") != axes:
        return None
    x_shape = b.shape(x)
    if b.dtype(x) != b.dtype(value) or b.dtype(m_node) != b.dtype(x):
        return None
    kept = tuple(d for d in range(len(x_shape)) if d not in axes)
    keepdims = tuple(1 if d in axes else s for d, s in enumerate(x_shape))
    mean = m_node
    if b.shape(mean) == tuple(x_shape[d] for d in kept):
        mean = b.op("broadcast_in_dim", (mean,), keepdims, b.dtype(x), broadcast_dimensions=kept)
    elif b.shape(mean) != keepdims:
        return None
    centred = b.binary("sub", x, mean, b.dtype(x))
    square = b.op("integer_pow", (centred,), x_shape, b.dtype(x), y=2)
    out = b.op("reduce_sum", (square,), b.shape(a_sum), b.dtype(a_sum), axes=axes)
    for step in reversed(a_chain):  # the mean of squares' own scale and layout, on the new sum
        args = tuple(out if i == step.prev else i for i in step.node.args)
        out = b.op(step.node.op, args, step.node.shape, step.node.dtype, **dict(step.node.params))
    return out if b.shape(out) == b.shape(value) else None


NONNEGATIVE_STEPS = ("add", "mul", "div", "reduce_sum", "reshape", "broadcast_in_dim", "sqrt")
"""Ops whose floating-point result is >= 0 where every operand is (a rounded sum or product of
non-negative numbers is non-negative)."""


def nonnegative(b: Any, i: int, depth: int = 8) -> bool:
    """Is node i >= 0 by construction, in floating point: a square, a relu, a positive constant,
    or a sum, product, quotient, mean or square root of such (equinox's LayerNorm clamps its
    centred variance, `jnp.var`, at zero)."""
    n = b.nodes[i]
    if n.op == "constant":
        return bool((n.param("value").array >= 0).all())
    if n.op == "relu" or _square_of(b, i) is not None:
        return True
    if n.op == "integer_pow" and int(n.param("y")) % 2 == 0:
        return True
    return (
        depth > 0
        and n.op in NONNEGATIVE_STEPS
        and all(nonnegative(b, a, depth - 1) for a in n.args)
    )


def _square_of(b: Any, i: int) -> int | None:
    """x where node i is `x²` (`integer_pow` 2 or `x * x`)."""
    n = b.nodes[i]
    if n.op == "integer_pow" and int(n.param("y")) == 2:
        return n.args[0]
    if n.op == "mul" and n.args[0] == n.args[1]:
        return n.args[0]
    return None


class _Step(NamedTuple):
    node: Any  # a scale or layout step of a mean
    prev: int  # the operand it takes the mean's value from


def _mean(b: Any, i: int) -> tuple[int, list[_Step]] | None:
    """(the reduce_sum, the steps from node i down to it) where node i is that sum's mean:
    scaled by exactly 1/n (n the summed elements) through `div`/`mul` by scalar constants and
    layout steps."""
    chain: list[_Step] = []
    scale = 1.0
    while b.nodes[i].op != "reduce_sum":
        n = b.nodes[i]
        if n.op in WRAPPERS:
            chain.append(_Step(n, n.args[0]))
            i = n.args[0]
            continue
        if n.op not in ("div", "mul") or len(n.args) != 2:
            return None
        side = _constant_side(b, n)
        if side is None:
            return None
        c, k = side
        if n.op == "div" and k != 0:  # c / x is no mean
            return None
        scale = scale / c if n.op == "div" else scale * c
        chain.append(_Step(n, n.args[k]))
        i = n.args[k]
    r = b.nodes[i]
    count = math.prod(b.shape(r.args[0])[d] for d in r.param("axes"))
    if not math.isclose(scale * count, 1.0, rel_tol=1e-6):
        return None
    return i, chain


def _constant_side(b: Any, n: Any) -> tuple[float, int] | None:
    """(the scalar constant, the position of the other operand) of a binary op with one."""
    for c_at, k in ((1, 0), (0, 1)):
        c = b.constant_scalar(n.args[c_at])
        if c is not None and float(c) != 0.0:
            return float(c), k
    return None
