"""The search's small representatives, and regions whose sizes are not powers of two."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from mirage_jax.mugraph import evaluate_reference, validate
from mirage_jax.search import Budget, search
from mirage_jax.search import dims as dims_mod


@pytest.mark.parametrize(
    ("size", "small"),
    [(2, 2), (3, 2), (5, 4), (25, 4), (12, 12), (16, 16), (18, 6), (34, 34), (4096, 16)],
)
def test_small_sizes_are_even_so_a_grid_of_two_can_split_them(size, small):
    p = lax_ir.capture(lambda x: x * 2.0, jax.ShapeDtypeStruct((size, 8), jnp.float32))
    d = dims_mod.analyse(p)
    (c,) = {ax[0] for ax in d.axes if ax and ax[0] is not None}
    assert dims_mod.small_sizes(d)[c] == small


def _attention(q, k, v):
    s = jnp.einsum("hqd,hkd->hqk", q, k)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v)


def test_an_odd_head_count_is_split_over_the_grid():
    """5 heads (GPT-2 XL has 25): the heads become a grid axis of 5 blocks, so every block
    matmul is 2-D and the µGraphs lower (before, the representative kept 5 heads, no grid of 2
    could split them, and every µGraph multiplied [5, m, k] tiles, which no backend lowers)."""
    spec = jax.ShapeDtypeStruct((5, 32, 16), jnp.float32)
    program = lax_ir.partition(lax_ir.capture(_attention, spec, spec, spec)).regions[0].program
    result = search(program, budget=Budget(time_s=120.0, results=8, confirm=2), progress=False)
    assert result.mugraphs, result.message
    for g in result.mugraphs:
        validate(g, "h100")  # no block matmul over a batch of tiles
    best = result.mugraphs[0]
    assert any(5 in op.block_graph.grid for _, op in best.graph_defined())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s, _ in program.input_avals]
    want = lax_ir.evaluate_reference(program, *xs)
    got = evaluate_reference(best, *xs)
    for w, o in zip(want, got):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-9, atol=1e-9)
