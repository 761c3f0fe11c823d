"""`mirage_jax.glue` and `copy_update`: a clipped one-window scatter is bound as
`dynamic_update_slice`, and the updates of inputs XLA must copy are written, copies and all, by
one kernel; each with the traced equation's result at every index, and the forms they cannot
say are bound as traced."""

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
from mirage_jax import copy_update, glue
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
        p = np.int32(pos)
        want = jax.jit(fn)(CACHE, new, p)
        (got,) = jax.jit(_rebound(fn, CACHE, new, p))(CACHE, new, p)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=fn.__name__)
        eqn = _update_eqn(fn, CACHE, new, p)
        if eqn is not None and glue.update_of(eqn) is not None:  # one kernel writes the copy
            (got,) = _copy_written(fn, CACHE, new, p)
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


def _update_eqn(fn, *args):
    """The one update (or scatter) equation of `fn`'s jaxpr, else None."""
    eqns = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    found = [e for e in eqns if e.primitive.name in ("scatter", "dynamic_update_slice")]
    return found[0] if len(found) == 1 else None


def _copy_written(fn, cache, new, pos):
    """`fn`'s update written by `copy_update` (Triton's interpreter), its operands computed as
    `fn`'s jaxpr computes them."""
    closed = jax.make_jaxpr(fn)(cache, new, pos)
    env = dict(zip(closed.jaxpr.invars, (cache, new, pos)))

    def read(v):
        return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

    for e in closed.jaxpr.eqns:
        vals = [read(v) for v in e.invars]
        if e.primitive.name in ("scatter", "dynamic_update_slice"):
            aval = e.invars[0].aval
            update = copy_update.Update(tuple(aval.shape), str(aval.dtype), glue.update_of(e)[1])
            return copy_update.writer([update], interpret=True)([glue.as_update(e, vals)])
        env.update(zip(e.outvars, bind_equation(e, vals)))
    raise AssertionError("no update")


def test_which_updates_one_kernel_writes() -> None:
    """Windows one position or whole along each dimension: the vmapped and plain cache writes;
    a window of two positions and a dropping scatter: left to XLA."""
    p = np.int32(3)
    one, wide = np.ones((3, 1, 2, 4), np.float32), np.ones((3, 2, 4), np.float32)
    assert glue.update_of(_update_eqn(_vmapped_update, CACHE, one, p)) == ((3, 1, 2, 4), (1,))
    assert glue.update_of(_update_eqn(_plain_update, CACHE, one, p)) == ((3, 1, 2, 4), (1,))
    assert glue.update_of(_update_eqn(_clipped_set, CACHE, wide, p)) == ((3, 1, 2, 4), (1,))
    assert glue.update_of(_update_eqn(_wide_update, CACHE, one, p)) is None
    assert glue.update_of(_update_eqn(_dropped_set, CACHE, wide, p)) is None


def test_one_kernel_writes_several_copies_of_other_shapes_and_dtypes() -> None:
    """Two updates of different shapes and dtypes, one moving along two dimensions, in one
    launch, each start clipped as `dynamic_update_slice` clips it."""
    a = np.arange(2 * 9 * 3, dtype=np.float32).reshape(2, 9, 3)
    b = np.arange(5 * 4, dtype=np.float16).reshape(5, 4)
    wa, wb = -np.ones((2, 1, 3), np.float32), -np.ones((1, 1), np.float16)
    write = copy_update.writer(
        [
            copy_update.Update(a.shape, "float32", (1,)),
            copy_update.Update(b.shape, "float16", (0, 1)),
        ],
        interpret=True,
    )
    for sa, sb in [((0, 4, 0), (2, 1)), ((0, 40, 0), (-3, 7)), ((0, -2, 0), (4, 3))]:
        got = write([(a, wa, [np.int32(s) for s in sa]), (b, wb, [np.int32(s) for s in sb])])
        want = [
            lax.dynamic_update_slice_p.bind(a, wa, *map(np.int32, sa)),
            lax.dynamic_update_slice_p.bind(b, wb, *map(np.int32, sb)),
        ]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


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
    writes both caches' copies, as for the flax and Gemma blocks; the block computes what
    jax.jit does either way."""
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
        assert "scatter" not in seen, seen
        assert ("dynamic_update_slice" in seen) is not bool(copied), seen
        got = jax.jit(fn)(*case.args)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3)


def test_jit_writes_copies_only_where_nothing_is_donated() -> None:
    """On a GPU backend `mirage_jax.jit` has every input written as a copy where nothing is
    donated; none where the caches are donated (XLA updates them in place), and none on the
    CPU."""
    import mirage_jax

    m = M.get("llama_decode_nnx", batch=1, size="tiny")
    program = lax_ir.capture(m.fn, *m.make(0).args)
    n = len(program.meta["jaxpr"].jaxpr.invars)
    assert list(mirage_jax.jit(m.fn, cache=False)._copied(program, "triton")) == list(range(n))
    donated = mirage_jax.jit(m.fn, cache=False, donate_argnums=(2, 3))
    assert not donated._copied(program, "triton")
    assert not mirage_jax.jit(m.fn, cache=False)._copied(program, "pallas-interpret")


@pytest.mark.gpu
def test_copy_kernel_on_the_gpu() -> None:
    """The compiled kernel (jax-triton) writes what `dynamic_update_slice` writes, for a
    float16 cache at every start tried, clipped ones included."""
    cache = jax.random.normal(jax.random.key(0), (2, 300, 3, 128), jnp.float16)
    rows = jax.random.normal(jax.random.key(1), (2, 1, 3, 128), jnp.float16)
    write = jax.jit(
        lambda c, w, p: copy_update.writer(
            [copy_update.Update(c.shape, "float16", (1,))], interpret=False
        )([(c, w, [jnp.int32(0), p, jnp.int32(0), jnp.int32(0)])])[0]
    )
    for p in (0, 5, 299, 300, 1000, -4):
        z = np.int32(0)
        want = lax.dynamic_update_slice_p.bind(cache, rows, z, np.int32(p), z, z)
        np.testing.assert_array_equal(np.asarray(write(cache, rows, np.int32(p))), np.asarray(want))
