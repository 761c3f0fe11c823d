"""Import of the original Mirage's checkpoints: every file, float and field checks, rendering."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fields
import lax_ir
from experiments.import_mirage import benchmark_for, shrink, workload_of
from lax_ir import FloatAlgebra
from mirage_jax.mugraph import (
    MuGraphError,
    from_json,
    import_mugraph,
    load_mirage_checkpoint,
    render,
    to_json,
    to_text,
)

FILES = {
    "rmsnorm": "h100/rmsnorm_bs1.json",
    "gqa": "h100/gqa_bs1.json",
    "lora": "h100/lora_bs1.json",
    "gated_mlp": "h100/gated_mlp_bs1.json",
    "ntrans": "h100/norm_transformer_bs1.json",
    "qknorm": "h100/qknorm_gqa_bs1.json",
}


def test_every_checkpoint_imports(peer_dir):
    files = sorted(peer_dir.glob("*/*.json"))
    assert len(files) == 46
    total, distinct = 0, {}
    for path in files:
        graphs = load_mirage_checkpoint(path)
        assert graphs, path
        total += len(graphs)
        for g in graphs:
            distinct.setdefault(g.canonical_hash, g)
            assert g.meta["source"] == str(path)
    assert total == 1796
    for g in distinct.values():  # exact JSON round trip of every distinct imported µGraph
        assert from_json(to_json(g)).ops == g.ops


def _first_graph(peer_dir, rel):
    return json.loads((peer_dir / rel).read_text())[0]


def test_unknown_block_op_type_is_named(peer_dir, tmp_path):
    ops = _first_graph(peer_dir, FILES["rmsnorm"])
    custom = next(op for op in ops if op["op_type"] == "kn_customized_op")
    custom["bgraph"]["operators"][3]["op_type"] = "tb_frobnicate_op"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([ops]))
    with pytest.raises(MuGraphError, match=r"bad\.json.*unknown Mirage op type 'tb_frobnicate_op'"):
        load_mirage_checkpoint(path)


def test_unknown_kernel_op_type_and_dtype_are_named(peer_dir):
    ops = _first_graph(peer_dir, FILES["gated_mlp"])
    bad = [dict(op) for op in ops]
    k = next(i for i, op in enumerate(bad) if op["op_type"] == "kn_mul_op")
    bad[k]["op_type"] = "kn_relu_op"
    with pytest.raises(MuGraphError, match=r"kernel op \d+ \(kn_relu_op\): unknown Mirage op type"):
        import_mugraph(bad, source="x.json")
    bad = json.loads(json.dumps(ops))
    bad[0]["output_tensors"][0]["data_type"] = 999
    with pytest.raises(MuGraphError, match="unknown data_type 999"):
        import_mugraph(bad)


def test_recorded_shapes_are_checked(peer_dir):
    ops = _first_graph(peer_dir, FILES["rmsnorm"])
    custom = next(op for op in ops if op["op_type"] == "kn_customized_op")
    custom["bgraph"]["operators"][3]["output_tensors"][0]["dim"][1] = 25
    with pytest.raises(
        MuGraphError, match=r"the checkpoint records \[2, 25\], shape inference gives \[2, 24\]"
    ):
        import_mugraph(ops)


def test_file_names_map_to_benchmarks():
    assert workload_of("qknorm_gqa_bs16") == ("qknorm", 16)
    assert workload_of("norm_transformer_bs8_old") == ("ntrans", 8)
    assert workload_of("single_lora") == ("lora", 1)
    bm = benchmark_for("ntrans_bs8", ((64, 4096),) * 3)
    assert bm.name == "ntrans_mirage" and dict(bm.dims)["rows"] == 64


@pytest.mark.parametrize("workload", ["rmsnorm", "gqa", "lora", "gated_mlp", "ntrans"])
def test_float16_evaluation_matches_reference(peer_dir, workload):
    """fp16 evaluation (fp32 accumulators) of imported µGraphs against the float64 reference:
    the first at full size with jnp/XLA, the last at reduced shapes with numpy."""
    graphs = load_mirage_checkpoint(peer_dir / FILES[workload])
    stem = FILES[workload].split("/")[1][:-5]
    g = graphs[0]
    bm = benchmark_for(stem, tuple(s for s, _ in g.input_avals))
    small, small_bm = shrink(graphs[-1], stem)
    for graph, bench, alg in ((g, bm, FloatAlgebra()), (small, small_bm, FloatAlgebra(np))):
        xs = bench.make_inputs(seed=1)
        ref = bench.reference(*xs)
        out = np.asarray(graph.interpret(xs, alg)[0], np.float64)
        assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 1e-2


@pytest.mark.parametrize("workload", ["rmsnorm", "gqa", "lora", "gated_mlp", "ntrans"])
def test_field_verification_at_reduced_shapes(peer_dir, workload):
    graphs = load_mirage_checkpoint(peer_dir / FILES[workload])
    stem = FILES[workload].split("/")[1][:-5]
    for g in graphs[:: max(1, len(graphs) // 3)]:
        small, bm = shrink(g, stem)
        program = lax_ir.capture(bm.fn, *bm.inputs)
        assert fields.verify(small, program, trials=1).equal, to_text(small)


def test_qknorm_checkpoints_are_wrong(peer_dir):
    """Their QKNorm µGraphs use Q only through the row sums of rms_norm(Q), never Q·K: the
    output does not change when Q's head dim is permuted; attention's does (theirs, not ours)."""
    g = load_mirage_checkpoint(peer_dir / FILES["qknorm"])[0]
    small, bm = shrink(g, "qknorm_gqa_bs1")
    program = lax_ir.capture(bm.fn, *bm.inputs)
    assert not fields.verify(small, program, trials=1).equal
    xs = [np.asarray(x, np.float64) for x in bm.make_inputs(seed=0)]
    alg = FloatAlgebra(np, "float64")
    out, ref = small.interpret(xs, alg)[0], bm.reference(*xs)
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) > 0.5
    perm = np.random.default_rng(0).permutation(xs[0].shape[-1])
    permuted = [xs[0][..., perm], *xs[1:]]
    np.testing.assert_allclose(small.interpret(permuted, alg)[0], out, rtol=1e-9)
    assert not np.allclose(bm.reference(*permuted), ref)


def test_render_imported(peer_dir, tmp_path):
    for workload in ("gqa", "qknorm", "rmsnorm"):
        g = load_mirage_checkpoint(peer_dir / FILES[workload])[0]
        for ext in ("svg", "png"):
            assert render(g, tmp_path / f"{workload}.{ext}").stat().st_size > 1000
        assert "graph_defined" in to_text(g)


def test_the_2024_checkpoint_format_imports(peer_dir, tmp_path):
    # The original's 2024 checkpoints (benchmark/saved_mugraphs/ of github.com/mirage-project/
    # mirage, e.g. single_mqa_bs1.json) name the accumulators tb_accum_nored_op,
    # tb_accum_red_ld_sum_op and tb_accum_redtox_ld_sum_op; the evaluation branch's files use the
    # tb_forloop_* names. The same µGraphs under the 2024 names import to the same graphs.
    src = peer_dir / "a100" / "gqa_bs1.json"
    text = src.read_text()
    renamed = text.replace("tb_forloop_accum_nored_op", "tb_accum_nored_op")
    renamed = renamed.replace("tb_forloop_accum_red_ld_sum_op", "tb_accum_red_ld_sum_op")
    renamed = renamed.replace("tb_forloop_accum_redtox_ld_sum_op", "tb_accum_redtox_ld_sum_op")
    assert "tb_accum_redtox_ld_sum_op" in renamed and "tb_forloop" not in renamed
    path = tmp_path / "gqa_bs1_2024.json"
    path.write_text(renamed)
    old, new = load_mirage_checkpoint(src), load_mirage_checkpoint(path)
    assert [g.canonical_hash for g in new] == [g.canonical_hash for g in old]
    assert json.loads(renamed)  # still the same document otherwise
