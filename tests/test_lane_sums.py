"""Sums over the loop and the last dim kept lane by lane (`triton_rules.lanes`).

`accum_sum_last`, `accum_mean_last` and `accum_rms_last` used to reduce their tile's last dim
at every loop step: a block-wide reduction and barrier each step. A combining kernel that takes
the rms of a 4096-wide row over 16 steps took 6.0 µs that way, and 1.5 µs with the lanes
summed once after the loop (H200, 2026-11-28). Run in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mirage_jax.lower import TritonConfig, lower, plan
from mirage_jax.lower import triton as tr
from mirage_jax.lower.triton_rules import LANE_ELEMENTS
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder

pytest.importorskip("triton")


def stats_graph(rows: int, cols: int, loop: int):
    """Per row of x (rows, cols), fp16: its sum, mean and rms (eps 1e-6), the loop walking the
    columns in `loop` steps; 2 blocks over the rows."""
    b = BlockGraphBuilder(grid=(2,), forloop_range=loop)
    x = b.input((rows, cols), "float16", imap=(0,), forloop_dim=1)
    b.output(b.op("accum_sum_last", x), (0,))
    b.output(b.op("accum_mean_last", x), (0,))
    b.output(b.op("accum_rms_last", x, eps=1e-6), (0,))
    mb = MuGraphBuilder()
    xi = mb.input((rows, cols), "float16")
    return mb.build(mb.graph_defined([xi], b.build()), name="row stats")


def _expected(x: np.ndarray) -> list[np.ndarray]:
    h = x.astype(np.float64)
    mean_sq = np.mean(h * h, axis=-1, keepdims=True)
    return [h.sum(-1, keepdims=True), h.mean(-1, keepdims=True), np.sqrt(mean_sq + 1e-6)]


def _loop_body(src: str) -> str:
    """The statements of the generated kernel's loop over K."""
    body = src.split("for it in", 1)[1]
    return body.split("# after the loop", 1)[0]


@pytest.mark.parametrize("split", [1, 2])
def test_lane_sums_give_the_row_statistics_and_reduce_once(split):
    g = stats_graph(8, 96, 4)  # tiles [4, 24] padded to [4, 32]: the padded lanes stay zero
    x = np.random.default_rng(0).standard_normal((8, 96)).astype(np.float16)
    outs = lower(g, backend="triton", config=TritonConfig(loop_split=split), interpret=True)(x)
    for got, want in zip(outs, _expected(x)):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3, atol=2e-3)
    (p,) = plan(g).values()
    _, src = tr.kernel_source(p, TritonConfig())
    assert "tl.sum(" not in _loop_body(src), _loop_body(src)
    after = src.split("# after the loop", 1)[1]
    assert len(re.findall(r"tl\.sum\(acc\d+, axis=1", after)) == 3, after


def test_a_wide_tile_still_reduces_each_step():
    """Above `LANE_ELEMENTS` a tile's lanes would cost registers: one sum per step, as before."""
    cols = 2 * LANE_ELEMENTS
    g = stats_graph(2, cols * 2, 2)
    x = np.random.default_rng(1).standard_normal((2, cols * 2)).astype(np.float16)
    outs = lower(g, backend="triton", interpret=True)(x)
    for got, want in zip(outs, _expected(x)):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3, atol=2e-2)
    (p,) = plan(g).values()
    _, src = tr.kernel_source(p, TritonConfig())
    assert "tl.sum(" in _loop_body(src)
