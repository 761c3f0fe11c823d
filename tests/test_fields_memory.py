"""Verification trials kept within the machine's memory (`fields.memory`)."""

from __future__ import annotations

import importlib
import threading
import time

import jax
import jax.numpy as jnp
import pytest

import fields
import lax_ir
from fields import memory
from mirage_jax.search import Budget, search
from mirage_jax.select import select


def _program(n: int = 64):
    spec = jax.ShapeDtypeStruct((n, n), jnp.float32)
    return (
        lax_ir.partition(lax_ir.capture(lambda x, w: (x @ w) * 2.0, spec, spec)).regions[0].program
    )


def test_trial_bytes_grow_with_the_region():
    small, big = _program(16), _program(64)
    assert 15 * memory.trial_bytes(small, small) < memory.trial_bytes(big, big)
    assert memory.trial_bytes(small, small) == memory.BYTES_PER_ELEMENT * memory.elements(small)


def test_a_trial_larger_than_the_room_is_refused_with_the_sizes(monkeypatch):
    monkeypatch.setattr(memory, "room", lambda: 1000)
    too_large = pytest.raises(memory.TooLarge, match=r"needs about .* GiB of memory, more than")
    with too_large, memory.GATE.admit(2000):
        pass
    with memory.GATE.admit(1000):  # one that fits runs
        pass


def test_trials_wait_for_room_beside_the_ones_running(monkeypatch):
    monkeypatch.setattr(memory, "room", lambda: 100)
    order = []
    first_in = threading.Event()

    def first():
        with memory.GATE.admit(60):
            first_in.set()
            time.sleep(0.3)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    first_in.wait()
    with memory.GATE.admit(60):  # 120 > 100 together: waits for the first
        order.append("second in")
    t.join()
    assert order == ["first done", "second in"]
    assert memory.GATE.held == 0


def test_verify_refuses_a_trial_that_cannot_fit(monkeypatch):
    p = _program()
    monkeypatch.setattr(memory, "room", lambda: 1)
    monkeypatch.setattr(importlib.import_module("fields.verify"), "SMALL_TRIAL", 0)
    with pytest.raises(memory.TooLarge):
        fields.verify(p, p, trials=1)


def test_a_region_too_large_to_verify_keeps_xla_and_says_why(monkeypatch):
    p = _program(32)
    result = search(p, budget=Budget(time_s=60.0, results=4, confirm=2), progress=False)
    assert result.mugraphs, result.message
    monkeypatch.setattr(memory, "room", lambda: 1)
    sel = select(result, p, timed=False, verify_trials=1)
    assert sel.best is None
    assert sel.reason.startswith("not verified: one verification trial of this region needs")
    again = search(p, budget=Budget(time_s=60.0, results=4, confirm=2), seed=1, progress=False)
    assert again.mugraphs and all(
        g.meta.get("verified") == "representative" for g in again.mugraphs
    )
