"""Operands of fewer dims broadcast from the right inside a µGraph: a region's canonical form
drops leading unit dims, so a mask `[T, T]` meets scores `[B, H, T, T]` and a bias `[1, d]` meets
`[B, T, d]`; the search finds them, the µGraphs lower and compute what jax does."""

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
import mirage_jax
from mirage_jax.lower import lower
from mirage_jax.mugraph.opdef import ShapeError, broadcast
from mirage_jax.search import Budget, search


def _r(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_shape_rule_aligns_from_the_right():
    assert broadcast([(2, 8, 64), (8, 64)]) == (2, 8, 64)
    assert broadcast([(1, 64), (2, 8, 64)]) == (2, 8, 64)
    assert broadcast([(4, 8, 8), (8, 1)]) == (4, 8, 8)
    with pytest.raises(ShapeError):
        broadcast([(2, 8, 64), (2, 64)])


@pytest.mark.parametrize("bias_shape", [(1, 8, 64), (1, 1, 64), (64,)])
@pytest.mark.parametrize("backend", ["pallas-interpret", "triton"])
def test_bias_of_fewer_dims_is_searched_and_lowered(bias_shape, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    x, b = _r(2, 8, 64), _r(*bias_shape, seed=1)
    (region,) = lax_ir.partition(lax_ir.capture(lambda x, b: jnp.exp(x + b), x, b)).regions
    ranks = {len(region.program.nodes[i].shape) for i in region.program.inputs}
    assert len(ranks) == 2  # the canonical form left the bias with fewer dims
    result = search(region.program, budget=Budget(time_s=20), seed=0, progress=False)
    assert result.mugraphs, result.message
    g = result.mugraphs[0]
    args = [np.asarray(a).reshape(s) for a, (s, _) in zip((x, b), g.input_avals)]
    got = lower(g, backend=backend)(*args)[0]
    np.testing.assert_allclose(np.asarray(got), np.exp(x + b), rtol=1e-5)


def test_attention_with_a_mask_over_every_batch_and_head_is_a_kernel():
    q, k, v = _r(2, 4, 8, 16, seed=2), _r(2, 4, 8, 16, seed=3), _r(2, 4, 8, 16, seed=4)
    mask = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), 0.0, -1e9)[None, None]

    def attn(q, k, v, mask):
        return jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) + mask, -1) @ v

    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(attn, backend="pallas-interpret", cache=Path(d) / "c.sqlite")
        got = f(q, k, v, mask)
        assert [dd.status for dd in f.last.decisions] == ["kernel"], f.last.decisions
    with jax.default_matmul_precision("highest"):  # not TF32 where a GPU runs the suite
        want = jax.jit(attn)(q, k, v, mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_negation_alone_is_a_scale():
    x = _r(16, 64)
    (region,) = lax_ir.partition(lax_ir.capture(lambda x: -x, x)).regions
    result = search(region.program, budget=Budget(time_s=20), seed=0, progress=False)
    assert result.mugraphs, result.message
