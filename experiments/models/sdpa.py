"""`jax.nn.dot_product_attention` (implementation="xla") as users call it, GQA, (B, T, N, H).

The library call does the rest: its 1/sqrt(H) scaling, its grouped-query reshape, its causal
mask and its float32 softmax. Three entries: full attention and causal attention over T = S
tokens (a prefill), and one query token over S keys (a decode step, where a causal mask
means nothing).
"""

from __future__ import annotations

import jax

from experiments.models import attention


def sdpa(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax(q kᵀ / sqrt(H)) v; q (B, T, N, H), k and v (B, S, K, H), N a multiple of K."""
    if attention.current() != attention.DEFAULT:  # a library kernel (real_baselines)
        return attention.attend(q, k, v)
    return jax.nn.dot_product_attention(q, k, v, implementation="xla")


def sdpa_causal(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`sdpa` with is_causal=True: query i sees keys 0..i."""
    if attention.current() != attention.DEFAULT:
        return attention.attend(q, k, v, causal=True)
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
