"""A kernel input whose value XLA computes from constants alone, known to the lowering as a
function to trace: jax's causal bias at sizes the capture does not fold into a constant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Computed:
    """An input's value as `fn()`, traceable (jnp), of `shape` and `dtype` (a name): computed
    under `jax.jit` on the default device only where the lowering asks what it holds, so a
    value of a billion elements is never on the host (`lower.masked_steps` reduces it there
    to one entry per tile)."""

    fn: Callable[[], Any]
    shape: tuple[int, ...]
    dtype: str

    def then(self, step: Callable[[Any], Any], shape: tuple[int, ...]) -> Computed:
        """The value after `step` (reshapes, transposes: `lax_ir.interface.apply_ops`); equal
        to another's where both `fn` and `step` are (a value made twice from the same nodes
        and steps, so what is asked of it on the device is asked once:
        `masked_steps._device_maps`)."""
        return Computed(_Then(self.fn, step), tuple(shape), self.dtype)


@dataclass(frozen=True)
class _Then:
    """`step(fn())`, equal where `fn` and `step` are."""

    fn: Callable[[], Any]
    step: Callable[[Any], Any]

    def __call__(self) -> Any:
        return self.step(self.fn())
