"""`mirage_jax.filter_jit`: equinox modules whose leaves are flags, numbers and functions run
under the search as under `equinox.filter_jit`; `mirage_jax.jit` names those leaves when it
fails on them."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax

OPTS = {"backend": "pallas-interpret", "cache": False}


class Block(eqx.Module):
    """A pre-norm MLP block as equinox users write it: `eqx.nn.MLP` holds its activation
    function, `eqx.nn.Dropout` its rate and `inference` flag (fields, not static)."""

    norm: eqx.nn.RMSNorm
    mlp: eqx.nn.MLP
    drop: eqx.nn.Dropout

    def __init__(self, d: int, key: jax.Array):
        self.norm = eqx.nn.RMSNorm(d)
        self.mlp = eqx.nn.MLP(d, d, 2 * d, 1, activation=jax.nn.gelu, key=key)
        self.drop = eqx.nn.Dropout(0.1, inference=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.drop(jax.vmap(lambda r: self.mlp(self.norm(r)))(x))


def step(block: Block, x: jax.Array) -> tuple[jax.Array, Block]:
    return block(x), block


@pytest.fixture(scope="module")
def block_and_x():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 32)) * 0.5, jnp.float32)
    return Block(32, jax.random.PRNGKey(0)), x


def test_a_module_with_flags_and_functions_reaches_the_search_and_matches_equinox(block_and_x):
    """The norm + MLP gets kernels; the output equals `eqx.filter_jit`'s; the module comes back
    with its function and flag (non-array output leaves); new array values reuse the trace, a
    changed static leaf (the activation) traces again."""
    block, x = block_and_x
    f = mirage_jax.filter_jit(step, **OPTS)
    y, back = f(block, x)
    want, _ = eqx.filter_jit(step)(block, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert back.mlp.activation is jax.nn.gelu and back.drop.inference is True
    assert any(d.status == "kernel" for d in f.last.decisions), f.last.decisions
    f(block, x + 1.0)
    assert f.stats.traces == 1
    relu = eqx.tree_at(lambda b: b.mlp.activation, block, jax.nn.relu)
    y2, _ = f(relu, x)
    assert f.stats.traces == 2
    want2, _ = eqx.filter_jit(step)(relu, x)
    np.testing.assert_allclose(np.asarray(y2), np.asarray(want2), rtol=1e-5, atol=1e-5)


def test_mirage_jit_names_the_leaves_it_cannot_trace(block_and_x):
    """Traced like jax.jit, the MLP's activation function is no JAX type; the error's note
    names the leaves that are no arrays and says what to use."""
    block, x = block_and_x
    with warnings.catch_warnings(), pytest.raises(Exception) as info:
        warnings.simplefilter("ignore", mirage_jax.MirageWarning)  # the capture's fallback
        mirage_jax.jit(step, search="off", cache=False)(block, x)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "function at args[0].mlp.activation" in note and "filter_jit" in note
    assert "bool at args[0].drop.inference" in note


def test_donation_methods_and_explain(block_and_x):
    """Donating all but the first argument's arrays runs and matches; a method decorated with
    `filter_jit` binds its instance; `explain` takes a `filter_jit` object."""
    block, x = block_and_x
    f = mirage_jax.filter_jit(lambda b, x: b(x), donate="all-except-first", search="off")
    want = eqx.filter_jit(lambda b, x: b(x))(block, x)
    np.testing.assert_allclose(np.asarray(f(block, jnp.array(x))), np.asarray(want), rtol=1e-6)

    class Holder:
        def __init__(self, block):
            self.block = block

        @mirage_jax.filter_jit(search="off", cache=False)
        def run(self, x):
            return self.block(x)

    assert Holder(block).run(x).shape == x.shape
    report = mirage_jax.explain(mirage_jax.filter_jit(step, **OPTS), block, x)
    assert report.record.decisions


def test_bad_arguments_are_refused_with_what_to_do(block_and_x):
    """Static and donate arguments are the filter's to decide; a bad `donate` and a static
    leaf that cannot be hashed are refused by name."""
    block, x = block_and_x
    with pytest.raises(TypeError, match="static_argnums"):
        mirage_jax.filter_jit(step, static_argnums=0)
    with pytest.raises(ValueError, match="donate"):
        mirage_jax.filter_jit(step, donate="some")
    f = mirage_jax.filter_jit(lambda x, s: x * len(s), search="off", cache=False)
    with pytest.raises(TypeError, match="set is not hashable"):
        f(x, {1, 2})
