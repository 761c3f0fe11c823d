"""`mirage_jax.glue`: a clipped one-window scatter is bound as `dynamic_update_slice`, with the
scatter's result at every index; the scatters it cannot say are bound as traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import lax_ir
from experiments import models as M
from mirage_jax.assemble import assemble, bind_equation
from mirage_jax.glue import bind_cheaper
from tests.test_assemble import _own


def _rebound(fn, *args):
    """`fn`'s jaxpr re-bound equation by equation with `bind_equation`, as the assembly does."""
    closed = jax.make_jaxpr(fn)(*args)

    def run(*xs):
        env = dict(zip(closed.jaxpr.constvars, closed.consts))
        env.update(zip(closed.jaxpr.invars, xs))

        def read(v):
            return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

        for eqn in closed.jaxpr.eqns:
            env.update(zip(eqn.outvars, bind_equation(eqn, [read(v) for v in eqn.invars])))
        return [read(v) for v in closed.jaxpr.outvars]

    return run


def _primitives(fn, *args) -> set[str]:
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def _vmapped_update(cache, new, pos):
    """The equinox way: one example's cache updated at `pos`, vmapped over the batch."""
    return jax.vmap(lambda c, k: lax.dynamic_update_slice(c, k, (pos, 0, 0)))(cache, new)


def _clipped_set(cache, new, pos):
    """`.at[].set` told to clip: an inserted window dimension (the position axis)."""
    return cache.at[:, pos].set(new, mode="clip")


def _dropped_set(cache, new, pos):
    """`.at[].set`'s default mode drops an out-of-bounds update: not a dynamic_update_slice."""
    return cache.at[:, pos].set(new)


CACHE = np.arange(3 * 16 * 2 * 4, dtype=np.float32).reshape(3, 16, 2, 4)


@settings(max_examples=25, deadline=None)
@given(pos=st.integers(-40, 40))
def test_rewrite_matches_the_scatter_at_every_index(pos: int) -> None:
    """In bounds, negative and past either end (clipped), the rewritten forms compute what the
    traced scatter does under jax.jit."""
    cases = [
        (_vmapped_update, np.full((3, 1, 2, 4), -1.0, np.float32)),
        (_clipped_set, np.full((3, 2, 4), -1.0, np.float32)),
        (_dropped_set, np.full((3, 2, 4), -1.0, np.float32)),
    ]
    for fn, new in cases:
        p = np.int32(pos)
        want = jax.jit(fn)(CACHE, new, p)
        (got,) = jax.jit(_rebound(fn, CACHE, new, p))(CACHE, new, p)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=fn.__name__)


def test_clipped_scatters_become_updates_and_dropping_ones_stay() -> None:
    p = np.int32(3)
    for fn, new, rewritten in [
        (_vmapped_update, np.ones((3, 1, 2, 4), np.float32), True),
        (_clipped_set, np.ones((3, 2, 4), np.float32), True),
        (_dropped_set, np.ones((3, 2, 4), np.float32), False),
    ]:
        assert "scatter" in _primitives(fn, CACHE, new, p)
        seen = _primitives(_rebound(fn, CACHE, new, p), CACHE, new, p)
        assert ("scatter" not in seen) is rewritten, (fn.__name__, seen)
        assert ("dynamic_update_slice" in seen) is rewritten, (fn.__name__, seen)


def test_scatters_it_cannot_say_are_left() -> None:
    """A scatter-add, and a scatter of several windows, have no one-update form."""
    idx = jnp.array([[1], [5]], jnp.int32)
    several = jax.make_jaxpr(lambda c, u: c.at[idx[:, 0]].set(u, mode="clip"))(
        jnp.zeros((8, 4)), jnp.ones((2, 4))
    )
    added = jax.make_jaxpr(lambda c, u: c.at[3].add(u, mode="clip"))(jnp.zeros((8, 4)), jnp.ones(4))
    for closed in (several, added):
        (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name.startswith("scatter")]
        vals = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.invars]
        assert bind_cheaper(eqn, vals) is None


def test_equinox_block_assembled_without_a_scatter() -> None:
    """The equinox block's vmapped cache updates reach XLA as dynamic_update_slice once any
    region is replaced, and the block still computes what jax.jit does."""
    m = M.get("llama_decode_eqx", batch=2, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    assert "scatter" in _primitives(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    asm = assemble(program, part, replacements)
    fn = lax_ir.as_function(program, asm.fn)
    assert "scatter" not in _primitives(fn, *case.args)
    got = jax.jit(fn)(*case.args)
    want = jax.jit(m.fn)(*case.args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3)
