"""bfloat16 model code reaches the search: numpy gives bfloat16 the dtype kind "V", and the
partition once read every bfloat16 op as non-float data outside the Lax fragment."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
import mirage_jax
from lax_ir.dtypes import is_float


def norm_mlp(x, w, g):
    """RMS norm in float32, its gain, a projection and SiLU, in the model's bfloat16."""
    x32 = x.astype(jnp.float32)
    h = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype)
    return jax.nn.silu((h * g) @ w)


def _inputs():
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    x = jax.random.normal(k[0], (16, 64), jnp.bfloat16)
    w = (jax.random.normal(k[1], (64, 128), jnp.float32) / 8).astype(jnp.bfloat16)
    return x, w, jnp.full((64,), 1.5, jnp.bfloat16)


@pytest.mark.parametrize(
    "dtype,want",
    [("bfloat16", True), ("float8_e4m3fn", True), ("float16", True), ("int32", False),
     ("bool", False), ("int4", False), ("complex64", False)],
)  # fmt: skip
def test_is_float_counts_bfloat16_and_float8(dtype, want):
    assert is_float(dtype) is want
    assert is_float(np.dtype(dtype)) is want


def test_a_bfloat16_block_is_one_region_with_nothing_residual():
    part = lax_ir.partition(lax_ir.capture(norm_mlp, *_inputs()))
    assert len(part.regions) == 1 and not part.residual, part


def test_a_bfloat16_block_runs_a_searched_kernel_like_jax_jit():
    xs = _inputs()
    f = mirage_jax.jit(norm_mlp, backend="pallas-interpret", cache=None)
    got = f(*xs)
    want = jax.jit(norm_mlp)(*xs)
    assert f.stats.kernels == 1, [d.reason for d in f.last.decisions]
    assert got.dtype == jnp.bfloat16
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    assert err <= 2e-2 * float(jnp.max(jnp.abs(want.astype(jnp.float32)))), err
