"""The whole-function check's value comparison: the assembled function against jax.jit."""

from __future__ import annotations

import numpy as np

from mirage_jax.function_check import FunctionCheck, best_subset, compare, short_of_wins


def test_compare_accepts_summation_order_noise() -> None:
    w = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert compare([w + 1e-5], [w]) is None
    assert compare([w.astype(np.float16)], [w.astype(np.float16)]) is None


def test_compare_names_what_differs() -> None:
    w = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert "max error" in compare([w.T], [w])
    assert "shape" in compare([w[:4]], [w])
    assert "outputs" in compare([w, w], [w])
    nan = w.copy()
    nan[0, 0] = np.nan
    assert "non-finite" in compare([w], [nan])
    assert compare([nan], [nan]) is None
    assert "differ" in compare([np.arange(4)], [np.arange(4)[::-1]])


def test_a_mismatch_is_the_reason_and_survives_the_cache() -> None:
    c = FunctionCheck("xla", 1.0, 2.0, "m", "measured", "output 0: max error 3")
    assert "values differ" in c.reason
    back = FunctionCheck.from_timings(c.timings())
    assert back.mismatch == c.mismatch and back.choice == "xla"


def _fake(times: dict[frozenset[int], float], xla_us: float, calls: list):
    """A check that answers from a table of kernel-set timings, recording what it was asked."""

    def check(subset: frozenset[int]) -> FunctionCheck:
        calls.append(subset)
        us = times.get(subset, 2 * xla_us)  # a set not in the table: slower than XLA
        return FunctionCheck("kernels" if us < xla_us else "xla", us, xla_us, "fake")

    return check


def test_a_winning_full_set_is_kept_without_subsets() -> None:
    calls: list = []
    full = FunctionCheck("kernels", 40.0, 50.0, "fake")
    assert best_subset([0, 1], _fake({}, 50.0, calls), full) == (frozenset({0, 1}), full)
    assert calls == []


def test_the_kernel_that_costs_the_function_is_left_out() -> None:
    # kernel 2 loses more across its cut than it wins: without it the function is faster
    t = {frozenset({0, 1}): 45.0, frozenset({0, 2}): 58.0, frozenset({1, 2}): 57.0}
    calls: list = []
    full = FunctionCheck("xla", 52.0, 50.0, "fake")
    subset, c = best_subset([0, 1, 2], _fake(t, 50.0, calls), full)
    assert subset == frozenset({0, 1}) and c.kernels_us == 45.0
    assert sorted(map(sorted, calls)) == [[0, 1], [0, 2], [1, 2]]


def test_every_kernel_whose_removal_helped_is_dropped_together() -> None:
    t = {
        frozenset({1, 2}): 51.0,  # without 0: better than all (53) but still behind XLA
        frozenset({0, 2}): 51.5,  # without 1: the same
        frozenset({0, 1}): 60.0,
        frozenset({2}): 47.0,  # without both: the winner
    }
    calls: list = []
    full = FunctionCheck("xla", 53.0, 50.0, "fake")
    subset, c = best_subset([0, 1, 2], _fake(t, 50.0, calls), full)
    assert subset == frozenset({2}) and c.kernels_us == 47.0
    assert calls[-1] == frozenset({2})


def test_no_subset_when_none_beats_xla_or_values_differ() -> None:
    t = {frozenset({0}): 55.0, frozenset({1}): 56.0}
    full = FunctionCheck("xla", 54.0, 50.0, "fake")
    assert best_subset([0, 1], _fake(t, 50.0, []), full) is None
    calls: list = []
    assert best_subset([0], _fake(t, 50.0, calls), full) is None and calls == []


def test_the_kernel_whose_values_differ_is_found_and_left_out() -> None:
    """Values differ with all kernels: the sets without one are checked, and the fastest that
    matches jax.jit and beats it runs; with one kernel, or where every set differs, none."""
    wrong = FunctionCheck("xla", 40.0, 50.0, "fake", mismatch="output 0: max error 3")
    good = {frozenset({0, 2}): 44.0}

    def check(subset: frozenset[int]) -> FunctionCheck:
        calls.append(subset)
        if 1 in subset:  # kernel 1 is unfaithful: every set with it differs
            return wrong
        us = good.get(subset, 60.0)
        return FunctionCheck("kernels" if us < 50.0 else "xla", us, 50.0, "fake")

    calls: list = []
    subset, c = best_subset([0, 1, 2], check, wrong)
    assert subset == frozenset({0, 2}) and c.kernels_us == 44.0 and c.mismatch is None
    assert sorted(map(sorted, calls)) == [[0, 1], [0, 2], [1, 2]]
    calls.clear()
    assert best_subset([1], check, wrong) is None and calls == []
    assert best_subset([0, 1], lambda s: wrong, wrong) is None


def test_kernels_that_cost_time_go_with_the_one_whose_values_differ() -> None:
    """Gemma 7B b=8's shape: kernel 1 is unfaithful, kernels 1 and 2 both cost the function
    time and kernel 4 wins it. Leaving out 1 or 2 each made the function faster (one set with
    values that differ), so the set without both is checked, and runs."""
    times = {
        frozenset({1, 2, 4}): 452.0,
        frozenset({2, 4}): 440.0,
        frozenset({1, 4}): 310.0,
        frozenset({1, 2}): 520.0,
        frozenset({4}): 296.0,
    }

    def check(subset: frozenset[int]) -> FunctionCheck:
        us = times[subset]
        differ = "output 0: max error 3" if 1 in subset else None
        return FunctionCheck("kernels" if us < 427.0 and not differ else "xla", us, 427.0,
                             "fake", mismatch=differ)  # fmt: skip

    full = check(frozenset({1, 2, 4}))
    subset, c = best_subset([1, 2, 4], check, full)
    assert subset == frozenset({4}) and c.kernels_us == 296.0


def test_a_subset_whose_values_differ_stops_the_search() -> None:
    def check(subset: frozenset[int]) -> FunctionCheck:
        return FunctionCheck("xla", 10.0, 50.0, "fake", mismatch="output 0: max error 1")

    assert best_subset([0, 1], check, FunctionCheck("xla", 52.0, 50.0, "fake")) is None


def test_leave_one_out_is_capped() -> None:
    calls: list = []
    kernels = list(range(9))
    t = {frozenset(kernels) - {k}: 60.0 for k in kernels}
    full = FunctionCheck("xla", 55.0, 50.0, "fake")
    assert best_subset(kernels, _fake(t, 50.0, calls), full, max_tries=4) is None
    assert len(calls) == 4


def test_a_marginal_kernel_that_costs_the_winning_function_is_left_out() -> None:
    """All kernels win, but the one that wins its region by a hair (a suspect) costs XLA a
    fusion: without it the function is faster by more than `KEEP_ALL_TIE`."""
    t = {frozenset({0, 1}): 35.0, frozenset({0, 2}): 37.5}
    calls: list = []
    full = FunctionCheck("kernels", 37.2, 39.3, "fake")
    subset, c = best_subset([0, 1, 2], _fake(t, 39.3, calls), full, suspects=[2])
    assert subset == frozenset({0, 1}) and c.kernels_us == 35.0
    # left out, tried back, then each other kernel left out (none helps)
    assert calls == [frozenset({0, 1}), frozenset({0, 1, 2}), frozenset({1}), frozenset({0})]
    # within the tie, all kernels stay
    t = {frozenset({0, 1}): 37.0}
    assert best_subset([0, 1, 2], _fake(t, 39.3, []), full, suspects=[2]) == (
        frozenset({0, 1, 2}),
        full,
    )


def test_where_all_won_slow_checks_stop_after_the_suspects_are_left_out() -> None:
    """All kernels won; three are suspects (as for Llama-7B b=1 on the H100, 2026-11-25, where
    each check is a whole-function compile and timing of seconds): the set without all three
    is measured, and none is tried back once `ADD_BACK_S` have passed."""
    from mirage_jax.function_check import ADD_BACK_S

    t = {frozenset({0}): 215.0}
    calls: list = []
    now = [0.0]

    def slow(subset: frozenset[int]) -> FunctionCheck:
        now[0] += ADD_BACK_S + 1.0  # each check takes more than the whole allowance
        return _fake(t, 237.4, calls)(subset)

    full = FunctionCheck("kernels", 220.4, 237.4, "fake")
    got = best_subset([0, 2, 6, 7], slow, full, suspects=[2, 6, 7], clock=lambda: now[0])
    assert got is not None and got[0] == frozenset({0}) and calls == [frozenset({0})]


def test_where_all_won_a_suspect_that_helps_comes_back() -> None:
    """Llama nnx b=8's shape (H100, 2026-11-26): four GEMM kernels won their regions, but the
    function is faster without all four; with quick checks they are tried back one at a time
    and the one that helps stays."""
    t = {
        frozenset({3}): 42.67,
        frozenset({3, 9}): 41.5,  # helps
        frozenset({3, 9, 0}): 42.3,  # hurts
        frozenset({3, 9, 8}): 41.6,  # within the tie
    }
    calls: list = []
    full = FunctionCheck("kernels", 44.70, 47.28, "fake")
    got = best_subset([0, 2, 3, 8, 9], _fake(t, 47.28, calls), full, suspects=[9, 0, 8, 2])
    assert got is not None and got[0] == frozenset({3, 9}) and got[1].kernels_us == 41.5
    assert calls[:2] == [frozenset({3}), frozenset({3, 9})] and len(calls) == 6
    assert calls[-1] == frozenset({9})  # the attention left out too: worse, so kept


def test_where_all_won_a_clear_winner_that_costs_the_function_is_left_out() -> None:
    """Llama nnx b=8's shape (H100, 2026-11-26): the norm + QKV kernel (region 0) wins its
    region clearly (7.6 against 9.7 µs), so it is no suspect, but the function is faster
    without it; with quick checks the kernels are left out one at a time, smallest region win
    first, and that one goes."""
    t = {
        frozenset({0, 2, 3}): 41.44,  # without the suspects 8, 9: slower than all
        frozenset({2, 3, 8, 9}): 38.85,  # without 0: faster
    }
    calls: list = []
    full = FunctionCheck("kernels", 40.42, 47.54, "fake")
    wins = {0: 2.1, 2: 3.5, 3: 2.8, 8: 0.5, 9: 0.5}
    got = best_subset([0, 2, 3, 8, 9], _fake(t, 47.54, calls), full, suspects=[9, 8], wins=wins)
    assert got is not None and got[0] == frozenset({2, 3, 8, 9}) and got[1].kernels_us == 38.85
    assert calls[:2] == [frozenset({0, 2, 3}), frozenset({2, 3, 8, 9})]


def test_where_all_won_kernels_timed_in_context_are_left_out_first() -> None:
    """Gemma b=1's shape (H100, 2026-11-26): the norm + QKV kernel, timed in context (its
    weights stored (heads, D, head_dim)), wins its region by the most (8.9 against 20.9 µs)
    yet the function is faster without it (40.5 against 49.2 µs); smallest win first, it came
    last and the allowance could end before it. Regions timed in context go first."""
    t = {frozenset({0, 3, 4, 9}): 40.51}
    calls: list = []
    full = FunctionCheck("kernels", 49.23, 55.63, "fake")
    wins = {0: 3.7, 1: 11.9, 3: 2.8, 4: 0.85, 9: 8.2}
    fake = _fake(t, 55.63, calls)
    got = best_subset([0, 1, 3, 4, 9], fake, full, suspects=[4], wins=wins, first=[1])
    assert got is not None and got[0] == frozenset({0, 3, 4, 9}) and got[1].kernels_us == 40.51
    assert calls[1] == frozenset({0, 3, 4, 9})  # after the set without the suspect
    calls.clear()
    best_subset([0, 1, 3, 4, 9], fake, full, suspects=[4], wins=wins)
    assert calls.index(frozenset({0, 3, 4, 9})) == len(calls) - 1  # smallest win first: last


def test_a_function_short_of_its_region_wins_is_searched_without_suspects() -> None:
    """Gemma b=1 on the H100, 2026-11-26: five kernels won their regions by 29.3 µs in all,
    none narrowly, and the function ran 49.57 µs against jax.jit's 56.45: its norm + QKV kernel
    (timed in context) is left out first, and the function runs faster without it."""
    t = {frozenset({1, 3, 4, 9}): 40.5}
    calls: list = []
    full = FunctionCheck("kernels", 49.57, 56.45, "fake")
    wins = {0: 3.87, 1: 11.65, 3: 3.07, 4: 1.95, 9: 8.72}
    assert short_of_wins(full, wins)
    fake = _fake(t, 56.45, calls)
    got = best_subset([0, 1, 3, 4, 9], fake, full, wins=wins, first=[0], clock=lambda: 0.0)
    assert got is not None and got[0] == frozenset({1, 3, 4, 9}) and got[1].kernels_us == 40.5
    assert calls[0] == frozenset({1, 3, 4, 9})
    # a function that gained what its regions did is not searched
    calls.clear()
    near = FunctionCheck("kernels", 30.0, 56.45, "fake")
    assert not short_of_wins(near, wins)
    assert best_subset([0, 1, 3, 4, 9], fake, near, wins=wins) == (frozenset({0, 1, 3, 4, 9}), near)
    assert calls == []


def test_small_cuts_that_cost_together_are_left_out_together() -> None:
    """All kernels lose together, and leaving any one out would not help: small kernels
    (suspects) each cost XLA a fusion (equinox b=1 on the H100, 2026-11-25: nine kernels 45.1
    against jax.jit's 39.1 µs). The set without every suspect is measured first, and wins;
    each suspect is then added back, and none helps."""
    t = {frozenset({0, 1}): 35.0}
    calls: list = []
    full = FunctionCheck("xla", 45.0, 39.0, "fake")
    got = best_subset([0, 1, 2, 3, 4], _fake(t, 39.0, calls), full, suspects=[2, 3, 4])
    assert got is not None and got[0] == frozenset({0, 1}) and got[1].kernels_us == 35.0
    assert calls == [frozenset({0, 1}), *(frozenset({0, 1, k}) for k in (2, 3, 4))]


def test_a_suspect_that_helps_is_added_back() -> None:
    """Of the suspects left out, the one whose kernel helps the function comes back (a down
    projection + residual beside RoPE pieces that cost their cuts)."""
    t = {
        frozenset({0, 1}): 37.6,
        frozenset({0, 1, 10}): 36.5,  # helps
        frozenset({0, 1, 10, 6}): 38.0,  # hurts
        frozenset({0, 1, 10, 12}): 35.7,  # helps again
    }
    calls: list = []
    full = FunctionCheck("xla", 45.1, 39.9, "fake")
    got = best_subset([0, 1, 6, 10, 12], _fake(t, 39.9, calls), full, suspects=[10, 6, 12])
    assert got is not None and got[0] == frozenset({0, 1, 10, 12}) and got[1].kernels_us == 35.7
    assert len(calls) == 4


def test_where_the_core_loses_leave_one_out_runs() -> None:
    """The set without the suspects loses too: the leave-one-out search runs as before."""
    t = {frozenset({1, 2}): 38.0}
    calls: list = []
    full = FunctionCheck("xla", 45.0, 39.0, "fake")
    got = best_subset([0, 1, 2], _fake(t, 39.0, calls), full, suspects=[2])
    assert got is not None and got[0] == frozenset({1, 2})
    assert calls[0] == frozenset({0, 1}) and frozenset({1, 2}) in calls


def test_marginal_kernels_come_from_their_region_times() -> None:
    from types import SimpleNamespace

    from mirage_jax.function_check import marginal

    def d(i, status, mine, xla):
        return SimpleNamespace(index=i, status=status, timings={"mugraph_us": mine, "xla_us": xla})

    ds = [
        d(0, "kernel", 3.44, 7.35),  # a clear win
        d(1, "kernel", 1.06, 1.12),  # 0.06 µs: marginal
        d(2, "kernel", 40.0, 43.0),  # 3 µs but 7%: marginal
        d(3, "xla", 1.0, 2.0),  # not a kernel
        SimpleNamespace(index=4, status="kernel", timings=None),  # not timed (no GPU)
        d(5, "kernel", 8.27, 9.34),  # 11% but 1.07 µs: marginal
        d(6, "kernel", 10.0, 12.0),  # 2 µs and 17%: a clear win
    ]
    assert marginal(ds) == [2, 5, 1]  # the largest win first


def test_kernels_within_the_tie_run_as_jax_jit(monkeypatch) -> None:
    """`measure`: the assembled function is kept only if faster than jax.jit by more than
    `FUNCTION_TIE`; a gain inside it runs the function itself (never slower by noise)."""
    import jax.numpy as jnp

    import lax_ir
    from mirage_jax import function_check, profile

    program = lax_ir.capture(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 8), jnp.float32))

    def assembled(xs):
        return list(lax_ir.evaluate(program, *xs))

    class T:
        def __init__(self, us):
            self.median_us = us

    for mine, want in ((99.5, "xla"), (98.9, "kernels"), (100.5, "xla")):
        times = iter([100.0, mine])  # jax.jit first, then the function with kernels
        monkeypatch.setattr(profile, "time_trace", lambda fn, inputs, calls, t=times: T(next(t)))
        got = function_check.measure(program, assembled)
        assert got.choice == want, (mine, got)
        assert got.kernels_us == mine and got.xla_us == 100.0
        if want == "xla":
            assert "not faster by 1%" in got.reason


def test_a_check_is_measured_once_then_recalled_from_the_memo_and_the_cache(
    tmp_path, monkeypatch
) -> None:
    """`checked`: measured (eagerly) the first time and stored; the same memo recalls it; a
    new memo (another function object) finds it in the cache with both times."""
    import jax.numpy as jnp

    import lax_ir
    from mirage_jax import function_check
    from mirage_jax.cache import Cache

    program = lax_ir.capture(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 8), jnp.float32))
    calls = []

    def measure(program, assembled, seed=0, calls_=30, xla_us=None):
        calls.append(xla_us)
        return FunctionCheck("kernels", 80.0, 100.0, "fake", "measured", None)

    monkeypatch.setattr(function_check, "measure", measure)
    cache = Cache(tmp_path / "c.sqlite")
    memo: dict = {}
    args = (program, ["k1", "k2"], lambda xs: xs, "triton")
    first = function_check.checked(*args, cache=cache, memo=memo, xla_us=100.0)
    assert first.choice == "kernels" and calls == [100.0]
    assert function_check.checked(*args, cache=cache, memo=memo) is first
    again = function_check.checked(*args, cache=cache, memo={})
    assert again.source == "cache" and (again.kernels_us, again.xla_us) == (80.0, 100.0)
    assert calls == [100.0]  # measured once
    other = function_check.checked(program, ["k1"], lambda xs: xs, "triton", cache=cache, memo={})
    assert other is not None and len(calls) == 2  # other kernels: another check


def test_the_checks_of_one_program_compile_jax_jit_once(monkeypatch) -> None:
    """Each subset check compares with jax.jit's outputs and times against its time: the jitted
    function and its outputs are kept for the program's checks (a fresh `jax.jit` compiled the
    7B blocks again, GEMM autotuning included, for every check) and dropped after them."""
    import jax.numpy as jnp

    import lax_ir
    from mirage_jax import function_check, profile

    program = lax_ir.capture(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 8), jnp.float32))
    traced = []

    def as_fun(jaxpr):  # a new function each time, as `jaxpr_as_fun` returns
        def fn(x):
            traced.append(1)  # runs once per compile
            return [jnp.tanh(x) * 2.0]

        return fn

    monkeypatch.setattr(function_check.jex_core, "jaxpr_as_fun", as_fun)

    class T:
        median_us = 10.0

    monkeypatch.setattr(profile, "time_trace", lambda fn, inputs, calls: T())
    function_check.forget_draws()
    for _ in range(3):
        got = function_check.measure(program, lambda xs: [jnp.tanh(xs[0]) * 2.0], xla_us=20.0)
        assert got.mismatch is None and got.choice == "kernels"
    assert len(traced) == 1
    function_check.forget_draws()
    assert function_check._KEPT == []
    function_check.measure(program, lambda xs: [jnp.tanh(xs[0]) * 2.0], xla_us=20.0)
    assert len(traced) == 2
    function_check.forget_draws()


def test_compare_on_device_arrays_as_on_host_ones() -> None:
    import jax.numpy as jnp

    w = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert compare([jnp.asarray(w) + 1e-5], [jnp.asarray(w)]) is None
    assert "max error" in compare([jnp.asarray(w.T)], [jnp.asarray(w)])
    b = jnp.asarray(w, jnp.bfloat16)
    assert compare([b], [b]) is None and "max error" in compare([b.T], [b])
    inf = w.copy()
    inf[1, 2] = -np.inf
    assert compare([jnp.asarray(inf)], [inf]) is None  # the same places
    assert "non-finite" in compare([jnp.asarray(w)], [jnp.asarray(inf)])
    c = (w + 1j * w).astype(np.complex64)
    assert compare([c], [c]) is None and "max error" in compare([c.T], [c])


def test_a_left_out_kernel_says_how_much_xla_grew_around_it() -> None:
    """One kernel left out that won its region alone: the reason gives both whole-function
    times and how much XLA's part grew around it (equinox 7B b=1 on the H200: 163.12 µs with
    all kernels, 138.08 without its gate/up kernel, which ran 50.80 µs against XLA's 57.47:
    31.71 µs more in XLA's part, a projection computed twice)."""
    from types import SimpleNamespace

    from mirage_jax.function_choice import left_out_reason

    full = FunctionCheck("xla", 163.12, 148.98, "fake")
    kept = FunctionCheck("kernels", 138.08, 148.98, "fake")
    gate_up = SimpleNamespace(timings={"mugraph_us": 50.80, "xla_us": 57.47})
    why = left_out_reason(full, kept, [gate_up])
    assert why.startswith(
        "left out by the whole-function check: whole function with kernels 138.08"
    )
    assert "with all kernels 163.12 µs" in why and "grew by 31.71 µs" in why
    two = left_out_reason(full, kept, [gate_up, gate_up])  # not attributable to one
    assert "163.12" in two and "grew" not in two
    bad = FunctionCheck("xla", 163.12, 148.98, "fake", mismatch="output 0: max error 3")
    assert "values differ" in left_out_reason(bad, kept, [gate_up])


def test_a_function_whose_kernels_fail_to_run_runs_as_xla(monkeypatch) -> None:
    """Where the function with the kernels raises (a compile or run error: on the H200 a dot
    algorithm XLA rejects) and jax.jit's runs, the check chooses XLA and says why; it used to
    fail, leaving the kernels in use unchecked."""
    import jax.numpy as jnp

    import lax_ir
    from mirage_jax import function_check, profile

    program = lax_ir.capture(lambda x: jnp.tanh(x) * 2.0, jnp.ones((4, 8), jnp.float32))

    def assembled(xs):
        raise RuntimeError("INVALID_ARGUMENT: Unsupported dot precision algorithm: 4")

    monkeypatch.setattr(profile, "time_trace", lambda fn, inputs, calls: None)  # not timed
    function_check.forget_draws()
    got = function_check.measure(program, assembled, xla_us=20.0)
    function_check.forget_draws()
    assert got.choice == "xla" and got.kernels_us is None
    assert "with the kernels it fails where jax.jit's runs: RuntimeError" in got.reason
    assert "runs as XLA" in got.reason
