"""The one relative-error measure of the experiments: a result against its reference."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


def max_rel_error(got: Any, want: Any) -> float:
    """The largest error relative to each output's magnitude, over the leaves of two pytrees
    (max|got - want| / max|want| on finite places, in float64). inf where the structure or a
    shape differs, or where NaN or inf values sit in other places than the reference's (a NaN
    must never read as a match: Python's max(0.0, nan) is 0.0, which once hid NaN outputs)."""
    got_l, want_l = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    if len(got_l) != len(want_l):
        return math.inf
    worst = 0.0
    for g, w in zip(got_l, want_l):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g64.shape != w64.shape:
            return math.inf
        fin = np.isfinite(w64)
        if not np.array_equal(fin, np.isfinite(g64)):
            return math.inf
        scale = float(np.max(np.abs(w64[fin]), initial=0.0)) + 1e-30
        worst = max(worst, float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0)) / scale)
    return worst
