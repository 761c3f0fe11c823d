"""Masks and constants in real model code: they never cut the float computation they feed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir


def _attention(fill):
    def f(q, k, v, pos):
        s = (q @ k.T) * 0.125
        mask = jnp.arange(k.shape[0])[None, :] <= pos
        s = jnp.where(mask, s, fill(s.dtype))
        return jax.nn.softmax(s, axis=-1) @ v

    return f


FILLS = {
    "-inf": lambda dt: -jnp.inf,
    "finfo.min": lambda dt: jnp.finfo(dt).min,
    "gemma": lambda dt: -2.3819763e38,
}


@pytest.mark.parametrize("fill", sorted(FILLS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16])
def test_a_masked_softmax_is_one_region_and_computes_the_same(fill, dtype):
    f = _attention(FILLS[fill])
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(s), dtype) for s in ((4, 16), (32, 16), (32, 16)))
    pos = jnp.int32(9)
    part = lax_ir.partition(lax_ir.capture(f, q, k, v, pos))
    regions = [r for r in part.regions if not r.is_trivial]
    assert len(regions) == 1, part.explain()
    ops = regions[0].program.op_counts()
    assert ops["matmul"] == 2 and ops["exp"] == 1 and ops["reduce_max"] == 1
    got = jax.jit(lax_ir.rebuild(part))(q, k, v, pos)
    want = jax.jit(f)(q, k, v, pos)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=2e-3, atol=2e-3)  # fmt: skip
    assert np.all(np.isfinite(np.asarray(got, np.float64)))


def test_a_where_that_is_not_a_mask_stays_xla():
    def f(x, y):
        return jnp.exp(jnp.where(x > 0, x, 3.0 * y))

    p = lax_ir.capture(f, jnp.ones((4, 4)), jnp.ones((4, 4)))
    assert any(
        n.op == "opaque" and n.param("payload").primitive.name == "select_n" for n in p.nodes
    )


def test_constants_only_equations_are_folded():
    def layer_norm(x):  # jnp.var guards its divisor with where(n - ddof > 0, ..., nan)
        return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(jnp.var(x, -1, keepdims=True) + 1e-5)

    part = lax_ir.partition(lax_ir.capture(layer_norm, jnp.ones((8, 32))))
    assert [r for r in part.regions if not r.is_trivial].__len__() == 1, part.explain()
    assert not part.residual


def test_a_causal_mask_that_depends_on_no_input_is_a_constant_bias():
    """`tril` of an iota at 128 × 128 (past the small-fold size) becomes one constant bias the
    attention region reads: no select is left for XLA to run on every call."""
    t = 128

    def f(q, k, v):
        s = jnp.einsum("qd,kd->qk", q, k) * 0.125
        s = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v

    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((t, 16)), jnp.float32) for _ in range(3))
    p = lax_ir.capture(f, q, k, v)
    assert not any(n.op == "opaque" for n in p.nodes), [n.op for n in p.nodes]
    biases = [n for n in p.nodes if n.op == "constant" and n.shape == (t, t)]
    assert len(biases) == 1
    bias = np.asarray(biases[0].param("value").array)
    np.testing.assert_array_equal(bias, np.where(np.tri(t, dtype=bool), 0.0, -np.inf))
    part = lax_ir.partition(p)
    assert [r for r in part.regions if not r.is_trivial].__len__() == 1, part.explain()
    got = jax.jit(lax_ir.rebuild(part))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(f)(q, k, v)), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_jax_causal_mask_left_to_xla_is_made_at_its_own_shape(monkeypatch):
    """Where the capture does not fold jax's causal mask (2048 tokens and more; here by a small
    fold limit), its `and` with an all-true mask and its reshape for the query groups are seen
    through: XLA makes the bias at [T, S] and the region reads it broadcast, instead of making
    it at (batch, heads, T, S) on every call; the values are jax's."""
    import sys

    monkeypatch.setattr(sys.modules["lax_ir.capture"], "MASK_FOLD_MAX_ELEMENTS", 16)

    def causal(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")

    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((2, 64, 4, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, 64, 2, 16)), jnp.float32) for _ in range(2))
    p = lax_ir.capture(causal, q, k, v)
    assert not any(n.op == "opaque" and n.param("payload").primitive.name == "and" for n in p.nodes)
    part = lax_ir.partition(p)
    (region,) = [r for r in part.regions if "exp" in r.program.op_counts()]
    (bias,) = [p.nodes[i] for i in region.inputs if p.nodes[i].op == "opaque"]
    assert bias.shape == (1, 1, 1, 64, 64)
    got = jax.jit(lax_ir.rebuild(part))(q, k, v)
    want = jax.jit(causal)(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_an_and_with_true_is_its_other_operand_and_keeps_its_value():
    def f(x, m):
        both = jnp.logical_and(jnp.ones((3, 5), bool), m[None, :])
        return jnp.where(both.reshape(3, 1, 5), x[:, None, :], 0.0)

    x = jnp.arange(15.0).reshape(3, 5)
    m = jnp.asarray([True, False, True, True, False])
    p = lax_ir.capture(f, x, m)
    assert not any(n.op == "opaque" and n.param("payload").primitive.name == "and" for n in p.nodes)
    got = jax.jit(lax_ir.rebuild(lax_ir.partition(p)))(x, m)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(x, m)))


@pytest.mark.parametrize("fill", [-1e9, -1e4])
def test_a_users_large_negative_fill_with_a_constant_causal_mask_is_a_bias(fill):
    """`where(tril, s, -1e9)`: every row keeps an entry, so the masked entries' exp is exactly 0
    as with −inf; the attention is one region and computes the same."""

    def f(q, k, v):
        s = q @ k.T * 0.25
        s = jnp.where(jnp.tril(jnp.ones((16, 16), bool)), s, fill)
        return jax.nn.softmax(s, axis=-1) @ v

    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((16, 8)), jnp.float32) for _ in range(3))
    program = lax_ir.capture(f, q, k, v)
    assert "opaque" not in program.op_counts(), program.pretty()
    part = lax_ir.partition(program)
    assert len(part.regions) == 1, part.explain()
    got = jax.jit(lax_ir.rebuild(part))(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(f)(q, k, v)), rtol=1e-6)


def test_a_large_negative_fill_stays_a_select_where_a_row_is_masked_whole():
    """A row with no kept entry is uniform under `where` and not under `s + bias`."""

    def f(s):
        mask = jnp.tril(jnp.ones((8, 8), bool), -1)  # row 0 keeps nothing
        return jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)

    p = lax_ir.capture(f, jnp.ones((8, 8)))
    assert any(
        n.op == "opaque" and n.param("payload").primitive.name == "select_n" for n in p.nodes
    )
