"""Kernels whose for-loops are unrolled (`kernel_graph.LOOP_UNROLL`, Triton interpreted): the
meta reaches the kernels' configs, the outputs stay those of the rolled loop, and `select` is
offered the variant only for small winners that loop."""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import kernel_graph, lower
from mirage_jax.mugraph import BlockGraphBuilder, MuGraph, MuGraphBuilder
from mirage_jax.tuning import SMALL_TUNING_US, UNROLL, unrolled_variant
from tests.test_row_major import _batched_attention


def _unrolled(g: MuGraph, n: int = UNROLL) -> MuGraph:
    return MuGraph(g.ops, g.outputs, {**g.meta, kernel_graph.LOOP_UNROLL: n})


def test_an_unrolled_kernel_gives_the_rolled_loops_outputs(monkeypatch):
    pytest.importorskip("triton")
    import mirage_jax.lower.triton as T

    g = _batched_attention()  # a loop of 4 steps
    seen = []
    build = T.build_kernel

    def spy(plan, config, **kw):
        seen.append(config.loop_unroll)
        return build(plan, config, **kw)

    monkeypatch.setattr(T, "build_kernel", spy)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(a[0]).astype(np.float32) for a in g.input_avals]
    rolled = np.asarray(lower(g, backend="triton", interpret=True)(*xs)[0])
    unrolled = np.asarray(lower(_unrolled(g), backend="triton", interpret=True)(*xs)[0])
    assert seen == [1, UNROLL]
    np.testing.assert_allclose(unrolled, rolled, rtol=1e-6, atol=1e-6)
    ((_, p),) = kernel_graph.plan(g).items()
    assert f"loop_unroll_factor={UNROLL}" in T.source_of(p, T.TritonConfig(loop_unroll=UNROLL))


def test_the_variant_is_offered_for_small_winners_that_loop():
    g = _batched_attention()
    assert unrolled_variant(g, SMALL_TUNING_US).meta[kernel_graph.LOOP_UNROLL] == UNROLL
    assert unrolled_variant(g, SMALL_TUNING_US * 2) is None  # its compile would cost more
    assert unrolled_variant(_unrolled(g), 1.0) is None  # already so
    assert unrolled_variant(_loop_free(), 1.0) is None


def _loop_free() -> MuGraph:
    b = MuGraphBuilder()
    x = b.input((8, 16), "float32")
    bb = BlockGraphBuilder(grid=(2,), forloop_range=1)
    bb.output(bb.op("exp", bb.input((8, 16), "float32", imap=(0, None))), omap=(0, None))
    (out,) = b.graph_defined([x], bb.build())
    return b.build([out])
