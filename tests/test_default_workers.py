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


def test_search_workers_run_blas_on_one_thread(monkeypatch):
    """The pool is the parallelism: its workers start with one BLAS thread (unless the user
    chose), and the parent's environment is left as it was."""
    import os

    from mirage_jax.search import workers

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    pool = workers.worker_pool(2)
    try:
        got = list(pool.map(_blas_env, range(2)))
    finally:
        pool.shutdown()
    assert got == [("1", "3")] * 2
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "3"


def _blas_env(_):
    import os

    return os.environ.get("OPENBLAS_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS")
