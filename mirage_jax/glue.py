"""Cheaper exact forms of the XLA glue the assembly binds (equations outside the fragment).

`assemble` re-binds the user's equations as traced. One of them costs more than it needs to:
`jax.vmap` of `lax.dynamic_update_slice` (the equinox way of writing a KV cache, one example at
a time) traces to a `scatter` in `clip` mode with one index vector. XLA cannot tell that the
clipped index is in bounds, so it lowers the scatter to a read of the old slice, a bounds test
and a select before the `dynamic_update_slice`: three kernels more per cache than the update
itself. Clipping the start so the window fits is what `dynamic_update_slice` does by
definition, so the scatter is bound as one, with the same result for every index.

Only `scatter` (no combiner) in `clip` or `promise_in_bounds` mode with a single index vector
and no batching dimensions is rewritten; `.at[i].set(v)`'s default mode drops an out-of-bounds
update instead of clipping it, which `dynamic_update_slice` cannot say, so it is bound as
traced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax import lax

_CLIPPING = (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _single_update(eqn: Any, operand: Any, indices: Any, updates: Any) -> tuple | None:
    """(window shape, operand dim per index) when `eqn` writes one window at one clipped index
    vector, else None."""
    p = eqn.params
    dn = p.get("dimension_numbers")
    if (
        eqn.primitive is not lax.scatter_p
        or p.get("update_jaxpr") is not None
        or p.get("mode") not in _CLIPPING
        or dn is None
        or tuple(getattr(dn, "operand_batching_dims", ()))
        or tuple(getattr(dn, "scatter_indices_batching_dims", ()))
    ):
        return None
    if indices.ndim < 1 or math.prod(indices.shape[:-1]) != 1 or operand.dtype != updates.dtype:
        return None
    window_dims = [int(d) for d in dn.update_window_dims]
    inserted = {int(d) for d in dn.inserted_window_dims}
    to_operand = [int(d) for d in dn.scatter_dims_to_operand_dims]
    if len(window_dims) + len(inserted) != operand.ndim or len(to_operand) != indices.shape[-1]:
        return None
    scatter_dims = [d for d in range(updates.ndim) if d not in window_dims]
    if any(updates.shape[d] != 1 for d in scatter_dims):
        return None
    sizes = iter(updates.shape[d] for d in window_dims)
    window = tuple(1 if d in inserted else next(sizes) for d in range(operand.ndim))
    return window, to_operand


def bind_cheaper(eqn: Any, vals: Sequence[Any]) -> list[Any] | None:
    """`eqn` bound to `vals` in a cheaper exact form, or None where it has none (bind it as
    traced)."""
    if eqn.primitive is not lax.scatter_p or len(vals) != 3:
        return None
    operand, indices, updates = vals
    shape_of = _single_update(eqn, operand, indices, updates)
    if shape_of is None:
        return None
    window, to_operand = shape_of
    flat = lax.reshape(indices, (indices.shape[-1],))
    starts: list[Any] = [lax.full((), 0, flat.dtype)] * operand.ndim
    for k, d in enumerate(to_operand):
        starts[d] = lax.index_in_dim(flat, k, keepdims=False)
    # The primitive: `lax.dynamic_update_slice` would first wrap a negative start around, which
    # the scatter does not; the primitive clips as the scatter does.
    return [lax.dynamic_update_slice_p.bind(operand, lax.reshape(updates, window), *starts)]
