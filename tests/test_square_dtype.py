"""A norm squares as the program does: in float16 where it does not upcast first.

Gemma's RMSNorm squares its float16 input without an upcast, so a row with |x| > 256 has an
infinite mean square under `jax.jit` and normalises to zeros. A kernel that squared in fp32
returned the finite norm: the whole-function check saw the values differ and ran the Gemma 7B
block as XLA (H100, 2026-11-26). The norms' `sq_dtype` param rounds the square as the program
does; these tests search such regions and run what the search found.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from mirage_jax.function_check import compare
from mirage_jax.lower import lower
from mirage_jax.search import Budget, search
from mirage_jax.search.vocab import build_vocabulary
from mirage_jax.select import random_inputs

warnings.filterwarnings("ignore", category=DeprecationWarning)

D, N = 64, 32


def _norm_matmul(upcast: bool):
    """x (8, D) float16 -> RMSNorm (gain 1 + s) -> @ w (D, N), squaring in f16 or in fp32."""

    def f(x, s, w):
        h = x.astype(jnp.float32) if upcast else x
        var = jnp.mean(jnp.square(h), axis=-1, keepdims=True)
        normed = (h * jax.lax.rsqrt(var + 1e-6)).astype(x.dtype)
        return (normed * (1 + s)) @ w

    return f


def _program(upcast: bool):
    specs = [
        jax.ShapeDtypeStruct((8, D), jnp.float16),
        jax.ShapeDtypeStruct((D,), jnp.float16),
        jax.ShapeDtypeStruct((D, N), jnp.float16),
    ]
    part = lax_ir.partition(lax_ir.capture(_norm_matmul(upcast), *specs))
    (region,) = [r for r in part.regions if not r.is_trivial]
    return region.program


def _norm_params(program) -> set[tuple]:
    from mirage_jax.search import dims
    from mirage_jax.search import expr as E

    d = dims.analyse(program)
    v = build_vocabulary(program, d, E.scalar_constants(program, d))
    return {p for name, p in (*v.unary, *v.accumulators) if name in ("rms_norm", "accum_rms_last")}


def test_the_vocabulary_squares_in_the_programs_dtype():
    assert all(dict(p).get("sq_dtype") == "float16" for p in _norm_params(_program(False)))
    assert all("sq_dtype" not in dict(p) for p in _norm_params(_program(True)))
    assert _norm_params(_program(False)) and _norm_params(_program(True))


@functools.cache
def _searched():
    program = _program(False)
    res = search(program, budget=Budget(time_s=90, results=16), seed=0)
    assert res.mugraphs, res.message
    return program, res


def _overflowing_inputs(program):
    """The region's random inputs with row 3 of x scaled past float16's square root of max."""
    xs = random_inputs(program, 0)
    (k,) = [k for k, a in enumerate(program.input_avals) if a[0] == (8, D)]
    x = xs[k] = xs[k].copy()
    x[3] = 1000 * np.sign(x[3]) + x[3]
    return xs


def _program_values(program, xs):
    """The region's values as the program computes them (its Lax ops under jax.jit)."""
    return jax.jit(lambda *a: lax_ir.evaluate(program, *a))(*xs)[0]


def test_the_program_zeroes_an_overflowing_row():
    program, _ = _searched()
    want = np.asarray(_program_values(program, _overflowing_inputs(program)))
    assert np.all(want[3] == 0) and np.abs(want[[0, 1, 2]]).max() > 0


def _squares_in_f16(g) -> bool:
    """Does a block op of `g` square with sq_dtype float16?"""
    ops = [bop for _, k in g.graph_defined() for bop in k.block_graph.ops]
    return any(dict(op.params).get("sq_dtype") == "float16" for op in ops)


@pytest.mark.parametrize("backend", ["pallas", "triton"])
def test_searched_norm_kernels_overflow_as_the_program_does(backend):
    program, res = _searched()
    xs = _overflowing_inputs(program)
    want = _program_values(program, xs)
    squaring = 0
    for g in res.mugraphs[:4]:
        squaring += _squares_in_f16(g)
        got = lower(g, backend=backend, interpret=True)(*xs)[0]
        assert compare(got, want) is None, (compare(got, want), g)
    assert squaring, "no kernel of the search squares the norm (nothing was tested)"
