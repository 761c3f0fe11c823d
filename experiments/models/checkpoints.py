"""Deterministic stand-in checkpoints and inputs for the model set, as plain numpy dicts.

A real port loads a checkpoint (a dict of named arrays) into its library's modules; here the
checkpoint is drawn from a seed instead. The same dict feeds the JAX modules (through each
port's `from_weights`) and the float64 numpy references, so both compute from identical
numbers. Every array is stored at the model dtype (what the module holds); the references
widen it to float64.

Scales keep activations O(1) at every size, so fp16 neither overflows nor loses everything:
projections are N(0, 1/fan_in), norm gains 1 + N(0, 0.1²) (Gemma stores w with gain 1 + w, so
its w is N(0, 0.1²)), biases N(0, 0.02²).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.models.configs import Config

Weights = dict[str, np.ndarray]


WeightSpecs = dict[str, tuple[tuple[int, ...], str, float]]
"""name -> (shape, kind, scale); kind "normal" (scale·N), "gain" (1 + scale·N)."""


def draw(specs: WeightSpecs, seed: int, stream: int, dtype: Any) -> Weights:
    """One array per spec, from the numpy stream (seed, stream), stored at `dtype`."""
    rng = np.random.default_rng([seed, stream])
    out: Weights = {}
    for name, (shape, kind, scale) in specs.items():
        z = rng.standard_normal(shape)
        out[name] = (1.0 + scale * z if kind == "gain" else scale * z).astype(dtype)
    return out


def llama_weight_specs(cfg: Config) -> WeightSpecs:
    """A Llama layer: norms' gains, q/k/v/o projections, SwiGLU MLP; (in, out) layout."""
    d, q, kv, f = cfg.d_model, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
    return {
        "attn_norm": ((d,), "gain", 0.1),
        "wq": ((d, q), "normal", d**-0.5),
        "wk": ((d, kv), "normal", d**-0.5),
        "wv": ((d, kv), "normal", d**-0.5),
        "wo": ((q, d), "normal", q**-0.5),
        "mlp_norm": ((d,), "gain", 0.1),
        "w_gate": ((d, f), "normal", d**-0.5),
        "w_up": ((d, f), "normal", d**-0.5),
        "w_down": ((f, d), "normal", f**-0.5),
    }


def gemma_weight_specs(cfg: Config) -> WeightSpecs:
    """A Gemma layer in Gemma's einsum layouts: q (N,D,H), kv (2,K,D,H), out (N,H,D),
    gating (2,F,D), down (F,D); norms store w for the gain 1 + w."""
    d, n, k, h, f = cfg.d_model, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.ffn
    return {
        "attn_norm": ((d,), "normal", 0.1),
        "q_proj": ((n, d, h), "normal", d**-0.5),
        "kv_proj": ((2, k, d, h), "normal", d**-0.5),
        "out_proj": ((n, h, d), "normal", (n * h) ** -0.5),
        "mlp_norm": ((d,), "normal", 0.1),
        "gating": ((2, f, d), "normal", d**-0.5),
        "down": ((f, d), "normal", f**-0.5),
    }


def gpt2_weight_specs(cfg: Config) -> WeightSpecs:
    """A GPT-2 layer with the names and (in, out) layout of its checkpoints (Conv1D)."""
    d, f = cfg.d_model, cfg.ffn
    return {
        "ln_1.g": ((d,), "gain", 0.1),
        "ln_1.b": ((d,), "normal", 0.02),
        "attn.c_attn.w": ((d, 3 * d), "normal", d**-0.5),
        "attn.c_attn.b": ((3 * d,), "normal", 0.02),
        "attn.c_proj.w": ((d, d), "normal", d**-0.5),
        "attn.c_proj.b": ((d,), "normal", 0.02),
        "ln_2.g": ((d,), "gain", 0.1),
        "ln_2.b": ((d,), "normal", 0.02),
        "mlp.c_fc.w": ((d, f), "normal", d**-0.5),
        "mlp.c_fc.b": ((f,), "normal", 0.02),
        "mlp.c_proj.w": ((f, d), "normal", f**-0.5),
        "mlp.c_proj.b": ((d,), "normal", 0.02),
    }


def decode_position(cfg: Config) -> int:
    """The cache slot a decode step writes: three quarters in, so both sides of the mask exist."""
    return (3 * cfg.kv_len) // 4


def decode_input_shapes(cfg: Config, batch: int) -> dict[str, tuple[int, ...]]:
    """x (B, q_len, D), k_cache and v_cache (B, kv_len, K, H), pos (a scalar)."""
    cache = (batch, cfg.kv_len, cfg.kv_heads, cfg.head_dim)
    return {"x": (batch, cfg.q_len, cfg.d_model), "k_cache": cache, "v_cache": cache, "pos": ()}


def prefill_input_shapes(cfg: Config, batch: int) -> dict[str, tuple[int, ...]]:
    """x (B, T, D) with T = q_len."""
    return {"x": (batch, cfg.q_len, cfg.d_model)}


def attention_input_shapes(cfg: Config, batch: int) -> dict[str, tuple[int, ...]]:
    """q (B, T, N, H), k and v (B, S, K, H); N = q_heads, K = kv_heads, T = q_len, S = kv_len."""
    kv = (batch, cfg.kv_len, cfg.kv_heads, cfg.head_dim)
    return {"q": (batch, cfg.q_len, cfg.q_heads, cfg.head_dim), "k": kv, "v": kv}


def input_dtype(name: str, dtype: Any) -> np.dtype:
    """`pos` is int32; every other input has the model dtype."""
    return np.dtype(np.int32) if name == "pos" else np.dtype(dtype)


def draw_inputs(
    shapes: dict[str, tuple[int, ...]], cfg: Config, seed: int, dtype: Any
) -> dict[str, np.ndarray]:
    """N(0, 1) activations at `dtype`; `pos` is `decode_position(cfg)`.

    KV caches are random everywhere, also past `pos`: those slots are what the causal mask
    must hide, so a broken mask shows in the outputs instead of multiplying zeros.
    """
    rng = np.random.default_rng([seed, 10])
    out = {}
    for name, shape in shapes.items():
        if name == "pos":
            out[name] = np.asarray(decode_position(cfg), dtype=np.int32)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out
