"""Loop steps a kernel may skip because a constant input masks them whole.

A causal attention's mask reaches its region as a constant bias: 0 where a query may see a
key, a huge negative number elsewhere (`jax.nn.dot_product_attention(is_causal=True)` uses
0.7 × float32's lowest, GPT-2's `where(tril, att, -inf)` −inf). The kernel adds it to the
scores of each step of its loop over keys. Where a block's tile of the bias is masked
throughout (at most `MASKED`), and every query row sees some key, that step adds nothing the
online softmax keeps: its exps are exp(−1e30 or less) = 0 beside the row's final max, or, if
computed while the running max was itself masked, rescaled by exp(masked max − final max) = 0
later. So the output is the same to the bit without it: half the steps of a causal prefill.

`step_bounds` finds, per block, the first and last step whose tile is not masked throughout,
from the constant's value, for kernels whose accumulators are the online softmax's alone
(`skippable`); the Triton generator then loops over that range only, reading the bounds from a
small table the kernel takes as an input. (Exact for scores below 1e29 in magnitude.) The
steps at the start of that range whose tile is +0 throughout (the keys a causal block sees
whole) form a loop of their own that does not read the mask: adding 0 changes nothing.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage_jax.lower.computed import Computed
from mirage_jax.lower.plan import KernelPlan
from mirage_jax.lower.running_max import RESCALED, depends, running_shifts

MAX_ELEMENTS = 1 << 26
"""Constants larger than this (canonical elements) are not inspected."""

MASKED = -1e30
"""A bias entry at most this masks its score (−inf, or a finite stand-in for it)."""


def skippable(plan: KernelPlan, k: int) -> bool:
    """May the kernel skip the loop steps where block input k is masked throughout? Where every
    accumulator is the online softmax's (a running max, or a sum rescaled by it with its values
    linear in the exps: `running_max.running_shifts`), and each softmax's scores are
    `s + input k` with s free of input k, read by both its max and its `exp(· − max)`."""
    if plan.forloop_range == 1 or plan.bg.inputs[k].forloop_dim is None:
        return False
    running = running_shifts(plan)
    if not running:
        return False
    for t in plan.accumulators:
        op = plan.op(t)
        if op.op == "accum_max" and op.args[0] in running:
            continue
        if op.op in RESCALED and op.args[1] in running:
            continue
        return False
    for m in running:
        y = plan.op(m).args[0]
        if y < plan.n_in:
            return False
        add = plan.op(y)
        if add.op != "add" or add.args.count(k) != 1:
            return False
        other = add.args[1] if add.args[0] == k else add.args[0]
        if depends(plan, other, k):
            return False
        for u in range(plan.n_in, plan.n_in + len(plan.bg.ops)):
            op = plan.op(u)
            if op.op == "sub" and op.args[1] == m and op.args[0] != y:
                return False
    return True


@dataclass(frozen=True)
class StepBounds:
    """A kernel's table of loop steps: `rows` (blocks, 4) int32, in launch order, each a
    block's row-major grid index, its first step, the first step that reads the mask (the
    steps before it see a tile of +0: the mask is not read), and its end; `mask`, the block
    input that is the mask."""

    mask: int
    rows: np.ndarray


def step_bounds(plan: KernelPlan, k: int, value: np.ndarray | Computed) -> StepBounds | None:
    """Per block, its row-major index in the grid, [first, end) of the steps whose tile of
    block input k (a constant, `value` as the kernel reads it, or a `Computed` one) is not
    masked throughout, and where in that range the leading steps whose tile is +0 throughout
    end; the blocks with the most steps first (so the longest start first, and the short ones
    fill the GPU after them). None where the tiles do not divide the value, a block's loop does
    not cover the keys whole, a row masks every key, a constant is too large, or no step can be
    skipped."""
    dims = plan.inputs[k]
    if tuple(value.shape) != tuple(d.size for d in dims):
        return None
    if not isinstance(value, Computed) and np.asarray(value).size > MAX_ELEMENTS:
        return None
    if any(d.size % d.tile for d in dims):
        return None  # (a padded tile's extra lanes are masked: its tile is `tile` elements)
    (keys,) = [j for j, d in enumerate(dims) if d.loop]
    if dims[keys].axis is not None:
        return None  # a block sees part of each row's keys: its rows' maxes are not final
    split: list[int] = []
    for d in dims:
        split += [d.size // d.tile, d.tile]
    maps = _tile_maps(value, keys, tuple(split))
    if maps is None:
        return None
    row_masked, dead, zero = maps
    if row_masked:
        return None  # a row masks every key: its softmax is over the masked scores themselves
    grid, F = plan.grid, plan.forloop_range
    ids = np.arange(int(np.prod(grid)))
    pid = list(np.unravel_index(ids, grid))  # row-major, as the kernel reads its row
    steps = np.arange(F)
    index = []
    for d in dims:
        at = pid[d.axis][:, None] if d.axis is not None else np.zeros((len(ids), 1), np.int64)
        if d.loop:
            index.append(at * F + steps[None, :])
        else:
            index.append(np.broadcast_to(at, (len(ids), F)))
    live = ~dead[tuple(index)]  # (blocks, steps)
    if live.all():
        return None
    first = np.where(live.any(axis=1), live.argmax(axis=1), 0)
    end = np.where(live.any(axis=1), F - live[:, ::-1].argmax(axis=1), 0)
    reads = ~zero[tuple(index)] & (steps[None, :] >= first[:, None])
    mid = np.clip(np.where(reads, steps[None, :], F).min(axis=1), first, end)
    order = np.argsort(first - end, kind="stable")  # most steps first
    rows = np.stack([ids, first, mid, end], axis=1)[order].astype(np.int32)
    return StepBounds(k, rows)


def _tile_maps(
    value: np.ndarray | Computed, keys: int, split: tuple[int, ...]
) -> tuple[bool, np.ndarray, np.ndarray] | None:
    """(does a row mask every key, per tile: masked throughout, +0 throughout) for a value
    whose axis j is `split[2j]` tiles of `split[2j + 1]`; a `Computed` value on the device,
    under jit (None, with a warning, where that fails: the kernel then walks every step)."""
    if not isinstance(value, Computed):
        return _maps(np, np.asarray(value), keys, split)
    try:
        sizes, tiles = split[0::2], split[1::2]
        base = _base_tiles(tuple(n * t for n, t in zip(sizes, tiles)))
        with _DEVICE:  # one value reduced at a time; the next asks its cache
            if any(t % b for t, b in zip(tiles, base)):
                return _device_maps(value, keys, split)
            fine = tuple(x for n, t, b in zip(sizes, tiles, base) for x in (n * t // b, b))
            row, dead, zero = _device_maps(value, keys, fine)
        return row, _coarser(dead, base, tiles), _coarser(zero, base, tiles)
    except Exception as e:  # the device's memory, a primitive that does not lower
        from mirage_jax._env import warn_once

        warn_once(
            f"masked_steps:{value.shape}",
            f"mirage_jax: the mask of shape {value.shape} could not be inspected on the device "
            f"({type(e).__name__}: {str(e)[:200]}); its kernel walks every loop step",
        )
        return None


BASE_TILE = 16
"""A `Computed` value is reduced on the device once, to tiles of this along its last two axes
(gcd with their sizes) and of 1 along the others; each kernel's tiling is then read from that
on the host. sdpa_causal at Llama-7B size, batch 8 (a mask of 2^32 entries): 9 reductions,
one per candidate, took 88 s of its selection (H100, 2026-11-28)."""

_DEVICE = threading.Lock()


def _base_tiles(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The tiles a `Computed` value of `shape` is reduced to on the device (`BASE_TILE`)."""
    return tuple(math.gcd(n, BASE_TILE) if j >= len(shape) - 2 else 1 for j, n in enumerate(shape))


def _coarser(fine: np.ndarray, base: tuple[int, ...], tiles: tuple[int, ...]) -> np.ndarray:
    """Per tile of `tiles`, whether every one of its tiles of `base` in `fine` holds."""
    split = tuple(x for n, t, b in zip(fine.shape, tiles, base) for x in (n * b // t, t // b))
    return fine.reshape(split).all(axis=tuple(range(1, len(split), 2)))


@functools.lru_cache(maxsize=16)
def _device_maps(
    value: Computed, keys: int, split: tuple[int, ...]
) -> tuple[bool, np.ndarray, np.ndarray]:
    """`_maps` of a `Computed` value on the device, once per value and tiling (`select` lowers
    many candidates of one region with the same mask), eagerly though the lowering runs while
    jax traces the user's function."""
    import jax
    import jax.numpy as jnp

    with jax.ensure_compile_time_eval():
        got = jax.jit(lambda: _maps(jnp, value.fn(), keys, split))()
        return bool(got[0]), np.asarray(got[1]), np.asarray(got[2])


def _maps(xp: Any, value: Any, keys: int, split: tuple[int, ...]) -> tuple[Any, Any, Any]:
    axes = tuple(range(1, len(split), 2))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN masks nothing; -1e30 is -inf in fp16
        masked = value <= MASKED
        zero = (value == 0) & ~xp.signbit(value)
    row = masked.all(axis=keys).any()
    return row, masked.reshape(split).all(axis=axes), zero.reshape(split).all(axis=axes)
