"""The lowering-rule registry: (backend module, op) -> rule; a missing rule names the op.

Each GPU backend module registers one rule per block-level op of `mirage_jax.mugraph.OPS`
against the op's name: "pallas" (`pallas.py`: block ops and for-loop accumulators inside one
`pl.pallas_call`, Triton lowering) and "triton" (`triton.py`: `@triton.jit` source text for
jax-triton). Pre-defined kernel ops need no rule: they run as their meaning (`OpDef.apply`
over jax.numpy). `tests/test_op_records.py` checks that every backend has every rule.

A rule is whatever its backend's emitter calls: a jnp function for "pallas", a source
generator for "triton". Accumulator rules are `AccumRule`s (init, update, finalise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class LoweringError(ValueError):
    """A µGraph cannot be lowered; the message names the op, the rule and the backend."""


@dataclass(frozen=True)
class AccumRule:
    """A for-loop accumulator: `init(ctx)`, `update(ctx, state, *args)`, `finalise(ctx, state)`.

    `state` is whatever the rule keeps across iterations (a value or a tuple of values).
    """

    init: Callable[..., Any]
    update: Callable[..., Any]
    finalise: Callable[..., Any]


_RULES: dict[tuple[str, str], Any] = {}


def register(backend: str, *ops: str) -> Callable[[Any], Any]:
    """Decorator: register the decorated rule for `ops` on `backend`."""

    def wrap(rule: Any) -> Any:
        for op in ops:
            _RULES[(backend, op)] = rule
        return rule

    return wrap


def add(backend: str, op: str, rule: Any) -> None:
    """Register `rule` for `op` on `backend` (replacing any previous one)."""
    _RULES[(backend, op)] = rule


def rule(backend: str, op: str, where: str = "") -> Any:
    """The rule for `op` on `backend`, or LoweringError naming both (and `where`)."""
    try:
        return _RULES[(backend, op)]
    except KeyError:
        prefix = f"{where}: " if where else ""
        have = sorted(o for b, o in _RULES if b == backend)
        raise LoweringError(
            f"{prefix}no {backend!r} lowering rule for op {op!r} (rules exist for: {', '.join(have)})"
        ) from None


def has_rule(backend: str, op: str) -> bool:
    return (backend, op) in _RULES


def ops(backend: str) -> list[str]:
    """The ops that have a rule on `backend`."""
    return sorted(o for b, o in _RULES if b == backend)
