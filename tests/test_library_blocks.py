"""The blocks of the libraries' own layers (`experiments.equinox_builtins`,
`experiments.nnx_builtins`, `experiments.flax_prefill`) and the softmax heads
(`experiments.softmax_heads`) on the CPU at tiny sizes: they reach the search, match the
libraries' own jits, and (nnx) carry the decode cache's index out."""

import jax.numpy as jnp

from experiments import equinox_builtins, flax_prefill, nnx_builtins, softmax_heads


def test_equinox_layers_under_filter_jit(tmp_path):
    (row,) = equinox_builtins.main(["--cpu", "--batches", "1", "--out", str(tmp_path)])
    assert row["rel_err"] < 1e-4 and row["kernels"] >= 1, row
    assert "| 1 | 8 | 32 |" in (tmp_path / "equinox_builtins.md").read_text()


def test_nnx_layers_decoding_with_their_cache_in_the_module(tmp_path):
    (row,) = nnx_builtins.main(["--cpu", "--batches", "1", "--steps", "2", "--out", str(tmp_path)])
    assert row["rel_err"] < 1e-4 and row["kernels"] >= 2, row  # the MLP and the attention
    assert row["carried_state"] and row["cache_index"] == (2, 2), row


def test_flax_prefill_blocks_in_nnx_and_linen(tmp_path):
    rows = flax_prefill.main(["--cpu", "--batches", "1", "--out", str(tmp_path)])
    assert [r["library"] for r in rows] == ["nnx", "linen"]
    for row in rows:  # the q/k/v projections, the attention and the output projection at least
        assert row["rel_err"] < 1e-4 and row["kernels"] >= 3, row
    assert "| linen | 1 | 8 | float32 | 32 |" in (tmp_path / "flax_prefill.md").read_text()


def test_flax_blocks_with_float32_parameters_and_bfloat16_compute():
    """flax's mixed precision: the capture, the converted biases' layouts and the norm's cut
    (its row stored in bfloat16) all reach kernels, the outputs within bfloat16's rounding."""
    row = flax_prefill.run_case(
        "linen", 1, 8, 32, 4, jnp.bfloat16, "pallas-interpret", 3, jnp.float32
    )
    assert row["param_dtype"] == "float32" and row["kernels"] >= 3, row
    assert row["rel_err"] < 2e-2, row


def test_softmax_heads(tmp_path):
    rows = softmax_heads.main(["--cpu", "--batches", "2", "--out", str(tmp_path)])
    assert [r["case"] for r in rows] == ["classifier", "router", "probabilities"]
    for row in rows:  # bfloat16 inputs
        assert row["kernels"] == 1 and row["rel_err"] < 2e-2, row
    assert "| router | 2 |" in (tmp_path / "softmax_heads.md").read_text()
