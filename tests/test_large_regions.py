"""What a region too large for one float64 reference or one verification trial needs: the
reference in pieces along batch-like dimensions (`mirage_jax.reference_pieces`), grids past the
target's block cap where no instance fits within it (`search.driver.WIDE_BLOCKS`), and a
selection that a reduced instance's verdict lets through (`select`)."""

from __future__ import annotations

import dataclasses
import importlib

import jax
import numpy as np
import pytest

import lax_ir
from fields import memory
from mirage_jax import reference_pieces
from mirage_jax import select as S
from mirage_jax.mugraph.validate import Target
from mirage_jax.search import Budget, search


def _attention(batch: int = 4, heads: int = 2, q: int = 16, kv: int = 32, d: int = 8):
    """A masked attention (the mask a bias input) with a batch and heads, as one region."""

    def f(x, k, v, bias):
        s = jax.numpy.einsum("bhqd,bhkd->bhqk", x, k) * 0.25 + bias
        return jax.numpy.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)

    rng = np.random.default_rng(0)
    shapes = [(batch, heads, q, d), (batch, heads, kv, d), (batch, heads, kv, d)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    xs.append(np.where(np.tril(np.ones((q, kv)), kv - q) > 0, 0.0, -1e9).astype(np.float32))
    return lax_ir.capture(f, *xs), xs


def test_the_reference_in_pieces_is_the_whole_reference():
    p, xs = _attention()
    want = lax_ir.evaluate_reference(p, *xs)
    whole = reference_pieces.float64_bytes(p)
    assert reference_pieces.plan(p, whole) == {}
    chunks = reference_pieces.plan(p, whole // 6)
    assert chunks and all(n >= 1 for n in chunks.values())
    calls = []

    def counted(piece, *ys):
        calls.append([y.shape for y in ys])
        return lax_ir.evaluate_reference(piece, *ys)

    got = reference_pieces.evaluate(p, xs, chunks, counted)
    assert len(calls) >= 6  # every piece within the limit
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-14)
    # the keys' class is reduced (the softmax, the second matmul): never sliced
    dims = reference_pieces.dims_mod.analyse(p)
    kv_class = dims.axes[p.inputs[1]][2]
    assert kv_class not in reference_pieces.batch_classes(dims)


def test_a_region_with_no_batch_like_class_is_not_cut():
    def f(x, w):
        return jax.numpy.sum(x @ w, axis=0)

    xs = [np.ones((16, 8), np.float32), np.ones((8, 16), np.float32)]
    p = lax_ir.capture(f, *xs)
    assert reference_pieces.plan(p, 8) is None


def test_select_takes_the_float_reference_in_pieces(monkeypatch):
    p, xs = _attention()
    monkeypatch.setattr(reference_pieces, "PIECE_BYTES", reference_pieces.float64_bytes(p) // 3)
    seen = []
    real = reference_pieces.evaluate
    monkeypatch.setattr(
        reference_pieces, "evaluate", lambda *a, **k: seen.append(a[2]) or real(*a, **k)
    )
    got = S.float_reference(p, *xs)
    assert seen and seen[0]
    np.testing.assert_allclose(got[0], lax_ir.evaluate_reference(p, *xs)[0], rtol=1e-12)


def _gemm():
    def f(x, w):
        return jax.nn.relu(x @ w)

    xs = [np.ones((256, 256), np.float16), np.ones((256, 256), np.float16)]
    return lax_ir.partition(lax_ir.capture(f, *xs)).regions[0].program


def test_grids_go_past_the_block_cap_only_where_nothing_fits_within_it():
    program = _gemm()
    budget = Budget(time_s=30.0, results=4, confirm=1)
    # 8 KiB of shared memory: no tile of this GEMM fits in one or two blocks
    tight = Target("tight", smem_bytes=8 * 1024, max_blocks=2)
    result = search(program, budget=budget, seed=0, progress=False, target=tight)
    assert result.mugraphs, result.message
    blocks = [op.block_graph.num_blocks for g in result.mugraphs for _, op in g.graph_defined()]
    assert max(blocks) > 2
    # where an instance fits within the cap, the cap holds
    roomy = Target("roomy", smem_bytes=227 * 1024, max_blocks=2)
    result = search(program, budget=budget, seed=0, progress=False, target=roomy)
    assert result.mugraphs, result.message
    for g in result.mugraphs:
        assert all(op.block_graph.num_blocks <= 2 for _, op in g.graph_defined())


def test_a_reduced_instances_verdict_lets_a_region_too_large_to_verify_through(monkeypatch):
    program = _gemm()
    result = search(program, budget=Budget(time_s=30.0, confirm=1), seed=0, progress=False)
    assert result.verdicts, result.message
    monkeypatch.setattr(memory, "room", lambda: 1)  # no trial fits this machine now
    chosen = S.select(result, program, timed=False, verify_trials=2)
    assert chosen.best is not None, chosen.reason
    # with no verdict known, it is refused before anything is lowered
    fresh = dataclasses.replace(result, verdicts={})
    verify = importlib.import_module("fields.verify")  # the module, not the function
    monkeypatch.setattr(verify, "_MEMO", {})
    refused = S.select(fresh, program, timed=False, verify_trials=2)
    assert refused.best is None and "not verified" in refused.reason


def _gemm_recipes():
    """The GEMM searched, with the (structure, numbers) its candidates were built from."""
    from tests.test_search_reduced import _search_with_recipes

    program = _gemm()
    result, seen = _search_with_recipes(program, Budget(time_s=30.0))
    return program, result, seen


def test_a_recipe_rebuilds_its_mugraph_and_its_reduced_instance():
    from mirage_jax.mugraph import MuGraph
    from mirage_jax.search import dims as dims_mod
    from mirage_jax.search import recipe
    from mirage_jax.search.reduced import reduced_instance
    from mirage_jax.search.structure import Numbers

    program, result, recipes = _gemm_recipes()
    dims = dims_mod.analyse(program)
    reduced = 0
    for g in result.mugraphs:
        if g.canonical_hash not in recipes:
            continue
        s, nums = recipes[g.canonical_hash]
        assert recipe.decode(recipe.encode(s, nums)) == (s, nums)
        told = MuGraph(g.ops, g.outputs, {**g.meta, recipe.RECIPE: recipe.encode(s, nums)})
        got, want = (
            recipe.reduced_from_recipe(told, program),
            reduced_instance(program, dims, s, nums),
        )
        assert (got is None) == (want is None)
        if want is not None:
            reduced += 1
            assert got.mugraph.canonical_hash == want.mugraph.canonical_hash
            assert got.sizes == want.sizes
        # another µGraph's numbers, or none at all: no reduced instance from it
        other = Numbers(tuple(tuple(2 * n for n in grid) for grid in nums.grids), nums.loops)
        wrong = MuGraph(g.ops, g.outputs, {**g.meta, recipe.RECIPE: recipe.encode(s, other)})
        assert recipe.reduced_from_recipe(wrong, program) is None
        assert recipe.reduced_from_recipe(g, program) is None or recipe.RECIPE in g.meta
    assert reduced, "no candidate of the GEMM has a reduced instance"


def test_a_cached_mugraph_too_large_for_a_trial_is_checked_on_its_reduced_instance(monkeypatch):
    from mirage_jax import cache_check
    from mirage_jax.cache_entry import StaleEntry
    from mirage_jax.mugraph import MuGraph
    from mirage_jax.search import dims as dims_mod
    from mirage_jax.search import recipe
    from mirage_jax.search.reduced import reduced_instance

    program, result, recipes = _gemm_recipes()
    dims = dims_mod.analyse(program)
    g = next(
        g
        for g in result.mugraphs
        if g.canonical_hash in recipes
        and reduced_instance(program, dims, *recipes[g.canonical_hash]) is not None
    )
    told = MuGraph(
        g.ops, g.outputs, {**g.meta, recipe.RECIPE: recipe.encode(*recipes[g.canonical_hash])}
    )
    r = reduced_instance(program, dims, *recipes[g.canonical_hash])
    small, full = memory.trial_bytes(r.mugraph, r.program), memory.trial_bytes(program, program)
    assert small < full
    monkeypatch.setattr(memory, "room", lambda: small)  # the reduced trial fits, no full one
    monkeypatch.setattr(importlib.import_module("fields.verify"), "SMALL_TRIAL", 0)
    verdict = cache_check._field_trial(told, program, seed=7)
    assert verdict.equal and verdict.instance.startswith("reduced: ")
    with pytest.raises(StaleEntry, match="re-verification failed to run"):
        cache_check._field_trial(MuGraph(g.ops, g.outputs, {}), program, seed=7)


def test_the_search_gives_a_large_regions_mugraphs_their_recipes(monkeypatch):
    from mirage_jax.search import recipe

    program = _gemm()
    plain = search(program, budget=Budget(time_s=30.0), seed=0, progress=False)
    assert not any(recipe.RECIPE in g.meta for g in plain.mugraphs)  # small: none kept
    monkeypatch.setattr(memory, "LARGE_TRIAL", 0)  # every region counts as large
    large = search(program, budget=Budget(time_s=30.0), seed=0, progress=False)
    told = [g for g in large.mugraphs if recipe.RECIPE in g.meta]
    assert told, large.message
    assert any(recipe.reduced_from_recipe(g, program) is not None for g in told)
