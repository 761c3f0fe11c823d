"""Kernels launched in row-major order of their grids (`kernel_graph.ROW_MAJOR`, Triton
interpreted): the same outputs as the grid's own launch, masked ones too, and `select` offers
the variant only for large winners whose grids have two axes or more."""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import kernel_graph, lower
from mirage_jax.mugraph import BlockGraphBuilder, MuGraph, MuGraphBuilder
from mirage_jax.tuning import ROW_MAJOR_MIN_US, row_major_variant
from tests.test_masked_steps import _attention_graph, _causal_bias, _qkv

B, T, S, H = 2, 32, 64, 16


def _batched_attention(tq: int = 16, ts: int = 16) -> MuGraph:
    """softmax(q kᵀ) v per batch, over a grid of (batch, query blocks) and a loop of keys."""
    f32 = "float32"
    b = MuGraphBuilder()
    q, kt, v = b.input((B, T, H), f32), b.input((B, H, S), f32), b.input((B, S, H), f32)
    bb = BlockGraphBuilder(grid=(B, T // tq), forloop_range=S // ts)
    tq_ = bb.input((B, T, H), f32, imap=(0, 1))
    tk = bb.input((B, H, S), f32, imap=(0, None), forloop_dim=2)
    tv = bb.input((B, S, H), f32, imap=(0, None), forloop_dim=1)
    s = bb.op("matmul", tq_, tk)
    m = bb.op("reduce_max", s, dim=2)
    e = bb.op("exp", bb.op("sub", s, m))
    big = bb.op("accum_max", m)
    num = bb.op("accum_rescale_sum", bb.op("matmul", e, tv), m, big)
    den = bb.op("accum_rescale_sum_last", e, m, big)
    bb.output(bb.op("div", num, den), omap=(0, 1))
    (out,) = b.graph_defined([q, kt, v], bb.build())
    return b.build([out])


def _row_major(g: MuGraph) -> MuGraph:
    return MuGraph(g.ops, g.outputs, {**g.meta, kernel_graph.ROW_MAJOR: True})


def test_a_kernel_launched_row_major_gives_the_same_outputs():
    pytest.importorskip("triton")
    from mirage_jax.lower.triton import TritonConfig, source_of

    g = _batched_attention()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(a[0]).astype(np.float32) for a in g.input_avals]
    s = np.einsum("bth,bhs->bts", *xs[:2]).astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bts,bsh->bth", p / p.sum(-1, keepdims=True), xs[2])
    plain = np.asarray(lower(g, backend="triton", interpret=True)(*xs)[0])
    rows = np.asarray(lower(_row_major(g), backend="triton", interpret=True)(*xs)[0])
    np.testing.assert_allclose(plain, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_array_equal(rows, plain)
    ((_, p),) = kernel_graph.plan(g).items()
    src = source_of(p, TritonConfig(row_major=True))
    assert "block = tl.program_id(0)  # row-major in grid (2, 2)" in src
    assert "tl.program_id(1)" not in src and "tl.program_id(1)" in source_of(p)


def test_a_masked_kernel_launched_row_major_gives_the_same_outputs():
    pytest.importorskip("triton")
    g = _attention_graph()
    q, kt, v = _qkv(4)
    bias = _causal_bias(64, 64)
    told = lower(g, backend="triton", interpret=True, known={3: bias})
    rows = lower(_row_major(g), backend="triton", interpret=True, known={3: bias})
    np.testing.assert_array_equal(
        np.asarray(rows(q, kt, v, bias)[0]), np.asarray(told(q, kt, v, bias)[0])
    )


def test_the_variant_is_offered_for_large_winners_of_two_axis_grids():
    g = _batched_attention()
    assert row_major_variant(g, "triton", ROW_MAJOR_MIN_US).meta[kernel_graph.ROW_MAJOR]
    assert row_major_variant(g, "triton", ROW_MAJOR_MIN_US / 2) is None  # a small kernel
    assert row_major_variant(g, "pallas", ROW_MAJOR_MIN_US) is None
    assert row_major_variant(_row_major(g), "triton", ROW_MAJOR_MIN_US) is None
    assert row_major_variant(_attention_graph(), "triton", ROW_MAJOR_MIN_US) is None  # 1 axis
