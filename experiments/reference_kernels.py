"""Hand-written Pallas kernels the lowered µGraphs are held against (issue 5's yardstick).

`split_kv_gqa` is the ~40-line split-KV (flash-decoding style) kernel for the original's `gqa`
form, exp(Q·K) / Σ exp(Q·K) · V with no scale and no max shift: a grid over (batch·head, query
row blocks, KV splits), an in-kernel loop over `block_kv`-wide KV slices with fp32 exp-sum and
output accumulators, then an XLA combine (sum the splits' partials, divide). It is not part of
the library: it is written by hand for one program, which is what the superoptimizer is meant
to make unnecessary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def _split_kv_kernel(q_ref, k_ref, v_ref, acc_ref, sum_ref, *, block_kv: int, steps: int):
    q = q_ref[...]  # (block_q, D)
    bq, d = q.shape

    def body(i, carry):
        acc, row_sum = carry
        k = k_ref[:, pl.ds(i * block_kv, block_kv)]  # (D, block_kv)
        v = v_ref[pl.ds(i * block_kv, block_kv), :]  # (block_kv, D)
        e = jnp.exp(jnp.dot(q, k, preferred_element_type=jnp.float32))
        row_sum = row_sum + jnp.sum(e, axis=-1)
        acc = acc + jnp.dot(e.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, row_sum

    init = (jnp.zeros((bq, d), jnp.float32), jnp.zeros((bq,), jnp.float32))
    acc, row_sum = jax.lax.fori_loop(0, steps, body, init)
    acc_ref[...] = acc
    sum_ref[...] = row_sum


@functools.partial(
    jax.jit, static_argnames=("splits", "block_q", "block_kv", "num_warps", "interpret")
)
def split_kv_gqa(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    splits: int = 16,
    block_q: int = 64,
    block_kv: int = 128,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:
    """exp(q @ k) / sum(exp(q @ k), -1) @ v for q (BH, Q, D), k (BH, D, S), v (BH, S, D)."""
    bh, nq, d = q.shape
    s = k.shape[-1]
    per_split = s // splits
    if s % splits or per_split % block_kv or nq % block_q:
        raise ValueError(
            f"kv_len {s} must split into {splits} × k·{block_kv}, q_len {nq} into {block_q}s"
        )
    kernel = functools.partial(_split_kv_kernel, block_kv=block_kv, steps=per_split // block_kv)
    acc, sums = pl.pallas_call(
        kernel,
        grid=(bh, nq // block_q, splits),
        in_specs=[
            pl.BlockSpec((None, block_q, d), lambda b, i, j: (b, i, 0)),
            pl.BlockSpec((None, d, per_split), lambda b, i, j: (b, 0, j)),
            pl.BlockSpec((None, per_split, d), lambda b, i, j: (b, j, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, block_q, d), lambda b, i, j: (b, j, i, 0)),
            pl.BlockSpec((None, None, block_q), lambda b, i, j: (b, j, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((bh, splits, nq, d), jnp.float32),
            jax.ShapeDtypeStruct((bh, splits, nq), jnp.float32),
        ],
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="split_kv_gqa",
    )(q, k, v)
    return (acc.sum(axis=1) / sums.sum(axis=1)[..., None]).astype(q.dtype)
