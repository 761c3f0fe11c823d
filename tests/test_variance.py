"""flax's fast variance, max(0, E[x²] - E[x]²), is captured as the centred variance
(`lax_ir.variance`): flax's LayerNorm is then one searchable region, not two cut by a `max`."""

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lax_ir
from lax_ir.interpret import evaluate


def _x(shape=(2, 8, 32), seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) + 3.0, jnp.float32)


def _check(fn, *args):
    """The capture has no `max`, one non-trivial region, and computes what `fn` does."""
    program = lax_ir.capture(fn, *args)
    assert "max" not in program.op_counts(), program.pretty()
    regions = [r for r in lax_ir.partition(program).regions if not r.is_trivial]
    assert len(regions) == 1, lax_ir.partition(program).explain()
    want = jax.tree.leaves(jax.jit(fn)(*args))
    got = evaluate(program, *jax.tree.leaves(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    return program


def test_linen_layer_norm_is_one_region():
    m = linen.LayerNorm()
    x = _x()
    params = m.init(jax.random.PRNGKey(0), x)
    program = _check(m.apply, params, x)
    assert program.op_counts()["reduce_sum"] == 2


def test_nnx_layer_norm_is_one_region():
    graphdef, state = nnx.split(nnx.LayerNorm(32, rngs=nnx.Rngs(0)))
    _check(lambda s, x: nnx.merge(graphdef, s)(x), state, _x(seed=1))


@pytest.mark.parametrize("keepdims", [False, True])
def test_hand_written_fast_variance(keepdims):
    """Written with jnp, with or without keepdims, the squares as x * x or x ** 2."""

    def fn(x):
        mean = jnp.mean(x, -1, keepdims=keepdims)
        mean2 = jnp.mean(x * x, -1, keepdims=keepdims)
        var = jnp.maximum(0.0, mean2 - mean**2)
        if not keepdims:
            mean, var = mean[..., None], var[..., None]
        return (x - mean) * jax.lax.rsqrt(var + 1e-6)

    _check(fn, _x(seed=2))


@pytest.mark.parametrize(
    "fn",
    [
        # not a variance: the squared mean is of another value
        lambda x, y: jnp.maximum(0.0, jnp.mean(x * x, -1) - jnp.mean(y, -1) ** 2),
        # not a mean: a sum
        lambda x, y: jnp.maximum(0.0, jnp.sum(x * x, -1) - jnp.mean(x, -1) ** 2),
        # other axes
        lambda x, y: jnp.maximum(0.0, jnp.mean(x * x, -1) - jnp.mean(x, 1) ** 2),
        # clamped at another value
        lambda x, y: jnp.maximum(1.0, jnp.mean(x * x, -1) - jnp.mean(x, -1) ** 2),
    ],
)
def test_other_clamps_are_kept(fn):
    """Not a variance: the clamp stays (`relu` at zero, `max` elsewhere), and no centred sum."""
    x, y = _x((2, 8, 8), seed=3), _x((2, 8, 8), seed=4)
    program = lax_ir.capture(fn, x, y)
    ops = program.op_counts()
    assert "relu" in ops or "max" in ops, program.pretty()
    assert ops.get("integer_pow", 0) + ops.get("mul", 0) == 2, program.pretty()


def test_equinox_layer_norm_clamp_of_a_centred_variance_is_dropped():
    """equinox clamps `jnp.var` (a mean of squares: never negative in floating point) at zero:
    the clamp is the identity, so the norm is one region with no `relu` or `max`."""
    import equinox as eqx

    ln = eqx.nn.LayerNorm(32)
    _check(lambda x: jax.vmap(jax.vmap(ln))(x), _x(seed=5))
    program = lax_ir.capture(lambda x: jnp.maximum(0.0, x * x) + jnp.maximum(0.0, x), _x(seed=6))
    assert program.op_counts()["relu"] == 1, program.pretty()  # x * x needs no clamp, x does
