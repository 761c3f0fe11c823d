"""Full-size verification on a reduced instance (`mirage_jax.search.reduced`).

The search verifies the candidates `select` will time on an instance with the candidate's own
tiles and two windows along each batch-like class; that verdict answers the full-size question.
These tests check that the classes it reduces are the ones the argument allows, that its
verdicts agree with full-size verification, and that a wrong candidate is rejected on it.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import pytest

import fields
import lax_ir
from experiments import benchmarks
from mirage_jax.search import Budget, search
from mirage_jax.search import confirm as confirm_mod
from mirage_jax.search import dims as dims_mod
from mirage_jax.search.reduced import batch_tiles, reduced_instance


def _program(fn) -> lax_ir.Program:
    bm = benchmarks.get("gqa_stable", 1)
    return lax_ir.partition(lax_ir.capture(fn, *bm.inputs)).regions[0].program


def _search_with_recipes(program: lax_ir.Program, budget: Budget):
    """`search(program)` and the recipes (structure, numbers) `confirm` was given."""
    seen: dict = {}
    verify_full = confirm_mod.verify_full

    def spy(raw, problem, graphs, trials, recipes=None, pairs=None):
        seen.update(recipes or {})
        return verify_full(raw, problem, graphs, trials, recipes, pairs)

    confirm_mod.verify_full = spy
    try:
        return search(program, budget=budget, seed=0, progress=False), seen
    finally:
        confirm_mod.verify_full = verify_full


def _verify_module():
    return importlib.import_module("fields.verify")  # the module (`fields.verify` is the function)


def _search_gqa_stable():
    """gqa_stable at full size (b=1) searched, the recipes `confirm` was given, and the
    verdicts the search left in this process's `fields.verify` memo."""
    memo = _verify_module()._MEMO
    before = set(memo)
    program = _program(benchmarks.gqa_stable)
    result, seen = _search_with_recipes(program, Budget(time_s=120.0, results=8, confirm=4))
    return program, result, seen, {k: v for k, v in memo.items() if k not in before}


@pytest.fixture(scope="module")
def searched(once_per_run):
    """gqa_stable at full size (b=1), searched once a run (`once_per_run`: a test process that
    did not search it reads it, with the verdicts the search's memo held, which `select`'s
    question in test_the_candidates_select_times_are_verified_on_reduced_instances reads)."""
    program, result, recipes, memo = once_per_run("gqa_stable_full_search", _search_gqa_stable)
    _verify_module()._MEMO.update(memo)
    return program, result, recipes


def test_the_candidates_select_times_are_verified_on_reduced_instances(searched):
    program, result, recipes = searched
    full = [g for g in result.mugraphs if g.meta.get("verified") == "full"]
    assert full, result.message
    reduced = [g for g in full if g.meta.get("instance", "").startswith("reduced: d1 256→")]
    assert reduced, [g.meta.get("instance") for g in full]
    for g in reduced:
        assert fields.verify(g, program, trials=2, seed=3).equal  # at full size, directly
        # the memo answers select's question with the reduced instance's verdict
        v = fields.verify(g, program, trials=result.stats["budget"]["trials"], seed=0)
        assert v.equal and v.instance == g.meta["instance"]


def test_only_classes_split_by_every_kernel_that_carries_them_are_reduced(searched):
    program, result, recipes = searched
    dims = dims_mod.analyse(program)
    # q (2, 256, 64), k (2, 64, 4096), v (2, 4096, 64): d0 groups, d1 rows, d2 = head dim of
    # Q and K (reduced), d3 keys (reduced), d4 = head dim of V (an output class)
    assert dims.sizes[:5] == (2, 256, 64, 4096, 64)
    for s, nums in recipes.values():
        windows = batch_tiles(s, nums, dims)
        assert set(windows) <= {1, 4}  # never the contractions d2, d3; d0 is too small
        for spec, grid in zip(s.kernels, nums.grids):
            for c, w in windows.items():
                assert c in spec.mapping.grid and c != spec.mapping.loop
                assert w % (dims.sizes[c] // grid[spec.mapping.grid.index(c)]) == 0
        if any(spec.mapping.split for spec in s.kernels):  # split-KV: the combine keeps D whole
            assert 4 not in windows


def test_a_wrong_candidate_is_rejected_on_its_reduced_instance(searched):
    _, _, recipes = searched
    # the same shapes and dimensions, another scale: every candidate of gqa_stable is wrong
    wrong = _program(lambda q, k, v: jax.nn.softmax((q @ k) * 0.25, axis=-1) @ v)
    dims = dims_mod.analyse(wrong)
    tried = 0
    for s, nums in recipes.values():
        r = reduced_instance(wrong, dims, s, nums)
        if r is None:
            continue
        tried += 1
        assert not fields.verify(r.mugraph, r.program, trials=2, seed=0).equal
    assert tried


@pytest.mark.parametrize("batch", [2, 3])
def test_a_class_is_reduced_only_where_two_windows_are_fewer(batch):
    """An attention over (batch, rows): a batch of 3 split in blocks of one becomes 2."""

    def attend(q, k, v):
        return jax.nn.softmax(q @ k, axis=-1) @ v

    q = jnp.zeros((batch, 64, 16), jnp.float16)
    k = jnp.zeros((batch, 16, 64), jnp.float16)
    v = jnp.zeros((batch, 64, 16), jnp.float16)
    program = lax_ir.partition(lax_ir.capture(attend, q, k, v)).regions[0].program
    result, seen = _search_with_recipes(program, Budget(time_s=60.0, results=4, confirm=2))
    assert result.mugraphs, result.message
    dims = dims_mod.analyse(program)
    for s, nums in seen.values():
        windows = batch_tiles(s, nums, dims)
        for c, w in windows.items():
            assert 2 * w < dims.sizes[c]
        if batch == 2:
            assert 0 not in windows
        r = reduced_instance(program, dims, s, nums)
        if r is not None:
            assert fields.verify(r.mugraph, r.program, trials=2, seed=0).equal
            if 0 in windows:
                assert r.sizes[0] == (3, 2 * windows[0]) and r.program.input_avals[0][0][0] == 2


def test_the_reduced_verdict_has_the_full_pairs_degrees(searched):
    """The cache re-verifies an entry at full size when it is read and compares the degree
    bounds it stored: the reduced instance's must be the full pair's."""
    program, result, recipes = searched
    dims = dims_mod.analyse(program)
    for g in result.mugraphs:
        if g.canonical_hash not in recipes:
            continue
        r = reduced_instance(program, dims, *recipes[g.canonical_hash])
        if r is not None:
            assert fields.degree_bound(r.mugraph) == fields.degree_bound(g)
            assert fields.degree_bound(r.program) == fields.degree_bound(program)


def test_the_verdicts_travel_with_the_result_to_another_process(searched):
    """`select` in another process (a pool, a Ray task) has an empty memo: the result carries
    the search's full-size verdicts, reduced ones included, and they answer its questions."""
    import pickle

    from mirage_jax.select import _known_verdicts

    verify_mod = _verify_module()

    program, result, _ = searched
    trials = result.stats["budget"]["trials"]
    moved = pickle.loads(pickle.dumps(result))
    assert moved.verdicts and set(moved.verdicts) <= {g.canonical_hash for g in moved.mugraphs}
    saved = dict(verify_mod._MEMO)
    verify_mod._MEMO.clear()
    try:
        _known_verdicts(moved, program, trials, 0)
        for g in moved.mugraphs:
            if g.canonical_hash in moved.verdicts:
                v = verify_mod._MEMO.get(verify_mod._memo_key(
                    g, program, trials, 0, None, verify_mod.TARGET_BOUND,
                    verify_mod.MAX_VOID_TRIALS,
                ))  # fmt: skip
                assert v is not None and v.equal and v.instance == g.meta.get("instance", "")
        verify_mod._MEMO.clear()
        _known_verdicts(moved, program, trials + 1, 0)  # other trials: not the same question
        assert not verify_mod._MEMO
    finally:
        verify_mod._MEMO.clear()
        verify_mod._MEMO.update(saved)
