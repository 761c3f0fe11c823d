"""One of stacked weights read in place: a static slice at a region's edge becomes an interface
step (`lax_ir.slices`), and a kernel reads the block through an `OffsetView`."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from lax_ir.interface import OffsetView, apply_ops, read_view, view_stored_shape
from lax_ir.views import contiguous_block, input_view
from mirage_jax.lower import lower
from mirage_jax.mugraph import evaluate_reference
from tests.test_split_views import _projection


def test_a_contiguous_block_has_an_offset_and_a_strided_one_has_none():
    assert contiguous_block((2, 12, 8), (1, 0, 0, 2, 12, 8)) == 96  # the second of two
    assert contiguous_block((4, 6), (1, 0, 3, 6)) == 6  # whole rows
    assert contiguous_block((1, 3, 4, 8), (0, 2, 1, 0, 1, 3, 3, 8)) == 2 * 32 + 8  # unit, rows
    assert contiguous_block((4, 6), (0, 0, 4, 3)) is None  # half of each row
    assert contiguous_block((2, 12, 8), (0, 0, 0, 2, 6, 8)) is None  # the first rows of both


@pytest.mark.parametrize("index", [0, 1])
def test_one_of_stacked_weights_transposed_is_an_offset_view(index):
    """`w[index].T` of w (2, 12, 8): the kernel takes w whole and reads the block in place."""
    ops = (("slice", (index, 0, 0, index + 1, 12, 8)), ("reshape", (12, 8)), ("transpose", (1, 0)))
    steps, view = input_view((2, 12, 8), ops)
    assert steps == () and view == OffsetView((1, 0), index * 96, (12, 8), (2, 12, 8))
    assert view_stored_shape((8, 12), view) == (2, 12, 8)
    w = np.arange(2 * 12 * 8).reshape(2, 12, 8)
    np.testing.assert_array_equal(read_view(w, view), apply_ops(w, ops))
    # the block as it lies (`w[index]`, no transpose): read in place too, an identity view
    steps, view = input_view((2, 12, 8), ops[:2])
    assert steps == () and view == OffsetView((0, 1), index * 96, (12, 8), (2, 12, 8))
    np.testing.assert_array_equal(read_view(w, view), apply_ops(w, ops[:2]))
    # a slice that is no contiguous block stays XLA's (a copy), as before
    assert input_view((2, 12, 8), (("slice", (0, 0, 0, 2, 12, 4)), *ops[1:])) is None


def _stacked_case(index, transposed, dtype, seed, scale=1.0):
    """(µGraph, x, view, stored, reference) of x (4, 64) @ W (64, 128) with W = stored[index].T,
    stored (3, 128, 64), or W = stored[index], stored (3, 64, 128)."""
    g = _projection(dtype)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 64)).astype(dtype)
    block = (128, 64) if transposed else (64, 128)
    stored = (rng.standard_normal((3, *block)) * scale).astype(dtype)
    view = OffsetView((1, 0) if transposed else (0, 1), index * 128 * 64, block, (3, *block))
    w = stored[index].T if transposed else stored[index]
    (want,) = evaluate_reference(g, x, np.ascontiguousarray(w))
    return g, x, view, stored, want


@pytest.mark.parametrize("backend", ["triton", "pallas-interpret"])
@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize("transposed", [True, False])
def test_a_weight_read_through_an_offset_view_gives_the_plain_outputs(backend, index, transposed):
    """x (4, 64) @ W (64, 128) with W = stored[index].T, stored (3, 128, 64), or W =
    stored[index], stored (3, 64, 128): Triton reads the block in place from its offset
    (interpreted here), Pallas gets it laid out by XLA."""
    if backend == "triton":
        pytest.importorskip("triton")
    g, x, view, stored, want = _stacked_case(index, transposed, "float32", seed=index)
    (got,) = lower(g, backend=backend, interpret=True, views={1: view})(x, stored)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    if backend == "triton":
        from mirage_jax.lower import triton as T
        from mirage_jax.lower.kernel_graph import plan

        (p,) = plan(g).values()
        _, src = T.kernel_source(p, T.default_config(), views={1: view})
        assert not index or f"{index * 128 * 64} + " in src  # the block's offset


def _gated(x, w, g):
    """A norm and Gemma's gated MLP input: both projections from one stacked parameter."""
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1 + g)
    return jax.nn.gelu(y @ w[0].T) * (y @ w[1].T)


def test_stacked_weights_reach_the_region_whole_and_its_kernel_reads_them_in_place():
    """Both slices of the stacked weight become steps of one region input (the parameter
    itself, no XLA slice or transpose left); the region's kernel (Triton interpreted) reads
    both blocks in place and gives `jax.jit`'s values."""
    from mirage_jax.regions import region_kernel, stored_views
    from mirage_jax.search import Budget, search

    pytest.importorskip("triton")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    w = (rng.standard_normal((2, 96, 64)) * 0.1).astype(np.float32)
    g = (rng.standard_normal((64,)) * 0.1).astype(np.float32)
    part = lax_ir.partition(lax_ir.capture(_gated, x, w, g))
    (region,) = [r for r in part.regions if any(n.op == "matmul" for n in r.program.nodes)]
    (k_w,) = [k for k, i in enumerate(region.inputs) if part.program.nodes[i].shape == (2, 96, 64)]
    assert part.program.nodes[region.inputs[k_w]].op == "input"
    views = stored_views(region.program, "triton").views
    offsets = sorted(v.offset for v in views.values() if isinstance(v, OffsetView))
    assert offsets == [0, 96 * 64]
    res = search(region.program, budget=Budget(time_s=60, max_candidates=4), seed=0, workers=1)
    decision = SimpleNamespace(mugraph=res.mugraphs[0], verification=None, cache_key="t")
    fn = region_kernel(decision, region, "triton", None, strict=True)
    assert callable(fn), fn
    args = [(x, w, g)[part.program.inputs.index(i)] for i in region.inputs]
    (got,) = fn(*args)
    want = jax.jit(_gated)(x, w, g)
    np.testing.assert_allclose(
        np.asarray(got).reshape(-1), np.asarray(want).reshape(-1), 1e-4, 1e-4
    )


@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [True, False])
def test_gpu_triton_reads_one_of_stacked_weights_in_place(transposed):
    """The same projection through jax-triton on the GPU: the block read from its offset."""
    g, x, view, stored, want = _stacked_case(2, transposed, "float16", seed=1, scale=0.1)
    (got,) = lower(g, backend="triton", views={1: view})(jnp.asarray(x), jnp.asarray(stored))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
