"""`mirage_jax.select` with hand-built µGraphs: untimed choice, full-size verification, tolerances."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
from mirage_jax.mugraph import MuGraphBuilder, evaluate_reference
from mirage_jax.search import SearchResult
from mirage_jax.select import FLOAT_TOL, select

SPECS = [jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 4), jnp.float32)]


def two(x, w):
    y = x @ w
    return y * 2.0, jnp.exp(y)


def program():
    return lax_ir.partition(lax_ir.capture(two, *SPECS)).regions[0].program


def graph(swapped=False, wrong=False):
    b = MuGraphBuilder()
    x, w = (b.input(s.shape, "float32") for s in SPECS)
    y = b.op("matmul", x, w)
    outs = [b.op("exp", y), b.op("mul_scalar", y, scalar=3.0 if wrong else 2.0)]  # region order
    return b.build(outs[::-1] if swapped else outs)


def fake_lower(scale=1.0):
    def lower(g, backend="pallas"):
        return lambda *xs: [scale * o for o in evaluate_reference(g, *xs)]

    return lower


def never_timed(fn, inputs):
    raise AssertionError("timed=False must time nothing")


def structured(g, structure):
    """`g` with the structure the search would have named in its meta."""
    from mirage_jax.mugraph import MuGraph

    return MuGraph(g.ops, g.outputs, {**g.meta, "structure": structure})


def test_untimed_takes_the_first_candidate_that_passes():
    p = program()
    r = SearchResult((graph(wrong=True), graph(), graph()), "exhausted", {})
    sel = select(r, p, top=None, timed=False, timer=never_timed, lower=fake_lower())
    assert sel.best is r.mugraphs[1] and sel.method == "cost model" and "not timed" in sel.reason
    assert "wrong result" in sel.contenders[1].error and len(sel.contenders) == 3
    assert sel.chosen.mugraph is sel.best and sel.xla_us is None and sel.fastest_us is None


def test_verification_drops_unequal_graphs_and_orders_outputs():
    p = program()
    swapped = graph(swapped=True)
    r = SearchResult((swapped,), "exhausted", {})
    sel = select(r, p, timed=False, lower=fake_lower())  # unverified: compared in order
    assert sel.best is None and "wrong result" in sel.reason and not sel.passed
    sel = select(r, p, timed=False, lower=fake_lower(), verify_trials=2, seed=1)
    assert sel.best is swapped and sel.chosen.verdict.equal and sel.chosen.verdict.trials == 2
    r = SearchResult((graph(wrong=True), swapped), "exhausted", {})
    sel = select(r, p, timed=False, lower=fake_lower(), verify_trials=2)
    assert sel.best is swapped and "not equal" in sel.contenders[1].error


def test_tolerance_per_dtype_and_the_tie_rule():
    p = program()
    r = SearchResult((graph(),), "exhausted", {})
    off = fake_lower(1.01)  # 1% off: within the default 2e-2, not within float32's 5e-3
    assert select(r, p, timed=False, lower=off).best is not None
    sel = select(r, p, timed=False, lower=off, rtol=FLOAT_TOL)
    assert sel.best is None and "first failure: wrong result" in sel.reason

    def timer(us):
        return lambda fn, inputs: (us(fn), "fake")

    times = iter([10.0, 9.9])  # XLA first, then the µGraph: 1% faster
    sel = select(r, p, timer=timer(lambda fn: next(times)), lower=fake_lower())
    assert sel.best is None and "within 2% or slower" in sel.reason and sel.fastest_us == 9.9
    times = iter([10.0, 9.9])
    sel = select(r, p, tie=0.0, timer=timer(lambda fn: next(times)), lower=fake_lower())
    assert sel.best is not None and sel.method == "fake" and sel.xla_us == 10.0
    times = iter([10.0, 10.0])
    sel = select(r, p, tie=0.0, timer=timer(lambda fn: next(times)), lower=fake_lower())
    assert sel.best is None and "not faster" in sel.reason  # XLA wins exact ties


def test_the_fastest_is_timed_again_with_other_warps_and_the_fastest_kept():
    """`tune_warps`: the winner is timed again with TUNED_WARPS and FEW_WARPS in its meta (the
    lowering reads it), verified once; the fastest form is chosen, and it keeps the winner's
    verdict."""
    from mirage_jax.lower.kernel_graph import WARPS
    from mirage_jax.tuning import FEW_WARPS, TUNED_WARPS

    p = program()
    r = SearchResult((structured(graph(), "s"), structured(graph(), "s")), "exhausted", {})
    lowered = []

    def lower(g, backend="pallas"):
        lowered.append(g.meta.get(WARPS))
        fn = fake_lower()(g, backend)
        fn.us = {None: 8.0, TUNED_WARPS: 6.0, FEW_WARPS: 7.0}[g.meta.get(WARPS)]
        fn.us += len(lowered) * 0.01
        return fn

    def timer(fn, inputs):
        return getattr(fn, "us", 10.0), "fake"

    sel = select(r, p, tie=0.0, timer=timer, lower=lower, tune_warps=True, verify_trials=1)
    assert sorted(lowered, key=str) == sorted([None, None, TUNED_WARPS, FEW_WARPS], key=str)
    assert sel.best.meta[WARPS] == TUNED_WARPS and sel.chosen.us < 6.1
    # the tuned form keeps the verdict of the one it tunes (the faster of the two copies: they
    # are prepared in threads, so which one lowered first, and is faster here, varies)
    tuned = sel.contenders[-2]
    base = next(
        c for c in sel.contenders[1:-1] if tuned.label == f"{c.label} with {TUNED_WARPS} warps"
    )
    assert sel.chosen.verdict is base.verdict and sel.chosen.verdict.equal
    sel = select(r, p, tie=0.0, timer=timer, lower=lower, verify_trials=1)  # not asked: no tuning
    assert WARPS not in sel.best.meta


def test_float_check_is_against_float64():
    p = program()
    xs = [np.full(s.shape, 0.5, np.float32) for s in SPECS]
    r = SearchResult((graph(),), "exhausted", {})
    sel = select(r, p, timed=False, inputs=lambda seed: xs, lower=fake_lower())
    assert sel.chosen.max_rel_error < 1e-6


def test_timing_order_sees_each_structure_before_a_second_tiling() -> None:
    """With four tilings of one structure ranked first, the fifth µGraph (another structure)
    is still among the first two timed, and its second tiling comes before the first
    structure's third; ranks are kept for the labels."""
    from types import SimpleNamespace

    from mirage_jax.select import timing_order

    gs = [SimpleNamespace(meta={"structure": s}) for s in "aaaabba"]
    assert [k for k, _ in timing_order(gs, 4)] == [0, 4, 1, 5]
    assert [k for k, _ in timing_order(gs, None)] == [0, 4, 1, 5, 2, 3, 6]
    assert [k for k, _ in timing_order(gs[:2], 4)] == [0, 1]


def test_timing_order_takes_structures_that_differ_in_op_order_as_one() -> None:
    """Two structures whose kernels have the same block ops in another order are one for the
    round robin: a third, different structure is timed before the second of them."""
    from types import SimpleNamespace

    from mirage_jax.select import timing_order

    a = "[grid[d2(8),d1(2816)] loop[d0(1024)]: accum_rms_last matmul div silu div mul]"
    b = "[grid[d2(8),d1(2816)] loop[d0(1024)]: accum_rms_last matmul div div silu mul]"
    c = "matmul(x2,x0) ; [grid[d2(8),d1(1024)] loop[-]: add accum_sum]"
    gs = [SimpleNamespace(meta={"structure": s}) for s in (a, b, c)]
    assert [k for k, _ in timing_order(gs, 2)] == [0, 2]
    assert [k for k, _ in timing_order(gs, None)] == [0, 2, 1]


def test_timing_order_skips_what_the_model_puts_far_behind() -> None:
    """A one-block µGraph estimated 100x the best is not timed; without estimates, all are."""
    from types import SimpleNamespace

    from mirage_jax.select import FAR_BEHIND, timing_order

    us = [10.0, 1000.0, 12.0, 10.0 * FAR_BEHIND]
    gs = [SimpleNamespace(meta={"structure": s, "cost": {"us": u}}) for s, u in zip("abcd", us)]
    assert [k for k, _ in timing_order(gs, 4)] == [0, 2, 3]
    assert [k for k, _ in timing_order(gs, None)] == [0, 1, 2, 3]  # untimed: the model's order


def test_in_context_timing_feeds_the_regions_own_inputs() -> None:
    """With `InContext`, XLA and every µGraph are timed on the region's own inputs (before the
    interface's layout steps) and return the region's own outputs; the float check runs that
    same function, so a kernel wrong only as the function calls it (a stored view misread) is
    dropped."""
    import dataclasses
    from types import SimpleNamespace

    import lax_ir
    from experiments import models as M
    from mirage_jax.regions import in_context, lower_mugraph, region_avals
    from mirage_jax.search import Budget, search
    from mirage_jax.select import select

    m = M.get("llama_decode_eqx", batch=1, size="tiny")
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    region = next(
        r
        for r in part.regions
        if r.program.meta.get("interface")
        and any(n.op == "matmul" for _, n in r.program.ops())
        and any(
            op == "transpose" for _, ops in r.program.meta["interface"]["inputs"] for op, _ in ops
        )
    )
    program, avals = region.program, region_avals(part, region)
    assert [s for s, _ in avals] != [s for s, _ in program.input_avals]
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    assert res.mugraphs
    opts = SimpleNamespace(seed=0, lower_config=None)
    own_out = [tuple(part.program.nodes[o].shape) for o in region.outputs]
    fed = []

    def timer(fn, inputs):
        xs = inputs(0)
        fed.append([x.shape for x in xs])
        assert [tuple(o.shape) for o in fn(*xs)] == own_out
        return 1.0

    context = in_context(program, opts, "reference", avals)
    sel = select(
        res,
        program,
        backend="reference",
        top=2,
        timer=timer,
        lower=lambda g, backend: lower_mugraph(g, backend),
        context=context,
    )
    assert fed and all(shapes == [s for s, _ in avals] for shapes in fed)
    assert all(c.error == "" for c in sel.contenders), sel.contenders
    assert all(c.max_rel_error < 1e-2 for c in sel.contenders[1:])  # checked in context

    def misread(g, backend, order=None):  # right on canonical inputs, wrong in context
        raw = context.lower(g, backend, order)
        return lambda *xs: [o * 1.5 for o in raw(*xs)]

    wrong = dataclasses.replace(context, lower=misread)
    bad = select(res, program, backend="reference", top=2, timer=timer, context=wrong,
                 lower=lambda g, backend: lower_mugraph(g, backend))  # fmt: skip
    assert len(bad.contenders) > 1
    assert all(c.error.startswith("wrong result") for c in bad.contenders[1:]), bad.contenders


def test_the_stored_verdict_has_the_bound_the_cache_trusts():
    """Two trials leave GPT-2's tanh-GELU region (tiny, b=1) at 6.4e-9; the search's full-size
    check runs the trials reaching 1e-9 and `select` keeps that verdict. Regression: the cache
    rejected weaker entries when read, so every rerun searched the region again."""
    import json
    import math

    from experiments import models
    from mirage_jax import search as search_mod
    from mirage_jax.api import MirageJit, _capture
    from mirage_jax.cache import MAX_BOUND
    from mirage_jax.regions import search_only, select_searched

    m = models.get("gpt2_prefill", 1, "tiny")
    region = lax_ir.partition(_capture(m.fn, tuple(m.abstract_args()), {})).regions[0]
    opts = MirageJit(m.fn, budget_s=math.inf, max_candidates=1, cache=False).opts
    found = search_only(search_mod, region.program, opts)
    first = found.mugraphs[0]
    assert first.meta["bound"] <= MAX_BOUND  # the search's own full-size verdict
    out = select_searched(found, region.program, opts, "pallas-interpret")
    verdict = json.loads(out.verdict_json)["verdict"]
    assert verdict["bound"] <= MAX_BOUND and verdict["trials"] >= 3


def test_a_verdict_short_of_the_bound_is_not_computed_twice(monkeypatch):
    """Where two trials cannot reach 1e-9 and no verdict is known, `select` runs the trials
    that reach it, once (a full-size trial at 7B takes seconds), not two and then three."""
    import fields
    from experiments import models
    from mirage_jax import select as select_mod
    from mirage_jax.search import Budget, search

    m = models.get("gpt2_prefill", 1, "tiny")
    region = next(
        r
        for r in lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args())).regions
        if any(n.op == "tanh" for _, n in r.program.ops())
    )
    g = search(region.program, budget=Budget(time_s=60, results=1), seed=0, workers=1).mugraphs[0]
    fields.verify.__globals__["_MEMO"].clear()
    asked = []
    real = fields.verify

    def spy(a, b, **kw):
        asked.append(kw.get("trials"))
        return real(a, b, **kw)

    monkeypatch.setitem(real.__globals__, "verify", spy)  # what `verify_to_bound` calls
    verdict, _ = select_mod._verify(g, region.program, 2, 0)
    assert asked == [None] and verdict.trials >= 3


def test_candidates_compile_together_and_are_timed_alone():
    """Timed, the candidates are lowered and compiled in several threads at once (XLA's
    function beside them); each is timed only after all are ready, XLA first, one at a time,
    so no other work runs under a trace."""
    import threading
    import time

    p = program()
    graphs = tuple(
        dataclasses.replace(graph(swapped=i % 2 == 1), meta={"cost": {"us": float(i)}})
        for i in range(4)
    )
    r = SearchResult(graphs, "exhausted", {})
    events: list[tuple[str, float, float, str]] = []
    lock = threading.Lock()
    ref = fake_lower()

    def lower(g, backend="pallas"):
        t0 = time.perf_counter()
        time.sleep(0.05)
        with lock:
            events.append(("lower", t0, time.perf_counter(), threading.current_thread().name))
        return ref(g, backend)

    def timer(fn, inputs):
        t0 = time.perf_counter()
        fn(*inputs(0))
        events.append(("time", t0, time.perf_counter(), threading.current_thread().name))
        first = sum(e[0] == "time" for e in events) == 1
        return (10.0 if first else 5.0), "fake"  # XLA is timed first

    sel = select(r, p, top=None, timer=timer, lower=lower, verify_trials=1, compile_threads=4)
    assert sel.best is not None and len(sel.passed) == 4, sel.contenders
    lowers = [e for e in events if e[0] == "lower"]
    times = [e for e in events if e[0] == "time"]
    assert len(lowers) == 4 and len(times) == 5  # XLA and four µGraphs
    assert len({e[3] for e in lowers}) > 1  # in several threads
    assert max(e[2] for e in lowers) <= min(e[1] for e in times)  # all ready before timing
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(times))  # one timing at a time


def test_one_launch_forms_are_timed_beside_the_top_not_instead() -> None:
    """A one-launch form (`ONE_LAUNCH`) first of its structure is timed in addition to the
    `top`: the µGraphs timed without it are all still timed."""
    from types import SimpleNamespace

    from mirage_jax.mugraph import ONE_LAUNCH
    from mirage_jax.select import timing_order

    plain = [SimpleNamespace(meta={"structure": s}) for s in "aaab"]
    one = [SimpleNamespace(meta={"structure": s, ONE_LAUNCH: True}) for s in "cc"]
    gs = [plain[0], one[0], one[1], *plain[1:]]
    assert [k for k, _ in timing_order(plain, 3)] == [0, 3, 1]
    assert [k for k, _ in timing_order(gs, 3)] == [0, 1, 5, 3]  # and the first "c" beside
    assert [k for k, _ in timing_order(gs, None)] == [0, 1, 5, 2, 3, 4]


def test_a_large_region_verifies_only_the_fastest_after_timing(monkeypatch):
    """Above `fields.memory.LARGE_TRIAL` the candidates are timed first and verified fastest
    first until one is equal (GPT-2 XL at b=8: one full-size verification instead of five);
    an unequal one that passed the float check is dropped with the reason; nothing is
    verified where no candidate beats XLA."""
    from fields import memory
    from mirage_jax import select as select_mod

    p = program()
    wrong, good = graph(wrong=True), graph()
    r = SearchResult((wrong, good), "exhausted", {})
    right = fake_lower()(good)

    def lower(g, backend="pallas"):  # both compute the right values: only the verifier sees
        fn = lambda *xs: right(*xs)  # noqa: E731
        fn.us = 5.0 if g is wrong else 8.0
        return fn

    def timer(fn, inputs):
        return getattr(fn, "us", 10.0), "fake"

    verified = []
    real = select_mod._verify
    monkeypatch.setattr(select_mod, "_verify", lambda g, *a: verified.append(g) or real(g, *a))
    monkeypatch.setattr(memory, "LARGE_TRIAL", 0)
    sel = select(r, p, tie=0.0, timer=timer, lower=lower, verify_trials=1)
    assert verified == [wrong, good]  # after timing, fastest first
    assert sel.best is good and sel.chosen.verdict.equal
    assert "NotEqual" in sel.contenders[1].error and sel.contenders[1].us == 5.0

    verified.clear()
    slow = lambda fn, inputs: (getattr(fn, "us", 4.0), "fake")  # noqa: E731 (XLA at 4 µs)
    sel = select(r, p, tie=0.0, timer=slow, lower=lower, verify_trials=1)
    assert verified == [] and sel.best is None and "not faster" in sel.reason

    monkeypatch.setattr(memory, "LARGE_TRIAL", 1 << 40)  # a small region: verified first
    sel = select(r, p, tie=0.0, timer=timer, lower=lower, verify_trials=1)
    assert sel.best is good and "not equal" in sel.contenders[1].error
    assert sel.contenders[1].us is None  # dropped before it was timed


def test_random_arrays_are_the_seeds_and_chunked_on_threads():
    """Timing inputs: one draw per seed, the same on every call (several threads fill the
    chunks of a large array), different for another seed, in the asked dtypes."""
    from mirage_jax import select as S

    avals = [((3, 5), "float16"), ((S._CHUNK * 2 + 7,), "float32"), ((4,), "int32"), ((2,), "bool")]
    a = S.random_arrays(avals, 0)
    b = S.random_arrays(avals, 0)
    c = S.random_arrays(avals, 1)
    assert [x.shape for x in a] == [(3, 5), (S._CHUNK * 2 + 7,), (4,), (2,)]
    assert [str(x.dtype) for x in a] == ["float16", "float32", "int32", "bool"]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])
    big = a[1]
    assert abs(float(big.std()) - 0.25) < 0.01 and abs(float(big.mean())) < 0.01
    # the chunks are independent streams, not one chunk repeated
    assert not np.array_equal(big[: S._CHUNK], big[S._CHUNK : 2 * S._CHUNK])


def test_the_function_checks_of_one_program_share_their_input_draws():
    from mirage_jax import function_check as F

    class P:  # a program: only its input avals are read (and its nodes: none reach a sqrt)
        input_avals = (((4, 4), "float16"),)
        nodes = inputs = ()

    p, q = P(), P()
    F.forget_draws()
    first = F._drawn(p, 0)
    assert F._drawn(p, 0) is first  # the subset checks reuse the full check's draw
    other = F._drawn(q, 0)
    assert other is not first and np.array_equal(other[0], first[0])
    assert F._drawn(p, 0) is not first  # another program's draw dropped it
    F.forget_draws()
    assert F._KEPT == []


def test_cost_model_reads_a_viewed_weight_along_its_stored_rows() -> None:
    """A GEMV tile of 4 columns over the whole K is narrow rows of a (K, N) weight, but whole
    rows of one stored (N, K) and read as its transpose (equinox): the cost model charges the
    view's tile less (`cost.stored_axes` gives the contiguous axis)."""
    from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder
    from mirage_jax.search.cost import estimate

    b = BlockGraphBuilder(grid=(256,), forloop_range=1)
    x = b.input((1, 2816), "float16", imap=(None,))
    w = b.input((2816, 1024), "float16", imap=(1,))
    b.output(b.op("accum_sum", b.op("matmul", x, w)), (1,))
    mb = MuGraphBuilder()
    ins = [mb.input((1, 2816), "float16"), mb.input((2816, 1024), "float16")]
    g = mb.build(mb.graph_defined(ins, b.build()))
    row_major, viewed = estimate(g), estimate(g, contiguous={1: 0})
    assert viewed.bytes < row_major.bytes and viewed.seconds < row_major.seconds


def test_a_slow_winner_is_timed_again_with_more_warps_only():
    """Past `SMALL_TUNING_US`, the winner is tuned with `TUNED_WARPS` alone: 2 warps and loop
    splits won only on small decode kernels, and their compiles cost 7B blocks their first
    call's time."""
    from mirage_jax.lower.kernel_graph import WARPS
    from mirage_jax.tuning import SMALL_TUNING_US, TUNED_WARPS

    r = SearchResult((graph(),), "exhausted", {})
    lowered = []

    def lower(g, backend="pallas"):
        lowered.append(g.meta.get(WARPS))
        fn = fake_lower()(g, backend)
        fn.us = SMALL_TUNING_US + (1.0 if g.meta.get(WARPS) else 5.0)
        return fn

    def timer(fn, inputs):
        return getattr(fn, "us", 100.0), "fake"

    sel = select(r, program(), tie=0.0, timer=timer, lower=lower, tune_warps=True)
    assert lowered == [None, TUNED_WARPS] and sel.best.meta[WARPS] == TUNED_WARPS


def test_a_winner_far_slower_than_xla_is_not_tuned():
    """Past `TUNE_WITHIN` times XLA's time no variant is timed (their compiles cost the first
    call, and none has gained that much)."""
    from mirage_jax.lower.kernel_graph import WARPS
    from mirage_jax.tuning import TUNE_WITHIN

    r = SearchResult((graph(),), "exhausted", {})
    lowered = []

    def lower(g, backend="pallas"):
        lowered.append(g.meta.get(WARPS))
        fn = fake_lower()(g, backend)
        fn.us = 10.0 * TUNE_WITHIN + 1.0
        return fn

    def timer(fn, inputs):
        return getattr(fn, "us", 10.0), "fake"

    sel = select(r, program(), tie=0.0, timer=timer, lower=lower, tune_warps=True)
    assert lowered == [None] and sel.best is None  # XLA kept, nothing tuned


def _select_with_a_wide_variant(monkeypatch, base_us: float, wide_us: float, **kw):
    """`select` over one µGraph and its `wide_variants` variant (faked: the same µGraph, meta
    "variant"), timed at `base_us` and `wide_us` against XLA's 10 µs; (selection, the
    variants `_verify` was called on, the variant)."""
    import mirage_jax.select as S
    from mirage_jax import tuning
    from mirage_jax.mugraph import MuGraph

    base = graph()
    wide = MuGraph(base.ops, base.outputs, {**base.meta, "variant": "wide"})
    monkeypatch.setattr(
        tuning, "wide_variants", lambda g, backend, contiguous=None: [("wide", wide)]
    )
    verified = []
    real = S._verify
    monkeypatch.setattr(
        S, "_verify", lambda g, *a: verified.append(g.meta.get("variant")) or real(g, *a)
    )

    def lower(g, backend="pallas"):
        fn = fake_lower()(g, backend)
        fn.us = wide_us if g.meta.get("variant") else base_us
        return fn

    def timer(fn, inputs):
        return getattr(fn, "us", 10.0), "fake"

    r = SearchResult((base,), "exhausted", {})
    sel = select(
        r, program(), tie=0.0, timer=timer, lower=lower, tune_warps=True, verify_trials=1, **kw
    )
    return sel, verified, wide


def test_a_winning_variant_at_other_numbers_is_verified_after_timing(monkeypatch):
    """A `wide_variants` µGraph is timed unverified (its full-size verification costs seconds
    at 7B); where it wins, it is verified then, and keeps the verdict."""
    sel, verified, _ = _select_with_a_wide_variant(monkeypatch, 8.0, 5.0)
    assert sel.best.meta.get("variant") == "wide" and sel.chosen.us == 5.0
    assert sel.chosen.verdict is not None and sel.chosen.verdict.equal
    assert verified.count("wide") == 1 and verified[-1] == "wide"  # once, after the timing


def test_a_variant_timed_unverified_that_comes_close_is_verified_as_the_runner_up(monkeypatch):
    """A `wide_variants` µGraph that loses to XLA narrowly is verified before it is returned
    as the runner-up: a runner-up without a verdict was dropped where the outcome is stored
    (`regions.search_region`), so the whole-function check never tried it (equinox 7B's
    down projection on the H200, 2026-11-29: 27.18 µs against XLA's 26.21)."""
    sel, verified, wide = _select_with_a_wide_variant(monkeypatch, 12.0, 10.5, near=0.1)
    assert sel.chosen is None and sel.runner_up is wide
    assert sel.runner_up_contender.verdict is not None and sel.runner_up_contender.verdict.equal
    assert "wide" in verified and "runner-up" in sel.reason


def test_a_close_runner_up_of_another_structure_is_tuned_too():
    """The fastest µGraph of another structure within `RETUNE_WITHIN` of the winner is tuned as
    well, and its variant may win (gqa_stable b=16 on the H100: split-KV lost at 4 warps, won
    at 8); one further behind, or of the winner's structure, is not tuned."""
    from mirage_jax.lower.kernel_graph import WARPS
    from mirage_jax.tuning import RETUNE_WITHIN, TUNED_WARPS

    def run(graphs, us):
        lowered = []

        def lower(g, backend="pallas"):
            lowered.append((g.meta["structure"], g.meta.get(WARPS)))
            fn = fake_lower()(g, backend)
            fn.us = us[g.meta["structure"], g.meta.get(WARPS)]
            return fn

        def timer(fn, inputs):
            return getattr(fn, "us", 100.0), "fake"  # XLA: 100 µs

        r = SearchResult(tuple(graphs), "exhausted", {})
        sel = select(r, program(), tie=0.0, timer=timer, lower=lower, tune_warps=True)
        return sel, sorted(lowered, key=str)

    one, split = structured(graph(), "one kernel"), structured(graph(), "split")
    fast_at_8 = {("one kernel", None): 30.0, ("one kernel", TUNED_WARPS): 33.0}
    fast_at_8 |= {("split", None): 35.0, ("split", TUNED_WARPS): 28.0}
    sel, lowered = run([one, split], fast_at_8)
    assert lowered == sorted(
        [("one kernel", None), ("split", None), ("one kernel", 8), ("split", 8)], key=str
    )
    assert sel.best.meta["structure"] == "split" and sel.best.meta[WARPS] == TUNED_WARPS
    assert sel.chosen.us == 28.0

    far = dict(fast_at_8)
    far["split", None] = 30.0 * RETUNE_WITHIN + 1.0
    sel, lowered = run([one, split], far)
    assert ("split", TUNED_WARPS) not in lowered and sel.best.meta["structure"] == "one kernel"

    same = {("one kernel", None): 30.0, ("one kernel", TUNED_WARPS): 33.0}
    sel, lowered = run([one, structured(graph(), "one kernel")], same)
    assert lowered.count(("one kernel", TUNED_WARPS)) == 1  # the winner's alone


def test_tuning_bases_are_the_fastest_and_a_close_other_structure() -> None:
    from mirage_jax.tuning import RETUNE_WITHIN, tuning_bases

    a, b, c = (structured(graph(), s) for s in ("a", "b", "a"))
    assert tuning_bases([]) == []
    assert tuning_bases([(10.0, a)]) == [0]
    assert tuning_bases([(12.0, b), (10.0, a), (11.0, c)]) == [1, 0]  # c: a's structure
    assert tuning_bases([(10.0 * RETUNE_WITHIN + 0.1, b), (10.0, a)]) == [1]
