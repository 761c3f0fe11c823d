"""A norm + projection split over K, its combining kernel taking the rms (`Budget.reread`).

The norm's statistic needs the whole row, so a split-K kernel of a norm + projection closes
only if its combining kernel reads the row again (`tasks._rereadable`). Off in `Budget` by
default, on in `mirage_jax.jit` (its `options["reread"]`); `experiments.gemv_tilings --norm`
times these µGraphs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from experiments.gemv_tilings import normed_gemv
from mirage_jax.lower import lower
from mirage_jax.search import Budget, search
from mirage_jax.select import random_inputs

K, N = 256, 64


@functools.cache
def _program():
    S = jax.ShapeDtypeStruct
    specs = [S((1, K), jnp.float16), S((K, N), jnp.float16), S((1, K), jnp.float16)]
    (region,) = lax_ir.partition(lax_ir.capture(normed_gemv, *specs)).regions
    return region.program


def _budget(reread: bool) -> Budget:
    return Budget(time_s=60, results=16, cuts=False, max_predefined=0, reread=reread)


def _rereading(g) -> bool:
    """Is `g` a split kernel and a combining kernel that takes the row's rms?"""
    kernels = [op.block_graph for _, op in g.graph_defined()]
    return len(kernels) == 2 and "accum_rms_last" in [b.op for b in kernels[1].ops]


@functools.cache
def _searched(reread: bool):
    return search(_program(), budget=_budget(reread), seed=0, workers=1, progress=False)


def test_the_default_search_has_no_combining_rms():
    res = _searched(False)
    assert res.mugraphs and not any(_rereading(g) for g in res.mugraphs)


@pytest.mark.parametrize("backend", ["pallas-interpret", "triton"])
def test_reread_finds_the_split_norm_and_it_computes_the_region(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    res = _searched(True)
    split = [g for g in res.mugraphs if _rereading(g)]
    assert split, [g.meta.get("structure") for g in res.mugraphs]
    program = _program()
    xs = random_inputs(program, 0)
    (want,) = lax_ir.evaluate_reference(program, *xs)
    interpret = {"interpret": True} if backend == "triton" else {}
    (got,) = lower(split[0], backend=backend, **interpret)(*xs)
    want = np.asarray(want, np.float64)
    err = np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))
    assert err < 2e-2, err


def test_the_reread_option_reaches_the_search_and_bad_values_are_refused(tmp_path, monkeypatch):
    """`mirage_jax.jit` searches with `Budget.reread` by default, without it under
    `options={"reread": False}`; a value that is not a bool is refused when the function is
    wrapped, not later as a region's fallback."""
    import argparse

    import mirage_jax
    from experiments import never_slower
    from mirage_jax import search as search_mod

    with pytest.raises(ValueError, match="reread"):
        mirage_jax.jit(normed_gemv, options={"reread": "yes"})
    budgets = []
    real = search_mod.search

    def spy(program, budget, **kwargs):
        budgets.append(budget)
        return real(program, budget=budget, **kwargs)

    monkeypatch.setattr(search_mod, "search", spy)
    f = mirage_jax.jit(
        normed_gemv, backend="pallas-interpret", cache=tmp_path / "c.sqlite", workers=1,
    )  # fmt: skip
    xs = random_inputs(_program(), 1)
    want = np.asarray(lax_ir.evaluate_reference(_program(), *xs)[0], np.float64)
    got = np.asarray(f(*xs), np.float64)
    assert budgets and all(b.reread for b in budgets)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 2e-2
    budgets.clear()
    g = mirage_jax.jit(
        normed_gemv, backend="pallas-interpret", cache=tmp_path / "d.sqlite", workers=1,
        options={"reread": False},
    )  # fmt: skip
    g(*xs)
    assert budgets and not any(b.reread for b in budgets)
    args = argparse.Namespace(no_reread=True)
    assert never_slower.options(args) == {"reread": False}
    assert never_slower.options(argparse.Namespace()) == {}


def test_a_one_block_best_has_the_pieces_searched_too():
    """With `Budget.reread`, a norm + projection region whose best one-piece µGraph has a
    one-block kernel has its pieces searched as well, though it is within `STARVED` times its
    floor (Gemma's norm + Q/K/V: without the pieces the loop forms were lost, 70 µs against
    22 µs at Llama-7B size on the H200); without `reread` the rule does not apply."""
    from experiments import models as M
    from mirage_jax.search import cost

    m = M.get("gemma_decode", batch=1, size="tiny")
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    found = []
    for r in part.regions:
        ops = [n.op for _, n in r.program.ops()]
        if "sqrt" not in ops or ops.count("matmul") < 2:
            continue
        res = search(r.program, budget=Budget(time_s=60, reread=True), seed=0, workers=1)
        st = res.stats
        if 1 in st["best_blocks"] and (st["best_over_floor"] or 0) <= cost.STARVED:
            found.append(r.index)
            assert "cuts" in st, f"region {r.index}: pieces not searched ({st['best_blocks']})"
            assert res.mugraphs
    assert found, "no norm + projection region of Gemma (tiny) has a one-block best"
