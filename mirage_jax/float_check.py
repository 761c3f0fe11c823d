"""The float checks of `select`: a region's float64 reference, and a candidate's error against it.

A lowered candidate must match its region run in float64 within a tolerance per output dtype
(`select.FLOAT_TOL`), its error each output's largest difference relative to the reference's
largest magnitude. Large regions take their reference from XLA on the GPU, in pieces where
its float64 nodes would not fit (`reference_pieces`), and their error is computed on the GPU.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from lax_ir.program import Program, matmul_flops

REFERENCE_ON_DEVICE_FLOPS = 2e9
"""Regions of at least this many matmul flops get their float64 reference from XLA on the GPU
(`lax_ir.evaluate_reference_on_device`), not numpy: sdpa_causal at Llama-7B size (275 Gflop) spent
22.0 s of its 38.2 s selection in numpy's (H100 machine, 2026-11-27), its first call 68 s."""


def float_reference(program: Program, *xs: Any) -> list[np.ndarray]:
    """The float64 reference of `program` on `xs` that the float checks compare against: on the
    GPU where the region is large (`REFERENCE_ON_DEVICE_FLOPS`), else in numpy; a GPU run that
    fails (its memory) is said in the log and done in numpy. A region whose float64 nodes
    exceed `reference_pieces.PIECE_BYTES` is computed in pieces along its batch-like
    dimensions (`reference_pieces`)."""
    import jax

    from mirage_jax import reference_pieces

    on_device = (
        jax.default_backend() == "gpu" and matmul_flops(program) >= REFERENCE_ON_DEVICE_FLOPS
    )
    chunks = reference_pieces.plan(program)
    if chunks:
        whole = functools.partial(_float_reference, on_device=on_device)
        return reference_pieces.evaluate(program, xs, chunks, whole)
    return _float_reference(program, *xs, on_device=on_device)


def _float_reference(program: Program, *xs: Any, on_device: bool) -> list[np.ndarray]:
    """`float_reference` of one piece (or the whole region): on the GPU if `on_device`."""
    import lax_ir

    if on_device:
        try:
            return lax_ir.evaluate_reference_on_device(program, *xs)
        except Exception as e:  # any failure there: numpy's reference instead
            from mirage_jax.log import logger

            logger.warning(
                "%s: the float64 reference on the GPU failed (%s: %s); computing it in numpy",
                program.meta.get("name", "region"),
                type(e).__name__,
                str(e)[:200],
            )
    return lax_ir.evaluate_reference(program, *xs)


ON_DEVICE_ELEMENTS = 1 << 22
"""Outputs of at least this many elements are compared on the GPU (in float32, against the
reference rounded once): sdpa's output at Llama-7B size and batch 8 (2^27 elements) took
seconds per candidate in float64 numpy, its download and conversion included."""


class FloatErrors:
    """Each output's largest error relative to the reference's largest magnitude, for one
    region's candidates (their outputs in the region's order); safe to call from threads."""

    def __init__(self, reference: Sequence[np.ndarray]):
        self.reference = list(reference)
        self.scale = [max(1e-30, float(np.max(np.abs(r)))) for r in self.reference]
        self._device: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, outs: Sequence[Any]) -> list[float]:
        """The errors of `outs` (NaN where an output holds one)."""
        return [self._error(j, o) / s for j, (o, s) in enumerate(zip(outs, self.scale))]

    def _error(self, j: int, out: Any) -> float:
        import jax

        if np.size(out) >= ON_DEVICE_ELEMENTS and isinstance(out, jax.Array):
            import jax.numpy as jnp

            with self._lock:  # the reference's float32 copy on the device, made once
                if j not in self._device:
                    self._device[j] = jnp.asarray(self.reference[j], jnp.float32)
            return float(jnp.max(jnp.abs(out.astype(jnp.float32) - self._device[j])))
        return float(np.max(np.abs(np.asarray(out, np.float64) - self.reference[j])))
