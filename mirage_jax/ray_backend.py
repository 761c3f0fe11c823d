"""Running `mirage_jax.zoo`'s tasks on a Ray cluster: searches on CPUs, selection on GPUs.

`RayExecutor("auto")` joins the cluster started with `ray start --head` (and `ray start
--address HEAD:6379` on the other machines); `RayExecutor("local")` starts one on this machine.
A search task holds one CPU; a selection task holds one GPU where the cluster has GPUs (Ray
gives it its own `CUDA_VISIBLE_DEVICES`, and a fresh worker process per GPU task), else one
CPU. Ray's own retries are off: the driver (`zoo.run`) retries a failed task once itself, so
that it can report the cause. Every machine needs mirage-jax installed (`pip install
"mirage-jax[ray]"`), and the same versions of it and of jax: the cache key names them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from mirage_jax.local_backend import probe

INSTALL_HINT = 'install Ray with `pip install "mirage-jax[ray]"`'


class RayUnavailable(RuntimeError):
    """Ray is not installed, or no cluster can be joined (the message says what to do)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable(f"--ray needs Ray, which is not installed here: {INSTALL_HINT}") from e
    return ray


def connect(mode: str, **init: Any) -> tuple[Any, bool]:
    """`ray.init` for `mode` "auto" (join a running cluster) or "local" (start one here);
    returns Ray and whether this call started it (an initialised Ray is used as it is)."""
    ray = _ray()
    if ray.is_initialized():
        return ray, False
    init = {"include_dashboard": False, "log_to_driver": False} | init
    with warnings.catch_warnings():  # Ray forks only to exec its own processes
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        _init(ray, mode, init)
    return ray, mode == "local"


def _init(ray: Any, mode: str, init: dict[str, Any]) -> None:
    if mode == "auto":
        try:
            ray.init(address="auto", **init)
        except (ConnectionError, RuntimeError) as e:
            raise RayUnavailable(
                f"--ray auto found no running Ray cluster ({e}); start one with `ray start "
                "--head` on this machine (and `ray start --address HEAD_IP:6379` on the "
                "others), or pass --ray local to start one for this run only"
            ) from e
    elif mode == "local":
        ray.init(address="local", **init)
    else:
        raise ValueError(f"ray mode must be 'auto' or 'local', got {mode!r}")


class RayExecutor:
    """`zoo.run`'s executor on a Ray cluster (see the module docstring)."""

    def __init__(self, mode: str = "auto", **init: Any):
        self.ray, self._started = connect(mode, **init)
        resources = self.ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        self.cpus = int(resources.get("CPU", 0))
        self.name = f"Ray ({self.cpus} CPU(s), {self.gpus} GPU(s))"
        self._remote: dict[tuple[str, Callable], Any] = {}

    def _task(self, kind: str, fn: Callable[..., Any]) -> Any:
        key = (kind, fn)
        if key not in self._remote:
            gpu = kind == "select" and self.gpus > 0
            resources = {"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": 1}
            self._remote[key] = self.ray.remote(max_retries=0, **resources)(fn)
        return self._remote[key]

    def target(self, backend: str) -> tuple[str, str | None, str]:
        """(device kind, backend, why not) where the selection runs: on a GPU worker when
        the cluster has GPUs, else here."""
        if self.gpus == 0:
            return probe(backend)
        remote = self.ray.remote(num_gpus=1, num_cpus=1, max_retries=1)(probe)
        return tuple(self.ray.get(remote.remote(backend)))  # type: ignore[return-value]

    def submit(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._task(kind, fn).remote(*args)

    def wait(self, handles: Sequence[Any]) -> list[tuple[Any, bool, Any]]:
        ready, _ = self.ray.wait(list(handles), num_returns=1)
        out = []
        for ref in ready:
            try:
                out.append((ref, True, self.ray.get(ref)))
            except Exception as e:  # the task raised, or its worker died: the driver retries
                out.append((ref, False, _cause(e)))
        return out

    def close(self) -> None:
        """Leaves a joined cluster running; shuts down one this executor started."""
        if self._started and self.ray.is_initialized():
            self.ray.shutdown()


def _cause(e: BaseException) -> BaseException:
    """The task's own exception where Ray wraps one (a RayTaskError), else Ray's error."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e
