"""The numbering step (every accepted structure instantiated at full size) keeps to the search's
deadline: past it, a structure stops after `MIN_NUMBERS` choices once it has an instance."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

import lax_ir
from mirage_jax.search import Budget, driver, search


def test_numbers_stop_at_the_deadline(monkeypatch) -> None:
    program = lax_ir.capture(
        lambda x, w: jnp.exp(x @ w),
        np.zeros((64, 512), np.float16),
        np.zeros((512, 2048), np.float16),
    )
    seen = []
    real = driver._instances

    def spy(problem, s, target, device, keep, deadline):
        seen.append((problem, s, target, device, keep, deadline))
        return real(problem, s, target, device, keep, deadline)

    monkeypatch.setattr(driver, "_instances", spy)
    result = search(program, budget=Budget(time_s=30.0, cuts=False), seed=0)
    assert result.mugraphs and seen
    assert all(math.isfinite(args[-1]) for args in seen)  # the search's own deadline
    cut_any = False
    for problem, s, target, device, keep, _ in seen:
        full, short = real(problem, s, target, device, keep, math.inf)
        assert not short
        late, cut = real(problem, s, target, device, keep, -math.inf)
        assert bool(late) == bool(full)  # an instance wherever there was one
        cut_any |= cut
    assert cut_any, "no structure had more than MIN_NUMBERS choices: the test checks nothing"
