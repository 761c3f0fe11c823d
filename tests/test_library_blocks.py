"""The blocks of the libraries' own layers (`experiments.equinox_builtins`,
`experiments.nnx_builtins`, `experiments.flax_prefill`) on the CPU at tiny sizes: they reach
the search, match the libraries' own jits, and (nnx) carry the decode cache's index out."""

from experiments import equinox_builtins, flax_prefill, nnx_builtins


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
    assert "| linen | 1 | 8 | 32 |" in (tmp_path / "flax_prefill.md").read_text()
