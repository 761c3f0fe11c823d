"""Kernel plans: the backend-independent analysis of one block graph before code generation.

A `KernelPlan` says, for every block tensor, its tile, its padded (power-of-two) tile, its phase
("pre": loop-invariant, computed once before the for-loop; "loop": per iteration; "post":
after the accumulators), and for every kernel argument and output, how each dim maps to the
grid, the loop and memory (`Dim`). Padding classes come from a union-find over (tensor, dim):
dims that must agree (elementwise operands, matmul M/N/K, kept dims of reductions) share one
padded size: the next power of two, at least 16 for the M/N/K of a tensor-core dot. Padded
lanes are loaded as 0 and re-masked before every op that sums or maxes across them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.cluster.hierarchy import DisjointSet

from mirage_jax.lower.registry import LoweringError
from mirage_jax.mugraph import BlockGraph, BlockInfo, MuGraphError, block_info
from mirage_jax.mugraph.ops import OPS


class SharedMemoryError(LoweringError):
    """The padded tiles of one loop step do not fit in shared memory."""


MIN_DOT = 16
"""Triton's tl.dot needs M, N, K >= 16."""
MAX_TILE_ELEMENTS = 1 << 18
"""Largest in-register tile (elements) a plan accepts; beyond it Triton spills or never ends."""
SMEM_BUDGET = 200 * 1024
"""Shared memory the input tiles may take (the H100 has 227 KiB a block; Triton needs some)."""
FMA_MAX_ELEMENTS = 1 << 15
"""Largest M·K·N of a matmul done as a broadcast multiply-sum on CUDA cores."""


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class KernelConfig:
    """The tuning knobs both backends share, validated once (see PallasConfig/TritonConfig)."""

    num_warps: int = 4
    num_stages: int = 3
    loop_unroll: int = 1
    min_dot: int = MIN_DOT

    def __post_init__(self):
        if self.min_dot < MIN_DOT or self.min_dot != next_pow2(self.min_dot):
            raise ValueError(f"min_dot must be a power of two >= {MIN_DOT}, got {self.min_dot}")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"num_warps must be a power of two <= 32, got {self.num_warps}")
        if self.num_stages < 1 or self.loop_unroll < 1:
            raise ValueError("num_stages and loop_unroll must be >= 1")


@dataclass(frozen=True)
class Dim:
    """One dim of a kernel argument or output as one block sees it.

    Arguments:
        size: the whole tensor's size.
        tile: per-iteration tile (what one block op sees).
        pad: the padded tile held in registers (a power of two >= tile).
        axis: the grid axis that splits this dim, or None.
        loop: whether the for-loop walks this dim (inputs only).
        forloop_range: F, the number of iterations.
    """

    size: int
    tile: int
    pad: int
    axis: int | None
    loop: bool
    forloop_range: int = 1

    @property
    def extent(self) -> int:
        """Elements of this dim one block reads or writes over all iterations."""
        return self.tile * (self.forloop_range if self.loop else 1)

    @property
    def masked(self) -> bool:
        """Whether loads/stores along this dim need a mask (padded lanes)."""
        return self.pad != self.tile


@dataclass(frozen=True)
class MatmulPlan:
    """How one block matmul runs: "mma" (tl.dot), "outer" (K = 1) or "fma" (multiply-sum)."""

    path: str
    m: int
    k: int
    n: int


@dataclass(frozen=True)
class KernelPlan:
    """Everything code generation needs about one graph-defined kernel (see module doc)."""

    bg: BlockGraph
    info: BlockInfo
    pads: tuple[tuple[int, ...], ...]
    phases: tuple[str, ...]
    inputs: tuple[tuple[Dim, ...], ...]
    outputs: tuple[tuple[Dim, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    matmuls: dict[int, tuple[MatmulPlan, ...]]
    shifts: dict[int, int]
    retiled_from: BlockGraph | None = None

    @property
    def n_in(self) -> int:
        return len(self.bg.inputs)

    @property
    def grid(self) -> tuple[int, ...]:
        return self.bg.grid

    @property
    def forloop_range(self) -> int:
        return self.bg.forloop_range

    def tile(self, t: int) -> tuple[int, ...]:
        return self.info.tiles[t]

    def dtype(self, t: int) -> str:
        return self.info.dtypes[t]

    def op(self, t: int):
        return self.bg.ops[t - self.n_in]

    @cached_property
    def accumulators(self) -> tuple[int, ...]:
        """Block tensor ids of the for-loop accumulators, in op order."""
        return tuple(
            self.n_in + k for k, op in enumerate(self.bg.ops) if OPS[op.op].kind == "accum"
        )

    def masked(self, t: int, d: int) -> bool:
        return self.pads[t][d] != self.info.tiles[t][d]

    def register_bytes(self) -> int:
        """A rough count of live fp32 register bytes: accumulators plus the largest tile."""
        acc = sum(4 * math.prod(self.pads[t]) for t in self.accumulators)
        big = max(4 * math.prod(p) for p in self.pads)
        fma = max(
            (4 * m.m * m.k * m.n for ms in self.matmuls.values() for m in ms if m.path == "fma"),
            default=0,
        )
        return acc + max(big, fma)

    def input_bytes(self, loop: bool) -> int:
        """Bytes of the padded input tiles one iteration loads (`loop`) or the block loads once."""
        return sum(
            math.prod(d.pad for d in dims) * np.dtype(b.dtype).itemsize
            for dims, b in zip(self.inputs, self.bg.inputs)
            if (b.forloop_dim is not None) == loop
        )

    def stages(self, requested: int, smem_bytes: int = SMEM_BUDGET) -> int:
        """Pipelining depth that fits: Triton stages each iteration's loads in shared memory.

        Raises SharedMemoryError when even one stage (plus the loop-invariant tiles) cannot fit.
        """
        once, per_iter = self.input_bytes(False), self.input_bytes(True)
        if once + per_iter > smem_bytes:
            raise SharedMemoryError(
                f"block tiles need {once + per_iter} bytes of shared memory per stage "
                f"> {smem_bytes}: choose a larger grid or forloop_range"
            )
        if self.forloop_range == 1 or per_iter == 0:
            return requested
        return max(1, min(requested, (smem_bytes - once) // per_iter))


def _where(bg: BlockGraph, t: int) -> str:
    n_in = len(bg.inputs)
    if t < n_in:
        return f"block input {t}"
    return f"block op {t - n_in} ({bg.ops[t - n_in].op})"


def plan_kernel(
    bg: BlockGraph, where: str = "graph-defined kernel", min_dot: int = MIN_DOT
) -> KernelPlan:
    """Analyse a block graph; LoweringError (naming the op and rule) if it cannot be lowered.

    `min_dot` is the smallest padded M/N/K of a tensor-core dot (>= 16, a power of two).
    """
    try:
        info = block_info(bg)
    except MuGraphError as e:
        raise LoweringError(f"{where}: invalid block graph: {e}") from None
    tiles = info.tiles
    n_in = len(bg.inputs)
    classes = DisjointSet()  # (tensor, dim) pairs that must pad alike
    dot_roots: set = set()

    def tie(a: int, da: int, b: int, db: int) -> None:
        sa, sb = tiles[a][da], tiles[b][db]
        if sa > 1 and sa == sb:
            x, y = (a, da % len(tiles[a])), (b, db % len(tiles[b]))
            classes.add(x)
            classes.add(y)
            classes.merge(x, y)

    def root(x: tuple[int, int]) -> tuple[int, int]:
        return classes[x] if x in classes else x  # noqa: SIM401 (DisjointSet has no get)

    matmuls: dict[int, tuple[MatmulPlan, ...]] = {}
    shifts: dict[int, int] = {}
    phases = ["loop" if b.forloop_dim is not None else "pre" for b in bg.inputs]
    order = {"pre": 0, "loop": 1, "post": 2}
    for k, op in enumerate(bg.ops):
        t = n_in + k
        spec = OPS[op.op]
        w = f"{where}: {_where(bg, t)}"
        rank = len(tiles[t])
        args = op.args
        if spec.kind == "accum":
            phases.append("post")
        else:
            phases.append(max((phases[a] for a in args), key=order.__getitem__))
        if spec.kind in ("elementwise", "norm") or op.op in (
            "accum_sum",
            "accum_max",
            "accum_keep",
        ):
            for a in args:
                pad = rank - len(tiles[a])  # an operand of fewer dims: aligned from the right
                for d in range(pad, rank):
                    tie(a, d - pad, t, d)
        elif spec.kind == "reduce" or op.op in (
            "accum_sum_last",
            "accum_mean_last",
            "accum_rms_last",
            "accum_sum_todimx",
        ):
            axis = op.param("dim", -1) % rank
            for d in range(rank):
                if d != axis:
                    tie(args[0], d, t, d)
            if op.op == "accum_sum_todimx":
                # the groups are padded to a power of two, masked to zero; each group's
                # width must stay whole in the padded tile
                last, dimx = tiles[args[0]][-1], op.param("dimx")
                if dimx != next_pow2(dimx) or last % dimx:
                    raise LoweringError(
                        f"{w}: accum_sum_todimx needs a power-of-two group width dividing the "
                        f"last dim, got last dim {last} and dimx {dimx}"
                    )
        elif op.op in ("accum_rescale_sum", "accum_rescale_sum_last"):
            x, m, big = args
            for d in range(rank):
                tie(x, d, m, d)
                tie(m, d, big, d)
                if op.op == "accum_rescale_sum" or d != rank - 1:
                    tie(x, d, t, d)
            producer = bg.ops[big - n_in] if big >= n_in else None
            if producer is None or producer.op != "accum_max" or producer.args[0] != m:
                raise LoweringError(
                    f"{w}: the final shift (arg 2) must be accum_max of this accumulator's own "
                    "shift (arg 1); only then can the running max rescale online"
                )
            if op.op == "accum_rescale_sum_last" and tiles[m][-1] != 1:
                raise LoweringError(
                    f"{w}: accum_rescale_sum_last needs a shift constant along the summed last dim "
                    f"(shift tile {list(tiles[m])})"
                )
            shifts[t] = big
        elif op.op == "concat":
            axis = op.param("dim") % rank
            for a in args:
                for d in range(rank):
                    if d != axis:
                        tie(a, d, t, d)
        elif op.op in ("matmul", "concat_matmul"):
            pairs = (
                [(args[0], args[1])]
                if op.op == "matmul"
                else [
                    (args[0], args[2]),
                    (args[1], args[3]),
                ]
            )
            plans = []
            for a, b in pairs:
                m, kk, n = tiles[a][-2], tiles[a][-1], tiles[b][-1]
                if any(s != 1 for s in (*tiles[a][:-2], *tiles[b][:-2])):
                    raise LoweringError(
                        f"{w}: batched matmul with a batch tile > 1 ({list(tiles[a])} @ "
                        f"{list(tiles[b])}); Triton dots are 2-D: split the batch over the grid"
                    )
                tie(a, rank - 2, t, rank - 2)
                tie(b, rank - 1, t, rank - 1)
                tie(a, rank - 1, b, rank - 2)
                if kk == 1:
                    path = "outer"
                elif m > 1 and n > 1:
                    path = "mma"
                    dot_roots.update({(a, rank - 2), (a, rank - 1), (b, rank - 1)})
                else:
                    path = "fma"
                plans.append(MatmulPlan(path, m, kk, n))
            if op.op == "concat_matmul":
                tie(args[0], rank - 2, args[1], rank - 2)
                tie(args[2], rank - 1, args[3], rank - 1)
            matmuls[t] = tuple(plans)
        else:
            raise LoweringError(f"{w}: no plan rule for block op {op.op!r}")

    # Padded sizes per class (all members of a class have one size).
    dot_classes = {root(x) for x in dot_roots}
    pads: list[tuple[int, ...]] = []
    for t, tile in enumerate(tiles):
        p = []
        for d, s in enumerate(tile):
            if s == 1:
                p.append(1)
                continue
            need = next_pow2(s)
            if root((t, d)) in dot_classes:
                need = max(need, min_dot)
            p.append(need)
        pads.append(tuple(p))
    # A matmul whose padded dims are all >= 16 runs on tensor cores; recompute the paths.
    for t, plans in list(matmuls.items()):
        op = bg.ops[t - n_in]
        pairs = (
            [(op.args[0], op.args[1])]
            if op.op == "matmul"
            else [
                (op.args[0], op.args[2]),
                (op.args[1], op.args[3]),
            ]
        )
        new = []
        for (a, b), mp in zip(pairs, plans):
            pm, pk, pn = pads[a][-2], pads[a][-1], pads[b][-1]
            if mp.path == "fma" and pm * pk * pn > FMA_MAX_ELEMENTS:
                raise LoweringError(
                    f"{where}: {_where(bg, t)}: matmul tile {pm}x{pk}x{pn} has M or N = 1, too "
                    f"small for tl.dot, and M·K·N > {FMA_MAX_ELEMENTS} for the multiply-sum path"
                )
            new.append(MatmulPlan(mp.path, pm, pk, pn))
        matmuls[t] = tuple(new)
    for t, op in enumerate(bg.ops, start=n_in):
        if op.op == "concat":
            axis = op.param("dim") % len(tiles[t])
            sizes = {tiles[a][axis] for a in op.args}
            if (
                len(op.args) != 2
                or len(sizes) != 1
                or any(pads[a][axis] != tiles[a][axis] for a in op.args)
            ):
                raise LoweringError(
                    f"{where}: {_where(bg, t)}: block-level concat needs 2 operands of one "
                    f"power-of-two size along dim {axis} (got {[tiles[a][axis] for a in op.args]})"
                )
    for t, p in enumerate(pads):
        if math.prod(p) > MAX_TILE_ELEMENTS:
            raise LoweringError(
                f"{where}: {_where(bg, t)}: block tile {list(p)} ({math.prod(p)} elements) too "
                f"large to hold in registers (limit {MAX_TILE_ELEMENTS})"
            )

    def dims_in(k: int) -> tuple[Dim, ...]:
        b = bg.inputs[k]
        out = []
        for d, size in enumerate(b.shape):
            axis = next((a for a, m in enumerate(b.imap) if m == d), None)
            out.append(
                Dim(size, tiles[k][d], pads[k][d], axis, b.forloop_dim == d, bg.forloop_range)
            )
        return tuple(out)

    def dims_out(j: int) -> tuple[Dim, ...]:
        o = bg.outputs[j]
        shape = info.output_shapes[j]
        out = []
        for d, size in enumerate(shape):
            axis = next((a for a, m in enumerate(o.omap) if m == d), None)
            out.append(Dim(size, tiles[o.arg][d], pads[o.arg][d], axis, False))
        return tuple(out)

    return KernelPlan(
        bg=bg,
        info=info,
        pads=tuple(pads),
        phases=tuple(phases),
        inputs=tuple(dims_in(k) for k in range(n_in)),
        outputs=tuple(dims_out(j) for j in range(len(bg.outputs))),
        output_shapes=tuple(info.output_shapes),
        matmuls=matmuls,
        shifts=shifts,
    )
