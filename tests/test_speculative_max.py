"""The online softmax against its first step's max (`lower.speculative_max`), Triton
interpreted: the same outputs as the running max's form where the fast path holds, and where a
later key outgrows the first step's max, or a row's first step is masked whole, the block's
rows redone with the running max."""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import kernel_graph, lower
from mirage_jax.lower.kernel_graph import plan
from mirage_jax.lower.running_max import running_shifts
from mirage_jax.lower.speculative_max import MAX_LIMIT, Speculation, speculation
from mirage_jax.mugraph import MuGraph
from tests.test_masked_steps import _attention_graph

T, S, H = 64, 128, 16


def _inputs(seed: int, bias: np.ndarray | None = None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H)).astype(np.float32)
    kt = rng.standard_normal((H, S)).astype(np.float32)
    v = rng.standard_normal((S, H)).astype(np.float32)
    return q, kt, v, np.zeros((T, S), np.float32) if bias is None else bias


def _reference(q, kt, v, bias):
    s = q.astype(np.float64) @ kt + bias
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


def _speculative(g):
    """`g` as `select` times its speculative twin: its meta says so."""
    return MuGraph(g.ops, g.outputs, {**g.meta, kernel_graph.SPECULATIVE_MAX: True})


def test_the_softmax_of_an_attention_kernel_can_take_its_first_steps_max():
    g = _attention_graph(T=T, S=S, H=H, tq=16, ts=16)
    ((_, p),) = plan(g).items()
    got = speculation(p, running_shifts(p), p.forloop_range)
    assert isinstance(got, Speculation)
    assert got.limit == S  # each row sums 8 steps of 16 keys: every term at most 1 before
    assert speculation(p, {}, p.forloop_range) == "it has no online softmax with a running max"
    assert speculation(p, running_shifts(p), 1) == "its loop has one step"
    assert MAX_LIMIT == 1 << 15
    # the exps also summed as they are (an output of their own): no running max, nothing taken
    g2 = _attention_graph(T=T, S=S, H=H, tq=16, ts=16, extra_sum=True)
    ((_, p2),) = plan(g2).items()
    assert isinstance(speculation(p2, running_shifts(p2), p2.forloop_range), str)


def _cases():
    later = np.zeros((T, S), np.float32)
    later[3, 100] = 100.0  # a key of the last steps far above the first step's scores
    later[40:48, 64:] = 95.0  # rows of another block: every later key above them
    first_masked = np.zeros((T, S), np.float32)
    first_masked[17, :16] = -np.inf  # row 17 sees nothing in the first step
    first_masked[50, :40] = -np.inf  # row 50 neither, nor part of the third
    return {"plain": None, "later keys above": later, "first step masked": first_masked}


@pytest.mark.parametrize("case", list(_cases()))
def test_the_speculative_form_gives_the_running_maxs_outputs(case):
    pytest.importorskip("triton")
    g = _attention_graph(T=T, S=S, H=H, tq=16, ts=16)
    xs = _inputs(5, _cases()[case])
    want = _reference(*xs)
    plain = np.asarray(lower(g, backend="triton", interpret=True)(*xs)[0])
    fast = np.asarray(lower(_speculative(g), backend="triton", interpret=True)(*xs)[0])
    assert np.isfinite(fast).all()
    np.testing.assert_allclose(plain, want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(fast, want, rtol=2e-4, atol=2e-5)


def test_the_generated_kernel_finds_one_max_and_guards_its_sums():
    pytest.importorskip("triton")
    from mirage_jax.lower.triton import source_of
    from mirage_jax.lower.triton_config import TritonConfig

    g = _attention_graph(T=T, S=S, H=H, tq=16, ts=16)
    ((_, p),) = plan(g).items()
    src = source_of(p, TritonConfig(speculative_max=True))
    fast, _, slow = src.partition("if tl.max(tl.where(")
    assert slow, src  # the guard, then the running max's loop
    loop = fast[fast.index("for it in") :]
    head, _, rest = loop.partition("if it == 0:")
    assert "tl.max(" not in head and rest.count("tl.max(") == 1  # only the first step's
    assert "tl.math.exp2((" not in rest  # no rescale: the reference is fixed
    assert "num_stages=1" in slow and "running max" in slow
    plain = source_of(p, TritonConfig())
    assert "if tl.max(tl.where(" not in plain
    # asked for where it does not apply: said so in the source
    g2 = _attention_graph(T=T, S=S, H=H, tq=16, ts=16, extra_sum=True)
    ((_, p2),) = plan(g2).items()
    assert "first step's max as reference: not applied" in source_of(
        p2, TritonConfig(speculative_max=True)
    )


def test_select_times_its_winner_with_the_first_steps_max_last(monkeypatch):
    """The winner's speculative twin is timed after every other variant, with its verdict (the
    µGraph is the same), and kept only where it is faster."""
    import mirage_jax.select as S
    from mirage_jax.search import SearchResult
    from tests.test_select import fake_lower, graph, program

    verified, timed = [], []
    real = S._verify
    monkeypatch.setattr(S, "_verify", lambda g, *a: verified.append(dict(g.meta)) or real(g, *a))
    for twin_us, kept in ((3.0, True), (9.0, False)):
        monkeypatch.setattr(S, "speculative_variant", lambda g, backend: _speculative(g))

        def lower(g, backend="pallas", twin_us=twin_us):
            fn = fake_lower()(g, backend)
            fn.us = twin_us if g.meta.get(kernel_graph.SPECULATIVE_MAX) else 8.0
            fn.meta = dict(g.meta)
            return fn

        def timer(fn, inputs):
            if not hasattr(fn, "meta"):  # XLA's
                return 10.0, "fake"
            timed.append(fn.meta)
            return fn.us, "fake"

        verified.clear()
        timed.clear()
        r = SearchResult((graph(),), "exhausted", {})
        sel = S.select(
            r, program(), tie=0.0, timer=timer, lower=lower, tune_warps=True, verify_trials=1
        )
        assert timed[-1].get(kernel_graph.SPECULATIVE_MAX)  # last
        assert sum(bool(m.get(kernel_graph.SPECULATIVE_MAX)) for m in timed) == 1
        assert not any(m.get(kernel_graph.SPECULATIVE_MAX) for m in verified)
        assert bool(sel.best.meta.get(kernel_graph.SPECULATIVE_MAX)) == kept
        assert sel.chosen.verdict is not None and sel.chosen.verdict.equal


def test_the_speculative_variant_is_offered_only_where_a_kernel_can_take_it():
    from mirage_jax.tuning import speculative_variant

    g = _attention_graph(T=T, S=S, H=H, tq=16, ts=16)
    twin = speculative_variant(g, "triton")  # a bias known or not: both forms take it
    assert twin is not None and twin.meta[kernel_graph.SPECULATIVE_MAX] is True
    assert speculative_variant(twin, "triton") is None  # already so
    assert speculative_variant(g, "pallas") is None
    assert speculative_variant(_attention_graph(T=T, S=S, H=H, extra_sum=True), "triton") is None


def _told(g, bias, interpret=True):
    """`g` lowered knowing its bias (input 3): each block walks the steps the mask leaves."""
    return lower(g, backend="triton", interpret=interpret, known={3: bias})


@pytest.mark.parametrize("late", [False, True])
def test_a_kernel_told_its_mask_takes_the_first_step_it_walks_as_reference(late, interpret=True):
    """Told a causal mask, each block walks its own steps (`masked_steps`), the first of them its
    reference; a later key far above it (`late`) sends the block back to the running max."""
    pytest.importorskip("triton" if interpret else "jax_triton")
    g = _attention_graph(T=T, S=T, H=H, tq=16, ts=16)
    causal = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf).astype(np.float32)
    q, kt, v, _ = _inputs(7)
    kt = np.ascontiguousarray(kt[:, :T])
    v = np.ascontiguousarray(v[:T])
    if late:  # row 40's keys of its last step (a block that walks 3 steps) far above the first
        q[40] = 0.0  # its scores are its bias: 0 in its first step, 90 in its last
        causal = causal.copy()
        causal[40, 33:41] = np.where(np.arange(33, 41) <= 40, 90.0, -np.inf)
    want = _reference(q, kt, v, causal)
    plain = np.asarray(_told(g, causal, interpret)(q, kt, v, causal)[0])
    fast = np.asarray(_told(_speculative(g), causal, interpret)(q, kt, v, causal)[0])
    assert np.isfinite(fast).all()
    tol = dict(rtol=2e-4, atol=2e-5) if interpret else dict(rtol=2e-3, atol=2e-3)  # tf32 dots
    np.testing.assert_allclose(plain, want, **tol)
    np.testing.assert_allclose(fast, want, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True])
def test_gpu_a_kernel_told_its_mask_takes_the_first_step_it_walks_as_reference(late):
    """The same, compiled by Triton (both loops over runtime bounds) on the GPU."""
    test_a_kernel_told_its_mask_takes_the_first_step_it_walks_as_reference(late, interpret=False)


def test_a_told_kernels_source_takes_its_reference_at_the_first_step_of_its_row():
    pytest.importorskip("triton")
    from mirage_jax.lower.triton import kernel_source
    from mirage_jax.lower.triton_config import TritonConfig

    g = _attention_graph(T=T, S=T, H=H, tq=16, ts=16)
    ((_, p),) = plan(g).items()
    _, src = kernel_source(p, TritonConfig(speculative_max=True), mask=3)
    fast, _, slow = src.partition("if tl.max(tl.where(")
    assert fast.count("if it == first:") == 2  # the unread-mask steps' loop and the masked one's
    assert "tl.range(first, mid" in slow and "tl.range(mid, end" in slow
