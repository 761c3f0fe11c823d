"""`mirage_jax.glue`: a clipped one-window scatter is bound as `dynamic_update_slice`, an update
of an input XLA must copy as one select; each with the traced equation's result at every index,
and the forms they cannot say are bound as traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import lax_ir
from experiments import models as M
from mirage_jax.assemble import assemble, bind_equation
from mirage_jax.glue import bind_cheaper
from tests.test_assemble import _own


def _rebound(fn, *args, copied=False):
    """`fn`'s jaxpr re-bound equation by equation with `bind_equation`, as the assembly does
    (`copied`: its first input is one XLA must copy to update)."""
    closed = jax.make_jaxpr(fn)(*args)
    first = closed.jaxpr.invars[0]

    def run(*xs):
        env = dict(zip(closed.jaxpr.constvars, closed.consts))
        env.update(zip(closed.jaxpr.invars, xs))

        def read(v):
            return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

        for eqn in closed.jaxpr.eqns:
            on_input = copied and eqn.invars[:1] == [first]
            outs = bind_equation(eqn, [read(v) for v in eqn.invars], on_input)
            env.update(zip(eqn.outvars, outs))
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


def _plain_update(cache, new, pos):
    """The flax way: `lax.dynamic_update_slice` on the batched cache."""
    return lax.dynamic_update_slice(cache, new, (0, pos, 0, 0))


def _wide_update(cache, new, pos):
    """A window of two positions: no one-select form."""
    return lax.dynamic_update_slice(cache, jnp.concatenate([new, new], axis=1), (0, pos, 0, 0))


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
        (_plain_update, np.full((3, 1, 2, 4), -1.0, np.float32)),
        (_wide_update, np.full((3, 1, 2, 4), -1.0, np.float32)),
    ]
    for fn, new in cases:
        for copied in (False, True):
            p = np.int32(pos)
            want = jax.jit(fn)(CACHE, new, p)
            (got,) = jax.jit(_rebound(fn, CACHE, new, p, copied=copied))(CACHE, new, p)
            np.testing.assert_array_equal(
                np.asarray(got), np.asarray(want), err_msg=f"{fn.__name__} copied={copied}"
            )


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


def test_updates_of_copied_inputs_are_one_select() -> None:
    """An update of an input XLA copies is a select; of any other value, and a window wider
    than one position, the update as traced (XLA updates those in place)."""
    p = np.int32(3)
    new = np.ones((3, 1, 2, 4), np.float32)
    for fn in (_vmapped_update, _plain_update):
        on_input = _primitives(_rebound(fn, CACHE, new, p, copied=True), CACHE, new, p)
        assert "iota" in on_input and "dynamic_update_slice" not in on_input, on_input
        elsewhere = _primitives(_rebound(fn, CACHE, new, p), CACHE, new, p)
        assert "dynamic_update_slice" in elsewhere and "iota" not in elsewhere, elsewhere
    wide = _primitives(_rebound(_wide_update, CACHE, new, p, copied=True), CACHE, new, p)
    assert "dynamic_update_slice" in wide and "iota" not in wide, wide


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


@pytest.mark.parametrize("name", ["llama_decode_eqx", "llama_decode_nnx"])
def test_decode_blocks_assembled_with_cheaper_cache_writes(name: str) -> None:
    """The equinox block's vmapped cache writes reach XLA as dynamic_update_slice once any
    region is replaced, and as selects where its inputs are copied (no donation), as the flax
    block's are; the block computes what jax.jit does either way."""
    m = M.get(name, batch=2, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    want = jax.jit(m.fn)(*case.args)
    for copied in ((), range(len(program.meta["jaxpr"].jaxpr.invars))):
        asm = assemble(program, part, replacements, copied)
        fn = lax_ir.as_function(program, asm.fn)
        seen = _primitives(fn, *case.args)
        assert "scatter" not in seen, seen
        assert ("dynamic_update_slice" in seen) is not bool(copied), seen
        got = jax.jit(fn)(*case.args)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3)


def test_jit_writes_copies_only_where_nothing_is_donated() -> None:
    """`mirage_jax.jit` assembles the select form for a function that donates nothing, and
    leaves the update to XLA (in place) where the caches are donated."""
    import mirage_jax

    m = M.get("llama_decode_nnx", batch=1, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    for donate, selects in ((None, True), ((2, 3), False)):
        f = mirage_jax.jit(m.fn, cache=False, donate_argnums=donate)
        fn = lax_ir.as_function(program, f._assemble(program, part, replacements).fn)
        assert ("dynamic_update_slice" not in _primitives(fn, *case.args)) is selects
