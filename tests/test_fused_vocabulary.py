"""The vocabulary of a region with a fused op's pattern: the pattern's own ops and constants
stay out of it, the fused op and the region's other ops stay in (`search.vocab.fused_cover`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
from mirage_jax.search import dims as D
from mirage_jax.search import expr as E
from mirage_jax.search.vocab import build_vocabulary


def _vocab(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, np.float16) for s in shapes]
    part = lax_ir.partition(lax_ir.capture(fn, *args))
    program = next(r.program for r in part.regions if not r.is_trivial)
    d = D.analyse(program)
    scalars = E.scalar_constants(program, d)
    plain = build_vocabulary(program, d, scalars)
    trimmed = build_vocabulary(program, d, scalars, terms=E.program_terms(program, d))
    return plain, trimmed


def _names(v) -> set[str]:
    return {n for n, _ in v.unary} | set(v.binary) | {n for n, _ in v.accumulators}


def test_gelu_brings_only_itself():
    def gated(x, wg, wu):
        return jax.nn.gelu(x @ wg, approximate=False) * (x @ wu)

    plain, trimmed = _vocab(gated, (4, 32), (32, 16), (32, 16))
    assert "gelu" in _names(trimmed)
    assert {"sub", "mul_scalar"} <= _names(plain)  # 1 − erf(·), its ½ and 1/√2
    assert not {"sub", "mul_scalar", "layer_norm"} & _names(trimmed)
    assert _names(trimmed) < _names(plain)


def test_gelu_tanh_brings_only_itself():
    def mlp(x, w):
        return jax.nn.gelu(x @ w, approximate=True)

    plain, trimmed = _vocab(mlp, (4, 32), (32, 16))
    assert "gelu_tanh" in _names(trimmed)
    assert {"tanh", "mul_scalar", "add_scalar"} <= _names(plain)
    assert not {"tanh", "mul_scalar", "add_scalar"} & _names(trimmed)


def test_a_pattern_node_used_elsewhere_keeps_its_ops():
    """1 − erf(·) also feeds the output: the sub is the region's own, not gelu's alone."""

    def leaky(x, w):
        y = x @ w
        inner = 1.0 - jax.lax.erf(-y * jnp.float16(0.70710678))
        return (0.5 * y) * inner + inner

    _, trimmed = _vocab(leaky, (4, 32), (32, 16))
    assert "sub" in _names(trimmed)


def test_norm_ops_outside_the_pattern_stay():
    def norm_gated(x, g, wg, wu):
        ms = jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True)
        h = (x * jax.lax.rsqrt(ms + 1e-6) * g).astype(x.dtype)
        return jax.nn.gelu(h @ wg, approximate=False) * (h @ wu)

    _, trimmed = _vocab(norm_gated, (4, 32), (32,), (32, 16), (32, 16))
    names = _names(trimmed)
    assert {"gelu", "sqrt", "square", "accum_rms_last", "rms_norm"} <= names
    assert "add_scalar" in names  # the norm's epsilon
    assert "sub" not in names
