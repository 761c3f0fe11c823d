"""Search processes when none are asked for: the machine's CPUs less two, at most twelve."""

from __future__ import annotations

import pytest


def test_default_workers_use_the_machine_less_two_at_most_twelve(monkeypatch):
    import os

    from mirage_jax import api
    from mirage_jax.search import workers as W

    for cpus, want in [(1, 1), (2, 1), (3, 1), (4, 2), (16, 12), (64, 12)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert W.default_workers() == want
        assert api.MirageJit(lambda x: x).opts.workers == want
    assert api.MirageJit(lambda x: x, workers=3).opts.workers == 3
    with pytest.raises(ValueError, match="at least 1"):
        api.MirageJit(lambda x: x, workers=0)
