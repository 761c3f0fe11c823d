"""An input shifted by a constant: moved to the interface, searched shifted, added back in the
kernels where they load it (`lax_ir.layouts` shift rule, `mugraph.load_steps`,
`regions.stored_views`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from lax_ir.interface import adapt
from mirage_jax.mugraph import MuGraphBuilder
from mirage_jax.mugraph.evaluate import evaluate
from mirage_jax.mugraph.graph import BlockGraphBuilder
from mirage_jax.mugraph.load_steps import with_load_steps


def _gemma_norm(x, g, w):
    """Gemma's RMSNorm with its `1 + scale` gain, in float16, before a projection."""
    ms = jnp.mean(jnp.square(x).astype(jnp.float32), axis=-1, keepdims=True).astype(x.dtype)
    h = x * jax.lax.rsqrt(ms + jnp.float16(1e-6)) * (1 + g)
    return h @ w


def _region(fn, *args):
    part = lax_ir.partition(lax_ir.capture(fn, *args))
    return next(r for r in part.regions if any(n.op == "matmul" for _, n in r.program.ops()))


def _args(seed=0):
    r = np.random.default_rng(seed)
    x = r.normal(size=(4, 64)).astype(np.float16)
    g = (r.normal(size=(64,)) * 0.1).astype(np.float16)
    w = (r.normal(size=(64, 32)) * 0.1).astype(np.float16)
    return x, g, w


def test_a_shifted_input_becomes_an_interface_step_with_the_same_meaning():
    x, g, w = _args()
    region = _region(_gemma_norm, x, g, w)
    program = region.program
    steps = [ops for _, ops in program.meta["interface"]["inputs"]]
    assert sum(op == ("shift", 1.0) for ops in steps for op in ops) == 1, steps
    # the region no longer adds 1 to an input
    assert not any(
        n.op == "add" and any(program.nodes[a].op == "input" for a in n.args)
        for _, n in program.ops()
    )
    got = adapt(lambda *xs: lax_ir.evaluate(program, *xs), program)(x, g, w)
    np.testing.assert_allclose(
        np.asarray(got[0], np.float32),
        np.asarray(_gemma_norm(x, g, w), np.float32),
        rtol=2e-3,
        atol=2e-3,
    )


def _graph():
    """x[4, 8] * (g[1, 8]) in a graph-defined kernel, and g + x as a pre-defined op."""
    b = MuGraphBuilder()
    x, g = b.input((4, 8)), b.input((1, 8))
    bb = BlockGraphBuilder(grid=(2,))
    tx = bb.input((4, 8), "float16", imap=(0,))
    tg = bb.input((1, 8), "float16", imap=(None,))
    bb.output(bb.op("accum_sum", bb.op("mul", tx, tg)), omap=(0,))
    (y,) = b.graph_defined([x, g], bb.build())
    z = b.op("add", x, g)
    return b.build([y, z])


def test_load_steps_give_the_same_function_of_the_unshifted_input():
    g = _graph()
    shifted = with_load_steps(g, {1: (("shift", 1.0),)})
    # one block op in the kernel, one kernel-level op before the pre-defined add
    bg = next(op.block_graph for op in shifted.ops if op.block_graph is not None)
    assert [o.op for o in bg.ops] == ["add_scalar", "mul", "accum_sum"]
    assert sum(op.op == "add_scalar" for op in shifted.ops) == 1
    r = np.random.default_rng(1)
    x = r.normal(size=(4, 8)).astype(np.float16)
    gain = r.normal(size=(1, 8)).astype(np.float16)
    want = evaluate(g, x, (gain + np.float16(1.0)).astype(np.float16))
    got = evaluate(shifted, x, gain)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert with_load_steps(g, {}) is g
    with pytest.raises(ValueError, match="clip"):
        with_load_steps(g, {1: (("clip", 2.0),)})


def test_scales_and_shifts_are_applied_on_load_in_their_order():
    """Attention's 1/sqrt(d) on the queries, then a shift: mul_scalar, then add_scalar, in the
    kernel and before the pre-defined op; the same function of the input without them."""
    g = _graph()
    steps = (("scale", 0.125), ("shift", 1.0))
    both = with_load_steps(g, {1: steps})
    bg = next(op.block_graph for op in both.ops if op.block_graph is not None)
    assert [o.op for o in bg.ops] == ["mul_scalar", "add_scalar", "mul", "accum_sum"]
    r = np.random.default_rng(2)
    x = r.normal(size=(4, 8)).astype(np.float16)
    gain = r.normal(size=(1, 8)).astype(np.float16)
    want = evaluate(g, x, (gain * np.float16(0.125) + np.float16(1.0)).astype(np.float16))
    for a, b in zip(evaluate(both, x, gain), want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@functools.cache
def _searched():
    """The region's search, once for the backends' tests."""
    from mirage_jax.search import Budget, search

    x, g, w = _args()
    return search(
        _region(_gemma_norm, x, g, w).program, budget=Budget(time_s=60), seed=0, workers=1
    )


@pytest.mark.parametrize("backend", ["reference", "triton", "pallas"])
def test_the_kernel_applies_the_shift_and_xla_nothing(backend):
    """`stored_views` leaves the shift to the kernel; the lowered region takes its own inputs
    and matches XLA, and its jvp is XLA's."""
    from types import SimpleNamespace

    from mirage_jax.regions import lower_mugraph, region_kernel, stored_views

    x, g, w = _args()
    region = _region(_gemma_norm, x, g, w)
    program = region.program
    st = stored_views(program, backend)
    (k,) = st.loads
    assert st.loads[k] == (("shift", 1.0),)
    assert all(op[0] != "shift" for op in st.steps[k])
    res = _searched()
    assert res.mugraphs
    decision = SimpleNamespace(mugraph=res.mugraphs[0], verification=None, cache_key="t")
    fn = region_kernel(decision, region, backend, None, strict=True)
    assert callable(fn), fn
    want = _gemma_norm(x, g, w)
    got = fn(x, g, w)[0]
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), 2e-2, 2e-2
    )
    # the µGraph as searched reads 1 + g: fed g itself, it is off by the shift
    plain = adapt(lower_mugraph(res.mugraphs[0], backend), program, stored=st.steps)
    off = np.asarray(plain(x, g, w)[0], np.float32) - np.asarray(want, np.float32)
    assert np.abs(off).max() > 0.1
    tangent = jax.jvp(lambda gg: fn(x, gg, w)[0], (g,), (np.ones_like(g),))[1]
    want_t = jax.jvp(lambda gg: _gemma_norm(x, gg, w), (g,), (np.ones_like(g),))[1]
    np.testing.assert_allclose(
        np.asarray(tangent, np.float32), np.asarray(want_t, np.float32), 2e-2, 2e-2
    )
