"""The experiments' one relative-error measure (`experiments.errors.max_rel_error`)."""

from __future__ import annotations

import math

import numpy as np

from experiments.errors import max_rel_error


def test_relative_to_each_outputs_magnitude() -> None:
    w = np.array([[1.0, -4.0], [2.0, 0.5]])
    assert math.isclose(max_rel_error(w + 0.04, w), 0.04 / 4.0)
    assert math.isclose(
        max_rel_error([w, 100 * w], [w, 100 * w + 1.0]), 1.0 / 399.0
    )  # the reference -400 + 1 sets the scale


def test_nan_never_reads_as_a_match() -> None:
    w = np.ones((2, 2))
    nan = w.copy()
    nan[0, 1] = np.nan
    assert math.isinf(max_rel_error(nan, w))
    assert max_rel_error(nan, nan) == 0.0  # the same places: only finite values compared


def test_structure_and_shape_differences_are_infinite() -> None:
    w = np.ones((2, 3))
    assert math.isinf(max_rel_error(w[:1], w))
    assert math.isinf(max_rel_error([w, w], [w]))
