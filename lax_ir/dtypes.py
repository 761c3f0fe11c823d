"""Dtype questions asked across the project, answered once (bfloat16 and the float8 types are
floats, though numpy gives them kind "V")."""

from __future__ import annotations

from typing import Any

import ml_dtypes  # registers bfloat16 and the float8 names with numpy
import numpy as np


def is_float(dtype: Any) -> bool:
    """Is `dtype` (a name, a numpy or ml_dtypes dtype) a real floating dtype? bfloat16 and the
    float8 types are, though numpy gives them kind "V"."""
    try:
        d = np.dtype(dtype)
    except TypeError:
        return False
    if d.kind == "f":
        return True
    try:
        ml_dtypes.finfo(d)
    except (TypeError, ValueError):
        return False
    return d.kind == "V"
