"""Shared test configuration: GPU tests run only where jax sees a GPU; ../shared is optional."""

from __future__ import annotations

import pathlib

import jax
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# ../shared beside the checkout, or a copy inside it (how the data travels to the GPU machine)
SHARED = next(
    (p for p in (REPO.parent / "shared", REPO / "shared") if p.is_dir()), REPO.parent / "shared"
)
PEER = SHARED / "peer" / "mirage_mugraphs"


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def peer_dir() -> pathlib.Path:
    """The original system's checkpoints; skips where ../shared is absent (a fresh clone)."""
    if not PEER.is_dir():
        pytest.skip("../shared/peer/mirage_mugraphs is not present")
    return PEER


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
