"""A verdict asked twice in a process is answered from memory, exactly as first given."""

from __future__ import annotations

import importlib

import numpy as np

import fields
import lax_ir
from fields.numbers import default_field

verify_mod = importlib.import_module(
    "fields.verify"
)  # the module (the package exports the function)


def _programs():
    def f(x, w):
        return (x * 2.0) @ w

    def g(x, w):
        return 2.0 * (x @ w)

    def h(x, w):
        return (x * 3.0) @ w

    x, w = np.ones((4, 8), np.float32), np.ones((8, 6), np.float32)
    return [lax_ir.capture(fn, x, w) for fn in (f, g, h)]


def test_the_same_question_is_answered_from_memory(monkeypatch):
    a, b, c = _programs()
    calls = []
    real = verify_mod._verify
    monkeypatch.setattr(verify_mod, "_verify", lambda *xs: calls.append(xs) or real(*xs))
    verify_mod._MEMO.clear()
    first = fields.verify(a, b, trials=2, seed=5)
    again = fields.verify(a, b, trials=2, seed=5)
    assert first.equal and again is first and len(calls) == 1
    fields.verify(a, b, trials=3, seed=5)  # other trials, seed or programs: computed
    fields.verify(a, b, trials=2, seed=6)
    assert not fields.verify(a, c, trials=2, seed=5).equal
    assert len(calls) == 4
    assert not fields.verify(a, c, trials=2, seed=5).equal and len(calls) == 4


def test_a_fixed_field_is_never_remembered(monkeypatch):
    a, b, _ = _programs()
    calls = []
    real = verify_mod._verify
    monkeypatch.setattr(verify_mod, "_verify", lambda *xs: calls.append(xs) or real(*xs))
    field = default_field()
    fields.verify(a, b, trials=1, field=field)
    fields.verify(a, b, trials=1, field=field)
    assert len(calls) == 2
