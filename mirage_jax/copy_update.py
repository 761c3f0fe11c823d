"""One kernel that copies the inputs a function updates (KV caches it does not donate).

A decode step called without `donate_argnums` returns new caches: XLA copies each input cache
whole (one memcpy launch per cache), then writes the new rows into the copy in place. The
copies are launch-bound at decode sizes (on the H100 at 2026-11-27: 1.5 µs per 0.26 MB cache).
This kernel copies all of them in one launch; XLA's updates then write into its outputs in
place, with what XLA fused into them (a rotary embedding) kept.

Writing the new rows in the same kernel was tried and lost on the H100: the rows became the
kernel's operands, so XLA split the rotary embedding out of the update into more fusions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import jax

from mirage_jax.lower.triton_runtime import launcher

BLOCK = 4096
"""Elements per block: 8 KB of float16, 32 per thread of 4 warps."""

MAX_BYTES = 8 << 20
"""Inputs larger than this (together) are left to XLA's copies: measured on the H100 at 0.5 MB
(1.60 against 3.0 µs) and 4.2 MB (3.58 against 4.95 µs); larger copies run near full bandwidth,
where a launch saved matters less and the kernel's bandwidth was not measured."""


def source(sizes: Sequence[int], name: str) -> str:
    """Triton source of the kernel copying flat inputs of `sizes` elements: arguments (the
    inputs, then the outputs), one range of blocks per input."""
    ins = [f"x{i}" for i in range(len(sizes))]
    outs = [f"o{i}" for i in range(len(sizes))]
    lines = [
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {name}({', '.join(ins + outs)}):",
        "    pid = tl.program_id(0)",
    ]
    first = 0
    for i, n in enumerate(sizes):
        blocks = -(-n // BLOCK)
        lines += [
            f"    if (pid >= {first}) & (pid < {first + blocks}):",
            f"        e{i} = (pid - {first}) * {BLOCK} + tl.arange(0, {BLOCK})",
            f"        tl.store(o{i} + e{i}, tl.load(x{i} + e{i}, mask=e{i} < {n}), mask=e{i} < {n})",
        ]
        first += blocks
    return "\n".join(lines) + "\n"


def worth_it(avals: Sequence[jax.core.ShapedArray]) -> bool:
    """Whether one kernel should copy inputs of these types (more than one, small enough
    that launches matter, each under 2**31 elements)."""
    sizes = [math.prod(a.shape) for a in avals]
    total = sum(n * a.dtype.itemsize for n, a in zip(sizes, avals))
    return len(avals) > 1 and total <= MAX_BYTES and max(sizes) < 2**31


def copier(avals: Sequence[jax.core.ShapedArray], interpret: bool) -> Callable[..., list]:
    """A function of the inputs (of types `avals`) giving copies of them, in one launch
    (Triton's interpreter on the host with `interpret`). A copy is the identity: its tangent
    is the input's, and under `vmap` the inputs are returned as they are (XLA copies them
    where it must)."""
    shapes = tuple((tuple(a.shape), str(a.dtype)) for a in avals)
    name = f"copy_inputs_{hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]}"
    sizes = [math.prod(s) for s, _ in shapes]
    blocks = sum(-(-n // BLOCK) for n in sizes)
    out_shape = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    run = launcher(name, source(sizes, name), out_shape, (blocks,), 4, 1, interpret, "copies")

    @jax.custom_batching.custom_vmap
    def launched(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(run(*xs))

    @launched.def_vmap
    def batched(axis_size: int, in_batched: Sequence[bool], *xs: jax.Array):
        return tuple(xs), tuple(in_batched)

    @jax.custom_jvp
    def copies(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return launched(*xs)

    @copies.defjvp
    def identity(primals: tuple, tangents: tuple) -> tuple:
        return copies(*primals), tuple(tangents)

    return lambda *xs: list(copies(*xs))
