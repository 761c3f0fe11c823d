"""Which layout steps at a region's interface a kernel can read through in place.

A region's canonical input k is its input `position` with interface steps applied (reshapes,
transposes, ...: `lax_ir.layouts`). Any reshape of a row-major array is free, a transpose is a
copy XLA writes on every call. A chain of reshapes and transposes is a *view* when it equals
one reshape of the stored array followed by one transpose: a kernel then reads the stored
array in place, through the permuted strides (`mirage_jax.lower.triton_access.tile_access`).

`input_view` finds that form by following the stored array's axes ("atoms": its axes, split
where a reshape splits them) through each step. The chain is a view when every axis of the
result holds atoms that lie next to each other, in order, in the stored array: Gemma's
`transpose(0, 2, 1, 3)`, `reshape` (dropping a unit batch), `transpose(0, 2, 1)` of a cache
stored (1, S, heads, D) is one; the same at batch 8, which merges the batch with the heads,
is not. Where an axis holds atoms apart (Gemma's (heads, D, head_dim) weight read as
(D, heads * head_dim)) or atoms a broadcast widened (placed nowhere: stride 0), the chain is a
*split view* (`split_view`, `lax_ir.interface.SplitView`): the kernel addresses that axis per
element, each part by its own stride.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from lax_ir.interface import (
    OffsetView,
    Ops,
    SplitView,
    View,
    contiguous_axis,
    inverse,
    row_major_strides,
)

LAYOUT_STEPS = ("reshape", "transpose")


def shape_after(shape: Sequence[int], ops: Ops) -> tuple[int, ...]:
    """The shape of an array of `shape` with interface steps `ops` applied."""
    out = tuple(shape)
    for op, arg in ops:
        if op in ("reshape", "broadcast"):
            out = tuple(arg)
        elif op == "transpose":
            out = tuple(out[p] for p in arg)
        elif op == "slice":
            rank = len(arg) // 2
            out = tuple(b - a for a, b in zip(arg[:rank], arg[rank:]))
    return out


def contiguous_block(shape: Sequence[int], arg: Sequence[int]) -> int | None:
    """The offset in elements of the block a ("slice", (*starts, *limits)) step takes from a
    row-major array of `shape`, where that block is contiguous in memory (unit extents, then
    one axis sliced, then whole axes: one of stacked weights); else None."""
    rank = len(shape)
    starts, limits = arg[:rank], arg[rank:]
    extents = [b - a for a, b in zip(starts, limits)]
    first = next((d for d in range(rank) if extents[d] != 1), rank)
    if any(extents[d] != shape[d] for d in range(first + 1, rank)):
        return None
    return sum(a * s for a, s in zip(starts, row_major_strides(shape)))


class _Atoms:
    """The stored array's axes, refined where a reshape splits one; `order` is memory order."""

    def __init__(self, shape: Sequence[int]):
        self.size = {k: int(d) for k, d in enumerate(shape) if d != 1}
        self.order = [k for k, d in enumerate(shape) if d != 1]
        self.wide: set[int] = set()  # atoms a broadcast made: in no place of memory
        self.next = len(shape)

    def new(self, size: int, wide: bool = False) -> int:
        """A new atom of `size` (a broadcast's where `wide`, placed nowhere in memory)."""
        a, self.next = self.next, self.next + 1
        self.size[a] = size
        if wide:
            self.wide.add(a)
        return a

    def split(self, a: int, major: int) -> tuple[int, int]:
        """Atom a split into (major, rest) sizes; returns the two new atoms."""
        wide = a in self.wide
        first = self.new(major, wide)
        second = self.new(self.size[a] // major, wide)
        if not wide:
            i = self.order.index(a)
            self.order[i : i + 1] = [first, second]
        self.wide.discard(a)
        del self.size[a]
        return first, second


def _reshape(atoms: _Atoms, axes: list[list[int]], shape: Sequence[int]) -> list[list[int]] | None:
    """The axes (atom lists) after reshaping to `shape`, or None where sizes do not divide."""
    queue = [a for ax in axes for a in ax]  # logical row-major order of the current array
    out: list[list[int]] = []
    for d in shape:
        group: list[int] = []
        need = int(d)
        while need > 1:
            if not queue:
                return None
            a = queue.pop(0)
            n = atoms.size[a]
            if n <= need:
                if need % n:
                    return None
                group.append(a)
                need //= n
            else:
                if n % need:
                    return None
                major, rest = atoms.split(a, need)
                for ax in axes:  # the split atom's old place is gone everywhere
                    if a in ax:
                        i = ax.index(a)
                        ax[i : i + 1] = [major, rest]
                group.append(major)
                queue.insert(0, rest)
                need = 1
        out.append(group)
    return out if not queue else None


def _layout(
    shape: Sequence[int], ops: Ops, broadcasts: bool = False
) -> tuple[_Atoms, list[list[int]]] | None:
    """Follow the stored array's atoms through reshapes and transposes (and, with
    `broadcasts`, size-1 axes widened: atoms placed nowhere in memory)."""
    atoms = _Atoms(shape)
    axes: list[list[int]] = [[k] if d != 1 else [] for k, d in enumerate(shape)]
    for op, arg in ops:
        if op == "transpose":
            axes = [axes[p] for p in arg]
        elif op == "reshape":
            got = _reshape(atoms, axes, arg)
            if got is None:
                return None
            axes = got
        elif op == "broadcast" and broadcasts and len(arg) == len(axes):
            axes = [
                ax if ax or n == 1 else [atoms.new(int(n), wide=True)] for ax, n in zip(axes, arg)
            ]
        else:
            return None
    return atoms, axes


def view(shape: Sequence[int], ops: Ops) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(stored shape, permutation) with `apply(x, ops) == x.reshape(stored).transpose(perm)`
    for x of `shape`, where `ops` (reshapes and transposes only) is a view: a split view whose
    every axis is one part (`split_view`), its unit axes stored first; else None."""
    got = split_view(shape, ops, broadcasts=False)
    if got is None:
        return None
    stored, sv = got
    if any(len(run) > 1 for run in sv.runs):
        return None  # an axis whose atoms are not next to each other, in order
    units = [k for k, run in enumerate(sv.runs) if not run]
    held = [k for k, run in enumerate(sv.runs) if run]
    where = {k: j for j, k in enumerate(units)}
    where.update({k: len(units) + sv.perm[i] for i, k in enumerate(held)})
    return (1,) * len(units) + stored, tuple(where[k] for k in range(len(sv.runs)))


def split_view(
    shape: Sequence[int], ops: Ops, broadcasts: bool = True
) -> tuple[tuple[int, ...], SplitView] | None:
    """(stored shape, view) with `read_view(x.reshape(stored), view) == apply(x, ops)` for x of
    `shape`, where `ops` (reshapes, transposes and, with `broadcasts`, broadcasts of size-1
    axes) keep each stored axis whole in one canonical axis, but an axis may hold several that
    are not next to each other (Gemma's (heads, D, head_dim) weight read as (D, heads *
    head_dim)) or widened ones, read with stride 0 (a causal bias broadcast over the query
    groups and merged with the query axis: XLA writes no widened copy); else None."""
    got = _layout(shape, ops, broadcasts)
    if got is None:
        return None
    atoms, axes = got
    place = {a: i for i, a in enumerate(atoms.order)}
    runs: list[list[list[int]]] = []  # per canonical axis, its atoms cut where memory jumps
    for ax in axes:
        cut: list[list[int]] = []
        for a in ax:
            last = cut[-1][-1] if cut else None
            if last in place and a in place and place[last] + 1 == place[a]:
                cut[-1].append(a)
            else:
                cut.append([a])
        runs.append(cut)
    flat = [run for cut in runs for run in cut]  # the canonical axes, refined
    held = [i for i, run in enumerate(flat) if run[0] in place]  # not widened
    by_memory = sorted(held, key=lambda i: place[flat[i][0]])
    stored = tuple(math.prod(atoms.size[a] for a in flat[i]) for i in by_memory)
    where = {i: j for j, i in enumerate(by_memory)}
    perm = tuple(where.get(i, -1) for i in range(len(flat)))
    sizes = tuple(tuple(math.prod(atoms.size[a] for a in run) for run in cut) for cut in runs)
    return stored, SplitView(perm, sizes)


def _layout_tail(ops: Ops, steps: Collection[str] = LAYOUT_STEPS) -> tuple[Ops, Ops]:
    """`ops` split before the steps of kinds `steps` (reshapes and transposes) that end them."""
    j = len(ops)
    while j and ops[j - 1][0] in steps:
        j -= 1
    return tuple(ops[:j]), tuple(ops[j:])


def input_view(shape: Sequence[int], ops: Ops) -> tuple[Ops, View] | None:
    """How a kernel reads a region input of `shape` whose interface steps are `ops` in place:
    (the steps XLA still applies, ending in a free reshape; the permutation, or `SplitView`
    where an axis is made of stored axes apart or widened by a broadcast among the steps that
    end `ops`, the kernel reads through), or None where the layout steps that end `ops` are no
    view or move no data, or the stored array's contiguous axis would not be the innermost
    part of one of the tile's two (loads would not coalesce). Steps that start with a static
    slice taking a contiguous block of the stored array (`contiguous_block`) read that block in
    place too, through an `OffsetView`, the kernel given the whole array."""
    if ops and ops[0][0] == "slice":
        offset = contiguous_block(shape, ops[0][1])
        block = shape_after(shape, ops[:1])
        if offset is None:
            return None  # XLA slices (a copy) and lays the block out, as before
        rest = ops[1:]
        if all(op == "reshape" for op, _ in rest):  # the block as it lies, reshaped (free)
            final = shape_after(block, rest)
            return (), OffsetView(tuple(range(len(final))), offset, final, tuple(shape))
        got = input_view(block, rest)
        if got is None or any(op != "reshape" for op, _ in got[0]):
            return None
        inner = got[0][-1][1] if got[0] else block
        return (), OffsetView(got[1], offset, tuple(inner), tuple(shape))
    prefix, suffix = _layout_tail(ops)
    start = shape_after(shape, prefix)
    got = view(start, suffix)
    if got is not None:
        stored, perm = got
        rank = len(perm)
        if perm == tuple(range(rank)) or rank < 2 or rank - 1 not in perm[-2:]:
            return None
        return (*prefix, ("reshape", stored)), perm
    prefix, suffix = _layout_tail(ops, (*LAYOUT_STEPS, "broadcast"))
    split = split_view(shape_after(shape, prefix), suffix)
    if split is None or not split[0]:
        return None
    stored, sv = split
    rank, axis = len(sv.runs), contiguous_axis(sv)
    innermost = sum(len(run) for run in sv.runs[: axis + 1]) - 1  # axis's inner part, refined
    if rank < 2 or axis < rank - 2 or sv.perm[innermost] != len(stored) - 1:
        return None  # the stored contiguous axis is not the innermost of one of the tile's two
    return (*prefix, ("reshape", stored)), sv


def free_reshape(shape: Sequence[int], ops: Ops) -> Ops | None:
    """`ops` with the layout steps that end them made one reshape, where those steps move no
    data (transposes of unit axes around reshapes, Gemma's Q at batch 1); else None."""
    prefix, suffix = _layout_tail(ops)
    if not any(op == "transpose" for op, _ in suffix):
        return None
    start = shape_after(shape, prefix)
    got = view(start, suffix)
    if got is None or got[1] != tuple(range(len(got[1]))):
        return None
    return (*prefix, ("reshape", shape_after(start, suffix)))


def output_view(shape: Sequence[int], out_ops: Ops, after: Ops) -> tuple[View, Ops] | None:
    """How a kernel writes a canonical output of `shape` so that what follows it moves no data:
    the region's output is the canonical one with `out_ops` applied, and the program then
    applies `after` (layout steps only, as attention's (B, heads, T, D) -> (B, T, heads * D)).
    Returns (view, steps): the kernel writes the array that `view` reads as the canonical output
    (`lax_ir.interface.read_view`), and the region's output is that array with `steps` applied,
    steps that XLA folds into `after`'s. None where that is not so, or the stores would not
    coalesce (the canonical last axis's inner part must be the written array's last).

    Where `after` is transposes then reshapes and the canonical axes stay whole, the array is
    the output permuted and `steps` one reshape and one transpose. Otherwise (sdpa's grouped
    (B, kv heads, T * groups, D) output, which the program lays out (B, T, heads, D)), the array
    is the program's final one, written through a `SplitView`, and `steps` undo `after`."""
    plain = _permuted_output(shape, out_ops, after)
    if plain is not None:
        return plain
    chain = (*out_ops, *after)
    if not after or any(op not in LAYOUT_STEPS for op, _ in chain):
        return None
    final = shape_after(shape, chain)
    got = split_view(final, _undone(shape, chain), broadcasts=False)
    if got is None:
        return None
    stored, sv = got
    flat = [s for run in sv.runs for s in run]
    if sv.perm == tuple(range(len(flat))) or shape[-1] == 1 or not sv.runs[-1]:
        return None  # the same array, or no last axis to store along
    if sv.perm[len(flat) - 1] != len(stored) - 1:
        return None  # the canonical last axis's inner part is not stored innermost
    return sv, (("reshape", final), *_undone(shape_after(shape, out_ops), after))


def _undone(shape: Sequence[int], ops: Ops) -> Ops:
    """The layout steps that take an array of `shape` with `ops` applied back to `shape`."""
    back: list[tuple[str, tuple[int, ...]]] = []
    cur = tuple(shape)
    for op, arg in ops:
        if op == "transpose":
            back.append(("transpose", inverse(arg)))
        else:
            back.append(("reshape", cur))
        cur = shape_after(cur, ((op, arg),))
    return tuple(reversed(back))


def _permuted_output(shape: Sequence[int], out_ops: Ops, after: Ops) -> tuple[View, Ops] | None:
    """`output_view`'s first form: the output permuted, the region's output that array reshaped
    and transposed once, a transpose XLA folds into those of `after`."""
    kinds = [op for op, _ in after]
    first = kinds.index("reshape") if "reshape" in kinds else len(kinds)
    if first == 0 or set(kinds[:first]) != {"transpose"} or set(kinds[first:]) - {"reshape"}:
        return None  # not transposes then reshapes: XLA would not fold the transposes
    got = _layout(shape, (*out_ops, *after))
    if got is None:
        return None
    atoms, axes = got
    rank = len(shape)
    if any(a >= rank for a in atoms.size):
        return None  # a canonical axis is split: not one permutation of it
    units = [k for k, d in enumerate(shape) if d == 1]
    order = units + [a for ax in axes for a in ax]
    if order == list(range(rank)) or (shape[-1] != 1 and order[-1] != rank - 1):
        return None
    perm = inverse(order)
    stored = tuple(int(shape[a]) for a in order)
    back = view(stored, (("transpose", perm), *out_ops))
    return None if back is None else (perm, (("reshape", back[0]), ("transpose", back[1])))


def layout_after(program: Any, node: int, xla: Collection[int] | None = None) -> Ops:
    """The layout steps `program` applies to `node`'s value alone (its only user, and so on),
    up to a value the program returns or shares; with `xla`, only through steps XLA runs
    (a partition's residual nodes: a step inside another region is that region's to read)."""
    ops: list[tuple[str, tuple]] = []
    users, outputs = program.users, set(program.outputs)
    while node not in outputs and len(users[node]) == 1:
        nxt = users[node][0]
        if xla is not None and nxt not in xla:
            break
        n = program.nodes[nxt]
        if n.op == "reshape":
            ops.append(("reshape", tuple(n.shape)))
        elif n.op == "transpose":
            ops.append(("transpose", tuple(n.param("permutation"))))
        else:
            break
        node = nxt
    return tuple(ops)
