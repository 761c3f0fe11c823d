"""Runner-ups: a verified µGraph that lost its region narrowly is kept beside XLA's decision
and tried in the whole function (`mirage_jax.runner_up`), through select, the cache and jit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax
from mirage_jax.function_check import FunctionCheck
from mirage_jax.resolve import RegionDecision
from mirage_jax.runner_up import RUNNER_UP_TRIES, closeness, order, try_runner_ups
from mirage_jax.search import SearchResult
from mirage_jax.select import IN_CONTEXT, select
from tests.test_cache import _tamper, rmsnorm_region
from tests.test_select import fake_lower, graph, program


def decision(index, status="xla", runner=None, mine=None, xla=10.0):
    t = {"xla_us": xla} | ({"runner_up_us": mine} if mine is not None else {})
    return RegionDecision(index, f"h{index}", status, "search: XLA kept", timings=t,
                          cache_key=f"k{index}", runner_up=runner)  # fmt: skip


def fake_check(times, asked, xla_us=12.0, differ=()):
    """A whole-function check: the function's µs per kernel set (frozenset of regions)."""

    def check(subset, as_kernels):
        asked.append((subset, dict(as_kernels)))
        us = times[subset]
        bad = next((k for k in differ if k in subset), None)
        mismatch = None if bad is None else f"region {bad}'s values"
        return FunctionCheck("kernels" if us < xla_us else "xla", us, xla_us, "fake", "measured",
                             mismatch)  # fmt: skip

    return check


def test_the_closest_runner_ups_are_tried_and_kept_only_where_the_function_gains():
    ds = [
        decision(0, "kernel"),
        decision(1, runner="g1", mine=10.8),  # 8% slower alone
        decision(2, runner="g2", mine=10.2),  # 2%: tried first
        decision(3, runner="g3", mine=10.9),  # third: past RUNNER_UP_TRIES
        decision(4),
    ]
    assert RUNNER_UP_TRIES == 2 and closeness(ds[2]) == pytest.approx(0.02)
    base = FunctionCheck("kernels", 10.0, 12.0, "fake")
    times = {frozenset({0, 2}): 9.0, frozenset({0, 2, 1}): 8.95}  # region 1 within the tie
    asked = []
    got = try_runner_ups(ds, base, fake_check(times, asked))
    assert [s for s, _ in asked] == [frozenset({0, 2}), frozenset({0, 1, 2})]
    assert asked[0][1][2].status == "kernel" and asked[0][1][2].mugraph == "g2"
    assert got.changed and got.kept == frozenset({0, 2}) and got.check.kernels_us == 9.0
    status = {d.index: d.status for d in got.decisions}
    assert status == {0: "kernel", 1: "xla", 2: "kernel", 3: "xla", 4: "xla"}
    kept = got.decisions[2]
    assert kept.mugraph == "g2" and kept.runner_up is None
    assert "runner-up kept by the whole-function check" in kept.reason and "9.00" in kept.reason
    assert got.decisions[1].runner_up == "g1"  # not kept: still XLA, still a runner-up


def test_runner_ups_timed_in_context_are_tried_first():
    ds = [decision(0, runner="g0", mine=10.1), decision(1, runner="g1", mine=10.9)]
    ds[1] = dataclasses.replace(ds[1], timings=ds[1].timings | {"method": "x" + IN_CONTEXT})
    assert [d.index for d in order(ds)] == [1, 0]
    assert [d.index for d in order([*ds[:1], decision(2, runner="g", mine=10.0)])] == [2, 0]


def test_with_no_kernel_the_runner_up_must_beat_jax_jit():
    ds = [decision(0, runner="g0", mine=10.5), decision(1, runner="g1", mine=10.6)]
    asked = []
    got = try_runner_ups(ds, None, fake_check({frozenset({0}): 12.5, frozenset({1}): 11.0}, asked))
    assert [s for s, _ in asked] == [frozenset({0}), frozenset({1})]
    assert got.kept == frozenset({1}) and got.decisions[1].status == "kernel"
    assert got.decisions[0].status == "xla"


def test_a_runner_up_whose_values_differ_is_passed_over():
    ds = [decision(0, "kernel"), decision(1, runner="g1", mine=10.1)]
    base = FunctionCheck("kernels", 10.0, 12.0, "fake")
    asked = []
    got = try_runner_ups(ds, base, fake_check({frozenset({0, 1}): 5.0}, asked, differ=(1,)))
    assert len(asked) == 1 and not got.changed and got.check is base
    assert got.decisions[1].status == "xla"


def test_where_the_winners_lose_together_a_runner_up_can_make_them_beat_jax_jit():
    """Llama-7B-size equinox, b=1 (H100, 2026-11-26): four kernels 212.5 µs against
    jax.jit's 188.0; with the down-projection's runner-up, 175.9 in an earlier run."""
    ds = [decision(0, "kernel"), decision(1, "kernel"), decision(2, runner="g2", mine=39.3)]
    base = FunctionCheck("xla", 212.5, 188.0, "fake")
    asked = []
    got = try_runner_ups(ds, base, fake_check({frozenset({0, 1, 2}): 175.9}, asked, 188.0))
    assert got.changed and got.kept == frozenset({0, 1, 2}) and got.check.choice == "kernels"
    asked.clear()
    got = try_runner_ups(ds, base, fake_check({frozenset({0, 1, 2}): 187.0}, asked, 188.0))
    assert len(asked) == 1 and not got.changed  # within KEEP_ALL_TIE of jax.jit: not kept


def test_nothing_is_tried_where_the_kernels_themselves_were_not_checked():
    ds = [decision(0, "kernel"), decision(1, runner="g1", mine=10.1)]
    asked = []
    got = try_runner_ups(ds, None, fake_check({}, asked))  # the kernels' own check failed
    assert asked == [] and not got.changed


def test_select_keeps_a_close_verified_loser_as_runner_up():
    p = program()
    r = SearchResult((graph(),), "exhausted", {})

    def timer(times):
        it = iter(times)
        return lambda fn, inputs: (next(it), "fake")

    kw = dict(tie=0.0, lower=fake_lower(), verify_trials=1)
    sel = select(r, p, timer=timer([10.0, 10.5]), near=0.10, **kw)
    assert sel.best is None and sel.runner_up is not None
    assert sel.runner_up_contender.us == 10.5 and sel.runner_up_contender.verdict.equal
    assert "runner-up for the whole-function check (10.50 µs)" in sel.reason
    assert select(r, p, timer=timer([10.0, 11.5]), near=0.10, **kw).runner_up is None
    assert select(r, p, timer=timer([10.0, 10.5]), **kw).runner_up is None  # near=0: off


def test_a_runner_up_entry_is_xla_and_its_mugraph_is_checked_like_a_kernels(tmp_path):
    from types import SimpleNamespace

    from mirage_jax.cache import Cache, CacheWarning
    from mirage_jax.mugraph import to_json
    from mirage_jax.resolve import Resolver

    region_program, good, wrong = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    t = {"xla_us": 2.0, "mugraph_us": 2.1, "runner_up_us": 2.1, "runner_up": True}
    cache.store(region_program, good, device_kind="cpu", backend="reference", timings=t)
    h = region_program.canonical_hash
    entry, mugraph = cache.lookup(h, "cpu", "reference", program=region_program)
    assert entry.is_xla and entry.runner_up and mugraph == good
    region = SimpleNamespace(index=3, program=region_program)
    resolver = SimpleNamespace(backend="reference")
    d = Resolver._decision(resolver, region, entry, mugraph, "cache", "kernel why", "xla why")
    assert d.status == "xla" and d.runner_up == good and d.mugraph is None
    assert d.verification == entry.verification and d.reason == "xla why"

    _tamper(cache, mugraph_json=to_json(wrong))  # rejected as a kernel's µGraph would be
    with pytest.warns(CacheWarning, match="another µGraph"):
        assert cache.lookup(h, "cpu", "reference", program=region_program) is None


def test_jit_runs_a_runner_up_the_whole_function_check_keeps(tmp_path, monkeypatch):
    """The wiring in `jit`: the first region's µGraph is made a runner-up (as if it lost its
    region by a little); the (faked) whole-function check finds the other kernels slower
    than jax.jit (13 against 12 µs) and the function faster with the runner-up (9 µs), which
    is tried before any kernel is left out; it runs, with the reason, and the function still
    computes what jax.jit does."""
    from types import SimpleNamespace

    import mirage_jax.api as api
    from mirage_jax import function_choice, resolve

    def two_regions(x, w1, w2):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        y = (h @ w1).reshape(x.shape[0], 2, -1).transpose(1, 0, 2).reshape(x.shape[0] * 2, -1)
        return jnp.tanh(y @ w2)

    real = resolve.Resolver._decision
    turned = []

    def as_runner_up(self, region, entry, mugraph, *a):
        d = real(self, region, entry, mugraph, *a)
        if d.status != "kernel" or turned:
            return d
        turned.append(d.index)
        t = dict(d.timings or {}) | {"xla_us": 10.0, "runner_up_us": 10.4}
        return dataclasses.replace(d, status="xla", mugraph=None, runner_up=d.mugraph, timings=t)

    asked = []

    def check(self, decisions, flat, xla_us=None):
        kernels = frozenset(d.index for d in decisions if d.status == "kernel")
        asked.append(kernels)
        us = 9.0 if turned[0] in kernels else 13.0  # without it the winners lose
        return FunctionCheck("kernels" if us < 12.0 else "xla", us, 12.0, "fake")

    monkeypatch.setattr(resolve.Resolver, "_decision", as_runner_up)
    monkeypatch.setattr(function_choice.FunctionChoice, "check", check)
    monkeypatch.setattr(
        api, "backends", SimpleNamespace(get=lambda n: SimpleNamespace(needs_gpu=True))
    )
    monkeypatch.setattr(function_choice, "marginal", lambda ds: [])
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, 32), (32, 64), (32, 16))]
    f = mirage_jax.jit(two_regions, backend="reference", cache=tmp_path / "c.sqlite", workers=1)
    got = f(*xs)
    np.testing.assert_allclose(got, jax.jit(two_regions)(*xs), rtol=2e-3, atol=2e-3)
    assert turned, f.last.decisions
    d = f.last.decisions[turned[0]]
    assert d.status == "kernel" and "runner-up kept by the whole-function check" in d.reason
    assert all(k.status == "kernel" for k in f.last.decisions if k.index in asked[0])
    assert turned[0] in asked[1] and asked[1] > asked[0]  # the runner-up on top of the winners
    assert f.last.function_check.kernels_us == 9.0
