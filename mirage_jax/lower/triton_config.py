"""The knobs of the generated Triton kernels (`TritonConfig`), apart from the generator that
reads them (`triton`, `triton_body`)."""

from __future__ import annotations

from dataclasses import dataclass

from mirage_jax.lower.plan import KernelConfig


@dataclass(frozen=True)
class TritonConfig(KernelConfig):
    """Knobs of the generated Triton kernels.

    Arguments:
        num_warps: warps per program.
        num_stages: software-pipelining depth of the for-loop (passed to the compiler).
        loop_unroll: `tl.range(..., loop_unroll_factor=)` of the for-loop (1: none).
        min_dot: smallest M/N/K handed to tl.dot (a power of two >= 16).
        loop_split: S > 1 runs a kernel as two launches, its loop split over S times the
            blocks, then a launch that sums the parts (`triton_split`); `lower` applies it to
            the kernels launched alone whose plan allows it (`split_refusal`).
        squeeze: tiles drop the leading dims each holds once (`squeeze`); False keeps the
            block graph's rank (`select` times both where they differ).
        speculative_max: an online softmax takes its first step's row max as every step's
            reference, its rows redone with the running max where a row sum outgrows it
            (`speculative_max`; `select` times both).
        row_major: a kernel launched alone over its whole loop runs its blocks in row-major
            order of its grid (one launch axis, the grid's last axis fastest; a masked one its
            table in that order instead of the longest first), so the blocks running at once
            share the inputs that do not vary along the last axis (attention's keys and
            values over the query blocks).
    """

    loop_split: int = 1
    squeeze: bool = True
    speculative_max: bool = False
    row_major: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.loop_split < 1:
            raise ValueError(f"loop_split must be >= 1, got {self.loop_split}")


def default_config() -> TritonConfig:
    return TritonConfig()
