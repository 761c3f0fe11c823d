"""Regions no kernel of ours can win are not searched (`mirage_jax.compute_gate`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
import mirage_jax
from mirage_jax import compute_gate
from mirage_jax.regions import SearchOutcome

H100 = "NVIDIA H100 80GB HBM3"


def _region(m: int, k: int, n: int):
    """The one region of a layer norm + projection of `m` rows (GPT-2's QKV at m=4096)."""

    def ln_proj(x, g, w):
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return (((xf - mu) * jax.lax.rsqrt(var + 1e-5)) * g).astype(x.dtype) @ w

    f16 = jnp.float16
    args = (
        jax.ShapeDtypeStruct((m, k), f16),
        jax.ShapeDtypeStruct((1, k), f16),
        jax.ShapeDtypeStruct((k, n), f16),
    )
    part = lax_ir.partition(lax_ir.capture(ln_proj, *args))
    return next(r.program for r in part.regions if not r.is_trivial)


class _Opts:
    def __init__(self, **options):
        self.seed, self.options, self.strict = 0, options, False


class _Timer:
    def __init__(self, us: float):
        self.us, self.calls = us, 0

    def __call__(self, fn, inputs):
        self.calls += 1
        return self.us, "fake timer"


def test_matmul_flops_counts_every_matmul():
    program = _region(4096, 1024, 3072)
    assert compute_gate.matmul_flops(program) == 2 * 4096 * 1024 * 3072


def test_a_region_xla_runs_below_our_compute_floor_is_not_searched():
    program = _region(4096, 1024, 3072)  # 25.8 Gflop: 85.9 µs at 300 Tflop/s
    least = compute_gate.floor_us(program, H100)
    assert 85 < least < 87
    timer = _Timer(61.2)  # XLA's measured time for GPT-2's QKV at b=8
    got = compute_gate.unwinnable(program, _Opts(), "triton", H100, timer=timer)
    assert got is not None and timer.calls == 1
    reason, timings = got
    assert "not searched" in reason and "61.20" in reason and "85.9" in reason
    assert timings["xla_us"] == 61.2 and timings["compute_floor_us"] == round(least, 2)
    # select reuses the measurement instead of timing XLA again
    assert compute_gate.known_xla(program, _Opts(), "triton", False) == (61.2, "fake timer")
    assert compute_gate.known_xla(program, _Opts(), "pallas", False) is None


def test_a_region_xla_runs_above_the_floor_is_searched():
    program = _region(4096, 1024, 3072)
    timer = _Timer(400.0)
    assert compute_gate.unwinnable(program, _Opts(), "triton", H100, timer=timer) is None
    assert timer.calls == 1


def test_small_regions_unknown_devices_and_the_option_off_are_not_checked():
    timer = _Timer(0.1)
    small = _region(8, 1024, 1024)  # a decode projection: 16.8 Mflop, 0.06 µs
    assert compute_gate.unwinnable(small, _Opts(), "triton", H100, timer=timer) is None
    big = _region(4096, 1024, 3072)
    assert compute_gate.unwinnable(big, _Opts(), "triton", "cpu", timer=timer) is None
    off = _Opts(compute_gate=False)
    assert compute_gate.unwinnable(big, off, "triton", H100, timer=timer) is None
    assert timer.calls == 0  # XLA is timed only for the regions checked


def test_a_gated_region_runs_as_xla_unsearched_and_is_cached(tmp_path, monkeypatch):
    """api: the gate's decision replaces the region's search; the others are searched; a
    second function object finds the gated decision in the cache."""
    from mirage_jax import api, regions

    searched: list[str] = []
    real_search = regions.search_only

    def search_only(search_mod, program, opts):
        searched.append(program.canonical_hash)
        return real_search(search_mod, program, opts)

    monkeypatch.setattr(regions, "search_only", search_only)
    gated_hashes: list[str] = []

    def compute_gated(program, opts, backend, avals=None):
        if gated_hashes:  # the first region only
            return None
        gated_hashes.append(program.canonical_hash)
        timings = {"xla_us": 1.0, "compute_floor_us": 2.0}
        return SearchOutcome(None, None, None, timings, "not searched: (test) XLA below floor")

    monkeypatch.setattr(api, "compute_gated", compute_gated)

    def two_regions(x, w1, w2):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        y = (h @ w1).reshape(x.shape[0], 2, -1).transpose(1, 0, 2).reshape(x.shape[0] * 2, -1)
        return jnp.tanh(y @ w2)

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, 32), (32, 64), (32, 16))]
    cache = tmp_path / "c.sqlite"
    f = mirage_jax.jit(two_regions, backend="reference", cache=cache, workers=1)
    np.testing.assert_allclose(f(*xs), jax.jit(two_regions)(*xs), rtol=1e-5, atol=1e-5)
    gated = [d for d in f.last.decisions if d.region_hash in gated_hashes]
    assert len(gated) == 1 and gated[0].status == "xla"
    assert "not searched" in gated[0].reason
    assert gated_hashes[0] not in searched and searched  # the others were searched
    again = mirage_jax.jit(two_regions, backend="reference", cache=cache, workers=1)
    again(*xs)
    hit = [d for d in again.last.decisions if d.region_hash in gated_hashes]
    assert hit[0].source == "cache" and "not searched" in hit[0].reason


def test_search_ahead_waits_for_each_gate(monkeypatch):
    """`SearchAhead`: a gated program's future holds the gate's outcome (no search); an
    ungated one is searched; a gate ended by an interrupt ends its search with the error."""
    from concurrent.futures import CancelledError, Future

    import pytest

    from mirage_jax import regions

    searched: list[str] = []
    monkeypatch.setattr(regions, "search_only", lambda mod, p, opts: searched.append(p) or p)
    monkeypatch.setattr(regions, "_search_module", lambda: None)
    gates = [Future() for _ in range(3)]
    outcome = SearchOutcome(None, None, None, {}, "not searched: (test)")
    with regions.SearchAhead(["a", "b", "c"], _Opts(), gates) as ahead:
        gates[0].set_result(outcome)
        gates[1].set_result(None)
        gates[2].set_exception(CancelledError())
        assert ahead.futures[0].result() is outcome
        assert ahead.futures[1].result() == "b"
        with pytest.raises(CancelledError):
            ahead.futures[2].result()
    assert searched == ["b"]


def _only_region(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, jnp.float16) for s in shapes]
    part = lax_ir.partition(lax_ir.capture(fn, *args))
    return next(r.program for r in part.regions if not r.is_trivial)


def test_elementwise_regions_are_left_to_xla_fusion(monkeypatch) -> None:
    """A rotary-style product is elementwise only: decided XLA on a GPU, not searched, with
    the reason; a region with a matmul or a reduction is not; the option turns it off; on the
    CPU (nothing timed) nothing is gated."""
    from mirage_jax import regions

    rot = _only_region(lambda x, c, s: x * c + x * s * 0.5, (8, 128), (1, 128), (1, 128))
    reason, timings = compute_gate.fused_by_xla(rot, _Opts(), H100)
    assert "elementwise ops only" in reason and timings["search_s"] == 0.0
    assert compute_gate.fused_by_xla(rot, _Opts(elementwise_gate=False), H100) is None
    assert compute_gate.fused_by_xla(_region(8, 64, 32), _Opts(), H100) is None  # a matmul
    norm = _only_region(lambda x: x / jnp.sum(x, -1, keepdims=True), (8, 128))
    assert compute_gate.fused_by_xla(norm, _Opts(), H100) is None  # a reduction

    monkeypatch.setattr(regions, "timed_here", lambda backend: True)
    monkeypatch.setattr(regions, "device_kind", lambda: H100)
    got = regions.compute_gated(rot, _Opts(), "triton")
    assert got is not None and got.mugraph is None and "elementwise ops only" in got.reason
    monkeypatch.setattr(regions, "timed_here", lambda backend: False)
    assert regions.compute_gated(rot, _Opts(), "triton") is None
