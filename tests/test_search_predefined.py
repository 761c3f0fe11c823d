"""Kernel-level enumeration: pre-defined kernel ops (GEMMs left to XLA) before fused kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fields
import lax_ir
from experiments import benchmarks
from mirage_jax.lower import lower
from mirage_jax.mugraph import MuGraph, evaluate_reference
from mirage_jax.search import Budget, search
from mirage_jax.search import expr as E
from mirage_jax.search.predefined import KernelCounters, KernelEnumerator
from mirage_jax.search.tasks import prepare

warnings.filterwarnings("ignore", category=DeprecationWarning)

BUDGET = Budget(time_s=60.0, results=32, confirm=2)
_CACHE: dict = {}


def region(name: str) -> lax_ir.Program:
    bm = benchmarks.get(name, 1).small()
    return lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs)).regions[0].program


def searched(name: str):
    if name not in _CACHE:
        p = region(name)
        _CACHE[name] = (p, search(p, budget=BUDGET, seed=0, progress=False))
    return _CACHE[name]


def predefined_ops(g: MuGraph) -> list[str]:
    return [op.op for op in g.ops if op.op != "input" and op.block_graph is None]


def with_prefix(result, ops: list[str]) -> MuGraph:
    for g in result.mugraphs:
        if predefined_ops(g) == ops:
            return g
    raise AssertionError("no µGraph with pre-defined " + str(ops) + ":\n" + str(result.structures))


def test_rmsnorm_finds_a_gemm_then_a_fused_epilogue():
    p, r = searched("rmsnorm")
    g = with_prefix(r, ["matmul"])
    kernels = [op for op in g.ops if op.op != "input"]
    assert [k.block_graph is None for k in kernels] == [True, False]
    names = sorted(b.op for b in kernels[1].block_graph.ops)
    assert names == ["accum_rms_last", "accum_sum", "div"], names
    # the GEMM reads the region's inputs; the fused kernel reads X and the GEMM's result
    mm = kernels[0]
    assert all(a[0] in g.inputs for a in mm.args)
    assert fields.verify(g, p, trials=1, seed=3)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape) * 0.5 for shape, _ in p.input_avals]
    want = lax_ir.evaluate_reference(p, *xs)
    got = evaluate_reference(g, *xs)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-9, atol=1e-9)
    # it is one of the few `select` times (behind the best, as another kernel-level plan)
    assert any(predefined_ops(h) == ["matmul"] for h in r.mugraphs[:3])
    st = r.stats["predefined"]
    assert st["generated"] > 0 and st["accepted"] >= 1
    assert "expression" in st["pruned"] and "prologue" in st["pruned"]
    assert "matmul(x0,x1) → [x0,k0]" in st["prefixes"]


def test_gated_mlp_finds_two_gemms_then_silu_mul():
    p, r = searched("gated_mlp")
    g = with_prefix(r, ["matmul", "matmul"])
    (fused,) = [op for op in g.ops if op.block_graph is not None]
    names = [b.op for b in fused.block_graph.ops]
    assert "matmul" not in names and fused.block_graph.forloop_range == 1
    assert fields.verify(g, p, trials=1, seed=3)


def test_every_result_is_verified():
    for name in ("rmsnorm", "gated_mlp"):
        p, r = searched(name)
        assert r.mugraphs
        for g in r.mugraphs:
            assert fields.verify(g, p, trials=1, seed=5), g.meta["structure"]


@pytest.mark.parametrize("name", ["rmsnorm", "gated_mlp", "lora", "gqa"])
def test_canonical_order_generates_no_prefix_twice(name):
    problem = prepare(region(name), seed=0, budget=Budget())
    problem.targets.egraph  # noqa: B018
    c = KernelCounters()
    prefixes = KernelEnumerator(problem, 2, c).run()
    assert prefixes
    # the same ops in another order (or the same kernels) are one prefix
    keys = []
    for p in prefixes:
        ops = frozenset(
            (
                k.predefined,
                tuple(E.show(problem.inputs[r[1]].term) if r[0] == "in" else r for r in k.args),
            )
            for k in p.kernels
        )
        keys.append((ops, tuple(t.ref for t in p.rest)))
    assert len(keys) == len(set(keys))
    assert c.prefixes == len(prefixes)
    # and every structure the search accepted is new
    _, r = searched(name) if name in ("rmsnorm", "gated_mlp") else (None, None)
    if r is not None:
        hashes = [g.canonical_hash for g in r.mugraphs]
        assert len(hashes) == len(set(hashes))


def test_prefixes_pass_the_expression_test():
    problem = prepare(region("gated_mlp"), seed=0, budget=Budget())
    c = KernelCounters()
    for p in KernelEnumerator(problem, 2, c).run():
        for t in p.rest:
            assert problem.targets.contains(t.term)
    # silu(X @ W1) is a piece of the output; X @ W1 + X @ W2 is not
    assert c.pruned["expression"] > 0


def test_budget_zero_turns_it_off():
    p = region("rmsnorm")
    r = search(p, budget=Budget(time_s=60.0, max_predefined=0), seed=0, progress=False)
    assert r.mugraphs and not any(predefined_ops(g) for g in r.mugraphs)
    assert r.stats["predefined"] == {}


def test_covers_picks_the_inputs_of_the_rest():
    problem = prepare(region("rmsnorm"), seed=0, budget=Budget())
    t = problem.targets
    x, w = (u.term for u in problem.inputs)
    y = E.red(1, E.mul(x, w))
    leaves = {t.class_of(x): "X", t.class_of(w): "W", t.class_of(y): "Y"}
    sets = t.covers(leaves, 0)
    assert frozenset({"X", "Y"}) in sets and frozenset({"X", "W"}) in sets
    assert not any(s == frozenset({"Y"}) for s in sets)


def test_lowered_gemm_then_epilogue_matches(monkeypatch):
    p, r = searched("rmsnorm")
    g = with_prefix(r, ["matmul"])
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(shape).astype(dtype) for shape, dtype in g.input_avals]
    ref = np.asarray(evaluate_reference(g, *xs)[0], np.float64)
    (out,) = lower(g, backend="pallas", interpret=True)(*xs)
    out = np.asarray(out, np.float64)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < 5e-3, err
