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


def test_measured_times_are_the_attention_regions_own_and_set_against_the_floor(tmp_path):
    """From results files: the kernel region whose structure has an `exp` (not the other
    kernels), the donated run's time where a decode row has one, and a later file's row over an
    earlier one's; regions held to 2× without a time say so."""
    import json

    attn = "[grid[d0(8)] loop[d3(512)]: matmul reduce_max accum_max sub exp matmul div]"
    real = {
        "rows": [
            {"contender": "jax.jit", "model": "sdpa", "size": "realistic", "batch": 8},
            {
                "contender": "mirage_jax.jit",
                "model": "sdpa",
                "size": "realistic",
                "batch": 8,
                "regions": [
                    {"index": 0, "status": "kernel", "structure": "[grid: matmul accum_sum]"},
                    {"index": 1, "status": "kernel", "structure": attn, "in_function_us": 30.0},
                ],
            },
        ]
    }
    decode = {
        "rows": [
            {
                "key": "llama_decode_nnx_llama7b_b1",
                "regions": [
                    {"index": 3, "status": "kernel", "structure": attn, "in_function_us": 7.9}
                ],
                "donated": {"region_us": {"3": 10.7}},
            }
        ]
    }
    own = {  # the donated run's own choice: its attention a kernel where the other's was XLA
        "key": "gemma_decode_llama7b_b1",
        "regions": [{"index": 5, "status": "xla", "structure": None}],
        "donated": {"region_us": {"0": 24.6, "5": 10.8}, "kernel_regions": {"0": "x", "5": attn}},
    }
    assert AF._attention_time(own) == (10.8, "donated caches")
    later = {"rows": [{**real["rows"][1], "regions": [{**real["rows"][1]["regions"][1]}]}]}
    later["rows"][0]["regions"][0]["in_function_us"] = 16.0
    files = []
    for name, doc in (("a.json", real), ("b.json", decode), ("c.json", later)):
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(tmp_path / name)
    times = AF.measured(files[:2])
    assert times[("sdpa", "realistic", 8)]["us"] == 30.0
    assert times[("llama_decode_nnx", "llama7b", 1)] == {
        "us": 10.7,
        "run": "donated caches",
        "file": "b.json",
    }
    assert AF.measured(files)[("sdpa", "realistic", 8)]["us"] == 16.0
    rows = AF.floors("sdpa", "realistic", 8) + AF.floors("sdpa_decode", "realistic", 1)
    text = AF.against_floors(rows, times)
    assert "| sdpa | realistic | 8 | 30.00 | 8.69 | 3.45× | **no** |" in text
    assert "sdpa_decode" not in text  # not held to 2×
    text = AF.against_floors(rows, AF.measured(files))
    assert "| sdpa | realistic | 8 | 16.00 | 8.69 | 1.84× | yes |" in text
    assert "not measured" in AF.against_floors(rows, {})
