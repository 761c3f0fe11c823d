"""A region with no matmul may sum along a tile's last axis inside a block: a softmax on its
own (a router's, an LM head's after its GEMM) and a centring `x - mean(x)` get µGraphs."""

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jax.nn.softmax(x, axis=-1),
        lambda x: x - jnp.mean(x, axis=-1, keepdims=True),
    ],
    ids=["softmax", "centring"],
)
def test_a_row_reduction_on_its_own_is_a_kernel(fn):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 64)), jnp.float32)
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(fn, backend="pallas-interpret", cache=Path(d) / "c.sqlite")
        got = f(x)
        assert [dd.status for dd in f.last.decisions] == ["kernel"], f.last.decisions
    np.testing.assert_allclose(got, jax.jit(fn)(x), rtol=1e-5, atol=1e-6)
