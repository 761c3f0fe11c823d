"""`select`: lower the most promising searched µGraphs, time them and XLA, keep the fastest.

The search ranks its µGraphs by the cost model; `select` lowers the first `top` of them with
the chosen backend, checks each against the XLA result in float (a lowering that computes
something else is dropped, never timed), times them and the plain XLA function the same way
(`mirage_jax.profile.time_device`, the chained method, unless a `timer` is given), and returns
the fastest. XLA is a contender and wins ties: a µGraph is chosen only if it is faster than
XLA by more than `tie` (relative).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lax_ir.program import Program
from mirage_jax.mugraph import MuGraph
from mirage_jax.search.driver import SearchResult


@dataclass(frozen=True)
class Contender:
    """One timed candidate: a µGraph (or XLA), its time, or why it was dropped."""

    label: str
    us: float | None
    mugraph: MuGraph | None = None
    error: str = ""
    estimate_us: float | None = None
    max_rel_error: float | None = None


@dataclass(frozen=True)
class Selection:
    """The outcome of `select`.

    Arguments:
        best: the chosen µGraph, or None when XLA is kept.
        reason: why.
        contenders: every candidate considered, XLA first.
        method: how times were measured.
    """

    best: MuGraph | None
    reason: str
    contenders: tuple[Contender, ...] = ()
    method: str = ""
    backend: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def xla_us(self) -> float | None:
        return self.contenders[0].us if self.contenders else None

    def to_json(self) -> str:
        return json.dumps(
            {
                "best": None if self.best is None else self.best.canonical_hash,
                "reason": self.reason,
                "backend": self.backend,
                "method": self.method,
                "contenders": [
                    {
                        "label": c.label,
                        "us": c.us,
                        "estimate_us": c.estimate_us,
                        "error": c.error,
                        "max_rel_error": c.max_rel_error,
                        "structure": None if c.mugraph is None else c.mugraph.meta.get("structure"),
                    }
                    for c in self.contenders
                ],
            },
            sort_keys=True,
        )


def random_inputs(program: Program, seed: int, scale: float = 0.25) -> list[np.ndarray]:
    """Inputs for timing: N(0, scale²) in each input's dtype (small, so exp stays finite)."""
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(shape) * scale).astype(dtype) for shape, dtype in program.input_avals
    ]


def _default_timer(fn: Callable[..., Any], inputs: Callable[[int], Sequence[Any]]):
    from mirage_jax.profile import time_device

    t = time_device(fn, inputs)
    return t.median_us, t.method


def select(
    result: SearchResult,
    program: Program,
    *,
    backend: str = "pallas",
    top: int = 4,
    tie: float = 0.02,
    timer: Callable[[Callable[..., Any], Callable[[int], Sequence[Any]]], Any] | None = None,
    inputs: Callable[[int], Sequence[Any]] | None = None,
    rtol: float = 2e-2,
    lower: Callable[..., Any] | None = None,
) -> Selection:
    """Time the `top` best µGraphs of `result` and XLA; return the fastest (XLA wins ties).

    Arguments:
        result: a `search` result for `program`.
        program: the region (XLA runs it as plain jnp under `jax.jit`).
        backend: the lowering backend ("pallas", "triton", ...).
        top: how many µGraphs (best estimated first) to lower and time.
        tie: a µGraph must beat XLA by more than this fraction.
        timer: `timer(fn, inputs) -> median µs` or `(median µs, method)`; default:
            `mirage_jax.profile.time_device` (device time on a GPU).
        inputs: `seed -> input set`; default `random_inputs(program, seed)`.
        rtol: a lowered µGraph whose float result differs from XLA's by more than this
            (max relative error, normalised by the output's max magnitude) is dropped.
        lower: `lower(mugraph, backend=...) -> fn`; default `mirage_jax.lower.lower`.
    """
    import jax

    import lax_ir

    inputs = inputs or (lambda seed: random_inputs(program, seed))
    timer = timer or _default_timer
    if lower is None:
        from mirage_jax.lower import lower as lower_fn

        lower = lower_fn

    def run_timer(fn) -> tuple[float, str]:
        got = timer(fn, inputs)
        return got if isinstance(got, tuple) else (float(got), "")

    xla = jax.jit(lambda *xs: tuple(lax_ir.evaluate(program, *xs)))
    xla_us, method = run_timer(xla)
    contenders = [Contender("xla", xla_us)]
    reference = [np.asarray(o, np.float64) for o in xla(*inputs(0))]
    best: tuple[float, MuGraph] | None = None
    for k, g in enumerate(result.mugraphs[:top]):
        est = g.meta.get("cost", {}).get("us")
        label = f"mugraph[{k}]"
        try:
            fn = lower(g, backend=backend)
            outs = [np.asarray(o, np.float64) for o in fn(*inputs(0))]
            err = max(
                float(np.max(np.abs(o - r)) / max(1e-30, float(np.max(np.abs(r)))))
                for o, r in zip(outs, reference)
            )
            if not np.isfinite(err) or err > rtol:
                contenders.append(Contender(label, None, g, f"wrong result: {err:.3g}", est, err))
                continue
            us, _ = run_timer(fn)
        except Exception as e:  # a lowering or run failure drops the candidate, with the reason
            contenders.append(Contender(label, None, g, f"{type(e).__name__}: {e}"[:300], est))
            continue
        contenders.append(Contender(label, us, g, "", est, err))
        if best is None or us < best[0]:
            best = (us, g)
    if best is None:
        return Selection(
            None,
            "no µGraph lowered and ran correctly; XLA kept",
            tuple(contenders),
            method,
            backend,
        )
    if best[0] < xla_us * (1.0 - tie):
        why = f"fastest: {best[0]:.2f} µs against XLA {xla_us:.2f} µs"
        return Selection(best[1], why, tuple(contenders), method, backend)
    why = f"XLA kept: {xla_us:.2f} µs, best µGraph {best[0]:.2f} µs (within {tie:.0%} or slower)"
    return Selection(None, why, tuple(contenders), method, backend)
