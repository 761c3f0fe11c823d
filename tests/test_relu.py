"""`max(x, 0)` is the uninterpreted unary `relu`: a ReLU MLP is one searchable region that runs
as a kernel, and the verifier tells relu of a product from the product of relus."""

import tempfile
from pathlib import Path

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np

import fields
import lax_ir
import mirage_jax


def _n(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape) * 0.1, jnp.float32)


def test_relu_mlp_is_one_region_and_a_kernel():
    rng = np.random.default_rng(0)
    args = (_n(rng, 32, 64), _n(rng, 64), _n(rng, 64, 32), _n(rng, 16, 32))

    def mlp(w1, b1, w2, x):
        return jax.nn.relu(x @ w1 + b1) @ w2

    program = lax_ir.capture(mlp, *args)
    assert program.op_counts()["relu"] == 1 and "max" not in program.op_counts()
    assert len(lax_ir.partition(program).regions) == 1
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(mlp, backend="pallas-interpret", cache=Path(d) / "c.sqlite")
        got = f(*args)
        assert [dd.status for dd in f.last.decisions] == ["kernel"], f.last.decisions
    with jax.default_matmul_precision("highest"):  # not TF32 where a GPU runs the suite
        want = jax.jit(mlp)(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_zero_on_either_side_and_flax_relu():
    x = _n(np.random.default_rng(1), 4, 8)
    for fn in (lambda x: jnp.maximum(0.0, x), lambda x: jnp.maximum(x, 0.0), linen.relu):
        program = lax_ir.capture(fn, x)
        assert program.op_counts() == {"relu": 1}, program.pretty()
        np.testing.assert_allclose(lax_ir.evaluate(program, x)[0], jax.nn.relu(x))


def test_verifier_tells_relu_of_a_product_from_a_product_of_relus():
    x, w = _n(np.random.default_rng(2), 4, 8), _n(np.random.default_rng(3), 8, 8)
    f = lax_ir.capture(lambda x, w: jax.nn.relu(x @ w), x, w)
    g = lax_ir.capture(lambda x, w: jax.nn.relu(x) @ w, x, w)
    assert fields.verify(f, f)
    assert not fields.verify(f, g)
