"""The `mirage_jax` logger: what the search and the selection decided, and why.

Off unless asked for. `MIRAGE_JAX_LOG=info` prints to stderr one line per region when a
function is traced (kernel or XLA, why, the µGraph's and XLA's times where measured) and the
whole-function check's outcome; `MIRAGE_JAX_LOG=debug` adds each search's stop reason and
every candidate the selection timed. `logging.getLogger("mirage_jax")` is an ordinary logger:
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
