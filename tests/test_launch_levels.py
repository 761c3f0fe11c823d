"""One launch per dependency level (`ONE_LAUNCH` on a µGraph whose kernels depend on others).

Three split projections and their combining kernels would run as six launches; with
`ONE_LAUNCH` the Triton backend runs each level's kernels as one (`MuGraph.launch_levels`):
here two projections, then their two epilogues. Run in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import lower
from mirage_jax.lower import triton as tr
from mirage_jax.mugraph import (
    ONE_LAUNCH,
    BlockGraphBuilder,
    MuGraph,
    MuGraphBuilder,
    evaluate_reference,
)
from mirage_jax.search import cost as cost_model
from tests.conftest import interpret_backends


def _projection(n: int):
    """x (4, 64) @ w (64, n), columns over 2 blocks, K in 2 steps."""
    b = BlockGraphBuilder(grid=(2,), forloop_range=2)
    x = b.input((4, 64), "float32", imap=(None,), forloop_dim=1)
    w = b.input((64, n), "float32", imap=(1,), forloop_dim=0)
    b.output(b.op("accum_sum", b.op("matmul", x, w)), (1,))
    return b.build()


def _scaled(n: int, op: str):
    """An elementwise epilogue of a (4, n) tile: 2·y, or exp(y)."""
    b = BlockGraphBuilder(grid=(2,), forloop_range=1)
    y = b.input((4, n), "float32", imap=(1,))
    z = b.op("add", y, y) if op == "add" else b.op(op, y)
    b.output(b.op("accum_sum", z), (1,))
    return b.build()


def two_levels(one_launch: bool) -> MuGraph:
    mb = MuGraphBuilder()
    x = mb.input((4, 64), "float32")
    w1, w2 = mb.input((64, 32), "float32"), mb.input((64, 16), "float32")
    (y1,) = mb.graph_defined([x, w1], _projection(32))
    (y2,) = mb.graph_defined([x, w2], _projection(16))
    (z1,) = mb.graph_defined([y1], _scaled(32, "add"))
    (z2,) = mb.graph_defined([y2], _scaled(16, "exp"))
    return mb.build([z1, z2], **({ONE_LAUNCH: True} if one_launch else {}))


def _inputs(g: MuGraph):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * 0.2).astype(d) for s, d in g.input_avals]


def test_levels_are_the_kernels_by_dependency():
    g = two_levels(True)
    (k1, k2), (k3, k4) = g.launch_levels()
    assert g.launch_groups() == ((k1, k2), (k3, k4))
    assert g.independent_kernels() == ()  # not all independent: two launches, not one
    assert two_levels(False).launch_levels() == ()
    assert two_levels(False).dependency_levels() == g.launch_levels()


def test_the_cost_model_saves_a_launch_per_level():
    one, apart = cost_model.estimate(two_levels(True)), cost_model.estimate(two_levels(False))
    assert (one.kernels, apart.kernels) == (2, 4)
    assert apart.seconds - one.seconds == pytest.approx(2 * cost_model.H100.launch_s)


def test_each_level_runs_as_one_launch_with_the_values_of_four(monkeypatch):
    pytest.importorskip("triton")
    names: list[str] = []
    real = tr.launcher

    def spy(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(tr, "launcher", spy)
    g = two_levels(True)
    xs = _inputs(g)
    want = evaluate_reference(g, *xs)
    got = lower(g, backend="triton", interpret=True)(*xs)
    for o, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-4, atol=1e-5)
    assert len(names) == 2 and all("group" in n for n in names), names
    got = lower(two_levels(False), backend="pallas-interpret")(*xs)  # launches them one by one
    for o, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-4, atol=1e-5)


def qkv(x, g, wq, wk, wv):
    """A decode step's norm before its Q, K and V projections (float16, the statistic in fp32)."""
    import jax
    import jax.numpy as jnp

    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    h = h.astype(jnp.float16) * g
    return h @ wq, h @ wk, h @ wv


def test_the_reread_search_stitches_split_pieces_launched_by_level():
    """`Budget(reread=True)`: each output's piece splits over K with a combining kernel that
    takes the rms, and the stitch runs as two launches (`cut_search._split_levels`), verified
    at full size and equal to the region in both interpret modes."""
    import jax
    import jax.numpy as jnp

    import lax_ir
    from mirage_jax.search import Budget, search
    from mirage_jax.select import random_inputs
    from mirage_jax.tuning import split_depth_variants

    S = jax.ShapeDtypeStruct
    d, q, kv = 512, 512, 128
    specs = [S((1, d), jnp.float16), S((1, d), jnp.float16), S((d, q), jnp.float16)]
    specs += [S((d, kv), jnp.float16), S((d, kv), jnp.float16)]
    (region,) = lax_ir.partition(lax_ir.capture(qkv, *specs)).regions
    program = region.program
    res = search(program, budget=Budget(time_s=60, reread=True), seed=0, workers=1)
    levels = [
        g for g in res.mugraphs if g.meta["structure"].startswith("one launch per level, split")
    ]
    assert levels, [g.meta["structure"] for g in res.mugraphs]
    g = levels[0]
    assert g.meta["verified"] == "full" and len(g.launch_groups()) == 2
    assert all(len(lv) == 3 for lv in g.launch_groups())
    # `select`'s tuning offers every split deeper at once (the probes' fastest were 16-way)
    deeper = [h for how, h in split_depth_variants(g) if "3 splits deeper" in how]
    assert deeper and [len(lv) for lv in deeper[0].launch_groups()] == [3, 3]
    xs = random_inputs(program, 0)
    want = lax_ir.evaluate_reference(program, *xs)
    backends = interpret_backends()
    for backend, h in [(b, g) for b in backends] + [(backends[-1], deeper[0])]:
        got = lower(h, backend=backend, interpret=True)(*xs)
        for o, w in zip(got, want):
            w = np.asarray(w, np.float64)
            err = np.max(np.abs(np.asarray(o, np.float64) - w)) / np.max(np.abs(w))
            assert err < 2e-2, (backend, err)
