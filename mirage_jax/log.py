"""The `mirage_jax` logger: what the search and the selection decided, and why.

Off unless asked for. `MIRAGE_JAX_LOG=info` prints to stderr one line per region when a
function is traced (kernel or XLA, why; for a region searched now the search's stop reason and
time, how many candidates were checked and timed, and the winner's and XLA's times where
measured) and the whole-function check's outcome; `MIRAGE_JAX_LOG=debug` adds every candidate
with its time or why it was dropped. `logging.getLogger("mirage_jax")` is an ordinary logger:
attach handlers and set levels as for any other.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

LOG_ENV = "MIRAGE_JAX_LOG"
logger = logging.getLogger("mirage_jax")
logger.addHandler(logging.NullHandler())


def configure_from_env() -> None:
    """Apply `MIRAGE_JAX_LOG` (debug, info, warning, error; unset: nothing printed)."""
    name = os.environ.get(LOG_ENV, "").strip()
    if not name:
        return
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        from mirage_jax._env import warn_once

        warn_once(
            "log-env",
            f"{LOG_ENV}={name!r} is not a logging level; use debug, info, warning or error",
        )
        return
    if not any(getattr(h, "mirage_jax_env", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("mirage_jax %(levelname)s: %(message)s"))
        handler.mirage_jax_env = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        # printed here once: not again by a root handler another library configured (tokamax
        # in the same process printed every line twice)
        logger.propagate = False
    logger.setLevel(level)


def times(t: Mapping[str, Any] | None) -> str:
    """' (µGraph X µs, XLA Y µs)' from a decision's timings, or '' when nothing was timed."""
    t = t or {}
    parts = [
        f"{label} {t[key]:.2f} µs"
        for key, label in (("mugraph_us", "µGraph"), ("xla_us", "XLA"))
        if isinstance(t.get(key), (int, float))
    ]
    return f" ({', '.join(parts)})" if parts else ""


STOPS = {
    "exhausted": "the search space was exhausted",
    "no-candidates": "the search space was exhausted",
    "time": "the time budget ran out",
    "candidates": "the candidate limit was reached",
}


def search_summary(t: Mapping[str, Any] | None) -> str:
    """How a region's search ended and what the selection checked, from its timings, e.g.
    'search: 1.4 s, the search space was exhausted: 12 verified µGraph(s) from 3 structure(s);
    selection: 1.9 s, 1 candidate checked, none timed (no GPU)'; '' when there was no search."""
    t = t or {}
    if not isinstance(t.get("search_s"), (int, float)):
        return ""
    line = f"search: {t['search_s']:.1f} s"
    phases = t.get("search_phases_s") or {}
    slow = sorted(
        ((v, k) for k, v in phases.items() if k != "total" and isinstance(v, (int, float))),
        reverse=True,
    )[:2]
    if slow and slow[0][0] >= 1.0:  # where a search of seconds spent them
        line += " (" + ", ".join(f"{k} {v:.1f} s" for v, k in slow if v >= 0.1) + ")"
    if t.get("stop"):  # entries stored before it was recorded have none
        line += f", {STOPS.get(str(t['stop']), str(t['stop']))}"
    line += f": {t['search']}" if t.get("search") else ""
    if isinstance(t.get("candidates"), int):
        n, timed = t["candidates"], t.get("timed") or 0
        no_gpu = " (no GPU)" if t.get("device") == "cpu" else ""
        line += f"; selection: {float(t.get('select_s') or 0):.1f} s, "
        line += f"{n} candidate{'' if n == 1 else 's'} checked, "
        line += f"{timed} timed against XLA" if timed else f"none timed{no_gpu}"
    return line


def region_line(name: str, d: Any) -> str:
    """The info line of one region's decision (`RegionDecision`)."""
    line = f"{name} region {d.index}: {d.status}: {d.reason}{times(d.timings)}"
    summary = search_summary(d.timings) if d.source == "search" else ""
    return f"{line}; {summary}" if summary else line
