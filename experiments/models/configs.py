"""Model sizes for the real-model benchmark set: one `Config` per family and size name.

The same block code runs at every size; only the `Config` changes. Sizes:

- "tiny": everything small, for CPU tests (d_model 64, 4 query heads / 2 KV heads of 16).
- "realistic": d_model 1024, 8 query heads, 2 KV heads, head dim 128, FFN 2816, cache 512 (for
  GPT-2: gpt2-medium, 1024 / 16 heads of 64 / FFN 4096, 512 tokens).
- "llama7b": one Llama-7B-shaped layer, d_model 4096, 32 query heads, 8 KV heads (the GQA of
  Llama-2-70B/Llama-3 at 7B width), head dim 128, FFN 11008, cache 4096 (for GPT-2: gpt2-xl,
  1600 / 25 heads of 64 / FFN 6400, 1024 tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SIZES = ("tiny", "realistic", "llama7b")
"""Size names, smallest first."""


@dataclass(frozen=True)
class Config:
    """The shape hyper-parameters of one block.

    Arguments:
        d_model: width of the residual stream.
        q_heads: number of query heads.
        kv_heads: number of key/value heads (grouped-query attention when < q_heads).
        head_dim: per-head width.
        ffn: hidden width of the MLP.
        kv_len: KV-cache length for decode blocks; number of keys for attention-only entries.
        q_len: new tokens per call (1 for a decode step, T for a prefill).
        eps: norm epsilon.
        rope_theta: rotary base frequency (blocks with rotary embeddings only).
    """

    d_model: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    kv_len: int
    q_len: int = 1
    eps: float = 1e-5
    rope_theta: float = 10_000.0

    def replace(self, **changes: int | float) -> Config:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def groups(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads


_DECODE = {
    "tiny": Config(d_model=64, q_heads=4, kv_heads=2, head_dim=16, ffn=176, kv_len=32),
    "realistic": Config(d_model=1024, q_heads=8, kv_heads=2, head_dim=128, ffn=2816, kv_len=512),
    "llama7b": Config(d_model=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=11008, kv_len=4096),
}
"""Llama and Gemma decode steps (q_len 1 over a KV cache of kv_len)."""

_GPT2 = {
    "tiny": Config(
        d_model=64, q_heads=4, kv_heads=4, head_dim=16, ffn=256, kv_len=32, q_len=32, eps=1e-5
    ),
    "realistic": Config(
        d_model=1024, q_heads=16, kv_heads=16, head_dim=64, ffn=4096, kv_len=512, q_len=512
    ),
    "llama7b": Config(
        d_model=1600, q_heads=25, kv_heads=25, head_dim=64, ffn=6400, kv_len=1024, q_len=1024
    ),
}
"""GPT-2 prefill of q_len tokens (kv_len = q_len; no GQA)."""

_SDPA = {
    "tiny": Config(d_model=64, q_heads=4, kv_heads=2, head_dim=16, ffn=0, kv_len=32, q_len=32),
    "realistic": Config(
        d_model=1024, q_heads=8, kv_heads=2, head_dim=128, ffn=0, kv_len=512, q_len=512
    ),
    "llama7b": Config(
        d_model=4096, q_heads=32, kv_heads=8, head_dim=128, ffn=0, kv_len=4096, q_len=4096
    ),
}
"""`jax.nn.dot_product_attention` alone, prefill-shaped (q_len = kv_len); d_model/ffn unused."""

FAMILIES = {"decode": _DECODE, "gpt2": _GPT2, "sdpa": _SDPA}


def config(family: str, size: str) -> Config:
    """The `Config` of `family` ("decode", "gpt2", "sdpa") at `size`; KeyError naming choices."""
    try:
        return FAMILIES[family][size]
    except KeyError:
        raise KeyError(
            f"no size {size!r} for family {family!r}; families: {', '.join(FAMILIES)}; "
            f"sizes: {', '.join(SIZES)}"
        ) from None
