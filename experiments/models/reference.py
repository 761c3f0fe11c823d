"""Float64 numpy references of the model set, written apart from the JAX ports.

Each reference reads the same checkpoint dict (`experiments.models.checkpoints`) and input
dict as the port, widens everything to float64, and computes the block from its definition:
attention head by head in an explicit loop (no repeat or group reshape), the mask as -inf,
softmax with the max shift, GELU and SiLU from their formulas. Constants (epsilons, rotary
bases, Gemma's (1 + w) gain and query scaling) are restated here from the models' papers and
configs, not imported from the ports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from scipy.special import erf

Arrays = Mapping[str, np.ndarray]

LLAMA_EPS = 1e-5
LLAMA_THETA = 10_000.0
GEMMA_EPS = 1e-6
GEMMA_THETA = 10_000.0
GPT2_EPS = 1e-5


def _f64(d: Arrays) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}


def _rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Split-half rotation of x (B, T, heads, H): pairs (i, i + H/2) turn by pos·theta^(-2i/H)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    angle = positions[:, None] * inv_freq[None, :]  # (T, half)
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_positions: np.ndarray,
    causal: bool,
    scale: float,
) -> np.ndarray:
    """q (B, T, N, H) over k, v (B, S, K, H); query head n reads KV head n // (N/K).

    Causal: the query at position p sees keys 0..p (keys sit at positions 0..S-1).
    """
    n_heads, n_kv = q.shape[2], k.shape[2]
    group = n_heads // n_kv
    visible = np.arange(k.shape[1])[None, :] <= q_positions[:, None]  # (T, S)
    out = np.empty((*q.shape[:3], v.shape[-1]))
    for n in range(n_heads):
        s = np.einsum("bth,bsh->bts", q[:, :, n], k[:, :, n // group]) * scale
        if causal:
            s = np.where(visible[None], s, -np.inf)
        out[:, :, n] = np.einsum("bts,bsh->bth", _softmax(s), v[:, :, n // group])
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _write_cache(cache: np.ndarray, new: np.ndarray, pos: int) -> np.ndarray:
    out = cache.copy()
    out[:, pos : pos + new.shape[1]] = new
    return out


def llama_decode(w: Arrays, inputs: Arrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Llama decode step: (x, k_cache, v_cache) after writing T tokens at pos."""
    w, pos = _f64(w), int(inputs["pos"])
    x, kc, vc = (np.asarray(inputs[n], np.float64) for n in ("x", "k_cache", "v_cache"))
    b, t, _ = x.shape
    n_kv, hd = kc.shape[2], kc.shape[3]
    n_heads = w["wq"].shape[1] // hd
    positions = pos + np.arange(t, dtype=np.float64)

    h = _rms_norm(x, w["attn_norm"], LLAMA_EPS)
    q = _rope((h @ w["wq"]).reshape(b, t, n_heads, hd), positions, LLAMA_THETA)
    k = _rope((h @ w["wk"]).reshape(b, t, n_kv, hd), positions, LLAMA_THETA)
    v = (h @ w["wv"]).reshape(b, t, n_kv, hd)
    kc, vc = _write_cache(kc, k, pos), _write_cache(vc, v, pos)
    a = _attention(q, kc, vc, positions, causal=True, scale=hd**-0.5)
    x = x + a.reshape(b, t, -1) @ w["wo"]

    h = _rms_norm(x, w["mlp_norm"], LLAMA_EPS)
    x = x + (_silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
    return x, kc, vc


def gemma_decode(w: Arrays, inputs: Arrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gemma (v1) decode step with the erf GELU: (x, k_cache, v_cache)."""
    w, pos = _f64(w), int(inputs["pos"])
    x, kc, vc = (np.asarray(inputs[n], np.float64) for n in ("x", "k_cache", "v_cache"))
    b, t, _ = x.shape
    hd = kc.shape[3]
    positions = pos + np.arange(t, dtype=np.float64)

    h = _rms_norm(x, 1.0 + w["attn_norm"], GEMMA_EPS)
    q = _rope(np.einsum("btd,ndh->btnh", h, w["q_proj"]), positions, GEMMA_THETA)
    k = _rope(np.einsum("btd,kdh->btkh", h, w["kv_proj"][0]), positions, GEMMA_THETA)
    v = np.einsum("btd,kdh->btkh", h, w["kv_proj"][1])
    kc, vc = _write_cache(kc, k, pos), _write_cache(vc, v, pos)
    a = _attention(q, kc, vc, positions, causal=True, scale=hd**-0.5)
    x = x + np.einsum("btnh,nhd->btd", a, w["out_proj"])

    h = _rms_norm(x, 1.0 + w["mlp_norm"], GEMMA_EPS)
    gate, up = h @ w["gating"][0].T, h @ w["gating"][1].T
    x = x + (_gelu_erf(gate) * up) @ w["down"]
    return x, kc, vc


def gpt2_prefill(
    w: Arrays, inputs: Arrays, n_head: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPT-2 block over T tokens: (x, k, v), k and v (B, T, n_head, hd)."""
    w = _f64(w)
    x = np.asarray(inputs["x"], np.float64)
    b, t, c = x.shape
    hd = c // n_head

    h = _layer_norm(x, w["ln_1.g"], w["ln_1.b"], GPT2_EPS)
    qkv = h @ w["attn.c_attn.w"] + w["attn.c_attn.b"]
    q, k, v = (qkv[..., i * c : (i + 1) * c].reshape(b, t, n_head, hd) for i in range(3))
    a = _attention(q, k, v, np.arange(t), causal=True, scale=hd**-0.5)
    x = x + a.reshape(b, t, c) @ w["attn.c_proj.w"] + w["attn.c_proj.b"]

    h = _layer_norm(x, w["ln_2.g"], w["ln_2.b"], GPT2_EPS)
    f = _gelu_tanh(h @ w["mlp.c_fc.w"] + w["mlp.c_fc.b"])
    x = x + f @ w["mlp.c_proj.w"] + w["mlp.c_proj.b"]
    return x, k, v


def dot_product_attention(inputs: Arrays, causal: bool) -> np.ndarray:
    """softmax(q kᵀ / sqrt(H)) v for q (B, T, N, H), k, v (B, S, K, H); causal: key j ≤ query i."""
    q, k, v = (np.asarray(inputs[n], np.float64) for n in ("q", "k", "v"))
    return _attention(q, k, v, np.arange(q.shape[1]), causal=causal, scale=q.shape[-1] ** -0.5)
