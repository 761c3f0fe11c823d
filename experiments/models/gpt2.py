"""A GPT-2 block's prefill of T tokens in plain jax.numpy, parameters as a nested dict.

Written as the plain-JAX GPT-2 ports (nanoGPT-style) write it: parameters nested under the
checkpoint's names (`ln_1`, `attn.c_attn`, `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`),
LayerNorm with gain and bias, one fused qkv projection with bias split into three, causal
attention on (B, T, heads, head_dim) with the mask applied as `jnp.where(mask, att, -inf)`,
`jax.nn.softmax`, tanh-GELU MLP (`jax.nn.gelu(approximate=True)`), two residuals.

`gpt2_prefill(params, x)` is the registered entry point; it returns the block's output and
the keys and values it computed (the `present` a prefill hands to the KV cache).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from experiments.models import attention
from experiments.models.checkpoints import Weights
from experiments.models.configs import Config

Params = dict[str, Any]
LN_EPS = 1e-5
"""GPT-2's layer_norm_epsilon."""


def layer_norm(p: Params, x: jax.Array) -> jax.Array:
    """(x - mean) / sqrt(var + eps) * g + b over the last axis."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * p["g"] + p["b"]


def linear(p: Params, x: jax.Array) -> jax.Array:
    """x @ w + b (GPT-2's Conv1D, (in, out) layout)."""
    return x @ p["w"] + p["b"]


def causal_self_attention(p: Params, x: jax.Array, n_head: int) -> tuple[jax.Array, ...]:
    """Multi-head causal self-attention of x (B, T, C); returns (y, k, v), k and v (B, T, nh, hd)."""
    B, T, C = x.shape
    q, k, v = jnp.split(linear(p["c_attn"], x), 3, axis=-1)
    q = q.reshape(B, T, n_head, C // n_head)
    k = k.reshape(B, T, n_head, C // n_head)
    v = v.reshape(B, T, n_head, C // n_head)
    if attention.current() != attention.DEFAULT:  # a library kernel (real_baselines)
        y = attention.attend(q, k, v, causal=True).reshape(B, T, C)
        return linear(p["c_proj"], y), k, v

    att = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(k.shape[-1]))
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jnp.where(mask[None, None], att, -jnp.inf)
    att = jax.nn.softmax(att, axis=-1)
    y = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, C)
    return linear(p["c_proj"], y), k, v


def mlp(p: Params, x: jax.Array) -> jax.Array:
    """c_proj(gelu_tanh(c_fc(x)))."""
    return linear(p["c_proj"], jax.nn.gelu(linear(p["c_fc"], x), approximate=True))


def gpt2_block(p: Params, x: jax.Array, n_head: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x + attn(ln_1(x)), then + mlp(ln_2(.)); returns (x, k, v)."""
    a, k, v = causal_self_attention(p["attn"], layer_norm(p["ln_1"], x), n_head)
    x = x + a
    x = x + mlp(p["mlp"], layer_norm(p["ln_2"], x))
    return x, k, v


def make_gpt2_prefill(cfg: Config):
    """`gpt2_prefill(params, x)` for `cfg`'s head count (a static hyper-parameter)."""

    def gpt2_prefill(params: Params, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Prefill of x (B, T, C): (block output, keys, values)."""
        return gpt2_block(params, x, cfg.q_heads)

    return gpt2_prefill


def from_weights(cfg: Config, w: Weights, dtype: Any) -> Params:
    """The nested params of the checkpoint `w` (`checkpoints.gpt2_weights`), "a.b.c" -> p[a][b][c]."""
    del cfg
    params: Params = {}
    for name, a in w.items():
        *path, leaf = name.split(".")
        node = params
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = jnp.asarray(a, dtype)
    return params
