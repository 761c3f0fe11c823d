"""The numbering step (every accepted structure instantiated at full size) keeps to the search's
deadline: past it, a structure stops after `MIN_NUMBERS` choices once it has an instance."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
from mirage_jax.mugraph import Target
from mirage_jax.mugraph.validate import KernelLimitError
from mirage_jax.search import Budget, driver, search


@pytest.fixture(scope="module")
def numbered() -> tuple:
    """exp(x @ w) searched, and the arguments of every `_instances` call its numbering made."""
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

    driver._instances = spy
    try:
        result = search(program, budget=Budget(time_s=30.0, cuts=False), seed=0)
    finally:
        driver._instances = real
    return result, seen


def test_numbers_stop_at_the_deadline(numbered) -> None:
    result, seen = numbered
    real = driver._instances
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


def test_choices_past_the_targets_limits_are_skipped_unbuilt_with_the_same_instances(
    numbered, monkeypatch
) -> None:
    """A kernel whose tiles do not fit is not built again for other choices that give it the
    same tiles; what `_instances` keeps is what building every choice keeps."""
    _, seen = numbered
    real = driver._instances
    tight = Target("tight", smem_bytes=24 * 1024, max_blocks=4096)
    built = [0]
    instantiate = driver.instantiate

    def counted(*args):
        built[0] += 1
        return instantiate(*args)

    monkeypatch.setattr(driver, "instantiate", counted)

    def run(prune: bool) -> tuple[list, int]:
        built[0] = 0
        if not prune:  # no error is recognised as a kernel's: every choice is built
            monkeypatch.setattr(driver, "KernelLimitError", type("Never", (Exception,), {}))
        out = []
        for problem, s, _, device, keep, _ in seen:
            found, _ = real(problem, s, tight, device, keep, math.inf)
            out.append([(g.canonical_hash, nums) for g, _, nums in found])
        monkeypatch.setattr(driver, "KernelLimitError", KernelLimitError)
        return out, built[0]

    pruned, n_pruned = run(True)
    every, n_every = run(False)
    assert pruned == every
    assert any(pruned), "no structure fits the tight target: the test checks nothing"
    assert n_pruned < n_every, (n_pruned, n_every)
