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
