"""Mapping classes of a kernel and the numbers of a structure: grids, loop ranges, limits.

A mapping class names, per grid axis, the logical dimension it splits, and the dimension the
for-loop walks. It fixes every input's imap and forloop_dim (an input splits along a grid
axis exactly where it has that dimension, and is replicated where it has none) and every
output's omap (the axis of the same dimension; a split reduction stacks its partial results
along the last axis). Grid axes come from the dimensions of the outputs (and at most one
reduction dimension, split-K); the loop walks one reduced dimension or none. Grid axes are
listed in one canonical order, so no mapping is generated twice.

Numbers (`numbers_for`) are enumerated per structure at full size: grid sizes from the
divisors of each dimension whose tile is a power of two (Pallas pads other tiles), loop
ranges from powers of two that divide what a block walks, within the target's block limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from mirage_jax.search.structure import MappingClass, Numbers, Structure

LOOP_RANGES = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_GRID_AXES = 3


def schedule_classes(
    reduced: Sequence[int],
    sizes: Mapping[int, int],
    small: Mapping[int, int],
    *,
    split: bool = True,
    loop: bool = True,
) -> list[MappingClass]:
    """The loop and split-K choices of a kernel (grid axes over output dims come later).

    Only a reduction split across the grid or walked by the loop changes which block graphs
    are correct (what is a partial sum); splitting an output dimension does not, as long as
    the graph does not reduce over it. So the enumeration runs once per (loop, split) class,
    and `grid_expansions` adds the output dimensions to each closed graph.
    """
    red = [c for c in reduced if sizes[c] >= 4 and small[c] % 4 == 0]
    out: list[tuple[tuple, MappingClass]] = []
    for s in [None, *(red if split else [])]:
        for lp in [None, *(red if loop else [])]:
            m = MappingClass(() if s is None else (s,), lp, frozenset() if s is None else {s})
            # promise: a loop over the largest reduction, no split
            out.append(((lp is None, s is not None, -(sizes[lp] if lp is not None else 0)), m))
    out.sort(key=lambda km: km[0])
    return [m for _, m in out]


def grid_expansions(
    m: MappingClass, parallel: Sequence[int], sizes: Mapping[int, int], small: Mapping[int, int]
) -> list[MappingClass]:
    """`m` with every subset of the output dimensions `parallel` added as grid axes.

    Largest first; output dimensions come before the split dimension, in output-axis order.
    """
    par = [c for c in parallel if sizes[c] >= 2 and small[c] % 2 == 0 and c not in m.grid]
    room = MAX_GRID_AXES - len(m.grid)
    out = []
    for n in range(min(room, len(par)), -1, -1):
        for grid in itertools.combinations(par, n):
            out.append(MappingClass((*grid, *m.grid), m.loop, m.split))
    return out


def _grid_choices(size: int, max_blocks: int, allow_one: bool) -> list[int]:
    """Grid sizes g dividing `size` whose tile size/g is a power of two.

    1 is allowed on an output dimension (a structure stands for its smaller grids too: a grid
    that verified covers its subsets), not on a split reduction (that would be no split).
    """
    out = {1} if allow_one else set()
    for g in range(2, min(size, max_blocks) + 1):
        if size % g == 0 and (size // g) & (size // g - 1) == 0:
            out.add(g)
    return sorted(out)


LATER_KERNEL_OPTIONS = 6
"""Numbers kept for each graph-defined kernel after the first (see `numbers_for`)."""


def numbers_for(
    s: Structure, sizes: Mapping[int, int], *, max_blocks: int = 4096, limit: int = 20000
) -> Iterator[Numbers]:
    """Candidate numbers for structure `s` at `sizes` (at most `limit`).

    A kernel whose loop walks the partial results of an earlier split-K kernel runs exactly as
    many iterations as that kernel split its reduction into.
    """
    per_kernel: list[list[tuple[tuple[int, ...], int | tuple]]] = []
    split_axis: dict[int, tuple[int, int]] = {}  # split dim -> (kernel, grid axis)
    for spec in s.kernels:
        if spec.predefined:
            continue
        m = spec.mapping
        k = len(per_kernel)
        # largest grids first: where `limit` cuts, it cuts the grids that use the GPU least
        axis_choices = [_grid_choices(sizes[c], max_blocks, c not in m.split)[::-1] for c in m.grid]
        options = []
        for grid in itertools.product(*axis_choices):
            if math.prod(grid) > max_blocks:
                continue
            loops: list[int | tuple] = [1]
            if m.loop in split_axis:
                loops = [split_axis[m.loop]]  # coupled: filled in below
            elif m.loop is not None:
                walk = sizes[m.loop]
                for c, g in zip(m.grid, grid):
                    if c == m.loop:
                        walk //= g
                loops = [f for f in LOOP_RANGES[1:] if walk % f == 0]
            for f in loops:
                options.append((tuple(grid), f))
        for a, c in enumerate(m.grid):
            if c in m.split:
                split_axis[c] = (k, a)
        if per_kernel and len(options) > LATER_KERNEL_OPTIONS:
            # A later kernel (a split's combine) multiplies the product; keep a spread of its
            # options by block count so that `limit` reaches the first kernel's large grids.
            options.sort(key=lambda o: (math.prod(o[0]), o))
            step = (len(options) - 1) / (LATER_KERNEL_OPTIONS - 1)
            options = [options[round(i * step)] for i in range(LATER_KERNEL_OPTIONS)]
        per_kernel.append(options)
    for n, combo in enumerate(itertools.product(*per_kernel)):
        if n >= limit:
            return
        grids = tuple(g for g, _ in combo)
        loops = tuple(grids[f[0]][f[1]] if isinstance(f, tuple) else f for _, f in combo)
        yield Numbers(grids, loops)
