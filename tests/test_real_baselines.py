"""The real models' attention switch and experiments/real_baselines.py (CPU; GPU test marked)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from experiments import models as M
from experiments import real_baselines as RB
from experiments.models import attention as A
from experiments.never_slower import _max_rel

DECODE = ("llama_decode_nnx", "llama_decode_eqx", "gemma_decode", "sdpa_decode")


def _jaxpr(m: M.Model) -> str:
    return str(jax.make_jaxpr(m.fn)(*m.abstract_args()))


@pytest.mark.parametrize("name", M.names())
def test_default_attention_is_the_model_as_written(name):
    m = M.get(name, 2, "tiny")
    assert m.attention == "einsum"
    assert A.with_attention(m.fn, "einsum") is m.fn
    assert M.get(name, 2, "tiny", attention="einsum").fn.__code__ is m.fn.__code__
    assert _jaxpr(M.get(name, 2, "tiny", attention="einsum")) == _jaxpr(m)
    with A.use("einsum"):
        assert _jaxpr(m) == _jaxpr(m.with_attention("einsum"))
    if m.library != "jax.nn":  # the sdpa entries are written as that call already
        assert _jaxpr(m.with_attention("xla")) != _jaxpr(m)
    assert A.current() == "einsum"  # the wrapper's context is gone after tracing


def test_default_regions_match_the_hashes_recorded_before_the_switch():
    """The realistic models' region Programs (b = 1, 8) are those recorded in
    model_region_hashes.json: the attention switch leaves the default path (what
    mirage_jax.jit searches) unchanged. Re-recorded 2026-11-25 when masks became biases made
    at the mask's own shape and broadcast inside the region (`lax_ir.layouts._rank_rule`), and
    again 2026-11-26 when a mask that depends on no input became a constant bias (constants'
    broadcasts fold, so equinox's RoPE table is one constant), and when a convert ending a
    GEMM epilogue moved to the region that reads it (`lax_ir.pieces.gemm_cuts`), and when
    Gemma's `1 + scale` gain became a shift step at its norm regions' interface (regions 0 and
    1 of gemma_decode only: `lax_ir.layouts._shift_rule`), and 2026-11-27 when a mask widened
    over heads that the region groups by KV head reached the region unwidened (the attention
    regions of llama_decode_nnx and gemma_decode: `lax_ir.layouts._grouped_broadcast_rule`),
    and when a dot_general's contracted pairs came in the larger operand's memory order
    (gemma_decode's output projection, whose einsum lists (H, N): `lax_ir.capture`), and
    2026-11-29 when `x - zeros`, `x + zeros` and `x * ones` became x in the capture (flax's
    RMSNorm subtracts a mean of zeros: llama_decode_nnx's norm and rotary regions), and when
    equinox's vmapped `weight @ x` kept its swap back in the region and became `x Wᵀ`
    (llama_decode_eqx b=8: the residual add joins the output projection, by rows:
    `lax_ir.pieces.lays_out_product`, `lax_ir.transpose_layouts.product_rule`)."""
    import lax_ir

    want = json.loads((Path(__file__).parent / "model_region_hashes.json").read_text())
    got = {}
    for key in want:
        name, rest = key.split("_realistic_b")
        m = M.get(name, int(rest), "realistic")
        part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
        got[key] = [r.program.canonical_hash for r in part.regions]
    assert got == want


@pytest.mark.parametrize("name", M.names())
def test_library_attention_matches_the_einsums(name):
    m = M.get(name, 2, "tiny")
    xs = m.make(0).args
    want = jax.jit(m.fn)(*xs)
    for impl in ("xla", "pallas_decode"):
        if impl == "pallas_decode" and name not in DECODE:
            assert "one query token" in m.not_applicable(impl)
            with pytest.raises(ValueError, match="does not apply"):
                m.with_attention(impl)
            continue
        assert _max_rel(jax.jit(m.with_attention(impl).fn)(*xs), want) < 1e-5, impl


def test_decode_mask_is_a_valid_length_per_sequence():
    # pos + 1 visible slots; the cache past pos is random, so a wrong length shows
    m = M.get("llama_decode_nnx", 2, "tiny")
    case = m.make(0)
    *head, pos = case.args
    ref = jax.jit(m.fn)
    fns = {impl: jax.jit(m.with_attention(impl).fn) for impl in ("xla", "pallas_decode")}
    for p in (0, 5, m.config.kv_len - 1):
        xs = (*head, np.int32(p))
        want = ref(*xs)
        for impl, fn in fns.items():
            assert _max_rel(fn(*xs), want) < 1e-5, (impl, p)


def test_attend_groups_query_heads_as_jax_nn():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 8, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 32, 2, 16)).astype(np.float32) for _ in range(2))
    lengths = np.array([7, 32], np.int32)
    want = jax.nn.dot_product_attention(
        q, np.repeat(k, 4, axis=2), np.repeat(v, 4, axis=2), key_value_seq_lengths=lengths
    )
    for impl in ("xla", "pallas_decode"):
        got = A.attend(q, k, v, valid_len=lengths, name=impl)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="one query token"):
        A.attend(np.concatenate([q, q], 1), k, v, name="pallas_decode")


def test_not_applicable_says_why():
    assert "float16/bfloat16" in M.get("gpt2_prefill", 1, "tiny").not_applicable("cudnn")
    assert M.get("gpt2_prefill", 1, "tiny", dtype="float16").not_applicable("cudnn") is None
    assert "prefill" in M.get("sdpa_causal", 1, "realistic").not_applicable("pallas_decode")
    assert M.get("gemma_decode", 8, "realistic").not_applicable("pallas_decode") is None
    assert M.get("llama_decode_eqx", 1, "tiny").not_applicable("tokamax_mosaic") is None
    with pytest.raises(KeyError, match="one of einsum"):
        M.get("sdpa", attention="flash")


def test_cudnn_variants_trace_with_cudnn_on_every_model(monkeypatch):
    # the CPU jaxlib has no cuDNN: its version and capability checks are stood in for, so the
    # layouts, dtypes, masks and the vmap (equinox) of each cuDNN variant are traced here
    fa = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    for attr, value in (
        ("check_cudnn_version", lambda: 91000),
        ("check_compute_capability", lambda c: True),
        ("is_cuda_compute_capability_equal", lambda c: False),
    ):
        if not hasattr(fa, attr):
            pytest.skip(f"jax moved {attr}")
        monkeypatch.setattr(fa, attr, value)

    def primitives(jaxpr, seen):
        for e in jaxpr.eqns:
            seen.add(e.primitive.name)
            for p in e.params.values():
                inner = getattr(p, "jaxpr", None)
                if inner is not None:
                    primitives(getattr(inner, "jaxpr", inner), seen)
        return seen

    for name in M.names():
        m = M.get(name, 8, "realistic", attention="cudnn")
        seen = primitives(jax.make_jaxpr(m.fn)(*m.abstract_args()).jaxpr, set())
        assert any("dot_product_attention" in p for p in seen), name


# ---- the runner, with stand-ins for the timer and mirage_jax.jit ---------------------------


def _fake_timer(fn, inputs, calls):
    """Times by the number of equations of the traced program: stable and attention-dependent."""
    n = len(jax.make_jaxpr(fn)(*inputs(0)).jaxpr.eqns)
    return SimpleNamespace(median_us=float(n), p10_us=n - 0.5, p90_us=n + 0.5)


def _fake_mirage(model, inputs, timer, args):
    return {"status": "ok", "median_us": 1.0, "p10_us": 1.0, "p90_us": 1.0, "matches": True,
            "max_rel_error": 0.0, "tolerance": 2e-3, "first_call_s": 0.1, "kernels": 1}  # fmt: skip


def _args(tmp_path, *extra):
    argv = ["--models", "sdpa_decode", "sdpa_causal", "--sizes", "tiny", "--model-batches", "1",
            "--contenders", "mirage_jax.jit", "xla", "pallas_decode", "tokamax_triton",
            "--out", str(tmp_path), "--calls", "3", *extra]  # fmt: skip
    args = RB.parse(argv)
    args.check_only = False  # the fake timer stands in for the GPU
    return args


def test_runner_writes_rows_table_and_figure(tmp_path):
    doc = RB.run(_args(tmp_path), timer=_fake_timer, mirage=_fake_mirage)
    rows = {r["key"]: r for r in doc["rows"]}
    assert len(rows) == 2 * 5
    assert rows["sdpa_decode_tiny_b1/jax.jit"]["status"] == "ok"
    assert rows["sdpa_decode_tiny_b1/pallas_decode"]["matches"]
    assert rows["sdpa_decode_tiny_b1/mirage_jax.jit"]["speedup"] == pytest.approx(
        rows["sdpa_decode_tiny_b1/jax.jit"]["median_us"]
    )
    assert rows["sdpa_causal_tiny_b1/pallas_decode"]["status"] == "n/a"
    tk = rows["sdpa_causal_tiny_b1/tokamax_triton"]
    if importlib.util.find_spec("tokamax") is None:  # not installed here: a row, not a crash
        assert tk["status"] == "error" and "ImportError: tokamax is not installed" in tk["error"]
    else:
        assert tk["status"] == "ok", tk
    saved = json.loads((tmp_path / "real_baselines.json").read_text())
    assert [r["key"] for r in saved["rows"]] == [r["key"] for r in doc["rows"]]
    assert saved["machine"]["device"] and saved["versions"]["jax"] == jax.__version__
    md = (tmp_path / "real_baselines.md").read_text()
    assert "| sdpa_decode | tiny | 1 | Pallas decode_attention |" in md
    assert "n/a: Pallas decode_attention attends one query token" in md
    assert [p.name for p in RB.figure(doc, tmp_path)] == [
        "real_baselines.png",
        "real_baselines.svg",
    ]
    assert (tmp_path / "real_baselines.png").stat().st_size > 0


def test_resume_keeps_rows_and_retries_errors(tmp_path):
    calls = []

    def mirage(model, inputs, timer, args):
        calls.append(model.key)
        return _fake_mirage(model, inputs, timer, args)

    # past the limit from the start: one row still runs, so repeated runs make progress
    first = RB.run(_args(tmp_path, "--stop-after-s", "0"), timer=_fake_timer, mirage=mirage)
    assert first["stopped"].startswith("time limit") and len(first["rows"]) == 1
    broken = _args(tmp_path, "--resume")

    def failing(*a):
        raise RuntimeError("no device")

    doc = RB.run(broken, timer=_fake_timer, mirage=failing)
    errors = [r for r in doc["rows"] if r["contender"] == "mirage_jax.jit"]
    assert all(r["status"] == "error" and "no device" in r["error"] for r in errors)
    kept = {r["key"]: r["seconds"] for r in doc["rows"] if r["status"] != "error"}
    again = RB.run(_args(tmp_path, "--resume"), timer=_fake_timer, mirage=mirage)
    assert calls == ["sdpa_decode_tiny_b1", "sdpa_causal_tiny_b1"]  # only the failed rows
    assert {r["key"]: r["seconds"] for r in again["rows"] if r["key"] in kept} == kept
    assert len(again["rows"]) == 10 and "stopped" not in again


@pytest.mark.gpu
def test_every_library_attention_matches_on_the_gpu():
    for name in M.names():
        m = M.get(name, 8, "realistic")
        xs = m.make(0).args
        want = jax.jit(m.fn)(*xs)
        for impl in ("cudnn", "pallas_decode"):
            if m.not_applicable(impl) is None:
                got = jax.jit(m.with_attention(impl).fn)(*xs)
                assert _max_rel(got, want) < 2e-2, (name, impl)


def test_reproduce_phase_real_runs_the_real_baselines(tmp_path, monkeypatch):
    from experiments import reproduce

    seen = []
    monkeypatch.setattr(RB, "main", lambda argv: seen.append(argv) or 0)
    assert reproduce.main(["--phase", "real", "--out", str(tmp_path), "--deadline-s", "400"]) == 0
    (argv,) = seen
    assert argv[argv.index("--out") + 1] == str(tmp_path) and "--resume" in argv
    assert argv[argv.index("--stop-after-s") + 1] == "400.0"


def test_results_name_the_commit_that_ran(monkeypatch):
    """A results file says when the working tree differed from the commit it names, and takes
    the commit from MIRAGE_JAX_COMMIT where the copy's git metadata is not the code's (the
    device tool's copy keeps the session's first `.git`)."""
    from experiments.reproduce_common import COMMIT_ENV, commit_label, versions

    assert commit_label({"git_commit": "0123456789abc", "git_dirty": True}) == (
        "0123456789 with uncommitted changes"
    )
    assert commit_label({"git_commit": "0123456789abc", "git_dirty": False}) == "0123456789"
    monkeypatch.setenv(COMMIT_ENV, "feedfacecafe")
    v = versions()
    assert (v["git_commit"], v["git_dirty"], v["commit_from"]) == (
        "feedfacecafe",
        False,
        COMMIT_ENV,
    )
