"""A tile's pointer arithmetic in the generated Triton source: where a block's tile of an input
or output starts, how it moves with the loop's step, and each lane's offset, through the
strides of the array as stored (a plain row-major array, a permuted view, or a split view whose
axes are addressed per element by the index's digits: `lax_ir.interface.SplitView`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lax_ir.interface import View, view_offset, view_strides
from mirage_jax.lower.triton_rules import lane


def _digits(index: str, parts: Sequence[tuple[int, int]]) -> str:
    """The offset of `index` along an axis made of stored axes `parts` ((size, stride), outer
    first, not next to each other in memory; stride 0 for a widened one): each one's digit of
    the index times its stride."""
    terms, inner = [], math.prod(n for n, _ in parts)
    for j, (n, stride) in enumerate(parts):
        inner //= n
        if not stride:
            continue
        digit = f"({index})" if inner == 1 else f"(({index}) // {inner})"
        if j:
            digit = f"({digit} % {n})"
        terms.append(f"{digit} * {stride}")
    return " + ".join(terms) or "0"


def tile_access(
    dims, pids: list[str], view: View | None = None, drop: int = 0
) -> tuple[str, Callable[[str], str], str, str | None]:
    """(block base offset, the loop step's offset as a function of the step, lane offsets,
    mask) source of one tile.

    An input with a `view` is stored as the array the µGraph reads through it (a weight read
    as Wᵀ, a cache stored (B, S, heads, D) read as Kᵀ per head, Gemma's (heads, D, head_dim)
    query weight read as (D, heads * head_dim), one of stacked weights: `OffsetView`): the same
    logical tile, read through the stored array's strides from the view's offset. An axis made of stored axes apart (`SplitView`) is addressed per element,
    by its digits of the index. The lanes have the rank of the tile without its first `drop`
    dims (each held once: `squeeze.squeezed`), which still place it through the grid."""
    sizes = tuple(d.size for d in dims)
    parts = view_strides(sizes, view if view is not None else tuple(range(len(sizes))))
    pads = tuple(d.pad for d in dims)
    if any(p != 1 for p in pads[:drop]):
        raise ValueError(f"tile {pads}: its first {drop} dims are not held once")

    def lane_of(k: int) -> str:
        return "0" if k < drop else lane(pads[drop:], k - drop)

    offset = view_offset(view)
    base, step, offs = ([str(offset)] if offset else []), [], []
    split: list[tuple[int, Any, tuple[tuple[int, int], ...]]] = []
    for k, (d, dparts) in enumerate(zip(dims, parts)):
        if len(dparts) > 1:
            split.append((k, d, dparts))
            continue
        s = dparts[0][1] if dparts else 0
        if d.axis is not None:
            base.append(f"{pids[d.axis]} * {d.extent * s}")
        if d.loop:
            step.append(f"{d.tile * s}")
        if k >= drop:
            offs.append(f"{lane_of(k)} * {s}")
    for k, d, dparts in split:
        if d.loop:
            continue  # addressed per step below
        index = lane_of(k) if d.axis is None else f"{pids[d.axis]} * {d.extent} + {lane_of(k)}"
        offs.append(_digits(index, dparts))
    looped = [(k, d, dparts) for k, d, dparts in split if d.loop]
    linear = " + ".join(step)

    def at_step(at: str) -> str:
        terms = [f"({at}) * ({linear})"] if linear else []
        for k, d, dparts in looped:
            first = "" if d.axis is None else f"{pids[d.axis]} * {d.extent} + "
            terms.append(_digits(f"{first}({at}) * {d.tile} + {lane_of(k)}", dparts))
        return " + ".join(terms) or "0"

    masks = [f"({lane_of(k)} < {d.tile})" for k, d in enumerate(dims) if d.masked]
    return (
        " + ".join(base) or "0",
        at_step,
        " + ".join(offs) or "0",
        " & ".join(masks) if masks else None,
    )
