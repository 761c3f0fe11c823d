"""Every benchmark program captures, partitions into one Lax region, and rebuilds exactly."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import lax_ir
from experiments import benchmarks as B

KEYS = sorted(k for k, b in B.BENCHMARKS.items() if b.batch in (1, 8))


@pytest.mark.parametrize("key", KEYS)
def test_benchmark_is_one_lax_region_at_full_size(key):
    bench = B.BENCHMARKS[key]
    program = lax_ir.capture(bench.fn, *bench.inputs)
    part = lax_ir.partition(program)
    assert len(part.regions) == 1, part.explain()
    assert not part.residual, part.explain()
    assert part.regions[0].program.input_avals == program.input_avals


@pytest.mark.parametrize("key", KEYS)
def test_benchmark_rebuild_equals_original(key):
    bench = B.BENCHMARKS[key].small()
    specs = [jax.ShapeDtypeStruct(s.shape, np.float32) for s in bench.inputs]
    program = lax_ir.capture(bench.fn, *specs)
    part = lax_ir.partition(program)
    xs = bench.make_inputs(seed=1, dtype=np.float32)
    want = jax.jit(bench.fn)(*xs)
    got = jax.jit(lax_ir.rebuild(part))(*xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    (ref,) = lax_ir.evaluate_reference(program, *xs)
    np.testing.assert_allclose(ref, bench.reference(*xs), rtol=1e-5, atol=1e-6)
