"""Cheaper exact forms of the XLA glue the assembly binds (equations outside the fragment).

`assemble` re-binds the user's equations as traced, except one form of a KV-cache write that
XLA lowers to more kernels than it needs: a clipped one-window scatter. `jax.vmap` of
`lax.dynamic_update_slice` (the equinox way of writing a cache, one example at a time) traces to
a `scatter` in `clip` mode with one index vector. XLA cannot tell that the clipped index is in
bounds, so it reads the old slice, tests the bounds and selects before updating: three kernels
more per cache. Clipping the start so that the window fits is what `dynamic_update_slice` does
by definition, so the scatter is bound as one. `.at[i].set(v)`'s default mode drops an
out-of-bounds update instead, which `dynamic_update_slice` cannot say: it is bound as traced.
(The copies XLA makes of the inputs that updates write into are `copy_update`'s.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax import lax

_CLIPPING = (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _scatter_window(eqn: Any, operand: Any, indices: Any, updates: Any) -> tuple | None:
    """(window shape, operand dim per index) when the scatter `eqn` writes one window at one
    clipped index vector, else None."""
    p = eqn.params
    dn = p.get("dimension_numbers")
    if (
        p.get("update_jaxpr") is not None
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


def updates_operand(eqn: Any) -> bool:
    """Whether `eqn` returns its first operand with a window written (`dynamic_update_slice`,
    the scatters): XLA writes it in place into a copy of an input it may not overwrite."""
    name = eqn.primitive.name
    return name == "dynamic_update_slice" or name.startswith("scatter")


def bind_cheaper(eqn: Any, vals: Sequence[Any]) -> list[Any] | None:
    """`eqn` bound to `vals` in a cheaper exact form, or None where it has none (bind it as
    traced)."""
    if eqn.primitive is not lax.scatter_p or len(vals) != 3:
        return None
    operand, indices, updates = vals
    found = _scatter_window(eqn, operand, indices, updates)
    if found is None:
        return None
    window, to_operand = found
    flat = lax.reshape(indices, (indices.shape[-1],))
    starts: list[Any] = [lax.full((), 0, flat.dtype)] * operand.ndim
    for k, d in enumerate(to_operand):
        starts[d] = lax.index_in_dim(flat, k, keepdims=False)
    # The primitive: `lax.dynamic_update_slice` would first wrap a negative start around, which
    # the scatter does not; the primitive clips as the scatter does.
    return [lax.dynamic_update_slice_p.bind(operand, lax.reshape(updates, window), *starts)]
