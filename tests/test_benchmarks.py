"""Tests for experiments.benchmarks: programs against float64 references, floors, inputs, registry."""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from experiments import benchmarks as bench

NAMES = bench.names()
OURS = [n for n in NAMES if bench.get(n).form == "ours"]
MIRAGE = [n for n in NAMES if bench.get(n).form == "mirage"]
_HERE = Path(__file__).resolve().parents[1]
CHECKPOINT_DIRS = [
    p / "peer" / "mirage_mugraphs" for p in (_HERE / "shared", _HERE.parent / "shared")
]


def _rel_err(out, ref):
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def test_registry_covers_every_program_at_every_batch():
    assert set(OURS) == set(bench.PAPER_NAMES) | {"gqa_stable"}
    assert {bench.get(n).workload for n in MIRAGE} == {
        "gqa",
        "qknorm",
        "rmsnorm",
        "lora",
        "gated_mlp",
        "ntrans",
    }
    assert len(bench.BENCHMARKS) == len(NAMES) * len(bench.BATCHES)
    for key, bm in bench.BENCHMARKS.items():
        assert key == bm.key == f"{bm.name}_b{bm.batch}"
        assert bm.form in ("ours", "mirage")
        assert bm.name.startswith(bm.workload)
        assert len(bm.input_names) == len(bm.inputs)
        assert bm.notes
        assert (bm.checkpoint != "") == (bm.form == "mirage")


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", NAMES)
def test_program_matches_float64_reference(name, batch):
    bm = bench.get(name, batch).small()
    xs = bm.make_inputs(seed=batch, dtype=np.float32)
    out = jax.jit(bm.fn)(*xs)
    ref = bm.reference(*xs)
    assert out.shape == ref.shape == bm.output.shape
    assert ref.dtype == np.float64
    assert _rel_err(out, ref) < 1e-5


def test_output_specs_match_eval_shape_at_full_shapes():
    for bm in bench.BENCHMARKS.values():
        out = jax.eval_shape(bm.fn, *bm.inputs)
        assert out.shape == bm.output.shape, bm.key
        assert out.dtype == np.float16 == bm.dtype, bm.key


def test_floor_bytes_count_inputs_and_output_once():
    for bm in bench.BENCHMARKS.values():
        n = sum(np.prod(s.shape) for s in bm.inputs) + np.prod(bm.output.shape)
        assert bm.floor_bytes == 2 * n
        assert bm.floor_us() == pytest.approx(bm.floor_bytes / 3.0e12 * 1e6)
        assert bm.floor_us(1.5e12) == pytest.approx(2 * bm.floor_us())


@pytest.mark.parametrize(
    ("name", "batch", "expected_bytes"),
    [
        ("gqa", 1, 2.2e6),
        ("gqa", 8, 8 * 2.2e6),
        ("qknorm", 1, 2.2e6),
        ("rmsnorm", 1, 50.4e6),
        ("lora", 1, 2.3e6),
        ("gated_mlp", 1, 67.2e6),
        ("ntrans", 1, 32 * 1024),
    ],
)
def test_floor_matches_benchmarks_md(name, batch, expected_bytes):
    assert bench.get(name, batch).floor_bytes == pytest.approx(expected_bytes, rel=0.05)


def test_floor_us_matches_benchmarks_md():
    assert bench.get("rmsnorm").floor_us() == pytest.approx(16.8, rel=0.05)
    assert bench.get("gated_mlp").floor_us() == pytest.approx(22.4, rel=0.05)
    assert bench.get("lora").floor_us() == pytest.approx(0.8, rel=0.05)


def test_make_inputs_is_deterministic_with_right_shapes_and_dtypes():
    bm = bench.get("gqa").small()
    a, b, c = bm.make_inputs(3), bm.make_inputs(3), bm.make_inputs(4)
    for x, y, z, spec in zip(a, b, c, bm.inputs):
        assert x.shape == spec.shape and x.dtype == np.float16
        np.testing.assert_array_equal(x, y)
        assert not np.array_equal(x, z)
    assert [x.dtype for x in bm.make_inputs(3, dtype=np.float32)] == [np.float32] * 3
    # the same draw at another precision
    np.testing.assert_allclose(bm.make_inputs(3, dtype=np.float32)[0], a[0], rtol=1e-3, atol=1e-4)


def test_make_inputs_draws_q_and_k_small_and_the_rest_standard():
    q, k, v = bench.get("gqa").make_inputs(0, dtype=np.float32)
    assert np.std(q) == pytest.approx(0.25, rel=0.05)
    assert np.std(k) == pytest.approx(0.25, rel=0.05)
    assert np.std(v) == pytest.approx(1.0, rel=0.05)
    for x in bench.get("ntrans").make_inputs(0, dtype=np.float32):
        assert np.std(x) == pytest.approx(1.0, rel=0.1)


def test_make_inputs_scale_shapes_replaces_named_dims():
    bm = bench.get("gqa", 8)
    q, k, v = bm.make_inputs(0, scale_shapes={"kv_len": 128, "q_len": 16})
    assert (q.shape, k.shape, v.shape) == ((16, 16, 64), (16, 64, 128), (16, 128, 64))
    with pytest.raises(KeyError, match="has no dims \\['seq'\\]"):
        bm.make_inputs(0, scale_shapes={"seq": 4})


def test_small_shapes_share_the_program_and_stay_multiples_of_16():
    for bm in bench.BENCHMARKS.values():
        small = bm.small()
        assert (small.name, small.batch, small.fn, small.form) == (
            bm.name,
            bm.batch,
            bm.fn,
            bm.form,
        )
        assert small.floor_bytes < 1 << 20
        for (key, full), (key2, size) in zip(bm.dims, small.dims):
            assert key == key2 and size <= full
            if full % 256 == 0:
                assert size % 16 == 0, (bm.key, key)


def test_get_errors_clearly_on_unknown_names_and_batches():
    with pytest.raises(KeyError, match="no benchmark 'attention' at batch 1; names: gqa, "):
        bench.get("attention")
    with pytest.raises(KeyError, match="batches: 1, 8, 16"):
        bench.get("rmsnorm", 3)
    assert bench.get("rmsnorm", 8) is bench.BENCHMARKS["rmsnorm_b8"]


def test_paper_suite_is_our_forms_of_the_six_workloads_plus_gqa_scaled():
    suite = bench.paper_suite()
    assert [bm.key for bm in suite[:4]] == ["gqa_b1", "gqa_b8", "gqa_scaled_b1", "gqa_scaled_b8"]
    assert len(suite) == 14
    assert {bm.form for bm in suite} == {"ours"}
    assert {bm.workload for bm in suite} == {
        "gqa",
        "qknorm",
        "rmsnorm",
        "lora",
        "gated_mlp",
        "ntrans",
    }
    assert [bm.batch for bm in bench.paper_suite((16,))] == [16] * 7


def test_benchmarks_are_frozen_and_hashable():
    bm = bench.get("lora")
    assert hash(bm) == hash(bench.get("lora"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        bm.batch = 2  # type: ignore[misc]


def _ref_pair(a, b, batch=1, seed=0):
    bm = bench.get(a, batch).small()
    xs = bm.make_inputs(seed, dtype=np.float32)
    return bm.reference(*xs), bench.get(b, batch).small().reference(*xs)


def test_attention_variants_differ_where_they_should():
    gqa, scaled = _ref_pair("gqa", "gqa_scaled")
    assert _rel_err(gqa, scaled) > 1e-3
    scaled, stable = _ref_pair("gqa_scaled", "gqa_stable")
    assert _rel_err(scaled, stable) < 1e-12  # the max shift changes nothing in exact arithmetic
    gqa, gqa_mirage = _ref_pair("gqa", "gqa_mirage")
    np.testing.assert_array_equal(gqa, gqa_mirage)


def test_mirage_forms_differ_from_ours_where_they_should():
    ours, theirs = _ref_pair("qknorm", "qknorm_mirage")
    assert _rel_err(ours, theirs) > 1e-2
    for name in ("rmsnorm", "ntrans"):  # only eps differs: small but nonzero
        ours, theirs = _ref_pair(name, f"{name}_mirage")
        assert 1e-10 < _rel_err(ours, theirs) < 1e-4
    for name, rows in (("lora", 16), ("gated_mlp", 8)):
        assert bench.get(f"{name}_mirage", 1).inputs == bench.get(name, 1).inputs
        assert bench.get(f"{name}_mirage", 8).inputs[0].shape[0] == rows
        assert bench.get(name, 8).inputs[0].shape[0] == 8 * rows


def test_qknorm_normalises_the_right_axes():
    rng = np.random.default_rng(0)
    q, k, v = bench.get("qknorm").small().make_inputs(0, dtype=np.float64)
    h, lq, _ = q.shape
    kv = k.shape[-1]
    row_q, col_k, row_v = (rng.uniform(0.5, 2.0, s) for s in ((h, lq, 1), (h, 1, kv), (h, kv, 1)))
    ours = bench.qknorm_reference
    assert _rel_err(ours(q * row_q, k * col_k, v), ours(q, k, v)) < 1e-4  # up to eps
    assert _rel_err(ours(q, k, v * row_v), ours(q, k, v)) > 1e-2
    theirs = bench.qknorm_mirage_reference
    np.testing.assert_allclose(theirs(q * row_q, k, v * row_v), theirs(q, k, v), rtol=1e-12)
    assert _rel_err(theirs(q, k * col_k, v), theirs(q, k, v)) > 1e-2


def test_gated_mlp_silu_captures_as_logistic():
    bm = bench.get("gated_mlp").small()
    assert "logistic" in str(jax.make_jaxpr(bm.fn)(*bm.inputs))


def _checkpoint_dir():
    for d in CHECKPOINT_DIRS:
        if d.is_dir():
            return d
    pytest.skip("peer/mirage_mugraphs not found")


def _dims(tensor):
    return tuple(tensor["dim"][: tensor["num_dims"]])


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_mirage_forms_have_the_shapes_of_the_checkpoints(gpu):
    root = _checkpoint_dir() / gpu
    for name in MIRAGE:
        for batch in bench.BATCHES:
            bm = bench.get(name, batch)
            graphs = json.loads((root / bm.checkpoint).read_text())
            assert graphs, bm.checkpoint
            for graph in graphs:
                ins = [
                    _dims(op["output_tensors"][0]) for op in graph if op["op_type"] == "kn_input_op"
                ]
                outs = [
                    _dims(op["input_tensors"][0]) for op in graph if op["op_type"] == "kn_output_op"
                ]
                assert ins == [s.shape for s in bm.inputs], (gpu, bm.checkpoint)
                assert outs == [bm.output.shape], (gpu, bm.checkpoint)
