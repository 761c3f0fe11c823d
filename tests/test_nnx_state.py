"""flax nnx modules whose state a call changes: `mirage_jax.jit` writes the change back, as
`nnx.jit` does, where `jax.jit` drops it silently."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mirage_jax

OPTS = {"backend": "pallas-interpret", "cache": False}


class Counted(nnx.Module):
    """A projection that counts its calls in a Variable."""

    def __init__(self):
        self.count = nnx.Variable(jnp.zeros((), jnp.int32))
        self.w = nnx.Param(jnp.asarray(np.random.default_rng(0).standard_normal((16, 16)) * 0.3))

    def __call__(self, x):
        self.count[...] = self.count[...] + 1  # flax 0.12's in-place form
        return jnp.tanh(x @ self.w) * 2.0


def project(m, x):
    return m(x)


def test_a_counter_advances_and_the_function_still_gets_kernels():
    """Two calls: the Variable reads 2 (jax.jit leaves 0), the outputs match, the projection
    is a kernel; the aborted first trace is the only extra one."""
    x = jnp.ones((4, 16), jnp.float32)
    m, plain = Counted(), Counted()
    f = mirage_jax.jit(project, **OPTS)
    y = f(m, x)
    f(m, x)
    jax.jit(project)(plain, x)
    assert int(m.count.get_value()) == 2 and int(plain.count.get_value()) == 0
    np.testing.assert_allclose(np.asarray(y), np.asarray(jnp.tanh(x @ m.w.get_value()) * 2.0), 1e-5)
    assert f.stats.traces == 2
    assert any(d.status == "kernel" for d in f.last.decisions), f.last.decisions


def test_a_decoding_attention_matches_nnx_jit_step_by_step():
    """`nnx.MultiHeadAttention(decode=True)` writes its cache and index on every step: under
    mirage_jax.jit the outputs and the index follow nnx.jit's."""

    def attention():
        a = nnx.MultiHeadAttention(2, 8, decode=True, rngs=nnx.Rngs(0))
        a.init_cache((1, 4, 8))
        return a

    ours, theirs = attention(), attention()
    f, g = mirage_jax.jit(lambda a, x: a(x), **OPTS), nnx.jit(lambda a, x: a(x))
    rng = np.random.default_rng(1)
    for step in range(3):
        x = jnp.asarray(rng.standard_normal((1, 1, 8)), jnp.float32)
        np.testing.assert_allclose(np.asarray(f(ours, x)), np.asarray(g(theirs, x)), atol=1e-5)
        assert int(ours.cache_index.get_value()) == int(theirs.cache_index.get_value()) == step + 1


def test_a_module_whose_state_is_unchanged_keeps_the_plain_path():
    """Reading a module changes nothing: one trace, no stateful path."""

    class Plain(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.eye(8))

        def __call__(self, x):
            return x @ self.w

    f = mirage_jax.jit(lambda m, x: m(x), search="off", cache=False)
    f(Plain(), jnp.ones((2, 8)))
    assert f.stats.traces == 1 and f._stateful is None


def test_state_changes_with_donation_are_refused_by_name():
    """Donated or static arguments do not combine with carried state: the error names the
    Variable and the argument, and what to do."""
    f = mirage_jax.jit(project, donate_argnums=1, search="off", cache=False)
    with pytest.raises(TypeError, match=r"args\[0\]\.count.*donate_argnums"):
        f(Counted(), jnp.ones((4, 16)))
