"""Scan bodies reach the search (`mirage_jax.scan_bodies`): layers stacked and run by
`jax.lax.scan`, as large models are often written, were one opaque op and got no kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax
from mirage_jax import scan_bodies


def layer(x, w):
    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
    return x + jax.nn.silu(h @ w[0]) @ w[1], jnp.sum(x)


def model(x, ws):
    y, sums = jax.lax.scan(layer, x, ws)
    return y, sums


def inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 32)), jnp.float32)
    return x, jnp.asarray(rng.standard_normal((3, 2, 32, 32)) * 0.1, jnp.float32)


def test_a_scanned_stack_of_layers_gets_kernels_in_its_body(tmp_path):
    x, ws = inputs()
    f = mirage_jax.jit(model, backend="reference", cache=tmp_path / "c.sqlite", workers=1)
    got, want = f(x, ws), model(x, ws)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert len(f.scan_bodies) == 1
    body = f.scan_bodies[0]
    assert body.last.name == "model.scan_body"
    assert [d.status for d in body.last.decisions].count("kernel") >= 1, body.last.decisions
    gf = jax.grad(lambda x, ws: f(x, ws)[0].sum(), argnums=(0, 1))(x, ws)
    g0 = jax.grad(lambda x, ws: model(x, ws)[0].sum(), argnums=(0, 1))(x, ws)
    for a, b in zip(gf, g0):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_only_functions_with_scans_are_rewritten_and_the_signature_is_kept(tmp_path):
    def plain(x):
        return jnp.tanh(x) * 2.0

    assert not scan_bodies.has_scan(jax.make_jaxpr(plain)(jnp.ones((4, 4))))
    assert scan_bodies.has_scan(jax.make_jaxpr(jax.jit(model))(*inputs()))  # inside a jit too

    def first_layers(x, ws, scale, n):  # a static argument, a weak-typed scalar, a dict out
        y, sums = model(x * scale, ws[:n])
        return {"y": y, "sums": sums, "none": None}

    f = mirage_jax.jit(
        first_layers, static_argnums=3, backend="reference", cache=tmp_path / "c.sqlite", workers=1
    )
    x, ws = inputs()
    got, want = f(x, ws, 0.5, 2), first_layers(x, ws, 0.5, 2)
    assert got["none"] is None and got["sums"].shape == (2,) and len(f.scan_bodies) == 1
    for k in ("y", "sums"):
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-5)


def test_the_scan_operands_are_counted_in_both_parameter_forms():
    assert scan_bodies._counts({"num_consts": 2, "num_carry": 3}) == (2, 3)  # jax up to 0.11
    eqn = next(e for e in jax.make_jaxpr(model)(*inputs()).jaxpr.eqns if e.primitive.name == "scan")
    n_consts, n_carry = scan_bodies._counts(eqn.params)
    assert n_carry == 1 and n_consts + n_carry + 1 == len(eqn.invars)  # one xs: the weights
