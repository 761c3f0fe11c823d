"""Shared test configuration: GPU tests run only where jax sees a GPU; the original's
checkpoints are optional (`experiments.peer`); an expensive value several test processes need
is computed once a run (`once_per_run`)."""

from __future__ import annotations

import os
import pathlib
import pickle

import jax
import pytest


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def interpret_backends() -> list[str]:
    """The backends that run kernels on this CPU: Pallas's interpret mode, and Triton's
    interpreter where the `triton` package is installed."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return ["pallas-interpret"]
    return ["pallas-interpret", "triton"]


FILE_SECONDS = {
    "test_pieces.py": 302,
    "test_zoo.py": 208,
    "test_search.py": 191,
    "test_library_blocks.py": 118,
    "test_api.py": 114,
    "test_notebooks.py": 110,
    "test_lower.py": 76,
    "test_search_reduced.py": 64,
    "test_hfuse.py": 60,
    "test_prologue_cut.py": 60,
    "test_masked_steps.py": 59,
    "test_jit_parity.py": 56,
    "test_glue.py": 52,
    "test_reproduce.py": 47,
    "test_real_baselines.py": 38,
}
"""Seconds of tests per file in the README's suite run (2 cores, 2026-11-28, `--durations=0`),
for the order files are handed to the workers in: longest first. By number of tests (xdist's
default) test_zoo's 208 s came near the end, with the other worker idle for part of it."""


def capture_hoisted(fn, *args):
    """`fn` captured and its layouts moved to the interface (`lax_ir.layouts.hoist_layouts`):
    (program, hoisted), the hoisted one checked to compute `fn`'s outputs through its
    interface."""
    import numpy as np

    import lax_ir
    from lax_ir.interface import adapt
    from lax_ir.layouts import hoist_layouts

    program = lax_ir.capture(fn, *args)
    out = hoist_layouts(program)
    got = adapt(lambda *xs: lax_ir.evaluate(out, *xs), out)(*args)
    for g, w in zip(got, jax.tree.leaves(fn(*args))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    return program, out


def pytest_configure(config):
    # `--dist loadfile` hands out files in collection order (`pytest_collection_modifyitems`)
    # rather than by their number of tests
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {id(item): k for k, item in enumerate(items)}
    items.sort(key=lambda it: (-FILE_SECONDS.get(it.path.name, 0), rank[id(it)]))
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def peer_dir() -> pathlib.Path:
    """The original system's checkpoints (`experiments.peer`); skips, saying how to get them,
    where they are absent (a fresh clone)."""
    from experiments import peer

    found = peer.find()
    if found is None:
        pytest.skip(peer.HOW_TO_GET)
    return found


@pytest.fixture
def quiet_mirage():
    """No MirageWarning (e.g. "no GPU"), and every warn-once key forgotten (CLI tests)."""
    import warnings

    import mirage_jax
    from mirage_jax import api

    api._WARNED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mirage_jax.MirageWarning)
        yield


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """`once_per_run(name, produce)`: `produce()`, computed by one process of the run and read
    back (pickled) by the others. Under pytest-xdist every worker imports a test module, so a
    module-level cache of a search is filled once per worker that runs one of its tests (the
    CPU suite's 2 workers each searched gqa_stable at full size for tests/test_search_reduced.py,
    ~40 s apiece); the first worker to ask computes it while the other waits on a lock (its
    core free for the search) and then reads it. Without xdist it is `produce()`."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return lambda name, produce: produce()
    import fcntl

    root = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers

    def once(name: str, produce):
        path = root / f"once-{name}.pickle"
        with open(root / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if path.exists():
                return pickle.loads(path.read_bytes())
            value = produce()
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(value))
            tmp.replace(path)
            return value

    return once
