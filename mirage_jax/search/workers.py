"""The search's worker processes: spawned, started without the user's `__main__`, and shared by
every search of one `shared_pool()` block (one function's first call searches all its regions
with one pool, instead of starting one per region)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any


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


MAX_DEFAULT_WORKERS = 12
"""At most this many search processes when none are asked for (each holds jax, galois, numba)."""


def default_workers() -> int:
    """Search processes when none are asked for: the CPUs this process may use, less two (the
    caller's JAX and the selection's compiles), at most `MAX_DEFAULT_WORKERS`; 1 (the search
    in this process, no pool) on a machine of 3 CPUs or fewer."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_WORKERS, cpus - 2))


def start_worker(parent: int, initializer: Any = None, initargs: tuple = ()) -> None:
    """A spawned worker's initializer: it exits when `parent`, the process that started it, is
    gone. A killed parent (SIGKILL, the OOM killer) runs no shutdown, and its workers would wait
    on the pool's queue forever, each holding jax in memory."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="mirage_jax-parent-watch", daemon=True).start()
    if initializer is not None:
        initializer(*initargs)


def spawn_pool(workers: int, initializer: Any = None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of `workers` spawned processes (no fork of a process using jax) that exit with
    the process that started them (`start_worker`)."""
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=start_worker,
        initargs=(os.getpid(), initializer, initargs),
    )


def _ready() -> int:
    import fields  # noqa: F401  (galois, numba: imported before the first task, not in it)
    import mirage_jax.search.tasks  # noqa: F401

    return os.getpid()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` spawned search processes, started without the user's script: a script with
    no `if __name__ == "__main__":` guard works with workers > 1. Problems travel with the
    tasks (`tasks.run_keyed`), so one pool serves any number of searches."""
    pool = spawn_pool(workers)
    with _user_main_hidden(), _one_blas_thread():
        # A spawn pool starts a worker per submit while none is idle: submit one task per
        # worker before any can finish (a worker takes seconds to import jax), so all start here.
        for f in [pool.submit(_ready) for _ in range(workers)]:
            f.result()
    return pool


BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Workers started in this block run numpy's BLAS on one thread (unless the user set its
    thread count): the pool is the parallelism, and a BLAS of every core in each of 12 workers
    verifying at full size at once oversubscribes the machine (2 cores, 2 workers, 4 full-size
    verifications of gqa_stable b=8: 7.75 s with threaded BLAS, 5.28 s with one thread)."""
    saved = {k: os.environ.get(k) for k in BLAS_THREADS}
    for k in BLAS_THREADS:
        os.environ.setdefault(k, "1")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Shared:
    lock = threading.Lock()
    depth = 0
    pool: ProcessPoolExecutor | None = None
    workers = 0


@contextlib.contextmanager
def shared_pool() -> Iterator[None]:
    """Searches run inside this block share one worker pool, started by the first that needs
    it and shut down when the (outermost) block ends."""
    with _Shared.lock:
        _Shared.depth += 1
    try:
        yield
    finally:
        with _Shared.lock:
            _Shared.depth -= 1
            pool = _Shared.pool if _Shared.depth == 0 else None
            if pool is not None:
                _Shared.pool, _Shared.workers = None, 0
        if pool is not None:
            pool.shutdown(cancel_futures=True)


@contextlib.contextmanager
def pool_for(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """A pool of `workers` processes for one search (None for workers <= 1): the shared one
    inside `shared_pool()`, else one of its own, shut down after the search."""
    if workers <= 1:
        yield None
        return
    with _Shared.lock:
        shared = _Shared.depth > 0
        old = None
        if shared and (_Shared.pool is None or _Shared.workers != workers):
            old, _Shared.pool, _Shared.workers = _Shared.pool, worker_pool(workers), workers
        pool = _Shared.pool if shared else None
    if old is not None:
        old.shutdown(cancel_futures=True)
    if pool is None:
        pool = worker_pool(workers)
        try:
            yield pool
        finally:
            pool.shutdown(cancel_futures=True)
        return
    try:
        yield pool
    except BrokenProcessPool:  # a worker died: the next search starts a new pool
        with _Shared.lock:
            if _Shared.pool is pool:
                _Shared.pool, _Shared.workers = None, 0
        raise


def problem_blob(problem: Any) -> tuple[str, bytes]:
    """(key, pickled problem) for `tasks.run_keyed`: the key names this search's problem."""
    blob = pickle.dumps(problem)
    return f"{os.getpid()}:{id(problem)}:{len(blob)}:{hash(blob)}", blob
