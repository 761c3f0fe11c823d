"""Shape inference and validation of µGraphs: every broken rule names the op and the rule.

It reads a µGraph by its fields (ops, block graphs, maps), so `graph.py` builds on it.

Structural rules (always checked by shape inference): uneven split, grid axis mapped twice,
map entries out of range, output not accumulated, output replicated along a grid axis it must
split, loop and accumulated tensors mixed, shape rules of each op. Resource rules (checked by
`validate(g, target=...)`): too many blocks, tiles too large for the target's shared memory,
block matmuls over a batch of tiles (the backends' dots are 2-D).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from mirage_jax.mugraph.opdef import matmul_operand_dtype
from mirage_jax.mugraph.ops import OPS, POST_LOOP_ARGS, ShapeError

# `graph.py` re-exports these: this module sits below it (it reads µGraphs by their fields).
GRID_AXES = ("x", "y", "z")
Ref = tuple[int, int]
BlockGraph = MuGraph = Any  # `mirage_jax.mugraph.graph`'s classes (annotations only)


class MuGraphError(ValueError):
    """An ill-formed µGraph; the message names the op and the rule broken."""


class KernelLimitError(MuGraphError):
    """A graph-defined kernel past a target's limits; `grid` and `loop` are its block graph's
    (the search skips other numbers that give that kernel the same tiles)."""

    def __init__(self, message: str, grid: tuple[int, ...], loop: int):
        super().__init__(message)
        self.grid, self.loop = grid, loop

    def __reduce__(self):
        return (KernelLimitError, (str(self), self.grid, self.loop))


GRID_RANK = 3  # the vectorised form always has 3 grid axes (missing ones have size 1)


@dataclass(frozen=True)
class Target:
    """Launch limits of a GPU: shared memory per block (bytes) and blocks per kernel."""

    name: str
    smem_bytes: int
    max_blocks: int = 4096


TARGETS = {
    "h100": Target("h100", 227 * 1024),
    "a100": Target("a100", 163 * 1024),
    "mirage": Target("mirage", 96 * 1024),  # the original search's MAX_SMEM_SIZE
}


@dataclass(frozen=True)
class BlockInfo:
    """Static facts about each block tensor (inputs first, then ops) of a BlockGraph.

    `batch` is the vectorised batch shape: (gx, gy, gz, F) for a loop tensor, (gx, gy, gz) for
    an accumulated one, with 1 where the value does not vary along that axis.
    """

    tiles: tuple[tuple[int, ...], ...]
    batch: tuple[tuple[int, ...], ...]
    post: tuple[bool, ...]
    dtypes: tuple[str, ...]
    grid3: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    smem_bytes: int

    def full(self, t: int) -> tuple[int, ...]:
        return (*self.batch[t], *self.tiles[t])


def _axis(a: int) -> str:
    return GRID_AXES[a] if a < len(GRID_AXES) else str(a)


def _check_map(where: str, kind: str, m, grid, rank) -> None:
    if len(m) != len(grid):
        raise MuGraphError(f"{where}: {kind} has {len(m)} entries for a grid of {len(grid)} axes")
    seen: dict[int, int] = {}
    for a, d in enumerate(m):
        if d is None:
            continue
        if not 0 <= d < rank:
            raise MuGraphError(
                f"{where}: {kind} maps grid axis {_axis(a)} to dim {d}, out of range for rank {rank}"
            )
        if d in seen:
            raise MuGraphError(
                f"{where}: grid axis mapped twice: {kind} maps grid axes {_axis(seen[d])} and {_axis(a)} to the same dim {d}"
            )
        seen[d] = a


def narrower_float(dtype: str, than: str) -> bool:
    """Is `dtype` a float dtype with fewer bytes than the float dtype `than`?"""
    floats = ("float16", "bfloat16", "float32", "float64")
    return dtype in floats and than in floats and np.dtype(dtype).itemsize < np.dtype(than).itemsize


def result_dtype(dtypes: Sequence[str]) -> str:
    """The dtype of a block op's result: its operands' one dtype, or, where they differ (an
    fp32 residual stream normalised and multiplied by fp16 weights), the widest of them (fp32
    for fp16 with bf16): every op computes in fp32, so nothing is rounded that the program
    keeps."""
    kinds = set(dtypes)
    if len(kinds) == 1:
        return dtypes[0]
    sizes = {np.dtype(d).itemsize for d in kinds}
    widest = [d for d in kinds if np.dtype(d).itemsize == max(sizes)]
    return widest[0] if len(widest) == 1 else "float32"


def block_info(bg: BlockGraph) -> BlockInfo:
    """Infer tile shapes of a BlockGraph, or raise MuGraphError naming the op and rule. Kept on
    the (frozen) block graph once inferred: the search's numbering asks it of each kernel many
    times as it builds and validates a µGraph, and the shared cache below must hash the whole
    graph to answer."""
    info = bg.__dict__.get("_block_info")
    if info is None:
        info = _block_info(bg)
        object.__setattr__(bg, "_block_info", info)
    return info


@lru_cache(maxsize=4096)
def _block_info(bg: BlockGraph) -> BlockInfo:
    grid, F = bg.grid, bg.forloop_range
    if not 1 <= len(grid) <= GRID_RANK or any(int(g) < 1 for g in grid):
        raise MuGraphError(f"block graph: grid {grid} must have 1 to 3 axes, each >= 1")
    if F < 1:
        raise MuGraphError(f"block graph: forloop_range {F} must be >= 1")
    grid3 = (*grid, *(1,) * (GRID_RANK - len(grid)))
    tiles, batch, post, dtypes = [], [], [], []
    for k, b in enumerate(bg.inputs):
        where = f"block input {k} {list(b.shape)}"
        rank = len(b.shape)
        _check_map(where, "imap", b.imap, grid, rank)
        f = b.forloop_dim
        if f is not None and not 0 <= f < rank:
            raise MuGraphError(f"{where}: forloop_dim {f} out of range for rank {rank}")
        tile = list(b.shape)
        for a, d in enumerate(b.imap):
            if d is not None:
                if tile[d] % grid[a]:
                    raise MuGraphError(
                        f"{where}: uneven split: dim {d} of size {b.shape[d]} by grid axis {_axis(a)} = {grid[a]}"
                    )
                tile[d] //= grid[a]
        if f is not None:
            if tile[f] % F:
                raise MuGraphError(
                    f"{where}: uneven split: dim {f} (per-block size {tile[f]}) by forloop_range {F}"
                )
            tile[f] //= F
        tiles.append(tuple(tile))
        bt = [
            grid3[a] if a < len(b.imap) and b.imap[a] is not None else 1 for a in range(GRID_RANK)
        ]
        batch.append((*bt, F if f is not None else 1))
        post.append(False)
        dtypes.append(b.dtype)
    n_in = len(bg.inputs)
    for k, op in enumerate(bg.ops):
        where = f"block op {k} ({op.op})"
        spec = OPS.get(op.op)
        if spec is None or "block" not in spec.levels:
            raise MuGraphError(f"{where}: unknown block-level op {op.op!r}")
        if spec.arity is not None and len(op.args) != spec.arity:
            raise MuGraphError(f"{where}: takes {spec.arity} args, got {len(op.args)}")
        if not op.args or any(not 0 <= a < n_in + k for a in op.args):
            raise MuGraphError(f"{where}: refers to a later or invalid tensor {op.args}")
        for p in spec.params:
            if op.param(p) is None:
                raise MuGraphError(f"{where}: missing param {p!r}")
        if op.op in POST_LOOP_ARGS:  # the rescaled sums of online softmax
            shift = bg.op_of(op.args[2])
            if shift is None or shift.op != "accum_max" or shift.args != (op.args[1],):
                raise MuGraphError(
                    f"{where}: the final shift (argument 2) must be accum_max of the "
                    f"per-iteration shift (argument 1, tensor {op.args[1]})"
                )
        if op.op == "accum_keep" and batch[op.args[0]][GRID_RANK] != 1:
            raise MuGraphError(
                f"{where}: accum_keep carries a loop-invariant tile past the loop, but tensor "
                f"{op.args[0]} changes with the loop (it reads an input with a forloop_dim); "
                "accumulate it with accum_sum instead"
            )
        if spec.kind == "accum":
            want_post = POST_LOOP_ARGS.get(op.op, ())
            for i, a in enumerate(op.args):
                if post[a] != (i in want_post):
                    what = "an accumulated tensor" if post[a] else "a loop tensor"
                    raise MuGraphError(
                        f"{where}: argument {i} is {what}; accumulators take loop tensors (and the final shift accumulated)"
                    )
        elif len({post[a] for a in op.args}) > 1:
            raise MuGraphError(
                f"{where}: mixes loop tensors with accumulated tensors {list(op.args)}"
            )
        try:
            tile = spec.shape([tiles[a] for a in op.args], dict(op.params))
        except ShapeError as e:
            raise MuGraphError(f"{where}: {e}") from None
        bts = [batch[a] for a in op.args if not (spec.kind == "accum" and post[a])]
        bt = tuple(max(ds) for ds in zip(*bts))
        if spec.kind == "accum":
            bt = bt[:GRID_RANK]
        tiles.append(tuple(tile))
        batch.append(bt)
        post.append(spec.kind == "accum" or post[op.args[0]])
        dtypes.append(result_dtype([dtypes[a] for a in op.args]))
    out_shapes = []
    for j, o in enumerate(bg.outputs):
        where = f"block output {j}"
        if not 0 <= o.arg < len(tiles):
            raise MuGraphError(f"{where}: refers to an invalid tensor {o.arg}")
        if not post[o.arg]:
            raise MuGraphError(
                f"{where}: output not accumulated: tensor {o.arg} is a loop tensor (add a for-loop accumulator)"
            )
        tile = tiles[o.arg]
        _check_map(where, "omap", o.omap, grid, len(tile))
        shape = list(tile)
        for a, g in enumerate(grid):
            d = o.omap[a]
            if d is None:
                if g > 1:
                    raise MuGraphError(
                        f"{where}: replicated along grid axis {_axis(a)} (size {g}) it must split: omap[{_axis(a)}] is None"
                    )
            else:
                shape[d] *= g
        out_shapes.append(tuple(shape))
    smem = sum(int(np.prod(t)) * np.dtype(dt).itemsize for t, dt in zip(tiles, dtypes))
    return BlockInfo(
        tuple(tiles), tuple(batch), tuple(post), tuple(dtypes), grid3, tuple(out_shapes), smem
    )


def kernel_shapes(
    g: MuGraph, known: dict[Ref, tuple[tuple[int, ...], str]] | None = None
) -> dict[Ref, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every kernel tensor, or MuGraphError naming the op and rule. `known`:
    the shapes of a prefix of `g`'s ops already inferred (a builder's), not inferred again."""
    out: dict[Ref, tuple[tuple[int, ...], str]] = dict(known or {})
    for i, op in enumerate(g.ops):
        if (i, 0) in out:
            continue
        where = f"kernel op {i} ({op.op})"
        if any(a not in out for a in op.args):
            raise MuGraphError(f"{where}: refers to a later or invalid tensor {op.args}")
        args = [out[a] for a in op.args]
        if op.op == "input":
            out[(i, 0)] = (tuple(op.param("shape")), op.param("dtype"))
        elif op.op == "graph_defined":
            bg = op.block_graph
            if bg is None:
                raise MuGraphError(f"{where}: has no block graph")
            if len(args) != len(bg.inputs):
                raise MuGraphError(f"{where}: {len(args)} args for {len(bg.inputs)} block inputs")
            for k, ((shape, dt), b) in enumerate(zip(args, bg.inputs)):
                if tuple(shape) != b.shape or dt != b.dtype:
                    raise MuGraphError(
                        f"{where}: arg {k} is {dt}{list(shape)} but block input {k} expects {b.dtype}{list(b.shape)}"
                    )
            try:
                info = block_info(bg)
            except MuGraphError as e:
                raise MuGraphError(f"{where}: {e}") from None
            for j, s in enumerate(info.output_shapes):
                o = bg.outputs[j]
                if o.dtype and not narrower_float(o.dtype, info.dtypes[o.arg]):
                    raise MuGraphError(
                        f"{where}: output {j} is stored as {o.dtype}, which is no float dtype "
                        f"narrower than its tensor's {info.dtypes[o.arg]}"
                    )
                out[(i, j)] = (s, o.dtype or info.dtypes[o.arg])
        else:
            spec = OPS.get(op.op)
            if spec is None or "kernel" not in spec.levels:
                raise MuGraphError(f"{where}: unknown kernel-level op {op.op!r}")
            if spec.arity is not None and len(args) != spec.arity:
                raise MuGraphError(f"{where}: takes {spec.arity} args, got {len(args)}")
            for p in spec.params:
                if op.param(p) is None:
                    raise MuGraphError(f"{where}: missing param {p!r}")
            dtype = args[0][1]
            if len({dt for _, dt in args}) > 1:
                # a GEMM reading a stitched piece's fp32 value with 16-bit weights rounds it
                # first, as the program did where it cut (`opdef.matmul_operand_dtype`)
                dtype = matmul_operand_dtype([dt for _, dt in args]) if op.op == "matmul" else None
                if dtype is None:
                    raise MuGraphError(f"{where}: operand dtypes differ: {[dt for _, dt in args]}")
            try:
                shape = spec.shape([s for s, _ in args], dict(op.params))
            except ShapeError as e:
                raise MuGraphError(f"{where}: {e}") from None
            out[(i, 0)] = (tuple(shape), dtype)
    for r in g.outputs:
        if r not in out:
            raise MuGraphError(f"output {r} refers to an invalid tensor")
    return out


def validate(g: MuGraph, target: Target | str | None = None) -> None:
    """Check every rule; with a `target` (a Target or "h100"/"a100"/"mirage") also its limits."""
    kernel_shapes(g)
    if target is None:
        return
    if isinstance(target, str):
        target = TARGETS[target]
    for i, op in g.graph_defined():
        info = block_info(op.block_graph)
        where = f"kernel op {i} (graph_defined)"
        n = op.block_graph.num_blocks
        if n > target.max_blocks:
            raise KernelLimitError(
                f"{where}: too many blocks: grid {op.block_graph.grid} has {n} > {target.max_blocks} ({target.name})",
                op.block_graph.grid,
                op.block_graph.forloop_range,
            )
        if info.smem_bytes > target.smem_bytes:
            raise KernelLimitError(
                f"{where}: tile too large for shared memory: {info.smem_bytes} bytes > {target.smem_bytes} ({target.name})",
                op.block_graph.grid,
                op.block_graph.forloop_range,
            )
        for k, bop in enumerate(op.block_graph.ops):
            if bop.op not in ("matmul", "concat_matmul"):
                continue
            for a in bop.args:
                if any(s != 1 for s in info.tiles[a][:-2]):
                    raise KernelLimitError(
                        f"{where}: block op {k} ({bop.op}) multiplies a batch of tiles "
                        f"({list(info.tiles[a])}): block matmuls are 2-D in both backends; "
                        "split the batch dims over the grid",
                        op.block_graph.grid,
                        op.block_graph.forloop_range,
                    )
