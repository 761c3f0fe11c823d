"""A large region's float64 reference, computed in pieces along its batch-like dimensions.

The float checks compare a kernel's outputs with the region's value in float64. For sdpa at
Llama-7B size and batch 8 one float64 score array (8 × 8 × 16384 × 4096) takes 34 GB, more
than the GPU holds beside the others. A region is a map along each of its batch-like classes
(logical dimensions that no op reduces, counts or fixes: `search.dims`): the slice of its
outputs along such a class is the region shrunk to the slice's size (`dims.shrink`) applied to
its inputs' slices. `plan` picks slices whose float64 nodes fit in `PIECE_BYTES`; `evaluate`
computes each piece and writes it into the full outputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from lax_ir.program import Program
from mirage_jax.search import dims as dims_mod

PIECE_BYTES = 8 * 2**30
"""The float64 bytes of all of a piece's nodes together (an over-estimate of its peak: nodes
die as the evaluation goes): within the H100's 80 GB and a quarter of its host's memory."""


def float64_bytes(program: Program) -> int:
    """Bytes of every node of `program` in float64."""
    return 8 * sum(math.prod(n.shape) for n in program.nodes)


def batch_classes(dims: dims_mod.Dims) -> list[int]:
    """The classes a program is a map along (`Dims.batch_like`) that no node carries on two
    axes (in class order: the inputs' leading axes first)."""
    return [c for c in dims.batch_like() if all(row.count(c) <= 1 for row in dims.axes)]


def plan(program: Program, limit: int | None = None) -> dict[int, int] | None:
    """Per class to slice, its slice size, so that each piece's float64 nodes take at most
    `limit` bytes (default `PIECE_BYTES`): {} where the whole region fits, None where no slicing along its batch-like
    classes gets there. Classes are sliced in class order, each into as few pieces as
    possible (a divisor of its size)."""
    limit = PIECE_BYTES if limit is None else limit
    need = float64_bytes(program)
    if need <= limit:
        return {}
    dims = dims_mod.analyse(program)
    chunks: dict[int, int] = {}
    for c in batch_classes(dims):
        size = dims.sizes[c]
        parts = next((p for p in range(2, size + 1) if size % p == 0 and need / p <= limit), size)
        chunks[c] = size // parts
        need /= parts
        if need <= limit:
            return chunks
    return None


def evaluate(
    program: Program,
    xs: Sequence[Any],
    chunks: Mapping[int, int],
    reference: Callable[..., Sequence[Any]],
) -> list[np.ndarray]:
    """`reference(piece, *piece_inputs)` for every piece of `chunks` (`plan`), written into
    float64 outputs of the region's shapes."""
    dims = dims_mod.analyse(program)
    piece = dims_mod.shrink(program, dict(chunks), dims)
    outs = [np.empty(program.nodes[o].shape, np.float64) for o in program.outputs]
    classes = sorted(chunks)
    starts = [range(0, dims.sizes[c], chunks[c]) for c in classes]

    def window(node: int, at: Mapping[int, int]) -> tuple[slice, ...]:
        return tuple(
            slice(at[c], at[c] + chunks[c]) if c in at else slice(None) for c in dims.axes[node]
        )

    for offsets in itertools.product(*starts):
        at = dict(zip(classes, offsets))
        ys = [x[window(i, at)] for i, x in zip(program.inputs, xs)]
        for out, o, got in zip(outs, program.outputs, reference(piece, *ys)):
            out[window(o, at)] = np.asarray(got, np.float64)
    return outs
