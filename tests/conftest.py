"""Shared test configuration: GPU tests run only where jax sees a GPU; the original's
checkpoints are optional (`experiments.peer`)."""

from __future__ import annotations

import pathlib

import jax
import pytest


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
