"""A Llama decoder layer's decode step, written as a flax nnx user writes it.

Library layers where flax has them (`nnx.Linear`, `nnx.RMSNorm`), rotary embeddings and
grouped-query attention by hand in the style of the Llama ports (split-half `rotate_half`
rotation as in the Hugging Face port, `repeat_kv` to widen the KV heads, scores masked with
`jnp.where(mask, scores, finfo.min)`, softmax in float32 as Meta's reference does). The KV cache
is passed in and returned, written with `lax.dynamic_update_slice` at `pos`, as the flax
Gemma example threads its cache.

`llama_decode_nnx(block, x, k_cache, v_cache, pos)` is the registered entry point: a plain
function of a module (an nnx module is a pytree, so `jax.jit` takes it as an argument).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from experiments.models import attention
from experiments.models.checkpoints import Weights
from experiments.models.configs import Config


def rotate_half(x: jax.Array) -> jax.Array:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding of x (B, T, heads, head_dim) at integer `positions` (T,)."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    emb = jnp.concatenate([freqs, freqs], axis=-1)[None, :, None, :]  # (1, T, 1, head_dim)
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: jax.Array, n_rep: int) -> jax.Array:
    """(B, S, kv_heads, H) -> (B, S, kv_heads * n_rep, H), each KV head repeated in place."""
    return x if n_rep == 1 else jnp.repeat(x, n_rep, axis=2)


class Attention(nnx.Module):
    """Grouped-query self-attention over a KV cache, one decode step."""

    def __init__(self, cfg: Config, *, dtype: Any, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h = cfg.d_model, cfg.head_dim
        kw = {"use_bias": False, "dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.q_proj = nnx.Linear(d, cfg.q_heads * h, **kw)
        self.k_proj = nnx.Linear(d, cfg.kv_heads * h, **kw)
        self.v_proj = nnx.Linear(d, cfg.kv_heads * h, **kw)
        self.o_proj = nnx.Linear(cfg.q_heads * h, d, **kw)

    def __call__(
        self, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        cfg = self.cfg
        bsz, seqlen, _ = x.shape
        q = self.q_proj(x).reshape(bsz, seqlen, cfg.q_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(bsz, seqlen, cfg.kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(bsz, seqlen, cfg.kv_heads, cfg.head_dim)

        positions = pos + jnp.arange(seqlen)
        q = apply_rope(q, positions, cfg.rope_theta)
        k = apply_rope(k, positions, cfg.rope_theta)

        k_cache = lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
        v_cache = lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
        if attention.current() != attention.DEFAULT:  # a library kernel (real_baselines)
            lengths = attention.decode_lengths(pos, bsz)
            out = attention.attend(q, k_cache, v_cache, valid_len=lengths)
            return self.o_proj(out.reshape(bsz, seqlen, -1)), k_cache, v_cache
        keys = repeat_kv(k_cache, cfg.groups)
        values = repeat_kv(v_cache, cfg.groups)

        scores = jnp.einsum("bthd,bshd->bhts", q, keys) / math.sqrt(cfg.head_dim)
        mask = jnp.arange(k_cache.shape[1])[None, :] <= positions[:, None]  # (T, S)
        scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
        out = jnp.einsum("bhts,bshd->bthd", probs, values)
        return self.o_proj(out.reshape(bsz, seqlen, -1)), k_cache, v_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: Config, *, dtype: Any, rngs: nnx.Rngs):
        kw = {"use_bias": False, "dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.gate_proj = nnx.Linear(cfg.d_model, cfg.ffn, **kw)
        self.up_proj = nnx.Linear(cfg.d_model, cfg.ffn, **kw)
        self.down_proj = nnx.Linear(cfg.ffn, cfg.d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nnx.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: Config, *, dtype: Any, rngs: nnx.Rngs):
        norm = {"epsilon": cfg.eps, "dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.input_layernorm = nnx.RMSNorm(cfg.d_model, **norm)
        self.self_attn = Attention(cfg, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = nnx.RMSNorm(cfg.d_model, **norm)
        self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)

    def __call__(
        self, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        h, k_cache, v_cache = self.self_attn(self.input_layernorm(x), k_cache, v_cache, pos)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_cache, v_cache


def llama_decode_nnx(
    block: LlamaBlock, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step: (new x, updated k_cache, updated v_cache)."""
    return block(x, k_cache, v_cache, pos)


def from_weights(cfg: Config, w: Weights, dtype: Any) -> LlamaBlock:
    """A `LlamaBlock` holding the checkpoint `w` (see `checkpoints.llama_weights`).

    Built abstractly (`nnx.eval_shape`, no random init) and then filled, as a checkpoint
    loader does; works under `jax.eval_shape` too, for abstract arguments.
    """
    block = nnx.eval_shape(lambda: LlamaBlock(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    attn, mlp = block.self_attn, block.mlp
    loads = [
        (block.input_layernorm.scale, "attn_norm"),
        (attn.q_proj.kernel, "wq"),
        (attn.k_proj.kernel, "wk"),
        (attn.v_proj.kernel, "wv"),
        (attn.o_proj.kernel, "wo"),
        (block.post_attention_layernorm.scale, "mlp_norm"),
        (mlp.gate_proj.kernel, "w_gate"),
        (mlp.up_proj.kernel, "w_up"),
        (mlp.down_proj.kernel, "w_down"),
    ]
    for param, name in loads:
        param.set_value(jnp.asarray(w[name], dtype))
    return block
