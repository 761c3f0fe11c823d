"""A roofline cost model of µGraphs, to rank candidates before any is lowered or timed.

Per kernel: bytes moved (every block reads its tiles, each loop iteration its loop tiles, so
a replicated input is counted once per block that reads it), flops (tile dims padded to powers
of two, matmul operands to at least 16, as the Pallas lowering pads them), the launch, and how
much of the GPU the grid can use (blocks against SMs, blocks that fit an SM's shared memory,
and whether a block can overlap its loads: per-iteration tiles double-buffered in a loop).
Time is the larger of the memory and compute times at the used fraction of the device, plus
the launch and the loop's sequential iterations. Compute counts the tensor-core flops and the
special-function unit's operations (exp, sqrt, reciprocals: on attention at fp16 the exps of
a recomputed Q·K cost as much as the dots), and a kernel takes at least the sequential work
of one block per wave of SMs (a grid of few, long blocks cannot use the whole GPU). A pre-defined kernel (an XLA op: a cuBLAS
GEMM, an elementwise op) is its bytes at the full bandwidth, or its flops at the full rate,
plus a launch. The H100 timings of 2026-11-21 (rmsnorm:
128 KiB weight tiles per iteration ran at 50-65 µs where the original's smaller tiles ran at
38 µs) are why tiles that cannot be double-buffered are penalised. Absolute numbers are rough; the model is for ordering candidates, and the GPU
timing in `select` decides.

Calibration: `iteration_s` (a loop step's fixed latency: issue of its loads, the wait, one small
dot) was 0.05 µs; the H200 run of 2026-11-21 (17 benchmarks with 2-6 timed candidates each)
measured 0.29 µs a step (gated_mlp b=1: the same kernel with 32 steps of 128 rows ran 21.1 µs,
with 16 steps of 256 rows 17.8 µs). At 0.3 µs the model's first pick is within 5% of the
fastest timed candidate on 15 of the 17 (13 before); geometric-mean loss 1.04× (1.08×).

Narrow tiles: a block reading a [K, n] slice of a row-major [K, N] weight moves whole 32-byte
sectors per row. On the H100 (2026-11-25, `experiments/results/skinny_sweep_2026-11-25.json`, a
norm + GEMM of 8 rows, N=2816, loop-free) tiles of 32, 16 and 8 columns ran 6.9, 9.7 and
12.8 µs; but a GEMV of one row with 16-column tiles (32-byte rows) ran 5.4 µs against XLA's
14.1 (llama nnx b=1, its down-projection + residual). Rows under a sector are charged
(32 / row bytes)^0.75: 8 fp16 columns 1.7×, 4 columns 2.8×.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mirage_jax.mugraph import MuGraph, block_info
from mirage_jax.mugraph.ops import OPS


@dataclass(frozen=True)
class Device:
    """What the cost model knows of a GPU."""

    name: str = "h100"
    bandwidth: float = 3.0e12  # bytes/s, reads + writes
    flops: float = 4.0e14  # dense fp16 with fp32 accumulation, achievable
    sms: int = 132
    launch_s: float = 3.0e-6
    iteration_s: float = 3e-7  # one loop iteration's fixed latency in a block (calibrated)
    sm_bandwidth_share: float = 1.5  # one SM can pull this many times its fair share
    smem_per_sm: int = 228 * 1024
    max_resident: int = 8  # blocks per SM
    unpipelined: float = 0.6  # bandwidth a block gets when it cannot overlap loads (no loop)
    oversize: float = 0.35  # ... and when its tiles cannot be double-buffered at all
    loop_tile_bytes: int = 32 * 1024  # per-iteration tiles above this pipeline less well
    sfu_rate: float = 3.7e12  # transcendental ops/s (MUFU: 16 a clock per SM, 132 SMs, 1.75 GHz)
    line_bytes: int = 32  # a tile row narrower than this (a sector) wastes the rest ...
    line_share: float = 0.75  # ... to this power (calibrated: `_row_waste`)


H100 = Device()


@dataclass(frozen=True)
class Cost:
    """The estimate for one µGraph (seconds) and what it is made of."""

    seconds: float
    bytes: int
    flops: int
    kernels: int
    blocks: tuple[int, ...] = field(default=())

    def to_dict(self) -> dict:
        return {
            "us": round(self.seconds * 1e6, 3),
            "bytes": self.bytes,
            "flops": self.flops,
            "kernels": self.kernels,
            "blocks": list(self.blocks),
        }


def _pad(n: int, at_least: int = 1) -> int:
    return max(at_least, 1 << max(0, (n - 1).bit_length()))


STARVED = 8.0
"""A µGraph estimated slower than this multiple of the region's memory floor
(`memory_floor_s`) is starved: the driver then searches the region's pieces too
(`cut_search.search_cuts`) and keeps the cheapest of all, and a starved one-kernel-per-output
stitch gets its first cut as a rival. With `Budget.reread`, a region whose combining kernels
can take an rms has its pieces searched also where its best µGraph has a kernel of one block:
Gemma's norm + Q/K/V closed whole as a split whose combining kernel is one block, estimated 7.6
times its floor at Llama-7B size (70.4 µs on the H200, b=1) and 3.8 times at d_model 1024
(5.86 µs), so its pieces were not searched and the loop forms the cuts find (22.2 and 3.46 µs)
were lost (2026-11-28)."""


def memory_floor_s(program: Any, device: Device) -> float:
    """A region's memory floor: its inputs read and its outputs written once, one launch."""
    moved = sum(nbytes(s, d) for s, d in (*program.input_avals, *program.output_avals))
    return device.launch_s + moved / device.bandwidth


def nbytes(shape, dtype) -> int:
    """The bytes of an array of `shape` and `dtype`."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _op_flops(op: str, arg_tiles, out_tile) -> int:
    if op == "matmul":
        a, b = arg_tiles
        batch = math.prod(max(x, y) for x, y in zip(a[:-2], b[:-2]))
        return 2 * batch * _pad(a[-2], 16) * _pad(a[-1], 16) * _pad(b[-1], 16)
    if op == "concat_matmul":
        a, b, c, d = arg_tiles
        return _op_flops("matmul", (a, c), out_tile) + _op_flops("matmul", (b, d), out_tile)
    big = max((math.prod(t) for t in arg_tiles), default=1)
    return max(big, math.prod(out_tile))


def _op_sfu(op: str, out_tile) -> int:
    """Special-function-unit operations (exp2, rsqrt/rcp: `SearchProps.sfu` per element) of
    one op: per padded output element, or per accumulated element for an accumulator (the
    online-softmax rescales: the exp of the shift and of the rescale)."""
    spec = OPS[op]
    if spec.kind == "accum":
        return spec.search.sfu * math.prod(out_tile)
    return spec.search.sfu * math.prod(_pad(n) for n in out_tile)


def _row_waste(tile, b, device: Device, axis: int = -1) -> float:
    """How many more bytes than its tile a block moves when the tile's rows are narrower
    than the memory's line (`Device.line_bytes`): a slice of each row of a wider row-major
    tensor. Softened by `Device.line_share` (neighbouring blocks find part of the rest in L2).
    `axis`: the tile's axis that is contiguous in memory (the last, unless the kernel reads
    the tensor through a view of the array as it is stored)."""
    if not tile or tile[axis] >= b.shape[axis]:
        return 1.0  # whole rows: consecutive rows are contiguous
    row = tile[axis] * np.dtype(b.dtype).itemsize
    return max(1.0, device.line_bytes / max(1, row)) ** device.line_share


def _time(
    bytes_: int, flops: int, blocks: int, device: Device, memory_use: float = 1.0, sfu: int = 0
) -> float:
    use = min(1.0, blocks * device.sm_bandwidth_share / device.sms) * memory_use
    use_c = min(1.0, blocks / device.sms)
    compute = flops / (device.flops * use_c) + sfu / (device.sfu_rate * use_c)
    return max(bytes_ / (device.bandwidth * use), compute)


def _memory_use(loop_bytes: int, smem: int, loop: int, device: Device) -> tuple[float, int]:
    """The fraction of its bandwidth share a block gets, and how many blocks fit on an SM.

    A block double-buffers its per-iteration tiles: if that does not fit in shared memory the
    loads cannot overlap anything (`oversize`); without a loop nothing overlaps either
    (`unpipelined`).
    """
    need = smem + (loop_bytes if loop > 1 else 0)
    resident = min(device.max_resident, device.smem_per_sm // max(1, need))
    if resident == 0:
        return device.oversize, 1
    if loop == 1:
        return device.unpipelined, resident
    # large per-iteration tiles pipeline poorly (fewer stages fit, longer latency per load)
    return min(1.0, (device.loop_tile_bytes / max(1, loop_bytes)) ** 0.5), resident


def estimate(
    g: MuGraph, device: Device = H100, contiguous: Mapping[int, int] | None = None
) -> Cost:
    """The estimated device time of µGraph `g` (see the module docstring); `contiguous`:
    µGraph input position -> its axis that is contiguous in memory, for inputs a kernel reads
    through a view of the array as the function stores it (`stored_axes`)."""
    shapes = g.shapes
    position = {i: k for k, i in enumerate(g.inputs)}
    contiguous = contiguous or {}
    total_s = 0.0
    total_b = 0
    total_f = 0
    kernels = 0
    blocks_list = []
    for i, op in enumerate(g.ops):
        if op.op == "input":
            continue
        kernels += 1
        if op.block_graph is None:
            arg_shapes = [shapes[a][0] for a in op.args]
            out_shape, dtype = shapes[(i, 0)]
            b = sum(nbytes(s, shapes[a][1]) for s, a in zip(arg_shapes, op.args))
            b += nbytes(out_shape, dtype)
            f = _op_flops(op.op, arg_shapes, out_shape)
            total_s += device.launch_s + _time(b, f, device.sms, device)
            total_b += b
            total_f += f
            blocks_list.append(0)
            continue
        bg = op.block_graph
        info = block_info(bg)
        n_blocks, loop = bg.num_blocks, bg.forloop_range
        per_block = 0
        loop_bytes = 0
        for k, b in enumerate(bg.inputs):
            axis = contiguous.get(position.get(op.args[k][0], -1), -1)
            waste = _row_waste(info.tiles[k], b, device, axis)
            t_bytes = int(nbytes(info.tiles[k], b.dtype) * waste)
            per_block += t_bytes * (loop if b.forloop_dim is not None else 1)
            loop_bytes += t_bytes if b.forloop_dim is not None else 0
        for o in bg.outputs:
            per_block += nbytes(info.tiles[o.arg], info.dtypes[o.arg])
        flops = sfu = 0
        n_in = len(bg.inputs)
        for k, bop in enumerate(bg.ops):
            t = n_in + k
            f = _op_flops(bop.op, [info.tiles[a] for a in bop.args], info.tiles[t])
            pre_loop = not info.post[t] or OPS[bop.op].kind == "accum"
            flops += f * (loop if pre_loop else 1)
            sfu += _op_sfu(bop.op, info.tiles[t]) * (loop if pre_loop else 1)
        b = per_block * n_blocks
        f = flops * n_blocks
        use, resident = _memory_use(loop_bytes, info.smem_bytes, loop, device)
        waves = math.ceil(n_blocks / (device.sms * resident))
        # a block's own work is sequential on one SM: with few blocks that is the bound
        block_s = flops / (device.flops / device.sms) + sfu / (device.sfu_rate / device.sms)
        kernel_s = max(
            _time(b, f, n_blocks, device, use, sfu * n_blocks),
            math.ceil(n_blocks / device.sms) * block_s,
        )
        total_s += device.launch_s + kernel_s + waves * loop * device.iteration_s
        total_b += b
        total_f += f
        blocks_list.append(n_blocks)
    for grouped in g.launch_groups():  # one launch for these kernels: their others saved
        total_s -= device.launch_s * (len(grouped) - 1)
        kernels -= len(grouped) - 1
    return Cost(total_s, total_b, total_f, kernels, tuple(blocks_list))


def stored_axes(program: Any) -> dict[int, int]:
    """Region input position -> its axis that is contiguous in memory, for the inputs a
    kernel reads in place through a view (`lax_ir.views.input_view`: a weight stored as W and
    read as Wᵀ, a KV cache read per head); the others are row-major as they are."""
    from lax_ir.interface import contiguous_axis
    from lax_ir.views import input_view

    interface = program.meta.get("interface")
    out: dict[int, int] = {}
    for k, (pos, ops) in enumerate(interface["inputs"] if interface else ()):
        got = input_view(interface["shapes"][pos], ops)
        if got is not None:
            out[k] = contiguous_axis(got[1])
    return out
