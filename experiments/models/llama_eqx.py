"""A Llama decoder layer's decode step, written as an equinox user writes it.

Equinox style: modules act on one example (no batch axis) and the caller `jax.vmap`s them;
layers act on one vector and are vmapped over tokens (`jax.vmap(self.q_proj)(x)`); library
layers where equinox has them (`eqx.nn.Linear`, `eqx.nn.RMSNorm`); attention vmapped over KV
heads as `eqx.nn.MultiheadAttention` vmaps over heads, each KV head serving its group of
query heads; rotary embeddings as `eqx.nn.RotaryPositionalEmbedding` computes them (float32
cos/sin tiled over both halves, its `rotate_half`), but at positions pos + arange(T), since
the library module always starts at 0. The KV cache is passed in and returned, written with
`lax.dynamic_update_slice` at `pos`; the mask is `jnp.where(mask, logits, finfo.min)`.

`llama_decode_eqx(block, x, k_cache, v_cache, pos)` is the registered entry point: the block
vmapped over the batch.
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from experiments.models import attention
from experiments.models.checkpoints import Weights
from experiments.models.configs import Config


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding of x (T, heads, head_dim) at integer `positions` (T,)."""
    head_dim = x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0.0, head_dim, 2)[jnp.newaxis, :] / head_dim))
    freqs_outer = positions.astype(jnp.float32)[:, jnp.newaxis] * freqs  # (T, head_dim/2)
    cos = jnp.tile(jnp.cos(freqs_outer), (1, 2))[:, jnp.newaxis, :]
    sin = jnp.tile(jnp.sin(freqs_outer), (1, 2))[:, jnp.newaxis, :]
    rotated = eqx.nn.RotaryPositionalEmbedding.rotate_half(x)
    return (x * cos + rotated * sin).astype(x.dtype)


class Attention(eqx.Module):
    """Grouped-query self-attention of one sequence over its KV cache."""

    q_proj: eqx.nn.Linear
    k_proj: eqx.nn.Linear
    v_proj: eqx.nn.Linear
    o_proj: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    rope_theta: float = eqx.field(static=True)

    def __init__(self, cfg: Config, *, dtype: Any, key: jax.Array):
        qkey, kkey, vkey, okey = jax.random.split(key, 4)
        d, h = cfg.d_model, cfg.head_dim
        self.q_proj = eqx.nn.Linear(d, cfg.q_heads * h, use_bias=False, dtype=dtype, key=qkey)
        self.k_proj = eqx.nn.Linear(d, cfg.kv_heads * h, use_bias=False, dtype=dtype, key=kkey)
        self.v_proj = eqx.nn.Linear(d, cfg.kv_heads * h, use_bias=False, dtype=dtype, key=vkey)
        self.o_proj = eqx.nn.Linear(cfg.q_heads * h, d, use_bias=False, dtype=dtype, key=okey)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.q_heads, cfg.kv_heads, h
        self.rope_theta = cfg.rope_theta

    def __call__(
        self, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x (T, D), caches (S, K, H) -> (out (T, D), k_cache, v_cache)."""
        seq_len = x.shape[0]
        kv_len = k_cache.shape[0]
        groups = self.num_heads // self.num_kv_heads
        q = jax.vmap(self.q_proj)(x).reshape(seq_len, self.num_heads, self.head_dim)
        k = jax.vmap(self.k_proj)(x).reshape(seq_len, self.num_kv_heads, self.head_dim)
        v = jax.vmap(self.v_proj)(x).reshape(seq_len, self.num_kv_heads, self.head_dim)

        positions = pos + jnp.arange(seq_len)
        q = rope(q, positions, self.rope_theta)
        k = rope(k, positions, self.rope_theta)
        k_cache = lax.dynamic_update_slice(k_cache, k, (pos, 0, 0))
        v_cache = lax.dynamic_update_slice(v_cache, v, (pos, 0, 0))
        if attention.current() != attention.DEFAULT:  # a library kernel (real_baselines)
            lengths = attention.decode_lengths(pos, 1)
            out = attention.attend(q[None], k_cache[None], v_cache[None], valid_len=lengths)[0]
            return jax.vmap(self.o_proj)(out.reshape(seq_len, -1)), k_cache, v_cache

        mask = jnp.arange(kv_len)[None, None, :] <= positions[:, None, None]  # (T, 1, S)

        def kv_head(q_group: jax.Array, k_head: jax.Array, v_head: jax.Array) -> jax.Array:
            """q_group (T, G, H) against one KV head's k_head, v_head (S, H)."""
            logits = jnp.einsum("tgh,sh->tgs", q_group, k_head) / math.sqrt(self.head_dim)
            logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
            weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v_head.dtype)
            return jnp.einsum("tgs,sh->tgh", weights, v_head)

        q = q.reshape(seq_len, self.num_kv_heads, groups, self.head_dim)
        out = jax.vmap(kv_head, in_axes=(1, 1, 1), out_axes=1)(q, k_cache, v_cache)
        out = jax.vmap(self.o_proj)(out.reshape(seq_len, -1))
        return out, k_cache, v_cache


class MLP(eqx.Module):
    """SwiGLU on one vector: down(silu(gate(x)) * up(x))."""

    gate_proj: eqx.nn.Linear
    up_proj: eqx.nn.Linear
    down_proj: eqx.nn.Linear

    def __init__(self, cfg: Config, *, dtype: Any, key: jax.Array):
        gkey, ukey, dkey = jax.random.split(key, 3)
        self.gate_proj = eqx.nn.Linear(cfg.d_model, cfg.ffn, use_bias=False, dtype=dtype, key=gkey)
        self.up_proj = eqx.nn.Linear(cfg.d_model, cfg.ffn, use_bias=False, dtype=dtype, key=ukey)
        self.down_proj = eqx.nn.Linear(cfg.ffn, cfg.d_model, use_bias=False, dtype=dtype, key=dkey)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(eqx.Module):
    """Pre-norm decoder layer on one sequence: x + attn(norm(x)), then + mlp(norm(.))."""

    input_layernorm: eqx.nn.RMSNorm
    self_attn: Attention
    post_attention_layernorm: eqx.nn.RMSNorm
    mlp: MLP

    def __init__(self, cfg: Config, *, dtype: Any, key: jax.Array):
        akey, mkey = jax.random.split(key)
        self.input_layernorm = eqx.nn.RMSNorm(cfg.d_model, eps=cfg.eps, use_bias=False, dtype=dtype)
        self.self_attn = Attention(cfg, dtype=dtype, key=akey)
        self.post_attention_layernorm = eqx.nn.RMSNorm(
            cfg.d_model, eps=cfg.eps, use_bias=False, dtype=dtype
        )
        self.mlp = MLP(cfg, dtype=dtype, key=mkey)

    def __call__(
        self, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x (T, D), caches (S, K, H) -> (x, k_cache, v_cache)."""
        h, k_cache, v_cache = self.self_attn(
            jax.vmap(self.input_layernorm)(x), k_cache, v_cache, pos
        )
        x = x + h
        x = x + jax.vmap(self.mlp)(jax.vmap(self.post_attention_layernorm)(x))
        return x, k_cache, v_cache


def llama_decode_eqx(
    block: LlamaBlock, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step for a batch: x (B, T, D), caches (B, S, K, H), pos shared."""
    return jax.vmap(block, in_axes=(0, 0, 0, None))(x, k_cache, v_cache, pos)


def from_weights(cfg: Config, w: Weights, dtype: Any) -> LlamaBlock:
    """A `LlamaBlock` holding the checkpoint `w` (`checkpoints.llama_weights`).

    Built abstractly (`eqx.filter_eval_shape`, no random init) and filled with `eqx.tree_at`;
    `eqx.nn.Linear` keeps (out, in) weights, so the (in, out) checkpoint is transposed.
    Works under `jax.eval_shape` too, for abstract arguments.
    """
    block = eqx.filter_eval_shape(LlamaBlock, cfg, dtype=dtype, key=jax.random.key(0))

    def leaves(b: LlamaBlock) -> tuple[Any, ...]:
        a, m = b.self_attn, b.mlp
        return (
            b.input_layernorm.weight,
            a.q_proj.weight,
            a.k_proj.weight,
            a.v_proj.weight,
            a.o_proj.weight,
            b.post_attention_layernorm.weight,
            m.gate_proj.weight,
            m.up_proj.weight,
            m.down_proj.weight,
        )

    def arr(name: str, transpose: bool = True) -> jax.Array:
        a = jnp.asarray(w[name], dtype)
        return a.T if transpose else a

    values = (
        arr("attn_norm", transpose=False),
        arr("wq"),
        arr("wk"),
        arr("wv"),
        arr("wo"),
        arr("mlp_norm", transpose=False),
        arr("w_gate"),
        arr("w_up"),
        arr("w_down"),
    )
    return eqx.tree_at(leaves, block, values)
