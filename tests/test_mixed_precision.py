"""A matmul of an fp32 activation and fp16 weights: operands rounded to fp16, fp32 accumulation.

Real model code normalises in fp32 and converts to the weights' dtype before the GEMM
(`opdef.matmul_operand_dtype`). The µGraph's float meaning and both backends do the same, so
the GEMM runs on tensor cores (an fp32 "ieee" tl.dot of a [16, 1024] tile ran 30x slower than
the fp16 one on the H100, 2026-11-25: docs/perf_log.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import lower, plan, source_of
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder, evaluate
from mirage_jax.mugraph.opdef import matmul_operand_dtype


def test_operand_dtype_rule():
    assert matmul_operand_dtype(["float32", "float16"]) == "float16"
    assert matmul_operand_dtype(["bfloat16", "float32"]) == "bfloat16"
    assert matmul_operand_dtype(["float16", "float16"]) is None
    assert matmul_operand_dtype(["float32", "float32"]) is None
    assert matmul_operand_dtype(["float16", "bfloat16"]) is None  # no narrower one: fp32


def mixed_graph():
    """x (fp32, 32x64) @ w (fp16, 64x32) on tensor cores over a K loop; a row (fp32, M = 1)
    @ w by multiply-sum."""
    b = BlockGraphBuilder(grid=(2,), forloop_range=2)
    x = b.input((32, 64), "float32", imap=(0,), forloop_dim=1)
    w = b.input((64, 32), "float16", imap=(None,), forloop_dim=0)
    b.output(b.op("accum_sum", b.op("matmul", x, w)), (0,))
    v = BlockGraphBuilder(grid=(1,), forloop_range=2)
    row = v.input((1, 64), "float32", imap=(None,), forloop_dim=1)
    w2 = v.input((64, 32), "float16", imap=(None,), forloop_dim=0)
    v.output(v.op("accum_sum", v.op("matmul", row, w2)), (None,))
    mb = MuGraphBuilder()
    xi, wi, ri = (
        mb.input((32, 64), "float32"),
        mb.input((64, 32), "float16"),
        mb.input((1, 64), "float32"),
    )
    (o1,) = mb.graph_defined([xi, wi], b.build())
    (o2,) = mb.graph_defined([ri, wi], v.build())
    return mb.build([o1, o2], name="mixed")


def _inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float16)
    r = rng.standard_normal((1, 64)).astype(np.float32)
    return x, w, r


def _products(x, w, r, round_to=None):
    def rnd(a):
        return a.astype(round_to).astype(np.float64) if round_to else a.astype(np.float64)

    wf = w.astype(np.float64)
    return rnd(x) @ wf, rnd(r) @ wf


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def test_float_meaning_rounds_the_wide_operand():
    x, w, r = _inputs()
    got = evaluate(mixed_graph(), x, w, r)
    rounded = _products(x, w, r, np.float16)
    exact = _products(x, w, r)
    for g, want, unrounded in zip(got, rounded, exact):
        assert _rel(g, want) < 1e-6  # fp32 sums of the fp16-rounded products
        assert _rel(g, unrounded) > 1e-5  # and not the fp32 operands' products


@pytest.mark.parametrize("backend", ["pallas", "triton"])
def test_interpret_mode_follows_the_float_meaning(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    x, w, r = _inputs()
    g = mixed_graph()
    want = evaluate(g, x, w, r)
    got = lower(g, backend=backend, interpret=True)(x, w, r)
    for o, e in zip(got, want):
        assert _rel(o, np.asarray(e, np.float64)) < 1e-6


def test_triton_source_runs_the_mixed_gemm_in_fp16():
    lines = [
        line
        for p in plan(mixed_graph()).values()
        for line in source_of(p).splitlines()
        if "# matmul" in line
    ]
    dots = [line for line in lines if "tl.dot(" in line]
    sums = [line for line in lines if "tl.sum(" in line]
    assert len(dots) == 1 and "ieee" not in dots[0] and "tl.float16" in dots[0], dots
    assert len(sums) == 1 and ".to(tl.float16)" in sums[0], sums


@pytest.mark.parametrize(("dtype", "dot"), [("float16", "f16"), ("float32", "f32")])
def test_a_predefined_gemm_multiplies_16_bit_operands_into_fp32(dtype, dot):
    """A pre-defined matmul (a GEMM left to XLA) of fp16 operands is one dot of fp16 operands
    with an fp32 result (tensor cores), not an fp32 GEMM of converted operands; fp32 operands
    stay fp32. Its float meaning is unchanged."""
    import re

    import jax

    mb = MuGraphBuilder()
    x, w = mb.input((64, 128), dtype), mb.input((128, 32), dtype)
    g = mb.build([mb.op("matmul", x, w)], name="predefined")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(dtype) for s in ((64, 128), (128, 32))]
    fn = lower(g, backend="pallas", interpret=True)
    text = jax.jit(fn).lower(*xs).as_text()
    dots = re.findall(
        r"dot_general.*\(tensor<64x128x(\w+)>, tensor<128x32x(\w+)>\) -> tensor<64x32x(\w+)>", text
    )
    assert dots == [(dot, dot, "f32")], dots
    want = xs[0].astype(np.float64) @ xs[1].astype(np.float64)
    (got,) = fn(*xs)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3, atol=5e-2)


@pytest.mark.parametrize("backend", ["pallas", "triton", "reference"])
def test_outputs_come_back_in_the_dtypes_asked_stored_so_by_triton(backend):
    """`lower(out_dtypes=)`: a µGraph output wider than the region's (fp32 here) comes back
    rounded to the region's dtype; the Triton kernel stores it so itself (no XLA convert)."""
    if backend == "triton":
        pytest.importorskip("triton")
    from mirage_jax.lower import triton as tl_backend

    x, w, r = _inputs()
    g = mixed_graph()
    assert [d for _, d in g.output_avals] == ["float32", "float32"]
    want = [np.asarray(e).astype(np.float16) for e in evaluate(g, x, w, r)]
    got = lower(g, backend=backend, interpret=True, out_dtypes={1: "float16"})(x, w, r)
    assert [str(o.dtype) for o in got] == ["float32", "float16"]
    np.testing.assert_allclose(
        np.asarray(got[1], np.float64), want[1].astype(np.float64), rtol=1e-3
    )
    p = plan(g)[sorted(plan(g))[1]]  # the kernel of output 1
    _, src = tl_backend.kernel_source(p, tl_backend.default_config(), out_dtypes={0: "float16"})
    stores = [line for line in src.splitlines() if "tl.store(" in line]
    assert stores and all(".to(tl.float16)" in line for line in stores), stores


def test_other_float_covers_bfloat16_and_both_ways():
    """bfloat16 is a float (numpy calls its kind "V"); a cast goes either way, floats only."""
    from mirage_jax.lower.kernel_graph import other_float

    assert other_float("float32", "bfloat16") and other_float("float32", "float16")
    assert other_float("float16", "float32") and other_float("float16", "bfloat16")
    assert not other_float("float16", "float16") and not other_float("int32", "int8")
    assert not other_float("float32", "int8")


def _norm_graph():
    """RMSNorm of float16 rows times a float16 gain: a µGraph that keeps its inputs' dtype
    where the region it stands for upcasts and returns fp32."""
    b = BlockGraphBuilder(grid=(4,), forloop_range=1)
    x = b.input((8, 64), "float16", imap=(0,), forloop_dim=None)
    gain = b.input((1, 64), "float16", imap=(None,), forloop_dim=None)
    b.output(b.op("accum_sum", b.op("mul", b.op("rms_norm", x, eps=1e-6), gain)), (0,))
    mb = MuGraphBuilder()
    xi, gi = mb.input((8, 64), "float16"), mb.input((1, 64), "float16")
    (o,) = mb.graph_defined([xi, gi], b.build())
    return mb.build([o], name="f16 norm")


@pytest.mark.parametrize("backend", ["pallas", "triton", "reference"])
def test_outputs_wider_than_the_mugraph_come_back_wide(backend):
    """`lower(out_dtypes=)` widens too: a float16 µGraph whose region returns fp32 comes back
    in fp32, and a kernel stores its fp32 values, not float16-rounded ones (before, such a
    region got no kernel: its lowered µGraph returned float16)."""
    if backend == "triton":
        pytest.importorskip("triton")
    from mirage_jax.lower import triton as tl_backend

    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 64)).astype(np.float16)
    gain = rng.standard_normal((1, 64)).astype(np.float16)
    g = _norm_graph()
    assert [d for _, d in g.output_avals] == ["float16"]
    h = x.astype(np.float64)
    want = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6) * gain.astype(np.float64)
    (got,) = lower(g, backend=backend, interpret=True, out_dtypes={0: "float32"})(x, gain)
    assert str(got.dtype) == "float32"
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    rounding = float(np.max(np.abs(want.astype(np.float16).astype(np.float64) - want)))
    if backend == "reference":  # the evaluator computes in float16; XLA widens its result
        assert err <= 2 * rounding, (err, rounding)
    else:
        assert err < rounding / 20, (err, rounding)
    if backend == "triton":
        (p,) = plan(g).values()
        _, src = tl_backend.kernel_source(p, tl_backend.default_config(), out_dtypes={0: "float32"})
        stores = [line for line in src.splitlines() if "tl.store(" in line]
        assert stores and all(".to(tl.float32)" in line for line in stores), stores


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_region_that_upcasts_its_16_bit_inputs_gets_a_kernel(tmp_path, dtype):
    """16-bit rows and gain, the norm computed and returned in fp32 (mixed-precision code that
    keeps its residual stream in fp32): the region runs as a kernel, its output in fp32 with
    fp32 values (before, the lowered µGraph returned the 16-bit dtype and the region ran as
    XLA)."""
    import jax
    import jax.numpy as jnp

    import mirage_jax

    def norm(x, gain):
        h = x.astype(jnp.float32)
        var = jnp.mean(h * h, axis=-1, keepdims=True)
        return h * jax.lax.rsqrt(var + 1e-6) * gain.astype(jnp.float32)

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((8, 64)), dtype)
    gain = jnp.asarray(rng.standard_normal((64,)), dtype)
    f = mirage_jax.jit(norm, backend="pallas-interpret", cache=tmp_path / "c.sqlite", workers=1)
    got = f(x, gain)
    assert [d.status for d in f.last.decisions] == ["kernel"], f.last.decisions
    assert str(got.dtype) == "float32"
    want = np.asarray(jax.jit(norm)(x, gain), np.float64)
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    rounded = np.asarray(jnp.asarray(want, jnp.float32).astype(dtype), np.float64)
    rounding = float(np.max(np.abs(rounded - want)))
    assert err < rounding / 20, (err, rounding)
