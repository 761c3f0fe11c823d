"""The variants `select(tune_warps=True)` times a region's fastest µGraph with.

The kernels' knobs that the µGraph does not fix (warps per block, a loop split over the grid)
ride in its meta (`kernel_graph.WARPS`, `LOOP_SPLIT`), which the lowering reads when given no
config; `select` times each variant these name and keeps the fastest.
"""

from __future__ import annotations

import math

from mirage_jax.lower.registry import LoweringError
from mirage_jax.mugraph import MuGraph

TUNED_WARPS = 8
"""The alternative to the backends' default of 4 warps that `select(tune_warps=True)` times
(a [16, 1024] × [1024, 16] fp16 block GEMM: 20.6 µs with 4 warps, 14.9 with 8; H100)."""

FEW_WARPS = 2
"""The other warps `select(tune_warps=True)` times for every kernel: small decode kernels
(H100, 2026-11-26, Llama nnx b=8: its norm + QKV one-launch group 7.73 µs with 4 warps, 6.63
with 2; its o-projection 3.87 and 3.52)."""

SPLIT_PARTS = (2, 4, 8)
"""The loop splits (`TritonConfig.loop_split`) `select(tune_warps=True)` may time."""

SPLIT_BLOCKS = 4 * 132
"""... only while a split kernel runs at most this many blocks (four per H100 SM), and at
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


def warp_variants(g: MuGraph, few: bool = True) -> list[int | tuple[int, ...]]:
    """The warps `select(tune_warps=True)` times the fastest µGraph with, beside the default:
    `TUNED_WARPS` for every kernel (and `FEW_WARPS`, with `few`), then, for 2 to
    `MAX_TUNED_LAUNCHES` launches, `TUNED_WARPS` for one launch at a time (a tuple per
    graph-defined kernel, in op order; `kernel_graph.WARPS`)."""
    from mirage_jax.lower.plan import KernelConfig

    kernels = [i for i, op in enumerate(g.ops) if op.block_graph is not None]
    group = set(g.one_launch())
    launches = [[i] for i in kernels if i not in group] + ([sorted(group)] if group else [])
    out: list[int | tuple[int, ...]] = [TUNED_WARPS, FEW_WARPS] if few else [TUNED_WARPS]
    if 2 <= len(launches) <= MAX_TUNED_LAUNCHES:
        default = KernelConfig().num_warps
        for launch in launches:
            out.append(tuple(TUNED_WARPS if i in launch else default for i in kernels))
    return out


def split_variants(g: MuGraph, backend: str) -> list[int]:
    """The loop splits `select(tune_warps=True)` times the fastest µGraph with: the smallest
    `MAX_SPLITS` of `SPLIT_PARTS` that the backend can apply to one of its kernels launched
    alone (`SPLIT_REFUSAL`), each kernel then running at most `SPLIT_BLOCKS` blocks."""
    from mirage_jax.lower import backends
    from mirage_jax.lower.kernel_graph import plan

    try:
        refusal = getattr(backends.get(backend).load(), "SPLIT_REFUSAL", None)
        plans = plan(g) if refusal is not None else {}
    except (backends.UnknownBackend, ImportError, LoweringError):
        return []
    group = set(g.one_launch())
    alone = [p for i, p in plans.items() if i not in group]
    out = []
    for s in SPLIT_PARTS:
        split = [p for p in alone if refusal(p, s) is None]
        if split and max(math.prod(p.grid) for p in split) * s <= SPLIT_BLOCKS:
            out.append(s)
    return out[:MAX_SPLITS]
