"""The `mirage_jax` logger: one line per region at info level, switched on by MIRAGE_JAX_LOG."""

from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import pytest

import mirage_jax
from mirage_jax import log


def test_info_names_each_region_and_why(caplog) -> None:
    def f(x, w):
        return jax.nn.silu(x @ w)

    x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
    with caplog.at_level(logging.INFO, logger="mirage_jax"):
        mirage_jax.jit(f, search="off", cache=False)(x, w)
    lines = [r.getMessage() for r in caplog.records if r.name == "mirage_jax"]
    assert any("f region 0: xla: search='off'" in m for m in lines), lines


def test_debug_shows_the_search_and_the_candidates(caplog, tmp_path) -> None:
    def f(x, w):
        return x @ w

    x, w = jnp.ones((16, 16)), jnp.ones((16, 16))
    with caplog.at_level(logging.DEBUG, logger="mirage_jax"):
        mirage_jax.jit(f, backend="pallas-interpret", cache=tmp_path / "c.sqlite", workers=1)(x, w)
    lines = [r.getMessage() for r in caplog.records if r.name == "mirage_jax"]
    assert any(" search: " in m and "µGraph(s) in" in m for m in lines), lines
    assert any(" candidate mugraph[0]: " in m for m in lines), lines


def test_info_gives_the_search_stop_reason_candidates_and_times(caplog, tmp_path) -> None:
    """Issue 17: at info level a searched region says how the search stopped and how long it
    took, what the selection checked and timed, and the winner; `explain` says the same."""

    def f(x, w):
        return x @ w

    x, w = jnp.ones((16, 16)), jnp.ones((16, 16))
    fast = mirage_jax.jit(f, backend="pallas-interpret", cache=tmp_path / "c.sqlite", workers=1)
    with caplog.at_level(logging.INFO, logger="mirage_jax"):
        fast(x, w)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    line = next(m for m in lines if m.startswith("f region 0: kernel: "))
    # the phases' breakdown, "(enumerate 0.2 s, ...)", is given where the search took long
    # enough for it (a loaded machine): either form
    stop = r"; search: [0-9.]+ s( \([^)]*\))?, the search space was exhausted: "
    assert re.search(stop, line), line
    assert "; selection: " in line and "1 candidate checked, none timed (no GPU)" in line, line
    text = str(mirage_jax.explain(fast, x, w))
    assert "\n  when stored: search: " in text, text  # a cache hit: the search was earlier
    assert log.search_summary({"xla_us": 3.0}) == ""
    older = {"search_s": 0.5, "search": "12 verified µGraph(s)"}  # stored without "stop"
    assert log.search_summary(older) == "search: 0.5 s: 12 verified µGraph(s)"
    timed = {"search_s": 9.0, "stop": "time", "candidates": 4, "timed": 4, "select_s": 2.0}
    assert log.search_summary(timed) == (
        "search: 9.0 s, the time budget ran out; selection: 2.0 s, 4 candidates checked, "
        "4 timed against XLA"
    )
    phases = {"enumerate": 8.6, "numbers": 18.3, "verify_full": 56.6, "total": 81.5}
    assert log.search_summary({**timed, "search_phases_s": phases}).startswith(
        "search: 9.0 s (verify_full 56.6 s, numbers 18.3 s), the time budget ran out"
    )


def test_the_environment_switches_it_on(monkeypatch) -> None:
    monkeypatch.setenv(log.LOG_ENV, "debug")
    before = list(log.logger.handlers)
    try:
        log.configure_from_env()
        log.configure_from_env()  # once: no second handler
        added = [h for h in log.logger.handlers if h not in before]
        assert len(added) == 1 and log.logger.level == logging.DEBUG
        # a root handler configured by someone else does not print the lines a second time
        seen: list[logging.LogRecord] = []
        root = logging.Handler()
        root.emit = seen.append  # type: ignore[method-assign]
        logging.getLogger().addHandler(root)
        try:
            log.logger.info("one line")
        finally:
            logging.getLogger().removeHandler(root)
        assert seen == []
    finally:
        for h in log.logger.handlers:
            if h not in before:
                log.logger.removeHandler(h)
        log.logger.setLevel(logging.NOTSET)
        log.logger.propagate = True


def test_a_wrong_level_says_so(monkeypatch) -> None:
    monkeypatch.setenv(log.LOG_ENV, "loud")
    with pytest.warns(mirage_jax.MirageWarning, match="not a logging level"):
        log.configure_from_env()


def test_a_cached_xla_decision_keeps_its_reason(tmp_path) -> None:
    """A region stored as XLA says why on the next process's cache hit (here: the search found
    nothing for shifted scores left unnormalised, whose value depends on the max that only
    a softmax's normalisation cancels), not that a µGraph was beaten."""

    def f(q, k):
        s = q @ (2.0 * k).T
        return jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))

    q, k = jnp.ones((16, 32)), jnp.ones((16, 32))
    cache = tmp_path / "c.sqlite"
    first = mirage_jax.jit(f, backend="pallas-interpret", cache=cache, workers=1, budget_s=5)
    first(q, k)
    stored = {d.index: d.reason for d in first.last.decisions if d.status == "xla"}
    assert any("no µGraph found" in r for r in stored.values()), stored
    again = mirage_jax.jit(f, backend="pallas-interpret", cache=cache, workers=1, budget_s=5)
    again(q, k)
    hits = [d for d in again.last.decisions if d.status == "xla" and d.source == "cache"]
    assert hits, again.last.decisions
    for d in hits:
        assert d.reason == "cached: " + stored[d.index].removeprefix("search: "), d.reason
