"""Cheaper exact forms of the XLA glue the assembly binds (equations outside the fragment).

`assemble` re-binds the user's equations as traced, except two forms of a KV-cache write that
XLA lowers to more kernels than they need:

- **A clipped one-window scatter.** `jax.vmap` of `lax.dynamic_update_slice` (the equinox way
  of writing a cache, one example at a time) traces to a `scatter` in `clip` mode with one
  index vector. XLA cannot tell that the clipped index is in bounds, so it reads the old slice,
  tests the bounds and selects before updating: three kernels more per cache. Clipping the
  start so that the window fits is what `dynamic_update_slice` does by definition, so the
  scatter is bound as one. `.at[i].set(v)`'s default mode drops an out-of-bounds update
  instead, which `dynamic_update_slice` cannot say: it is bound as traced.
- **An update of an input that XLA must copy.** A function that returns an updated copy of an
  input it does not donate (a decode step called without `donate_argnums`) makes XLA copy the
  input whole, then write the window into the copy: two launches per cache. `copy_update`
  writes every such copy, new rows included, in one launch; `update_of` says which updates it
  can take (a window one position along each dimension it moves on, whole along the others).
  Writing the copy with a `select` instead was tried and lost on the H100 (XLA fused each
  cache's select apart and split the rotary embedding's sin and cos out of its fusions).
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


def as_update(eqn: Any, vals: Sequence[Any]) -> tuple[Any, Any, list[Any]] | None:
    """(input, window values, start per input dimension) of a one-window update bound to
    `vals`, else None."""
    if eqn.primitive is lax.dynamic_update_slice_p:
        return vals[0], vals[1], list(vals[2:])
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
    return operand, lax.reshape(updates, window), starts


def update_of(eqn: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(window shape, the dimensions it is one position along) of a one-window update (a
    `dynamic_update_slice`, or a scatter `bind_cheaper` binds as one) that `copy_update` can
    write, from the equation's types alone; else None."""
    avals = [v.aval for v in eqn.invars]
    if eqn.primitive is lax.dynamic_update_slice_p:
        operand, window, dtype = avals[0], tuple(avals[1].shape), avals[1].dtype
    elif eqn.primitive is lax.scatter_p and len(avals) == 3:
        operand, dtype = avals[0], avals[2].dtype
        found = _scatter_window(eqn, *avals)
        if found is None:
            return None
        window = found[0]
    else:
        return None
    shape = tuple(operand.shape)
    if operand.dtype != dtype or math.prod(shape) >= 2**31:
        return None
    if any(w not in (1, n) for w, n in zip(window, shape)):
        return None
    return window, tuple(d for d, (w, n) in enumerate(zip(window, shape)) if w != n)


def bind_cheaper(eqn: Any, vals: Sequence[Any]) -> list[Any] | None:
    """`eqn` bound to `vals` in a cheaper exact form, or None where it has none (bind it as
    traced)."""
    if eqn.primitive is not lax.scatter_p:
        return None
    update = as_update(eqn, vals)
    if update is None:
        return None
    operand, window, starts = update
    # The primitive: `lax.dynamic_update_slice` would first wrap a negative start around, which
    # the scatter does not; the primitive clips as the scatter does.
    return [lax.dynamic_update_slice_p.bind(operand, window, *starts)]
