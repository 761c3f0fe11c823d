"""`mirage_jax.zoo`'s executor on this machine: a spawned process pool for the searches, and
the selection in the calling process (as `mirage_jax.jit` does) or in one process per GPU."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any


class LocalExecutor:
    """Searches in a spawned process pool of `workers` processes on this machine (as
    `mirage_jax.search` uses); selection in this process (on its GPU, if any), or with
    `gpus` > 0 in one spawned process per GPU (`CUDA_VISIBLE_DEVICES` set to its index), each
    running one selection at a time (how `experiments/zoo_timing.py` spreads timing
    without Ray)."""

    def __init__(self, workers: int = 1, gpus: int = 0):
        self.workers = max(1, int(workers))
        self.gpus = max(0, int(gpus))
        self.name = "local process pool" + (f", {self.gpus} GPU process(es)" if gpus else "")
        self._pool: cf.ProcessPoolExecutor | None = None
        self._gpu_pools: list[cf.ProcessPoolExecutor | None] = [None] * self.gpus
        self._idle = list(range(self.gpus))
        self._queue: list[tuple[cf.Future, Callable[..., Any], tuple]] = []
        self._lock = threading.Lock()

    def target(self, backend: str) -> tuple[str, str | None, str]:
        from mirage_jax.search.workers import _user_main_hidden

        if self.gpus:  # where the selection runs: a GPU process
            with _user_main_hidden():
                return self._gpu_pool(0).submit(probe, backend).result()
        return probe(backend)

    def _gpu_pool(self, index: int) -> cf.ProcessPoolExecutor:
        pool = self._gpu_pools[index]
        if pool is None:
            pool = self._gpu_pools[index] = _spawn_pool(1, _pin_gpu, (index,))
        return pool

    def submit(self, kind: str, fn: Callable[..., Any], *args: Any) -> cf.Future:
        from mirage_jax.search.workers import _user_main_hidden

        if kind == "select" and self.gpus:
            outer: cf.Future = cf.Future()
            with self._lock:
                self._queue.append((outer, fn, args))
            self._dispatch()
            return outer
        if kind == "select":  # in this process, on its GPU
            f: cf.Future = cf.Future()
            try:
                f.set_result(fn(*args))
            except Exception as e:
                f.set_exception(e)
            return f
        if self._pool is None:
            self._pool = _spawn_pool(self.workers)
        with _user_main_hidden():  # a worker started now does not re-run the user's script
            return self._pool.submit(fn, *args)

    def _dispatch(self) -> None:
        """Start queued selections on idle GPU processes (one each)."""
        from mirage_jax.search.workers import _user_main_hidden

        while True:
            with self._lock:
                if not self._queue or not self._idle:
                    return
                outer, fn, args = self._queue.pop(0)
                index = self._idle.pop(0)
            try:
                with _user_main_hidden():
                    inner = self._gpu_pool(index).submit(fn, *args)
            except Exception as e:  # a broken pool: a fresh one next time
                self._gpu_pools[index] = None
                self._release(index)
                outer.set_exception(e)
                continue
            inner.add_done_callback(functools.partial(self._done, outer, index))

    def _done(self, outer: cf.Future, index: int, inner: cf.Future) -> None:
        e = inner.exception()
        if isinstance(e, cf.process.BrokenProcessPool):
            self._gpu_pools[index] = None
        self._release(index)
        if e is not None:
            outer.set_exception(e)
        else:
            outer.set_result(inner.result())
        self._dispatch()

    def _release(self, index: int) -> None:
        with self._lock:
            self._idle.append(index)

    def wait(self, handles: Sequence[Any]) -> list[tuple[Any, bool, Any]]:
        done, _ = cf.wait(handles, return_when=cf.FIRST_COMPLETED)
        out = []
        for f in done:
            e = f.exception()
            out.append((f, e is None, e if e is not None else f.result()))
        if any(isinstance(e, cf.process.BrokenProcessPool) for _, ok, e in out if not ok):
            self._pool = None  # a worker died: a fresh pool for what is retried
        return out

    def close(self) -> None:
        for pool in [self._pool, *self._gpu_pools]:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        self._pool = None
        self._gpu_pools = [None] * self.gpus


def _spawn_pool(
    workers: int, initializer: Callable[..., Any] | None = None, initargs: tuple = ()
) -> cf.ProcessPoolExecutor:
    from mirage_jax.search.workers import spawn_pool

    return spawn_pool(workers, initializer, initargs)  # its workers exit with this process


def _pin_gpu(index: int) -> None:
    """In a fresh GPU process, before JAX starts its backend: only GPU `index` is visible."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)


def probe(backend: str) -> tuple[str, str | None, str]:
    """Where the selection runs: its device kind and the backend kernels are lowered for."""
    from mirage_jax._env import device_kind
    from mirage_jax.regions import effective_backend

    return (device_kind(), *effective_backend(backend))
