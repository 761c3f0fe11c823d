"""Hypothesis: random JAX programs over the supported op set survive capture -> partition -> rebuild."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import lax_ir

# Unary ops keep values bounded so float comparisons stay meaningful.
UNARY = {
    "tanh": jnp.tanh,
    "exp_tanh": lambda x: jnp.exp(jnp.tanh(x)),
    "neg": lambda x: -x,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "sigmoid": jax.nn.sigmoid,
    "rsqrt": lambda x: lax.rsqrt(x * x + 1.0),
    "sqrt": lambda x: jnp.sqrt(x * x + 0.5),
    "square": jnp.square,
    "cube": lambda x: x**3,
    "scale": lambda x: x * 0.5,
    "softmax": lambda x: jax.nn.softmax(x, axis=-1),
    "where": lambda x: jnp.where(x > 0, x, 0.1 * x),
    "rms_norm": lambda x: x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6),
    "jit_tanh": jax.jit(lambda x: jnp.tanh(x) * 2.0),
}
BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "div": lambda a, b: a / (b * b + 1.0),
    "max": jnp.maximum,
}
REDUCE = {
    "sum": jnp.sum,
    "mean": jnp.mean,
    "max": jnp.max,
}


@st.composite
def programs(draw):
    m = draw(st.integers(1, 4))
    n = draw(st.integers(1, 5))
    n_inputs = draw(st.integers(1, 3))
    steps = []
    n_values = n_inputs + 1  # inputs plus the weight
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "matmul", "transpose2"]))
        if kind == "unary":
            steps.append(
                ("unary", draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, n_values - 1)))
            )
        elif kind == "binary":
            steps.append(
                (
                    "binary",
                    draw(st.sampled_from(sorted(BINARY))),
                    draw(st.integers(0, n_values - 1)),
                    draw(st.integers(0, n_values - 1)),
                )
            )
        elif kind == "reduce":
            steps.append(
                (
                    "reduce",
                    draw(st.sampled_from(sorted(REDUCE))),
                    draw(st.integers(0, n_values - 1)),
                    draw(st.integers(0, 1)),
                )
            )
        elif kind == "matmul":
            steps.append(("matmul", draw(st.integers(0, n_values - 1))))
        else:
            steps.append(("transpose2", draw(st.integers(0, n_values - 1))))
        n_values += 1
    n_out = draw(st.integers(1, 2))
    return m, n, n_inputs, steps, n_out


def build(m, n, n_inputs, steps, n_out):
    """A JAX function over inputs x_i[m, n] and w[n, n]; every value stays [m, n]-broadcastable."""

    def fn(xs, w):
        vals = [*xs, w[:m] if m <= n else jnp.tile(w, (m // n + 1, 1))[:m]]
        for s in steps:
            if s[0] == "unary":
                v = UNARY[s[1]](vals[s[2]])
            elif s[0] == "binary":
                v = BINARY[s[1]](vals[s[2]], vals[s[3]])
            elif s[0] == "reduce":
                v = REDUCE[s[1]](vals[s[2]], axis=s[3], keepdims=True)
            elif s[0] == "matmul":
                v = jnp.broadcast_to(vals[s[1]], (m, n)) @ w
            else:
                v = jnp.broadcast_to(vals[s[1]], (m, n)) @ w.T
            vals.append(v)
        return {"out": [jnp.broadcast_to(v, (m, n)) for v in vals[-n_out:]]}

    return fn


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**31 - 1))
def test_capture_partition_rebuild_equals_original(prog, seed):
    m, n, n_inputs, steps, n_out = prog
    fn = build(*prog)
    xs_spec = [jax.ShapeDtypeStruct((m, n), jnp.float32) for _ in range(n_inputs)]
    w_spec = jax.ShapeDtypeStruct((n, n), jnp.float32)
    program = lax_ir.capture(fn, xs_spec, w_spec)
    part = lax_ir.partition(program)
    rng = np.random.default_rng(seed)
    xs = [jnp.asarray(rng.standard_normal((m, n)), jnp.float32) for _ in range(n_inputs)]
    w = jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32)
    want = jax.jit(fn)(xs, w)
    got = jax.jit(lax_ir.rebuild(part))(xs, w)
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)
    # Every node is accounted for exactly once: in one region, residual, or structural.
    in_regions = [i for r in part.regions for i in r.nodes]
    assert len(in_regions) == len(set(in_regions))
    accounted = set(in_regions) | set(part.residual)
    for i, node in program.ops():
        assert (i in accounted) == (node.op not in ("constant",)), (i, node)
    # Re-capturing gives the same canonical Program.
    assert lax_ir.capture(fn, xs_spec, w_spec) == program
