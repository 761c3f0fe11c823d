"""`mirage_jax.glue` and `copy_update`: a clipped one-window scatter is bound as
`dynamic_update_slice`, with the scatter's result at every index (the scatters it cannot say
are bound as traced); the inputs that updates write into, where XLA must copy them, are copied
by one kernel."""

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
from mirage_jax import copy_update
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


def _plain_update(cache, new, pos):
    """The flax way: `lax.dynamic_update_slice` on the batched cache."""
    return lax.dynamic_update_slice(cache, new, (0, pos, 0, 0))


def _wide_update(cache, new, pos):
    """A window of two positions (bound as traced, as every dynamic_update_slice is)."""
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


def test_one_kernel_copies_inputs_of_other_shapes_and_dtypes() -> None:
    """Inputs of different sizes (one not a whole number of blocks) and dtypes, in one launch
    (Triton's interpreter)."""
    xs = [
        np.arange(2 * 9 * 3, dtype=np.float32).reshape(2, 9, 3),
        np.arange(copy_update.BLOCK + 5, dtype=np.float16),
        np.arange(6, dtype=np.int32).reshape(2, 3),
    ]
    avals = [jax.core.ShapedArray(x.shape, x.dtype) for x in xs]
    got = copy_update.copier(avals, interpret=True)(*xs)
    for g, x in zip(got, xs):
        assert g.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(g), x)


def test_copies_differentiate_and_batch_as_the_identity() -> None:
    """grad through the copies is the identity's, and under vmap the inputs come back as they
    are (the kernel is built for one shape)."""
    aval = jax.core.ShapedArray((3, 4), np.float32)
    copies = copy_update.copier([aval, aval], interpret=True)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    grad = jax.grad(lambda a, b: sum(c.sum() * k for k, c in enumerate(copies(a, b), 1)), (0, 1))
    g0, g1 = grad(x, x)
    np.testing.assert_array_equal(np.asarray(g0), np.ones_like(x))
    np.testing.assert_array_equal(np.asarray(g1), 2 * np.ones_like(x))
    xs = np.stack([x, x + 1])
    got = jax.vmap(lambda a: copies(a, a * 2))(xs)
    np.testing.assert_array_equal(np.asarray(got[0]), xs)
    np.testing.assert_array_equal(np.asarray(got[1]), xs * 2)


def test_copies_worth_a_kernel() -> None:
    """Two or more inputs, small enough that their launches matter."""
    small = jax.core.ShapedArray((8, 512, 2, 128), np.float16)
    large = jax.core.ShapedArray((8, 4096, 8, 128), np.float16)
    assert copy_update.worth_it([small, small])
    assert not copy_update.worth_it([small])
    assert not copy_update.worth_it([large, large])


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


@pytest.mark.parametrize("name", ["llama_decode_eqx", "llama_decode_nnx", "gemma_decode"])
def test_decode_blocks_assembled_with_cheaper_cache_writes(name: str) -> None:
    """The equinox block's vmapped cache writes reach XLA as dynamic_update_slice once any
    region is replaced; where its inputs are copied (no donation), one `copy_update` kernel
    copies both caches, as for the flax and Gemma blocks, and the updates write into its
    copies; the block computes what jax.jit does either way."""
    m = M.get(name, batch=2, size="tiny")
    case = m.make(0)
    program = lax_ir.capture(m.fn, *case.args)
    part = lax_ir.partition(program)
    replacements = {r.index: _own(r.program) for r in part.regions if not r.is_trivial}
    want = jax.jit(m.fn)(*case.args)
    for copied in ((), range(len(program.meta["jaxpr"].jaxpr.invars))):
        asm = assemble(program, part, replacements, copied, interpret=True)
        fn = lax_ir.as_function(program, asm.fn)
        seen = _primitives(fn, *case.args)
        assert "scatter" not in seen and "dynamic_update_slice" in seen, seen
        text = str(jax.make_jaxpr(fn)(*case.args))  # the kernel, interpreted, nested in it
        assert ("custom_vmap_call" in text) is bool(copied), seen
        got = jax.jit(fn)(*case.args)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3)

        def total(x, k_cache, fn=fn):  # grad through the copies too (each block's args 1, 2)
            args = (case.args[0], x, k_cache, *case.args[3:])
            return sum(o.astype(jnp.float32).sum() for o in jax.tree_util.tree_leaves(fn(*args)))

        grads = jax.grad(total, (0, 1))(case.args[1], case.args[2])
        for g, a in zip(grads, case.args[1:3]):
            assert g.shape == a.shape and np.isfinite(np.asarray(g, np.float32)).all()


def test_jit_writes_copies_only_where_nothing_is_donated() -> None:
    """On a GPU backend `mirage_jax.jit` counts every input as one XLA must copy to update
    where nothing is donated; none where the caches are donated (XLA updates them in place),
    in a scan's body, or on the CPU."""
    import mirage_jax

    m = M.get("llama_decode_nnx", batch=1, size="tiny")
    program = lax_ir.capture(m.fn, *m.make(0).args)
    n = len(program.meta["jaxpr"].jaxpr.invars)
    assert list(mirage_jax.jit(m.fn, cache=False)._copied(program, "triton")) == list(range(n))
    donated = mirage_jax.jit(m.fn, cache=False, donate_argnums=(2, 3))
    assert not donated._copied(program, "triton")
    assert not mirage_jax.jit(m.fn, cache=False)._copied(program, "pallas-interpret")
    body = mirage_jax.jit(m.fn, cache=False)._scan_body(m.fn)
    assert not body._copied(program, "triton")


@pytest.mark.gpu
def test_copy_kernel_on_the_gpu() -> None:
    """The compiled kernel (jax-triton) copies float16 caches exactly."""
    caches = [jax.random.normal(jax.random.key(i), (2, 300, 3, 128), jnp.float16) for i in (0, 1)]
    avals = [jax.core.ShapedArray(c.shape, c.dtype) for c in caches]
    got = jax.jit(copy_update.copier(avals, interpret=False))(*caches)
    for g, c in zip(got, caches):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(c))


def test_cache_write_probe_forms_agree() -> None:
    """`experiments.cache_write_forms`: its select forms write what `dynamic_update_slice`
    writes (wrapped and clipped positions too); with the rope, within its rounding."""
    from experiments.cache_write_forms import form

    def r(i, shape):
        return jax.random.normal(jax.random.key(i), shape, jnp.float32)

    for pos in (0, 5, 15, 40, -3, -40):
        args = (r(0, (2, 16, 2, 8)), r(1, (2, 16, 2, 8)), r(2, (2, 1, 4, 8)),
                r(3, (2, 1, 2, 8)), r(4, (2, 1, 2, 8)), jnp.int32(pos))  # fmt: skip
        for roped in (False, True):
            want = jax.jit(form("dus", roped))(*args)
            for name in ("select", "barrier", "shared"):
                for g, w in zip(jax.jit(form(name, roped))(*args), want):
                    np.testing.assert_allclose(
                        np.asarray(g), np.asarray(w), 0 if not roped else 1e-5
                    )
