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
  input whole, then update the copy in place: two launches per cache. Where the window is one
  position along each dimension it moves on and whole along the others, the update is one
  `select` that writes the copy with the new rows in it (on the H100, two 0.26 MB caches: 1.9
  µs against 4.5 for the copies and updates; two 16.8 MB ones: 11.0 against 13.5). It is
  used only for the function's own inputs (`copied`): an intermediate value, or a donated
  input, XLA updates in place, which the select would turn into a full pass.
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


def _as_update(eqn: Any, vals: Sequence[Any]) -> tuple[Any, Any, list[Any]] | None:
    """(operand, window, start per operand dimension) of a one-window update, else None."""
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


def _select_update(operand: Any, window: Any, starts: Sequence[Any]) -> Any | None:
    """The update as one select over a copy of `operand`, where the window is one position or
    whole along each dimension; else None."""
    if any(w not in (1, n) for w, n in zip(window.shape, operand.shape)):
        return None
    mask = None
    for d, (w, n) in enumerate(zip(window.shape, operand.shape)):
        if w == n:  # whole: the start clips to 0
            continue
        at = lax.clamp(0, lax.convert_element_type(starts[d], "int32"), n - 1)
        hit = lax.broadcasted_iota("int32", operand.shape, d) == at
        mask = hit if mask is None else lax.bitwise_and(mask, hit)
    if mask is None:  # the window is the whole operand
        return window
    rows = lax.broadcast_in_dim(window, operand.shape, tuple(range(operand.ndim)))
    return lax.select(mask, rows, operand)


def bind_cheaper(eqn: Any, vals: Sequence[Any], copied: bool = False) -> list[Any] | None:
    """`eqn` bound to `vals` in a cheaper exact form, or None where it has none (bind it as
    traced). `copied`: its first operand is an input XLA must copy to update."""
    update = _as_update(eqn, vals)
    if update is None:
        return None
    operand, window, starts = update
    if copied:
        selected = _select_update(operand, window, starts)
        if selected is not None:
            return [selected]
    if eqn.primitive is lax.dynamic_update_slice_p:
        return None
    # The primitive: `lax.dynamic_update_slice` would first wrap a negative start around, which
    # the scatter does not; the primitive clips as the scatter does.
    return [lax.dynamic_update_slice_p.bind(operand, window, *starts)]
