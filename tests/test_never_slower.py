"""`experiments.never_slower`'s choice of cases from its command line."""

from __future__ import annotations

import argparse

from experiments.never_slower import _cases


def _keys(**kw) -> list[str]:
    args = argparse.Namespace(
        **(
            {"names": None, "batches": [1], "models": [], "sizes": ["tiny"], "model_batches": [1]}
            | kw
        )
    )
    return [key for key, *_ in _cases(args)]


def test_names_alone_means_no_benchmark():
    """`--names --models X` runs X only (it ran every benchmark before, twice costing GPU time)."""
    keys = _keys(names=[], models=["sdpa_decode"])
    assert len(keys) == 1 and keys[0].startswith("sdpa_decode"), keys
    assert len(_keys()) > 1  # no --names: every benchmark
    assert [k.split("_b")[0] for k in _keys(names=["gqa"])] == ["gqa"]
