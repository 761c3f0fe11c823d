"""The variants `select(tune_warps=True)` times a region's fastest µGraphs with.

The kernels' knobs that the µGraph does not fix (warps per block, a loop split over the grid,
the tiles' rank, an online softmax's reference max) ride in its meta (`kernel_graph.WARPS`,
`LOOP_SPLIT`, `FULL_RANK`, `SPECULATIVE_MAX`), which the lowering reads when given no config;
`select` times each variant these name and keeps the fastest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from mirage_jax.lower.kernel_graph import FULL_RANK, LOOP_SPLIT, ROW_MAJOR, SPECULATIVE_MAX, WARPS
from mirage_jax.lower.registry import LoweringError
from mirage_jax.mugraph import MuGraph
from mirage_jax.search.order import structure_key

TUNED_WARPS = 8
"""The alternative to the backends' default of 4 warps that `select(tune_warps=True)` times
(a [16, 1024] × [1024, 16] fp16 block GEMM: 20.6 µs with 4 warps, 14.9 with 8; H100)."""

FEW_WARPS = 2
"""The other warps `select(tune_warps=True)` times for every kernel: small decode kernels
(H100, 2026-11-26, Llama nnx b=8: its norm + QKV one-launch group 7.73 µs with 4 warps, 6.63
with 2; its o-projection 3.87 and 3.52)."""

SPLIT_PARTS = (2, 4, 8)
"""The loop splits (`TritonConfig.loop_split`) `select(tune_warps=True)` may time."""

SPLIT_BLOCKS_PER_SM = 4
"""... only while a split kernel runs at most this many blocks per SM (`sm_count`), and at
most `MAX_SPLITS` of them: a kernel of 64 blocks and 4 loop steps (Llama nnx b=8, norm + QKV)
ran 10.75 µs whole, 8.03 in 2 parts, 7.04 in 4 (each with its finishing launch); one of 176
blocks lost 1.4 µs split in 2 (H100, 2026-11-26)."""

MAX_SPLITS = 2
"""At most this many loop splits are timed per winner (their compiles cost the first call)."""

SMALL_TUNING_US = 20.0
"""`FEW_WARPS` and the loop splits are timed only where the fastest µGraph takes at most this
long: they won on decode kernels of 3-11 µs, and at Llama-7B size (regions of 12-150 µs: 2
warps within 1% of 4, a split 15% slower) their compiles took the first calls past 60 s
(H100, 2026-11-26: Gemma 7B b=8 65.3 s, 51.8 s before)."""

MAX_TUNED_LAUNCHES = 3
"""µGraphs of 2 to this many launches also time each launch alone at `TUNED_WARPS`: kernels
of one µGraph differ (gqa_stable at b=8: its split-KV kernel runs 18.26 µs with 4 warps and
17.25 with 8, its combining kernel 2.09 and 2.87; H100, `config_probe_gqa_stable_b8`)."""


TUNE_WITHIN = 2.0
"""`select(tune_warps=True)` times no variant of a winner that took more than this multiple of
XLA's time: the most a variant has gained is half (Llama nnx b=8, norm + QKV: 9.97 µs, 5.12
read wide; H100, 2026-11-26), and the compiles of hopeless ones cost the first call (Gemma
7B b=8's norm + QKV, 70.6 µs against XLA's 23.7: 12.3 s of selection)."""


def within(best_us: float, xla_us: float | None) -> bool:
    """A winner of `best_us` is worth tuning against XLA's `xla_us` (None: not timed)."""
    return xla_us is None or best_us <= TUNE_WITHIN * xla_us


RETUNE_WITHIN = 1.25
"""`select(tune_warps=True)` also tunes the fastest µGraph of another structure that took at
most this multiple of the fastest's time: at the default numbers it may lose by less than its
own warps or split win back (H100, 2026-11-27, gqa_stable b=16: one kernel took 33.7 µs at 4
warps; split-KV 36.3 + 2.1 at 4 warps, but its split kernel 29.5 at 8)."""


def tuning_bases(timed: Sequence[tuple[float, MuGraph]]) -> list[int]:
    """Which first-round µGraphs `select(tune_warps=True)` tunes, as indices into `timed`
    ((µs, µGraph) pairs): the fastest, and the fastest of any other structure if it took at
    most `RETUNE_WITHIN` times as long."""
    if not timed:
        return []
    ranked = sorted(range(len(timed)), key=lambda k: timed[k][0])
    best = ranked[0]

    def key(k: int) -> Any:
        return structure_key(timed[k][1].meta.get("structure", k))

    other = next((k for k in ranked[1:] if key(k) != key(best)), None)
    close = other is not None and timed[other][0] <= RETUNE_WITHIN * timed[best][0]
    return [best, other] if close else [best]


def tuned_variants(
    label: str, base: MuGraph, us: float, backend: str, contiguous: Any
) -> tuple[list[tuple[str, MuGraph]], list[tuple[str, MuGraph]]]:
    """The variants of one timed µGraph `base` (`label`, `us` µs): at its own numbers (its
    meta's warps, loop split, tiles' rank) and at other numbers (µGraphs of their own: wide
    tiles, a combine over more blocks, on Triton a split over more parts), as (label, µGraph)
    lists. `contiguous`: the region's stored axes (`search.cost.stored_axes`)."""
    small = us <= SMALL_TUNING_US
    meta = [(f"{label} with {w} warps", {WARPS: w}) for w in warp_variants(base, few=small)]
    meta += [
        (f"{label} with its loop in {s} parts", {LOOP_SPLIT: s})
        for s in (split_variants(base, backend) if small else [])
    ]
    if full_rank_differs(base, backend):
        meta.append((f"{label} at its tiles' full rank", {FULL_RANK: True}))
    same = [(lb, MuGraph(base.ops, base.outputs, {**base.meta, **m})) for lb, m in meta]
    other = (
        wide_variants(base, backend, contiguous)
        + combine_variants(base)
        + (split_depth_variants(base) if backend == "triton" else [])
        + row_split_variants(base)
    )
    return same, [(f"{label}, {why}", h) for why, h in other]


def warp_variants(g: MuGraph, few: bool = True) -> list[int | tuple[int, ...]]:
    """The warps `select(tune_warps=True)` times the fastest µGraph with, beside the default:
    `TUNED_WARPS` for every kernel (and `FEW_WARPS`, with `few`), then, for 2 to
    `MAX_TUNED_LAUNCHES` launches, `TUNED_WARPS` for one launch at a time (a tuple per
    graph-defined kernel, in op order; `kernel_graph.WARPS`)."""
    from mirage_jax.lower.plan import KernelConfig

    kernels = [i for i, op in enumerate(g.ops) if op.block_graph is not None]
    group = g.grouped_kernels()
    launches = [[i] for i in kernels if i not in group] + [list(lv) for lv in g.launch_groups()]
    out: list[int | tuple[int, ...]] = [TUNED_WARPS, FEW_WARPS] if few else [TUNED_WARPS]
    if 2 <= len(launches) <= MAX_TUNED_LAUNCHES:
        default = KernelConfig().num_warps
        for launch in launches:
            out.append(tuple(TUNED_WARPS if i in launch else default for i in kernels))
    return out


def full_rank_differs(g: MuGraph, backend: str) -> bool:
    """Does a kernel of `g` lower otherwise at its tiles' full rank (`TritonConfig.squeeze`)?
    Then `select(tune_warps=True)` times it so too: on the H100 (2026-11-27) squeezed tiles
    took sdpa b=8's attention from 32.7 to 26.9 µs, but its causal form (a bias tile added to
    the scores) from 42.1 to 55.1 µs."""
    if backend != "triton":
        return False
    from mirage_jax.lower.kernel_graph import plan
    from mirage_jax.lower.squeeze import squeezed

    try:
        return any(squeezed(p)[1] for p in plan(g).values())
    except LoweringError:
        return False


def split_variants(g: MuGraph, backend: str) -> list[int]:
    """The loop splits `select(tune_warps=True)` times the fastest µGraph with: the smallest
    `MAX_SPLITS` of `SPLIT_PARTS` that the backend can apply to one of its kernels launched
    alone (`SPLIT_REFUSAL`), each kernel then running at most `SPLIT_BLOCKS_PER_SM` blocks
    per SM."""
    from mirage_jax.lower.kernel_graph import plan

    refusal = _split_refusal(backend)
    if refusal is None:
        return []
    try:
        plans = plan(g)
    except LoweringError:
        return []
    group = g.grouped_kernels()
    alone = [p for i, p in plans.items() if i not in group]
    out = []
    for s in SPLIT_PARTS:
        split = [p for p in alone if refusal(p, s) is None]
        if split and max(math.prod(p.grid) for p in split) * s <= SPLIT_BLOCKS_PER_SM * sm_count():
            out.append(s)
    return out[:MAX_SPLITS]


WIDE_ROW_BYTES = (256, 128)
"""The widths, in bytes along its stored rows, of the weight tile a `wide_variants` variant
reads per block and step (a decode GEMV, hand-written on the H100, 2026-11-26,
`gemv_probe_h100_2026-11-26za`: [1, 4096] × [4096, 6144] fp16 ran 19.6 µs at 128 columns ×
128 rows split 8 ways, 22.4 µs at 32 × 512 unsplit; the search's norm + QKV kernel of 16-column
tiles took 27.7)."""

WIDE_TILE_ELEMENTS = 1 << 14
"""Elements of the weight tiles (all alike weights together: gate and up) per block and loop
step in a `wide_variants` variant: 32 KB in fp16, so that three pipelining stages leave room
for two blocks per SM."""

WIDE_NK_TILE_ELEMENTS = (1 << 14, 1 << 12)
"""The tile sizes (elements a block and step) a weight stored [N, K] is re-tiled to. Equinox's
7B down projection, [4096, 11008] split 43 ways, on the H200: hand-written in 32 rows of 128
columns (8 KB) 26.2-26.4 µs (`gemv_probe_h200_2026-11-28_nk`); our µGraph at those tiles 27.2
µs, at 128 rows 30.0 (`never_slower_h200_2026-11-29_s34_7b_b1_cut_debug.log`)."""

WIDE_MIN_BYTES = 1 << 20
"""`wide_variants` re-tiles only µGraphs whose kernels' largest inputs (weights) add up to at
least this many bytes, and in them each kernel whose weights make at least half of what it
reads."""

FILL_PER_SM = 2
"""`wide_variants` splits a re-tiled kernel's loop until its launch runs this many blocks per
SM (or `SPLIT_PARTS` runs out)."""


def sm_count() -> int:
    """The GPU's SMs (132 on an H100 SXM where jax does not say)."""
    try:
        import jax

        return int(getattr(jax.devices()[0], "core_count", 0) or 132)
    except Exception:  # no backend: the H100's count
        return 132


def _wide_numbers(
    g: MuGraph,
    op: Any,
    row_bytes: int,
    contiguous: Mapping[int, int],
    nk_tile: int = WIDE_TILE_ELEMENTS,
) -> tuple[tuple[int, ...], int] | None:
    """(grid, loop) for a kernel whose largest input (a weight) is then read in tiles
    `row_bytes` wide along its stored rows and `WIDE_TILE_ELEMENTS` in all per loop step; None
    where the kernel is no decode GEMV (its weights less than half of what it reads), reads
    them `row_bytes` wide already, or its maps do not allow it. A weight stored [N, K] (the loop
    along its stored rows, the grid over N: equinox's `Linear`) gets fewer rows a block, as
    many as make its step's tiles `nk_tile` elements.
    `contiguous`: region input -> its axis contiguous in memory, where it is not the last (an
    input read in place through a view: `cost.stored_axes`)."""
    import numpy as np

    bg = op.block_graph
    sizes = [math.prod(b.shape) * np.dtype(b.dtype).itemsize for b in bg.inputs]
    k = max(range(len(sizes)), key=sizes.__getitem__)
    w = bg.inputs[k]
    alike = (w.shape, w.imap, w.forloop_dim)  # gate and up: two weights alike
    like = [n for b, n in zip(bg.inputs, sizes) if (b.shape, b.imap, b.forloop_dim) == alike]
    if 2 * sum(like) < sum(sizes) or w.forloop_dim is None:
        return None
    src = g.ops[op.args[k][0]]
    at = src.param("index") if src.op == "input" else None
    last, fd = contiguous.get(at, len(w.shape) - 1), w.forloop_dim
    width = row_bytes // np.dtype(w.dtype).itemsize
    if last not in w.imap and fd != last:
        return None
    grid = list(bg.grid)
    other = [d for d in range(len(w.shape)) if d not in (last, fd) and w.shape[d] > 1]
    if fd == last:  # the loop walks the stored rows: steps at least `width` wide
        part = w.shape[fd] // (grid[w.imap.index(fd)] if fd in w.imap else 1)  # a block's
        if part // bg.forloop_range >= width or part % width:
            return None
        if other:  # [N, K] stored: the grid splits N; fewer rows a block, wider steps
            if len(other) > 1 or other[0] not in w.imap:
                return None
            axis = w.imap.index(other[0])
            rows = min(w.shape[other[0]] // grid[axis], nk_tile // len(like) // width)
            if w.shape[other[0]] % rows:
                return None
            grid[axis] = w.shape[other[0]] // rows
        return tuple(grid), part // width
    if other or w.shape[last] % width or w.shape[last] < width:
        return None
    # the grid splits the stored rows: tiles `width` wide, the loop walks the rest
    grid[w.imap.index(last)] = w.shape[last] // width
    rows = WIDE_TILE_ELEMENTS // len(like) // width  # the step's weight tiles: 32 KB in all
    if w.shape[fd] % rows:
        return None
    return tuple(grid), max(1, w.shape[fd] // rows)


def wide_variants(
    g: MuGraph, backend: str, contiguous: Mapping[int, int] | None = None
) -> list[tuple[str, MuGraph]]:
    """The same µGraph at other numbers for its decode GEMV kernels: weight tiles
    `WIDE_ROW_BYTES` wide along the stored rows (the search's cheapest instances read them in
    32-128 B pieces), with the loop split (`LOOP_SPLIT`) until each launch fills the GPU
    (`FILL_PER_SM`) where `backend` splits loops; labelled, for `select(tune_warps=True)` to
    time (and verify where one wins). `contiguous`: as `_wide_numbers` takes it (default:
    every input row-major)."""
    import numpy as np

    from mirage_jax.lower.kernel_graph import LOOP_SPLIT
    from mirage_jax.mugraph import MuGraphError
    from mirage_jax.mugraph.resize import with_numbers

    weights = sum(
        max(math.prod(b.shape) * np.dtype(b.dtype).itemsize for b in op.block_graph.inputs)
        for _, op in g.graph_defined()
    )
    if weights < WIDE_MIN_BYTES:
        return []
    group = g.grouped_kernels()
    out: list[tuple[str, MuGraph]] = []
    seen = set()
    for row_bytes, nk_tile in itertools.product(WIDE_ROW_BYTES, WIDE_NK_TILE_ELEMENTS):
        numbers = {}
        for i, op in g.graph_defined():
            n = _wide_numbers(g, op, row_bytes, contiguous or {}, nk_tile)
            if n is not None and n != (tuple(op.block_graph.grid), op.block_graph.forloop_range):
                numbers[i] = n
        if not numbers:
            continue
        try:
            h = with_numbers(g, numbers)
        except (MuGraphError, ValueError):
            continue
        blocks = _launch_blocks(h, group)
        loops = [op.block_graph.forloop_range for _, op in h.graph_defined()]
        splits = 1
        for s in SPLIT_PARTS if _split_refusal(backend) is not None else ():
            if max(blocks) * splits >= FILL_PER_SM * sm_count():
                break
            if any(f % s for f in loops):
                break
            splits = s
        meta = {**h.meta, LOOP_SPLIT: splits} if splits > 1 else dict(h.meta)
        h = MuGraph(h.ops, h.outputs, meta)
        key = (h.canonical_hash, splits)
        if key in seen:
            continue
        seen.add(key)
        label = (
            f"weights read {row_bytes} B wide"
            + (f" ({nk_tile // 1024}K-element tiles)" if nk_tile != WIDE_TILE_ELEMENTS else "")
            + (f", loop in {splits} parts" if splits > 1 else "")
        )
        out.append((label, h))
    return out


def _split_refusal(backend: str) -> Any:
    """`backend`'s `SPLIT_REFUSAL` (why a plan's loop cannot be split over the grid; Triton's),
    or None where it splits no loop or cannot be loaded."""
    from mirage_jax.lower import backends

    try:
        return getattr(backends.get(backend).load(), "SPLIT_REFUSAL", None)
    except (backends.UnknownBackend, ImportError, LoweringError):
        return None


def _launch_blocks(g: MuGraph, group: set[int]) -> list[int]:
    """Blocks per launch: the one-launch group's together, each other kernel's alone."""
    kernels = g.graph_defined()
    alone = [math.prod(op.block_graph.grid) for i, op in kernels if i not in group]
    grouped = sum(math.prod(op.block_graph.grid) for i, op in kernels if i in group)
    return alone + ([grouped] if grouped else [])


COMBINE_DIM_MAX = 32
"""`combine_variants` gives a split's combining kernel one block per row of each output dim
of at most this many rows (heads, query groups)."""


def _combines(g: MuGraph) -> dict[int, list[tuple[int, int]]]:
    """The kernels of `g` that combine another kernel's partials, each with the (producer,
    grid axis) pairs it combines along: it loops over a dim of the producer's output that the
    producer's grid axis is split along."""
    kernels = dict(g.graph_defined())
    out: dict[int, list[tuple[int, int]]] = {}
    for i, op in kernels.items():
        for a, b in zip(op.args, op.block_graph.inputs):
            if a[0] not in kernels or b.forloop_dim is None:
                continue
            omap = kernels[a[0]].block_graph.outputs[a[1]].omap
            if b.forloop_dim in omap:
                out.setdefault(i, []).append((a[0], omap.index(b.forloop_dim)))
    return out


def _combine_grid(g: MuGraph, i: int) -> tuple[int, ...]:
    """Combining kernel i's grid with one block per row of each output dim it splits, where
    that dim has at most `COMBINE_DIM_MAX` rows."""
    bg = g.ops[i].block_graph
    grid = list(bg.grid)
    for axis in range(len(grid)):
        if any(o.omap[axis] is None for o in bg.outputs):
            continue  # an axis no output is split along
        rows = {g.shapes[(i, j)][0][o.omap[axis]] for j, o in enumerate(bg.outputs)}
        if len(rows) == 1 and max(rows) <= COMBINE_DIM_MAX:
            grid[axis] = max(grid[axis], rows.pop())
    return tuple(grid)


def _resized(g: MuGraph, numbers: dict) -> MuGraph | None:
    from mirage_jax.mugraph import MuGraphError
    from mirage_jax.mugraph.resize import with_numbers

    try:
        return with_numbers(g, numbers)
    except (MuGraphError, ValueError):
        return None


def combine_variants(g: MuGraph) -> list[tuple[str, MuGraph]]:
    """The µGraph with its splits' combining kernels over more blocks (`_combine_grid`), where
    that launches at most `SPLIT_BLOCKS_PER_SM` blocks per SM (Llama-7B decode attention at
    b=1, H100, 2026-11-26: its combine over 16 partials took 2.5 µs in 16 blocks, 1.9 in 32;
    `attention_numbers_probe_h100_2026-11-26zv`); labelled, for `select(tune_warps=True)` to
    time (and verify if it wins)."""
    numbers = {}
    for i in _combines(g):
        bg = g.ops[i].block_graph
        grid = _combine_grid(g, i)
        if grid != bg.grid and math.prod(grid) <= SPLIT_BLOCKS_PER_SM * sm_count():
            numbers[i] = (grid, bg.forloop_range)
    h = _resized(g, numbers) if numbers else None
    if h is None:
        return []
    grids = ", ".join(str(n[0]) for n in numbers.values())
    return [(f"its combine over grid {grids}", h)]


def split_depth_variants(g: MuGraph) -> list[tuple[str, MuGraph]]:
    """The µGraph with a split kernel over more parts, for a combine lowered flat (Triton,
    `triton_flat`): S parts of F loop steps become S·F parts of one step (the same tiles,
    no loop), and 2S parts of F/2 steps; its combine loops over the parts, on the grid of
    `_combine_grid`.

    On the H100 (2026-11-27, Llama-7B b=1 decode attention, `split_parts_probe_h100_2026-11-27`)
    the split kernel took 9.7 µs at 16 parts (8 warps), 8.9-9.0 at 32 and 8.8 at 64 (4 warps),
    and its combine, flat, 1.9-2.3 µs at any of them: 11.0 µs at 64 parts against 11.6 at 16
    (the search numbers the split for a combine that loops, which costs a step per part)."""
    from mirage_jax.lower.triton_flat import FLAT_MAX_STEPS

    out = []
    seen = set()
    every: dict[int, dict] = {0: {}, 1: {}}  # each split deepened at once, per option
    for i, pairs in _combines(g).items():
        if len({a for a, _ in pairs}) != 1 or len({x for _, x in pairs}) != 1:
            continue  # one producer split along one axis
        (a, axis), combine = pairs[0], g.ops[i].block_graph
        bg = g.ops[a].block_graph
        S, F = bg.grid[axis], bg.forloop_range
        for option, (parts, steps) in enumerate(((S * F, 1), (2 * S, max(1, F // 2)))):
            m = parts // S
            grid = tuple(parts if x == axis else n for x, n in enumerate(bg.grid))
            loop = combine.forloop_range * m
            if m < 2 or loop > FLAT_MAX_STEPS:
                continue
            if math.prod(grid) > SPLIT_BLOCKS_PER_SM * sm_count():
                continue
            numbers = {a: (grid, steps), i: (_combine_grid(g, i), loop)}
            every[option].update(numbers)
            if (parts, steps) in seen:
                continue
            seen.add((parts, steps))
            h = _resized(g, numbers)
            if h is not None:
                out.append((f"its split over {parts} parts of {steps} step(s)", h))
    # several splits (the stitched split projections of a norm + Q/K/V): all of them deeper
    for option, numbers in every.items():
        if len(numbers) > 2:
            h = _resized(g, numbers)
            if h is not None:
                how = "of one step" if option == 0 else "twice the parts"
                out.append((f"its {len(numbers) // 2} splits deeper ({how})", h))
    return out


ROW_SPLIT_MIN_ROWS = 128
"""`row_split_variants` halves tiles of at least this many rows."""


def row_split_variants(g: MuGraph) -> list[tuple[str, MuGraph]]:
    """The µGraph with each looping matmul kernel that runs at most one block per SM over
    twice the blocks along its output rows (tiles of at least `ROW_SPLIT_MIN_ROWS` rows
    halved): two blocks per SM hide the latency of a short loop. On the H100 (2026-11-27,
    `stable_split_probe_h100_2026-11-27`) gqa_stable's split kernel at b=8 took 20.7 µs in 128
    blocks of 128 rows and 15.7 in 256 of 64 (4 warps), gqa's 18.8 and 13.7."""
    numbers = {}
    for i, op in g.graph_defined():
        bg = op.block_graph
        if bg.forloop_range < 2 or bg.num_blocks > sm_count():
            continue
        if not any(b.op == "matmul" for b in bg.ops):
            continue
        for axis in range(len(bg.grid)):
            if any(b.imap[axis] is not None and b.imap[axis] == b.forloop_dim for b in bg.inputs):
                continue  # a split reduction (its partials' axis)
            if any(o.omap[axis] is None for o in bg.outputs):
                continue
            rows = {
                g.shapes[(i, j)][0][o.omap[axis]] // bg.grid[axis] for j, o in enumerate(bg.outputs)
            }
            if len(rows) == 1 and rows.pop() >= ROW_SPLIT_MIN_ROWS:
                grid = tuple(2 * n if x == axis else n for x, n in enumerate(bg.grid))
                numbers[i] = (grid, bg.forloop_range)
                break
    h = _resized(g, numbers) if numbers else None
    if h is None:
        return []
    grids = ", ".join(str(n[0]) for n in numbers.values())
    return [(f"its rows over twice the blocks, grid {grids}", h)]


def speculative_variant(g: MuGraph, backend: str) -> MuGraph | None:
    """`g` with its online softmax against its first step's max (`SPECULATIVE_MAX`), where a
    kernel of it has one that can (`lower.speculative_max.for_plan`, Triton), else None.
    `select` times it after the other variants, for whichever won: on the H100 (2026-11-27,
    `stable_split_probe_h100_2026-11-27b`) gqa_stable's split kernel at b=8 took 14.2 µs so
    against 15.8 with the running max (gqa's unstable one 13.6), but at 128 x 64 tiles with 8
    warps 19.8 against 15.9."""
    if backend != "triton" or g.meta.get(SPECULATIVE_MAX):
        return None
    from mirage_jax.lower.kernel_graph import plan
    from mirage_jax.lower.speculative_max import Speculation, for_plan

    try:
        plans = plan(g)
    except LoweringError:
        return None
    if any(isinstance(for_plan(p), Speculation) for p in plans.values()):
        return MuGraph(g.ops, g.outputs, {**g.meta, SPECULATIVE_MAX: True})
    return None


ROW_MAJOR_MIN_US = 200.0
"""The shortest winner `select` also times launched row-major (`row_major_variant`): the
blocks running at once can outgrow the L2 cache only where a kernel reads much."""


def row_major_variant(g: MuGraph, backend: str, us: float) -> MuGraph | None:
    """`g` with its kernels' blocks launched in row-major order of their grids (`ROW_MAJOR`),
    where it took at least `ROW_MAJOR_MIN_US` and a kernel of it launched alone has a grid of
    two axes or more (Triton), else None. `select` times it after the other variants. On the H100
    (2026-11-28) sdpa at Llama-7B size and batch 8 ran its 8 × 8 × 128 blocks batch-fastest:
    the 264 blocks running at once read the keys and values of 64 heads, 128 MB against a
    50 MB L2."""
    if backend != "triton" or g.meta.get(ROW_MAJOR) or us < ROW_MAJOR_MIN_US:
        return None
    group = g.grouped_kernels()  # launched together: their launch keeps its own order
    grids = [op.block_graph.grid for i, op in g.graph_defined() if i not in group]
    if not any(sum(n > 1 for n in grid) >= 2 for grid in grids):
        return None
    return MuGraph(g.ops, g.outputs, {**g.meta, ROW_MAJOR: True})
