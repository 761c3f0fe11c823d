"""Kernel tensors, mapping classes and µGraph structures: what the enumerator builds and instantiates.

A *structure* is a µGraph with the numbers left out: for each graph-defined kernel, which
logical dimension each grid axis splits and which one the for-loop walks (its *mapping class*),
its block ops and outputs; pre-defined kernel ops as they are. `instantiate` turns a structure
plus sizes (one per logical dimension) plus numbers (grid sizes, loop range per kernel) into a
`MuGraph`. The small representative used for verification and the full-size candidates are two
instantiations of one structure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax.mugraph import BlockGraphBuilder, MuGraph, MuGraphBuilder

# A tensor axis label: a logical dimension (int), None (size 1), or ("stack", base, split):
# blocks' partial results over dimension `split` concatenated along an axis of dimension `base`.
Label = Any
Ref = tuple  # ("in", i): region input i; ("k", kernel, output)


def is_stack(label: Label) -> bool:
    return isinstance(label, tuple)


def label_size(label: Label, sizes: Mapping[int, int], splits: Mapping[int, int]) -> int:
    if label is None:
        return 1
    if is_stack(label):
        _, base, split = label
        return (1 if base is None else sizes[base]) * splits[split]
    return sizes[label]


@dataclass(frozen=True)
class KTensor:
    """A kernel-level tensor as the search sees it.

    Arguments:
        ref: where it comes from (("in", i) or ("k", kernel, output)).
        term: its abstract expression.
        labels: per axis, its logical dimension (see `Label`).
        dtype: numpy dtype name.
        partial: dimensions it is still a partial sum over (a split-K kernel's output).
        shift, varies: a softmax shift (a max), and the dimensions it is a partial max over.
        shifted_by: for a partial sum rescaled to a partial max, that max's output index.
    """

    ref: Ref
    term: tuple
    labels: tuple
    dtype: str
    partial: frozenset = frozenset()
    shift: bool = False
    varies: frozenset = frozenset()
    shifted_by: int | None = None


@dataclass(frozen=True)
class MappingClass:
    """Which dimension each grid axis splits and which one the for-loop walks."""

    grid: tuple[int, ...]
    loop: int | None
    split: frozenset = frozenset()  # grid dimensions that are reductions (split-K)

    def imap(self, labels: Sequence[Label]) -> tuple[int | None, ...]:
        return tuple(_axis_of(labels, c) for c in self.grid) if self.grid else (None,)

    def fmap(self, labels: Sequence[Label]) -> int | None:
        return None if self.loop is None else _loop_axis_of(labels, self.loop)

    def describe(self, name=lambda c: f"d{c}") -> str:
        g = ",".join(name(c) + ("(split)" if c in self.split else "") for c in self.grid) or "1"
        return f"grid[{g}] loop[{name(self.loop) if self.loop is not None else '-'}]"


def _axis_of(labels: Sequence[Label], c: int) -> int | None:
    for ax, lab in enumerate(labels):
        if lab == c:
            return ax
    return None


def _loop_axis_of(labels: Sequence[Label], c: int) -> int | None:
    """The axis the loop walks: one of dimension c, or the stacked partial results over c."""
    for ax, lab in enumerate(labels):
        if lab == c or (is_stack(lab) and lab[2] == c):
            return ax
    return None


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a structure: a pre-defined op (`predefined`) or a graph-defined kernel.

    For a graph-defined kernel, `ops` are (name, block tensor args, params) with block tensor
    ids counting the inputs first; a param value ("size", d) is the size of dimension d at
    instantiation. `outputs` are (block tensor, output axis per grid axis or None).
    """

    args: tuple[Ref, ...]
    mapping: MappingClass | None = None
    ops: tuple[tuple[str, tuple[int, ...], tuple], ...] = ()
    outputs: tuple[tuple[int, tuple[int | None, ...]], ...] = ()
    predefined: str | None = None
    params: tuple = ()
    input_labels: tuple[tuple, ...] = ()

    @property
    def graph_defined(self) -> bool:
        return self.predefined is None


@dataclass(frozen=True)
class Structure:
    """A µGraph without numbers: kernels in order, and the refs of the region's outputs."""

    kernels: tuple[KernelSpec, ...]
    outputs: tuple[Ref, ...]

    def streams_gemms(self) -> bool:
        """Whether every graph-defined kernel with a matmul walks a for-loop (a loop-free GEMM
        holds its whole K in one tile: slow at large K; `Budget.loop_extra_depth`)."""
        return all(
            k.mapping.loop is not None
            for k in self.kernels
            if k.graph_defined and any(op in ("matmul", "concat_matmul") for op, _, _ in k.ops)
        )

    def describe(self, name=lambda c: f"d{c}") -> str:
        parts = []
        for k in self.kernels:
            if k.predefined:
                args = ",".join(f"x{r[1]}" if r[0] == "in" else f"k{r[1]}" for r in k.args)
                params = "".join(f",{n}={v}" for n, v in k.params)
                parts.append(f"{k.predefined}({args}{params})")
            else:
                ops = " ".join(op for op, _, _ in k.ops)
                parts.append(f"[{k.mapping.describe(name)}: {ops}]")
        return " ; ".join(parts)


@dataclass(frozen=True)
class Numbers:
    """Per graph-defined kernel (in order): grid sizes per grid axis and the loop range."""

    grids: tuple[tuple[int, ...], ...]
    loops: tuple[int, ...]


def resolve(value: Any, sizes: Mapping[int, int]) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "size":
        return sizes[value[1]]
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "inv_size":
        return 1.0 / sizes[value[1]]
    return value


def instantiate(
    s: Structure,
    input_avals: Sequence[tuple[tuple[int, ...], str]],
    sizes: Mapping[int, int],
    numbers: Numbers,
    **meta: Any,
) -> MuGraph:
    """Build the MuGraph of structure `s` at `sizes` with `numbers` (raises MuGraphError)."""
    kb = MuGraphBuilder()
    refs: dict[Ref, tuple[int, int]] = {}
    for i, (shape, dtype) in enumerate(input_avals):
        refs[("in", i)] = kb.input(shape, dtype)
    g = 0
    for k, spec in enumerate(s.kernels):
        args = [refs[r] for r in spec.args]
        if spec.predefined:
            params = {n: resolve(v, sizes) for n, v in spec.params}
            refs[("k", k, 0)] = kb.op(spec.predefined, *args, **params)
            continue
        m = spec.mapping
        grid, loop = numbers.grids[g], numbers.loops[g]
        g += 1
        # grid axes of size 1 are dropped: the µGraph is the one of the smaller mapping class
        keep = [a for a, n in enumerate(grid) if n > 1]
        sizes_kept = tuple(grid[a] for a in keep) or (1,)
        bb = BlockGraphBuilder(sizes_kept, loop)
        for a, labels in zip(args, spec.input_labels):
            shape, dtype = kb.shape(a)
            imap = m.imap(labels)
            bb.input(shape, dtype, tuple(imap[x] for x in keep) or (None,), m.fmap(labels))
        for op, op_args, params in spec.ops:
            bb.op(op, *op_args, **{n: resolve(v, sizes) for n, v in params})
        for t, omap in spec.outputs:
            bb.output(t, tuple(omap[x] for x in keep) or (None,))
        outs = kb.graph_defined(args, bb.build())
        for j, r in enumerate(outs):
            refs[("k", k, j)] = r
    return kb.build([refs[r] for r in s.outputs], **meta)


def representative(m: MappingClass, small: Mapping[int, int]) -> tuple[dict[int, int], int]:
    """The representative's numbers for one mapping class: grid 2 and loop 2 where they divide."""
    grid = {c: (2 if small[c] % 2 == 0 else 1) for c in m.grid}
    loop = 1
    if m.loop is not None:
        walk = small[m.loop] // grid.get(m.loop, 1)
        loop = 2 if walk % 2 == 0 else 1
    return grid, loop


def representative_numbers(s: Structure, small: Mapping[int, int]) -> Numbers:
    """The representative numbers of every graph-defined kernel of `s`."""
    grids, loops = [], []
    for spec in s.kernels:
        if spec.predefined:
            continue
        grid, loop = representative(spec.mapping, small)
        grids.append(tuple(grid[c] for c in spec.mapping.grid))
        loops.append(loop)
    return Numbers(tuple(grids), tuple(loops))


def omap_of(mapping: MappingClass, labels: tuple) -> tuple | None:
    """Per grid axis, the output axis blocks concatenate along (None if there is none)."""
    omap = []
    for c in mapping.grid:
        if c in mapping.split:
            # the partial results stack along the last axis, else (a grid axis splits that
            # one) along the last axis no grid axis splits, so the kernel splits N and K both
            free = [d for d in range(len(labels)) if d not in omap]
            if not free:
                return None
            ax = free[-1]
        else:
            ax = next((d for d, lab in enumerate(labels) if lab == c), None)
            if ax is None:
                return None
        if ax in omap:
            return None
        omap.append(ax)
    return tuple(omap)


def output_tensor(
    t: Any, mapping: MappingClass, ref, omap, shifted_by: int | None = None
) -> KTensor:
    """The kernel tensor a closed block output becomes (split outputs are stacked)."""
    labels = list(t.labels)
    for c, ax in zip(mapping.grid, omap):
        if c in mapping.split:
            labels[ax] = ("stack", labels[ax], c)
    return KTensor(
        ref, t.term, tuple(labels), "", frozenset(t.partial), t.shift, frozenset(t.varies),
        shifted_by,
    )  # fmt: skip
