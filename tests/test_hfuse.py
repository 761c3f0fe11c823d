"""Horizontal fusion (`mirage_jax.search.hfuse`): a norm before projections of different
widths, which the cuts give as one kernel per output, runs as one kernel for all outputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fields
import lax_ir
from mirage_jax.lower import lower
from mirage_jax.mugraph import TARGETS
from mirage_jax.search import Budget, search
from mirage_jax.search.hfuse import fused_variants, fusible
from tests.conftest import interpret_backends


def qkv(x, g, wq, wk, wv):
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    h = x * r * g
    return h @ wq, h @ wk, h @ wv


def _program():
    f32 = jnp.float32
    specs = [(1, 256), (1, 256), (256, 256), (256, 64), (256, 64)]  # a decode step: one row
    args = [jax.ShapeDtypeStruct(s, f32) for s in specs]
    part = lax_ir.partition(lax_ir.capture(qkv, *args))
    (region,) = [r for r in part.regions if not r.is_trivial]
    return region.program


def test_projections_of_different_widths_get_one_kernel() -> None:
    program = _program()
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    assert res.best is not None, res.message
    fused = [g for g in res.mugraphs if g.meta["structure"].startswith("one kernel for all")]
    assert fused, [g.meta["structure"] for g in res.mugraphs]
    g = fused[0]
    ((_, op),) = list(g.graph_defined())
    assert len(op.block_graph.outputs) == 3
    assert g.meta["verified"] == "full"
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s, np.float32) for s, _ in program.input_avals]
    got = lower(g, backend="pallas-interpret")(*xs)
    want = lax_ir.evaluate(program, *xs)
    for o, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-4, atol=1e-4)


def test_every_fused_variant_is_verified_equal_and_one_kernel() -> None:
    """Each variant (grid size and loop range valid for every kernel) is proved equal to the
    region; the per-output µGraph it came from had three kernels."""
    program = _program()
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    per_output = [g for g in res.mugraphs if g.meta["structure"].startswith("one kernel per")]
    assert per_output and len(fusible(per_output[0])) == 3
    variants = fused_variants(per_output[0], TARGETS["h100"], keep=8)
    assert variants
    for _, f in variants:
        assert len(list(f.graph_defined())) == 1
        assert fields.verify(f, program, trials=2, seed=1)


def test_projections_of_different_widths_get_one_launch() -> None:
    """The per-output kernels, each with its own tiling, as one launch (`ONE_LAUNCH`): the
    same µGraph (and verdict); the triton backend runs it as one kernel whose blocks are the
    three kernels' one after another, the others launch the three."""
    import pytest

    from mirage_jax.lower import triton as triton_lowering
    from mirage_jax.lower.kernel_graph import plan

    program = _program()
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    one = [g for g in res.mugraphs if g.meta["structure"].startswith("one launch for all")]
    assert one, [g.meta["structure"] for g in res.mugraphs]
    g = one[0]
    assert len(g.independent_kernels()) == 3 and g.meta["verified"] == "full"
    assert g.launch_groups() == (g.independent_kernels(),)
    per_output = [x for x in res.mugraphs if x.canonical_hash == g.canonical_hash and x is not g]
    assert per_output, "the one-launch form is the per-output µGraph itself"
    plans = plan(g)
    source = triton_lowering.generate_group_source(
        [plans[i] for i in g.independent_kernels()], triton_lowering.default_config(), "k"
    )
    assert source.count("tl.program_id") == 1 and source.count("tl.store") == 3
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s, np.float32) for s, _ in program.input_avals]
    want = lax_ir.evaluate(program, *xs)
    backends = interpret_backends()
    for backend in backends:
        got = lower(g, backend=backend, interpret=True)(*xs)
        for o, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-4, atol=1e-4)
    if "triton" not in backends:
        pytest.skip("triton not installed: the one launch was checked with pallas-interpret only")


def test_a_loop_free_tiling_is_offered_as_one_launch_too() -> None:
    """Where the pieces' best µGraphs loop over K (8 rows, K=1024: the cost model's choice),
    their best loop-free ones are stitched and offered as one launch as well, verified."""

    def qkv16(x, g, wq, wk, wv):
        xf = x.astype(jnp.float32)
        r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-5)
        h = (xf * r * g.astype(jnp.float32)).astype(jnp.float16)
        return h @ wq, h @ wk, h @ wv

    specs = [(8, 1024), (1, 1024), (1024, 1024), (1024, 256), (1024, 256)]
    args = [jax.ShapeDtypeStruct(s, jnp.float16) for s in specs]
    part = lax_ir.partition(lax_ir.capture(qkv16, *args))
    (region,) = [r for r in part.regions if not r.is_trivial]
    program = region.program
    res = search(program, budget=Budget(time_s=120), seed=0, workers=1)
    loop_free = [g for g in res.mugraphs if "one launch for all outputs, loop-free" in
                 g.meta["structure"]]  # fmt: skip
    assert loop_free, [g.meta["structure"][:60] for g in res.mugraphs]
    g = loop_free[0]
    assert len(g.independent_kernels()) == 3 and g.meta["verified"] == "full"
    assert g.launch_groups() == (g.independent_kernels(),)
    assert all(op.block_graph.forloop_range == 1 for _, op in g.graph_defined())
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(s) * 0.5).astype(np.float16) for s in specs]
    got = lower(g, backend="reference")(*xs)
    want = lax_ir.evaluate(program, *xs)
    for o, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(w, np.float32),
                                   rtol=2e-2, atol=2e-2)  # fmt: skip
