"""Inputs a square root needs non-negative are drawn so (`lax_ir.domain`). Regression: flax
linen's LayerNorm leaves the variance and its square root in two regions, the second's float64
reference was NaN on inputs of either sign, and every candidate failed the float check."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
import mirage_jax
from lax_ir.domain import nonnegative_inputs
from mirage_jax.select import random_inputs


def program_of(fn, *shapes):
    return lax_ir.capture(fn, *[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes])


def test_inputs_reaching_a_square_root_through_sign_keeping_ops_are_nonnegative():
    p = program_of(lambda v, x: x / jnp.sqrt(v + 1e-5), (4, 1), (4, 8))
    assert nonnegative_inputs(p) == {0}
    p = program_of(lambda a, b: jnp.sqrt(a * 2.0 + jnp.sum(b, -1, keepdims=True)), (4, 1), (4, 3))
    assert nonnegative_inputs(p) == {0, 1}
    p = program_of(lambda a, b: jnp.sqrt(a - b), (4,), (4,))  # a difference: no draw makes it so
    assert nonnegative_inputs(p) == set()
    p = program_of(lambda a: jnp.sqrt(a**2), (4,))  # an even power: any sign
    assert nonnegative_inputs(p) == set()
    p = program_of(lambda a, b: jnp.sqrt(jnp.mean(a * a, -1) + b), (4, 8), (4,))  # a square
    assert nonnegative_inputs(p) == {1}
    p = program_of(lambda a, b: jnp.sqrt(a * b), (4,), (4,))  # a product of two: both
    assert nonnegative_inputs(p) == {0, 1}
    p = program_of(lambda a: jnp.sqrt(a * -1.0), (4,))
    assert nonnegative_inputs(p) == set()
    xs = random_inputs(program_of(lambda v, x: x / jnp.sqrt(v + 1e-5), (64, 1), (64, 8)), 0)
    assert (xs[0] >= 0).all() and (xs[1] < 0).any()


def test_rms_normed_attention_inputs_are_drawn_of_both_signs():
    """qknorm (rms_norm of Q and K, softmax in fp16): its inputs reach a square root only
    squared, so they keep their signs; drawn |N| they made jax's own fp16 softmax sum overflow
    (its output all zeros) and the whole-function check rejected a correct kernel (H100,
    2026-11-27)."""
    from experiments import benchmarks

    bm = benchmarks.get("qknorm", 1)
    p = lax_ir.capture(bm.fn, *bm.inputs)
    assert nonnegative_inputs(p) == set()
    xs = random_inputs(p, 0)
    out = np.asarray(jax.jit(bm.fn)(*[jnp.asarray(x) for x in xs]), np.float64)
    assert np.isfinite(out).all() and np.abs(out).max() > 1e-3


def test_a_flax_linen_layernorm_mlp_block_gets_a_kernel_after_its_variance(tmp_path):
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(32)(nn.LayerNorm()(x))
            return x + nn.Dense(16)(nn.gelu(h))

    m = Block()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, 16)), jnp.float32)
    params = m.init(jax.random.PRNGKey(0), x)
    f = mirage_jax.jit(m.apply, backend="reference", cache=tmp_path / "c.sqlite", workers=1)
    got = f(params, x)
    want = m.apply(params, x)  # on a GPU its float32 matmuls run in TF32 (the H100: 3e-4 off)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-3, atol=2e-3)
    after = [
        d for d in f.last.decisions
        if any(n.op == "sqrt" for _, n in f.last.partition.regions[d.index].program.ops())
    ]  # fmt: skip
    assert after and all(d.status == "kernel" for d in after), f.last.decisions
