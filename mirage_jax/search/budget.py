"""`Budget`: the limits of one search (time, candidates, depth, kernels, verification)."""

from __future__ import annotations

from dataclasses import dataclass

from mirage_jax.search.order import TIME_TOP


@dataclass(frozen=True)
class Budget:
    """Limits of one search.

    Arguments:
        time_s: wall-clock limit of the enumeration (numbers and confirmation come after);
            `math.inf`: no wall-clock stop anywhere (nor in the e-graph's saturation or the
            full-size confirmation), so the search ends when exhausted or by `max_candidates`
            and its result depends on the region and the seed only.
        max_candidates: closed graphs examined (each a verification unless memoised).
        max_kernels: kernels per µGraph (a split-K pair is two).
        max_block_ops: block ops per graph-defined kernel (inputs not counted).
        extra_depth: depth explored beyond the smallest graph found (see the module docstring);
            loop_extra_depth: the same while every graph found holds a GEMM's whole K in one
            loop-free tile (the normalised GEMM whose loop form needs a few more ops: the
            statistic and the products accumulated, the division after the loop).
        max_outputs: outputs of a split-K kernel (its partial sums).
        results: µGraphs returned; confirm: how many of the best are verified at full size.
        trials: field trials per verification.
        numbers_per_structure: full-size instances kept per structure.
        split: try split-K (a reduction split across the grid, then a combining kernel).
        reread: a combining kernel may read again the small inputs its split kernel read (the
            row of a norm + projection, for the rms: `tasks._rereadable`), along its loop over
            the split. Off here by default (it lengthens the search); `mirage_jax.jit` turns it
            on (its `options["reread"]`): on the H200 (2026-11-28) the split norm + Q/K/V
            launched by level beat the loop forms in nnx's and equinox's 7B decode blocks.
        cuts: when nothing is found in one piece, cut the region at matmul prologues and search
            the pieces (`cuts.py`); cut_share: the part of `time_s` kept for that.
        max_predefined: pre-defined kernel ops (GEMMs and their epilogues, left to XLA) before
            the graph-defined kernel(s) (`predefined.py`; 0: none); predefined_block_ops: block
            ops per graph-defined kernel after them; predefined_share: the part of `time_s`
            for that phase (after the one-piece enumeration, before cuts).
        shards: tasks per schedule class, split by the first block op, so that more workers
            than classes have work; the graphs accepted, their order and the results are
            those of one task per class.
    """

    time_s: float = 300.0
    max_candidates: int = 20000
    max_kernels: int = 3
    max_block_ops: int = 10
    extra_depth: int = 1
    loop_extra_depth: int = 3
    max_outputs: int = 2
    results: int = 16
    confirm: int = TIME_TOP
    trials: int = 2
    numbers_per_structure: int = 4
    split: bool = True
    reread: bool = False
    cuts: bool = True
    cut_share: float = 0.5
    max_predefined: int = 2
    predefined_block_ops: int = 6
    predefined_share: float = 0.25
    shards: int = 8
