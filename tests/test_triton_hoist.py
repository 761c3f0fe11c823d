"""A norm fused into the GEMM after it: its statistics are summed in a loop of their own.

In the dots' loop, the sum of squares of the GEMM's input kept the loads from pipelining (H100,
2026-11-26: 10.75 µs, 7.17 in a loop of its own, 6.85 from tiles loaded before the main loop);
`triton_hoist` decides, and the values must not change.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from mirage_jax.lower import lower, plan, triton_hoist
from mirage_jax.lower.triton import TritonConfig, kernel_source
from mirage_jax.lower.triton_hoist import hoisted_statistics, preloaded
from mirage_jax.search import Budget, search
from mirage_jax.select import random_inputs

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _norm_gemm(x, g, w):
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-5)
    return (h.astype(x.dtype) * g) @ w


@functools.cache
def _searched():
    specs = [
        jax.ShapeDtypeStruct((8, 256), jnp.float16),
        jax.ShapeDtypeStruct((256,), jnp.float16),
        jax.ShapeDtypeStruct((256, 64), jnp.float16),
    ]
    part = lax_ir.partition(lax_ir.capture(_norm_gemm, *specs))
    (region,) = [r for r in part.regions if not r.is_trivial]
    budget = Budget(time_s=90, results=64, numbers_per_structure=8)
    return region.program, search(region.program, budget=budget, seed=0)


def _kernels(g):
    return [p for p in plan(g).values()]


@pytest.mark.parametrize("preload", [True, False])
def test_the_norms_statistics_leave_the_dots_loop_and_the_values_stay(preload, monkeypatch):
    """Hoisted statistics are summed after the dots' loop: from tiles loaded before it where
    they fit in registers (`preloaded`), else in a loop of their own."""
    if not preload:
        monkeypatch.setattr(triton_hoist, "PRELOAD_PER_THREAD", 0)
    program, res = _searched()
    looped = [
        g
        for g in res.mugraphs
        if any(p.forloop_range > 1 and hoisted_statistics(p)[0] for p in _kernels(g))
    ]
    assert looped, "no searched kernel loops over K with the norm fused (nothing tested)"
    xs = random_inputs(program, 0)
    want = np.asarray(jax.jit(lambda *a: lax_ir.evaluate(program, *a))(*xs)[0], np.float32)
    for g in looped[:3]:
        for p in _kernels(g):
            hoisted, need = hoisted_statistics(p)
            if not hoisted:
                continue
            assert all(p.op(t).op == "accum_rms_last" for t in hoisted)
            assert not any(u in p.matmuls for u in need)
            src = kernel_source(p, TritonConfig())[1]
            F, n = p.forloop_range, sum(1 for k in need if k < p.n_in)
            assert preloaded(p, need, F, 4) == preload
            assert src.count("for it in range(") == (1 if preload else 2), src
            assert src.count(" = tl.load(in") == (n * F if preload else n) + p.n_in, src
        got = np.asarray(lower(g, backend="triton", interpret=True)(*xs)[0], np.float32)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_nothing_is_hoisted_without_a_dot_or_a_loop():
    program, res = _searched()
    for g in res.mugraphs:
        for p in _kernels(g):
            hoisted, _ = hoisted_statistics(p)
            if p.forloop_range == 1 or not p.matmuls:
                assert hoisted == ()
