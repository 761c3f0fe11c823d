"""A region's interface: how its canonical inputs are made from the region's own inputs, and
its own outputs from the canonical ones.

The interface is `meta["interface"] = {"inputs": ((position, ops), ...), "outputs": (ops, ...),
"shapes": (the region's own input shapes, by position)}`,
ops a tuple of ("reshape", shape) / ("transpose", permutation) / ("broadcast", shape) (size-1
axes widened) / ("scale", c) / ("shift", c) / ("slice", (*starts, *limits)) (a static slice of a
stored array, as `p["gating"][0]` takes one of two stacked weights) steps: canonical input k is the
region's input `position` with `ops` applied; the region's output j is canonical output j with
`ops` applied.

`adapt` wraps a function of the canonical inputs (a kernel, the region's own evaluation) in
these steps; a kernel may take some inputs as they are stored and write some outputs laid out
otherwise (`lax_ir.views`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from lax_ir.program import Program

Ops = tuple[tuple[str, tuple[int, ...]], ...]


def identity_interface(program: Program) -> dict[str, Any]:
    """The interface of a Program that is its region's own (no layout steps)."""
    return {
        "inputs": tuple((k, ()) for k in range(len(program.inputs))),
        "outputs": tuple(() for _ in program.outputs),
        "shapes": tuple(tuple(s) for s, _ in program.input_avals),
    }


def compose(first: dict[str, Any] | None, then: dict[str, Any]) -> dict[str, Any]:
    """The interface of a rewrite (`then`) of a Program whose own interface is `first`."""
    if first is None:
        return then
    return {
        "inputs": tuple(
            (first["inputs"][pos][0], merged((*first["inputs"][pos][1], *ops)))
            for pos, ops in then["inputs"]
        ),
        "outputs": tuple((*o2, *o1) for o2, o1 in zip(then["outputs"], first["outputs"])),
        "shapes": first["shapes"],
    }


def merged(ops: Ops) -> Ops:
    """`ops` with each run of consecutive reshapes made one (the last of them)."""
    out: list = []
    for op in ops:
        if op[0] == "reshape" and out and out[-1][0] == "reshape":
            out.pop()
        out.append(op)
    return tuple(out)


def apply_ops(x: Any, ops: Ops) -> Any:
    """Apply interface steps to an array (numpy or jax)."""
    for op, arg in ops:
        if op == "reshape":
            x = x.reshape(arg)
        elif op == "transpose":
            x = x.transpose(arg)
        elif op == "broadcast":  # size-1 axes widened (equal ranks)
            x = np.broadcast_to(x, arg) if isinstance(x, np.ndarray) else jnp.broadcast_to(x, arg)
        elif op == "shift":  # the input plus a constant, in its own dtype
            x = x + np.asarray(arg, dtype=x.dtype)
        elif op == "slice":  # (*starts, *limits)
            rank = len(arg) // 2
            x = x[tuple(slice(a, b) for a, b in zip(arg[:rank], arg[rank:]))]
        else:  # ("scale", c): the input times a constant, in its own dtype
            x = x * np.asarray(arg, dtype=x.dtype)
    return x


@dataclass(frozen=True)
class SplitView:
    """A stored array read as `stored.transpose(perm).reshape(canonical shape)`: a canonical
    axis made of stored axes that are not next to each other (Gemma's query weight, stored
    (heads, D, head_dim) and read as (D, heads * head_dim)). `runs[j]`: the sizes of canonical
    axis j's parts, outer first (none for a unit axis); `perm` maps each part of their
    concatenation to its stored axis, as a plain view's permutation does the canonical axes,
    or is -1 for a part that a broadcast widened (stored nowhere: read with stride 0)."""

    perm: tuple[int, ...]
    runs: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class OffsetView:
    """`view` (a permutation or `SplitView`) of the block of a larger stored array that starts
    `offset` elements into it: a static slice of one of stacked weights (Gemma's
    `p["gating"][0]`, of shape `stored`, within the array of shape `array`), read in place."""

    view: tuple[int, ...] | SplitView
    offset: int
    stored: tuple[int, ...]
    array: tuple[int, ...]


View = tuple[int, ...] | SplitView | OffsetView
Views = dict[int, View]
"""Inputs a kernel reads in the layout they are stored in: position -> a permutation, the
canonical input being `stored.transpose(permutation)`, or a `SplitView`."""


def view_stored_shape(shape: Sequence[int], view: View) -> tuple[int, ...]:
    """The shape of the stored array that `view` reads as a canonical input of `shape`."""
    if isinstance(view, OffsetView):
        return view.array
    if isinstance(view, SplitView):
        flat = [s for run in view.runs for s in run]
        out = [0] * sum(q >= 0 for q in view.perm)
        for s, q in zip(flat, view.perm):
            if q >= 0:
                out[q] = s
        return tuple(out)
    return stored_shape(shape, view)


def read_view(x: Any, view: View) -> Any:
    """The canonical input from the stored array `x` (numpy or jax), for a reader that cannot
    read it in place."""
    if isinstance(view, OffsetView):
        block = x.reshape(-1)[view.offset : view.offset + math.prod(view.stored)]
        return read_view(block.reshape(view.stored), view.view)
    if isinstance(view, SplitView):
        flat = tuple(s for run in view.runs for s in run)
        x = x.transpose(tuple(q for q in view.perm if q >= 0))
        x = x.reshape(tuple(1 if q < 0 else s for s, q in zip(flat, view.perm)))
        x = np.broadcast_to(x, flat) if isinstance(x, np.ndarray) else jnp.broadcast_to(x, flat)
        return x.reshape(tuple(math.prod(run) for run in view.runs))
    return x.transpose(view)


def write_view(y: Any, view: View) -> Any:
    """The stored array that `view` reads as the canonical `y` (`read_view`'s inverse), for a
    writer that cannot write it in place; `view` widens nothing (an output's)."""
    if isinstance(view, OffsetView):
        raise ValueError(f"{view}: an output is written whole, not into a block of an array")
    if isinstance(view, SplitView):
        if min(view.perm, default=0) < 0:
            raise ValueError(f"{view}: a widened part has no place to write")
        y = y.reshape(tuple(s for run in view.runs for s in run))
        return y.transpose(inverse(view.perm))
    return y.transpose(inverse(view))


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The element strides of a row-major array of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= int(s)
    return tuple(reversed(out))


def view_strides(shape: Sequence[int], view: View) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per canonical axis of `shape`, (size, stride in the stored array) of each stored axis it
    is made of, outer first: a plain view's axes have one each. An `OffsetView`'s block is a
    leading slice: its strides are those of the block alone (`view_offset` says where it is)."""
    if isinstance(view, OffsetView):
        return view_strides(shape, view.view)
    if isinstance(view, SplitView):
        runs, perm = view.runs, view.perm
    else:
        runs, perm = tuple((int(s),) for s in shape), view
    stored = row_major_strides(view_stored_shape(shape, view))
    out, i = [], 0
    for run in runs:
        out.append(
            tuple((s, stored[perm[i + j]] if perm[i + j] >= 0 else 0) for j, s in enumerate(run))
        )
        i += len(run)
    return tuple(out)


def view_offset(view: View | None) -> int:
    """Elements from the stored array's start to the first one `view` reads (0 but for an
    `OffsetView`)."""
    return view.offset if isinstance(view, OffsetView) else 0


def contiguous_axis(view: View) -> int:
    """The canonical axis whose innermost part is the stored array's contiguous axis."""
    if isinstance(view, OffsetView):
        return contiguous_axis(view.view)
    if isinstance(view, SplitView):
        last = view.perm.index(max(view.perm))
        ends = [len(r) for r in view.runs]
        return next(j for j in range(len(ends)) if sum(ends[: j + 1]) > last)
    return view.index(len(view) - 1)


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    """The permutation that undoes `perm` (`x.transpose(perm).transpose(inverse(perm)) == x`)."""
    out = [0] * len(perm)
    for j, q in enumerate(perm):
        out[q] = j
    return tuple(out)


def stored_shape(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    """The shape of the stored array whose `transpose(perm)` has `shape`."""
    out = [0] * len(shape)
    for j, q in enumerate(perm):
        out[q] = shape[j]
    return tuple(out)


def adapt(
    fn: Callable[..., Any],
    program: Program,
    stored: Mapping[int, Ops] | None = None,
    written: Mapping[int, Ops] | None = None,
) -> Callable[..., Any]:
    """`fn` (a function of `program`'s inputs) taking and returning the region's own values;
    canonical inputs k in `stored` reach `fn` with the steps `stored[k]` applied instead of
    their interface steps (a view the kernel reads through: `lax_ir.views.input_view`), and
    outputs k in `written` leave `fn` laid out otherwise, made the region's by `written[k]`
    (`lax_ir.views.output_view`)."""
    interface = program.meta.get("interface")
    if interface is None:
        return fn
    stored, written = stored or {}, written or {}
    ins, outs = interface["inputs"], interface["outputs"]
    cut = [(pos, stored.get(k, ops)) for k, (pos, ops) in enumerate(ins)]
    outs = [written.get(k, ops) for k, ops in enumerate(outs)]

    def adapted(*xs: Any) -> list[Any]:
        got = fn(*[apply_ops(xs[pos], ops) for pos, ops in cut])
        return [apply_ops(y, ops) for y, ops in zip(got, outs)]

    return adapted
