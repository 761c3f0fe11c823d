"""A softmax over a matmul's columns: a classifier's, a router's, a small LM head's.

The vocabulary offered no block sum along a tile's last axis in a region with a matmul (a norm's
row sums are its fused ops'), so `softmax(x @ w)` had no µGraph and ran as XLA. Sums over
dimensions no matmul of the region contracts are now offered (`vocab._reduced_dims`). Run in the
interpreters on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from mirage_jax.search import dims as dims_mod
from mirage_jax.search.vocab import _reduced_dims
from tests.conftest import interpret_backends


def _rnd(*shape, seed=0, scale=1.0, dtype=jnp.float32):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return jnp.asarray(x, dtype)


def _region(fn, *args):
    (region,) = lax_ir.partition(lax_ir.capture(fn, *args)).regions
    return region.program


def _norm_linear(x, g, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    return x @ w


def test_row_sums_over_a_matmul_s_columns_not_over_what_it_contracts():
    x, w = _rnd(16, 64), _rnd(64, 256)
    program = _region(lambda x, w: jax.nn.softmax(x @ w, -1), x, w)
    d = dims_mod.analyse(program)
    _, row_sums, shifts = _reduced_dims(program, d)
    (columns,) = shifts
    assert row_sums == {columns}
    # an RMSNorm's row sum is over the dimension its GEMM contracts: its fused ops say it
    program = _region(_norm_linear, x, _rnd(64), w)
    assert _reduced_dims(program, dims_mod.analyse(program))[1] == set()


HEADS = {
    "classifier": (
        lambda x, w, b: jax.nn.softmax(jnp.tanh(x[:, 0] @ w) @ b, -1),
        (_rnd(4, 8, 64), _rnd(64, 64, scale=0.1), _rnd(64, 10)),
    ),
    "router": (lambda x, w: jax.nn.softmax(x @ w, -1), (_rnd(64, 128), _rnd(128, 8, scale=0.1))),
    "lm_head_bf16": (
        lambda x, e: jax.nn.softmax((x[:, -1] @ e.T).astype(jnp.float32), -1),
        (_rnd(2, 8, 64, dtype=jnp.bfloat16), _rnd(512, 64, scale=0.1, dtype=jnp.bfloat16)),
    ),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_softmax_head_runs_as_a_kernel(tmp_path, name):
    import mirage_jax

    fn, args = HEADS[name]
    want = np.asarray(jax.jit(fn)(*args), np.float64)
    tol = (2e-2 if name.endswith("bf16") else 1e-5) * np.max(np.abs(want))
    f = mirage_jax.jit(fn, cache=tmp_path / "c.sqlite", backend="pallas-interpret")
    got = np.asarray(f(*args), np.float64)
    assert [d.status for d in f.last.decisions] == ["kernel"], f.last.decisions
    np.testing.assert_allclose(got, want, atol=tol)


def test_the_head_s_best_lowers_in_both_interpreters():
    from mirage_jax.lower import lower
    from mirage_jax.search import Budget, search
    from mirage_jax.select import random_inputs

    fn, args = HEADS["router"]
    program = _region(fn, *args)
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    assert res, res.message
    xs = random_inputs(program, 0)
    (want,) = lax_ir.evaluate_reference(program, *xs)
    for backend in interpret_backends():
        (got,) = lower(res.best, backend=backend, interpret=True)(*xs)
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), atol=1e-6)
