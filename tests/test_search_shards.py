"""Classes split into shards by the first block op: more tasks, the same µGraphs in the same
order as one task per class (`Budget.shards`, `BlockEnumerator.run(shard=...)`)."""

from __future__ import annotations

import dataclasses

import pytest

import lax_ir
from experiments import benchmarks
from mirage_jax.search import Budget, search


def _region(name: str) -> lax_ir.Program:
    bm = benchmarks.get(name, 1).small()
    return lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs)).regions[0].program


@pytest.mark.parametrize("name", ["rmsnorm", "gated_mlp"])
def test_shards_find_the_same_mugraphs_in_the_same_order(name):
    program = _region(name)
    budget = Budget(time_s=300.0, results=64, confirm=2)
    one = search(program, budget=dataclasses.replace(budget, shards=1), progress=False)
    many = search(program, budget=dataclasses.replace(budget, shards=5), progress=False)
    assert one.stop_reason == many.stop_reason == "exhausted"
    assert one.mugraphs, one.message
    assert [g.canonical_hash for g in many.mugraphs] == [g.canonical_hash for g in one.mugraphs]
    assert [g.meta["structure"] for g in many.mugraphs] == [
        g.meta["structure"] for g in one.mugraphs
    ]
    assert many.stats["tasks"] == 5 * one.stats["tasks"]
    assert many.stats["schedule_classes"] == one.stats["schedule_classes"]
