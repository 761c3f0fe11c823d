"""Searches of several regions at once in one process (`regions.SearchAhead` runs two at a
time): each gets what it gets alone. Regression: the in-process search (no pool, the cut
pieces' searches) read its problem from a process-wide slot, so two searches at once ran each
other's tasks and found nothing (Llama-7B equinox b=8 on the H100, 2026-11-26)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import lax_ir
from experiments import benchmarks
from mirage_jax.search import Budget, search

NAMES = ("rmsnorm", "gqa")
BUDGET = Budget(time_s=120.0, results=8, confirm=2)


def region(name: str) -> lax_ir.Program:
    bm = benchmarks.get(name, 1).small()
    return lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs)).regions[0].program


def hashes(result) -> list[str]:
    return [g.canonical_hash for g in result.mugraphs]


def test_regions_searched_in_threads_at_once_get_what_each_gets_alone():
    programs = [region(n) for n in NAMES]
    alone = [hashes(search(p, budget=BUDGET, seed=0, progress=False)) for p in programs]
    assert all(alone)
    with ThreadPoolExecutor(len(programs)) as pool:
        together = list(
            pool.map(lambda p: hashes(search(p, budget=BUDGET, seed=0, progress=False)), programs)
        )
    assert together == alone
