"""The search's worker processes: spawned, and started without the user's `__main__`."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mirage_jax.search.tasks import init_worker


@contextlib.contextmanager
def _user_main_hidden():
    """Workers started in this block do not re-run the user's `__main__` (spawn imports the
    main script in every child unless it has no file and no module name)."""
    main = sys.modules.get("__main__")
    stub = types.ModuleType("__main__")
    stub.__spec__ = None
    sys.modules["__main__"] = stub
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _ready() -> int:
    return os.getpid()


def worker_pool(workers: int, problem: Any) -> ProcessPoolExecutor:
    """`workers` spawned search processes holding `problem`, started without the user's
    script: a script with no `if __name__ == "__main__":` guard works with workers > 1."""
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),  # no fork of a process using jax
        initializer=init_worker,
        initargs=(problem,),
    )
    with _user_main_hidden():
        # A spawn pool starts a worker per submit while none is idle: submit one task per
        # worker before any can finish (a worker takes seconds to import jax), so all start here.
        for f in [pool.submit(_ready) for _ in range(workers)]:
            f.result()
    return pool
