"""experiments/attention_floors.py: which attention regions issue 16 holds to 2× of a floor."""

from __future__ import annotations

import pytest

from experiments import attention_floors as AF


def test_the_7b_decode_attention_floor_is_its_cache_read_once():
    """Llama-7B b=1: K and V (4096 × 8 heads × 128, float16) are 16.8 MB of the region's
    bytes; at 2.93 TB/s the floor is 5.73 µs, memory-bound, so the region is held to 2×."""
    (row,) = AF.floors("llama_decode_nnx", "llama7b", 1)
    cache = 2 * 4096 * 8 * 128 * 2
    assert cache <= row["bytes"] < cache * 1.01
    assert row["bound"] == "memory" and row["held_to_2x"]
    assert row["floor_us"] == pytest.approx(row["bytes"] / AF.H100_BANDWIDTH * 1e6, rel=1e-3)


def test_prefill_attention_is_compute_bound_and_small_decodes_are_not_held():
    (prefill,) = AF.floors("sdpa", "realistic", 8)
    assert prefill["flops"] == 4 * 8 * 8 * 512 * 512 * 128  # QKᵀ and PV, 2 flops a product
    assert prefill["bound"] == "compute" and prefill["held_to_2x"]
    (decode,) = AF.floors("sdpa_decode", "realistic", 1)
    assert decode["floor_us"] < AF.MIN_FLOOR_US and not decode["held_to_2x"]
    assert "| sdpa | realistic | 8 |" in AF.table([prefill, decode], 2.93e12, 989e12)
