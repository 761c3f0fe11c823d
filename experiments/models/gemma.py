"""A Gemma (v1) decoder layer's decode step in plain jax.numpy, parameters as a dict.

Written as the plain-JAX Gemma ports write it (and as flax's Gemma example does inside its
modules): einsums in Gemma's own weight layouts, RMSNorm with gain `(1 + w)` and no float32
upcast, split-half rotary embeddings with Gemma's timescales, queries scaled by
head_dim**-0.5 before the logits, grouped-query attention by splitting the query heads into
(kv_heads, groups) rather than repeating K and V, the mask value K_MASK = -2.3819763e38 of
Gemma's code, and a GELU-gated MLP.

The GELU is the exact erf form (`jax.nn.gelu(approximate=False)`); Gemma's own code uses the
tanh approximation. We take the erf form so the set covers it (the GPT-2 block covers tanh).

`gemma_decode(params, x, k_cache, v_cache, pos)` is the registered entry point.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from experiments.models import attention as attention_impl
from experiments.models.checkpoints import Weights
from experiments.models.configs import Config

K_MASK = -2.3819763e38
"""The mask value of Gemma's attention (a large negative float32)."""
EPS = 1e-6
"""Gemma's RMSNorm epsilon."""
MAX_WAVELENGTH = 10_000


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """Gemma's RMSNorm: x * rsqrt(mean(x²) + 1e-6) * (1 + scale)."""
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    normed = x * lax.rsqrt(var + EPS)
    return normed * (1 + scale)


def apply_rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Split-half rotary embedding of x (B, T, heads, H) at `positions` (B, T)."""
    head_dim = x.shape[-1]
    fraction = 2 * jnp.arange(head_dim // 2) / head_dim
    timescale = MAX_WAVELENGTH**fraction
    sinusoid = positions[..., None] / timescale[None, None, :]
    sinusoid = sinusoid[..., None, :]  # (B, T, 1, H/2)
    sin, cos = jnp.sin(sinusoid), jnp.cos(sinusoid)
    first, second = jnp.split(x, 2, axis=-1)
    out = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return out.astype(x.dtype)


def attention(
    p: dict[str, jax.Array], x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Grouped-query attention of x (B, T, D) over the cache, T new tokens written at pos."""
    b, t, _ = x.shape
    query = jnp.einsum("BTD,NDH->BTNH", x, p["q_proj"])
    key, value = jnp.einsum("BTD,CKDH->CBTKH", x, p["kv_proj"])
    positions = jnp.broadcast_to(pos + jnp.arange(t), (b, t))
    query = apply_rope(query, positions)
    query = query * query.shape[-1] ** -0.5
    key = apply_rope(key, positions)

    k_cache = lax.dynamic_update_slice(k_cache, key, (0, pos, 0, 0))
    v_cache = lax.dynamic_update_slice(v_cache, value, (0, pos, 0, 0))
    if attention_impl.current() != attention_impl.DEFAULT:  # a library kernel (real_baselines)
        lengths = attention_impl.decode_lengths(pos, b)
        encoded = attention_impl.attend(query, k_cache, v_cache, valid_len=lengths, scale=1.0)
        return jnp.einsum("BTNH,NHD->BTD", encoded, p["out_proj"]), k_cache, v_cache

    n_kv = k_cache.shape[2]
    q = query.reshape(b, t, n_kv, query.shape[2] // n_kv, query.shape[3])
    logits = jnp.einsum("BTKGH,BSKH->BTKGS", q, k_cache)
    logits = logits.reshape(b, t, -1, k_cache.shape[1])  # (B, T, N, S)
    mask = jnp.arange(k_cache.shape[1])[None, None, :] <= positions[:, :, None]  # (B, T, S)
    logits = jnp.where(mask[:, :, None, :], logits, K_MASK)
    probs = jax.nn.softmax(logits, axis=-1).astype(k_cache.dtype)

    probs = probs.reshape(b, t, n_kv, -1, k_cache.shape[1])
    encoded = jnp.einsum("BTKGS,BSKH->BTKGH", probs, v_cache).reshape(b, t, -1, query.shape[3])
    return jnp.einsum("BTNH,NHD->BTD", encoded, p["out_proj"]), k_cache, v_cache


def mlp(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """GELU-gated MLP: (gelu(x W_gate) * (x W_up)) W_down, Gemma's (2, F, D) gating layout."""
    ff_gate = jnp.dot(x, p["gating"][0].T)
    ff_up = jnp.dot(x, p["gating"][1].T)
    return jnp.dot(jax.nn.gelu(ff_gate, approximate=False) * ff_up, p["down"])


def gemma_decode(
    params: dict[str, jax.Array],
    x: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step: (new x, updated k_cache, updated v_cache)."""
    attn_out, k_cache, v_cache = attention(
        params, rms_norm(x, params["attn_norm"]), k_cache, v_cache, pos
    )
    x = x + attn_out
    x = x + mlp(params, rms_norm(x, params["mlp_norm"]))
    return x, k_cache, v_cache


def from_weights(cfg: Config, w: Weights, dtype: Any) -> dict[str, jax.Array]:
    """The params dict of the checkpoint `w` (`checkpoints.gemma_weights`) at `dtype`."""
    del cfg  # the layouts carry every size
    return {name: jnp.asarray(a, dtype) for name, a in w.items()}
