"""The whole-function check's value comparison: the assembled function against jax.jit."""

from __future__ import annotations

import numpy as np

from mirage_jax.function_check import FunctionCheck, compare


def test_compare_accepts_summation_order_noise() -> None:
    w = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert compare([w + 1e-5], [w]) is None
    assert compare([w.astype(np.float16)], [w.astype(np.float16)]) is None


def test_compare_names_what_differs() -> None:
    w = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert "max error" in compare([w.T], [w])
    assert "shape" in compare([w[:4]], [w])
    assert "outputs" in compare([w, w], [w])
    nan = w.copy()
    nan[0, 0] = np.nan
    assert "non-finite" in compare([w], [nan])
    assert compare([nan], [nan]) is None
    assert "differ" in compare([np.arange(4)], [np.arange(4)[::-1]])


def test_a_mismatch_is_the_reason_and_survives_the_cache() -> None:
    c = FunctionCheck("xla", 1.0, 2.0, "m", "measured", "output 0: max error 3")
    assert "values differ" in c.reason
    back = FunctionCheck.from_timings(c.timings())
    assert back.mismatch == c.mismatch and back.choice == "xla"
