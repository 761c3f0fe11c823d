"""The hand-written split-KV yardstick kernel computes the original's gqa (interpret mode)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import benchmarks
from experiments.reference_kernels import split_kv_gqa


@pytest.mark.parametrize("splits", [2, 4])
def test_split_kv_gqa_matches_reference(splits):
    bm = benchmarks.get("gqa", 1).resized({"kv_len": 512, "q_len": 64})
    q, k, v = bm.make_inputs(0, np.float32)
    out = split_kv_gqa(q, k, v, splits=splits, block_q=32, block_kv=128, interpret=True)
    np.testing.assert_allclose(np.asarray(out), bm.reference(q, k, v), rtol=2e-4, atol=1e-5)


def test_split_kv_gqa_rejects_uneven_splits():
    bm = benchmarks.get("gqa", 1).resized({"kv_len": 512, "q_len": 64})
    q, k, v = bm.make_inputs(0, np.float32)
    with pytest.raises(ValueError, match="split"):
        split_kv_gqa(q, k, v, splits=3, interpret=True)
