"""Full-size verification on a reduced instance: the same tiles, two windows per batch class.

The field verifier's cost grows with the number of elements (GPT-2 prefill at b=8: 35 s for
the attention's candidates). Most of those elements lie along *batch-like* classes: logical
dimensions that the region neither reduces, nor counts (a mean's n), nor fixes (constants,
real reshapes, concatenations, any op outside the shape-preserving fragment), and that every
graph-defined kernel of the candidate carrying them splits over its grid (not its loop, not a
split-K) with tiles that divide them.

Along such a class c the region is a map applied to every index alike (the program's ops
treat c elementwise or as a matmul batch axis: `dims.analyse` fixes every other case), and
each kernel of the candidate runs the same block program on every tile of c, reading and
writing only that tile. With L the least common multiple of the kernels' tiles along c, every
output element then depends on the inputs of its own L-window only, through the same function
for every window, in the region and in the candidate alike. So the candidate equals the region
at full size if and only if it does on any multiple of L: the reduced instance keeps 2L (two
windows, so that a block that read or wrote another block's window would differ), with the
candidate's own tiles, loop and every other class at full size. Structures with pre-defined
kernels and µGraphs built outside a structure (cuts, horizontal fusion) are not reduced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lax_ir.program import Program
from mirage_jax.mugraph import MuGraph
from mirage_jax.search import dims as dims_mod
from mirage_jax.search.structure import Numbers, Structure, instantiate, is_stack


@dataclass(frozen=True)
class Reduced:
    """A candidate and its region at reduced sizes (`sizes`: class -> (full, reduced))."""

    mugraph: MuGraph
    program: Program
    sizes: dict[int, tuple[int, int]]

    def describe(self) -> str:
        """E.g. "d0 8→2, d1 16→2": the classes reduced, at full and reduced size."""
        return ", ".join(f"d{c} {a}→{b}" for c, (a, b) in sorted(self.sizes.items()))


def _mentions(value, c: int) -> bool:
    """Whether an op parameter names the size of class `c` (("size", c), ("inv_size", c))."""
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] in ("size", "inv_size") and value[1] == c:
            return True
        return any(_mentions(v, c) for v in value)
    return False


def _labels_mention(labels, c: int) -> int:
    """How many axes of `labels` carry class `c`, and -1 where a stacked label involves it."""
    n = 0
    for lab in labels:
        if is_stack(lab):
            if c in lab[1:]:
                return -1
        elif lab == c:
            n += 1
    return n


def batch_tiles(s: Structure, nums: Numbers, dims: dims_mod.Dims) -> dict[int, int]:
    """Per batch-like class (module docstring) of structure `s` with `nums`, the least common
    multiple of its kernels' tiles along it: the window the reduced instance keeps twice."""
    if any(k.predefined for k in s.kernels):
        return {}
    out: dict[int, int] = {}
    for c in dims.batch_like():
        size = dims.sizes[c]
        window, ok = 1, True
        for spec, grid in zip(s.kernels, nums.grids):
            m = spec.mapping
            mentions = [_labels_mention(labels, c) for labels in spec.input_labels]
            if c not in m.grid:
                if any(mentions):  # carried whole by every block: not a batch of blocks
                    ok = False
                    break
                continue
            a = m.grid.index(c)
            named = any(_mentions(p, c) for _, _, params in spec.ops for p in params)
            if (
                min(mentions, default=0) < 0
                or max(mentions, default=0) > 1
                or named
                or c in m.split
                or m.loop == c
                or size % grid[a]
                or any(omap[a] is None for _, omap in spec.outputs)
            ):
                ok = False
                break
            window = math.lcm(window, size // grid[a])
        if ok and 2 * window < size:
            out[c] = window
    return out


def reduced_instance(
    program: Program, dims: dims_mod.Dims, s: Structure, nums: Numbers
) -> Reduced | None:
    """The candidate `instantiate(s, …, nums)` and `program` with every batch-like class at two
    windows, or None where no class can be reduced."""
    windows = batch_tiles(s, nums, dims)
    if not windows:
        return None
    sizes = dict(enumerate(dims.sizes))
    grids = []
    for spec, grid in zip((k for k in s.kernels if not k.predefined), nums.grids):
        grids.append(
            tuple(
                2 * windows[c] // (sizes[c] // n) if c in windows else n
                for c, n in zip(spec.mapping.grid, grid)
            )
        )
    small = {**sizes, **{c: 2 * w for c, w in windows.items()}}
    try:
        prog = dims_mod.shrink(program, small, dims)
    except dims_mod.ShrinkError:
        return None
    g = instantiate(s, prog.input_avals, small, Numbers(tuple(grids), nums.loops))
    return Reduced(g, prog, {c: (sizes[c], 2 * w) for c, w in windows.items()})
