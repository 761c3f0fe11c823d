"""Gemma-2's soft-capped attention scores, `c·tanh(s/c)` before the mask and softmax.

The search put no constant scale on tanh's result (`SearchProps.scale_result`), though it has no
other place to go, and the online-softmax kernel of a capped, masked attention needs 12 block
ops, two past `Budget.max_block_ops`: attention regions with more score ops than a plain one
are searched deeper while nothing is found (`driver.beyond`), since the attention core is never
cut. Run in the interpreters on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
from mirage_jax.lower import lower
from mirage_jax.search import Budget, search
from mirage_jax.search.driver import beyond
from mirage_jax.select import random_inputs
from tests.conftest import interpret_backends

B, T, H, D = 2, 8, 4, 16


def capped(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    s = jnp.tanh(s / 50.0) * 50.0
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def plain(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def _program(fn):
    x = jax.ShapeDtypeStruct((B, T, H, D), jnp.float32)
    (region,) = lax_ir.partition(lax_ir.capture(fn, x, x, x)).regions
    return region.program


def test_only_attention_with_more_score_ops_is_searched_deeper():
    assert beyond(_program(plain)) == 0
    assert beyond(_program(capped)) == 2  # tanh and its scale


def test_a_soft_capped_masked_attention_has_a_kernel():
    program = _program(capped)
    res = search(program, budget=Budget(time_s=60, cuts=False), seed=0, workers=1)
    assert res, res.message
    best = res.best
    assert "tanh mul_scalar" in best.meta["structure"], best.meta["structure"]
    xs = random_inputs(program, 0)
    want = lax_ir.evaluate_reference(program, *xs)
    for backend in interpret_backends():
        (got,) = lower(best, backend=backend, interpret=True)(*xs)
        w = np.asarray(want[0], np.float64)
        err = np.max(np.abs(np.asarray(got, np.float64) - w)) / np.max(np.abs(w))
        assert err < 1e-4, (backend, err)


def test_a_scale_of_a_scale_is_one_scale():
    """1/√d and then a soft cap's 1/c on float32 scores of bfloat16 operands (the convert keeps
    either from moving onto Q): the canonical form multiplies once, by the product rounded once
    (`canonical._scale_of_scale`)."""
    from lax_ir.canonical import squeeze_leading

    def fn(x, w):
        s = (x @ w).astype(jnp.float32)
        return jnp.tanh(s * np.float32(0.125) * np.float32(0.02))

    spec = jax.ShapeDtypeStruct
    program = lax_ir.capture(fn, spec((8, 16), jnp.bfloat16), spec((16, 8), jnp.bfloat16))
    assert program.op_counts()["mul"] == 2
    squeezed = squeeze_leading(program)
    assert squeezed.op_counts()["mul"] == 1, squeezed
    (scale,) = [n for n in squeezed.nodes if n.op == "constant"]
    assert float(np.asarray(scale.param("value").array)) == float(np.float32(0.125 * 0.02))
