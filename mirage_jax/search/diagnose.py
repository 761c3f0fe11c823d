"""Why a region got no µGraph: the constructs in it that the search does not handle yet.

A static scan of the region Program for what real model code contains and the enumeration
cannot express today (each is a known dead end, measured on the CPU on 2026-11-23: the search
returns no candidate in under a second): a transposed matmul operand (`q @ k.T`, einsum
layouts), a reshape that merges or splits dimensions (a 3-D activation against a 2-D weight, a
head split), a low-rank gain or bias broadcast over rows, a division or scale by a constant
that is not a dyadic rational's reciprocal, mean-centering before a matmul, and regions with
more matmuls than one kernel plan covers. `search` appends the findings to its message when it
finds nothing, so `explain` names the construct and the node.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from lax_ir.program import Program

MAX_MATMULS = 3
"""More matmuls than this in one region exceed the kernel-level plans (no cutting into pieces)."""
_THROUGH = ("convert", "broadcast_in_dim", "reshape")


def _source(program: Program, i: int) -> int:
    """Node i seen through converts (what a matmul operand really is)."""
    nodes = program.nodes
    while nodes[i].op == "convert":
        i = nodes[i].args[0]
    return i


def _constant(program: Program, i: int) -> float | None:
    n = program.nodes[_source(program, i)]
    while n.op == "broadcast_in_dim":
        n = program.nodes[_source(program, n.args[0])]
    if n.op != "constant":
        return None
    v = np.asarray(n.param("value").array)
    return float(v.reshape(-1)[0]) if v.size and np.all(v == v.reshape(-1)[0]) else None


def _exact_reciprocal(c: float) -> bool:
    """Is 1/c a float exactly (c a power of two)?"""
    r = Fraction(1) / Fraction(c)
    return r.denominator & (r.denominator - 1) == 0 and r.numerator in (1, -1)


def _is_mean(program: Program, i: int, steps: int = 4) -> bool:
    """Is node i a row statistic (a reduce_sum, seen through division and layout ops)?"""
    for _ in range(steps):
        n = program.nodes[i]
        if n.op == "reduce_sum":
            return True
        if n.op not in (*_THROUGH, "div", "mul"):
            return False
        i = n.args[0]
    return False


def _reaches_matmul(program: Program, i: int, steps: int = 4) -> bool:
    """Does node i feed a matmul within `steps` elementwise or layout ops?"""
    frontier = {i}
    for _ in range(steps):
        frontier = {u for f in frontier for u in program.users[f]}
        if any(program.nodes[u].op == "matmul" for u in frontier):
            return True
    return False


def blockers(program: Program) -> list[str]:
    """The constructs of `program` the search does not handle yet, one line each with a node."""
    nodes = program.nodes
    found: list[str] = []
    matmuls = [i for i, n in program.ops() if n.op == "matmul"]
    for i in matmuls:
        for pos, a in enumerate(nodes[i].args):
            s = _source(program, a)
            if nodes[s].op == "transpose":
                perm = tuple(nodes[s].param("permutation"))
                if perm[-2:] != (len(perm) - 2, len(perm) - 1):
                    found.append(
                        f"a transposed matmul operand (%{s}, permutation {perm}, "
                        f"operand {pos} of %{i}): layouts are not search choices yet"
                    )
    for i, n in program.ops():
        if n.op == "reshape":
            src = [d for d in nodes[n.args[0]].shape if d > 1]
            dst = [d for d in n.shape if d > 1]
            if src != dst:
                found.append(
                    f"a reshape that merges or splits dimensions (%{i}: "
                    f"{list(nodes[n.args[0]].shape)} -> {list(n.shape)})"
                )
        elif n.op == "transpose" and nodes[n.args[0]].op not in ("input", "constant"):
            src = nodes[n.args[0]].shape
            kept = [p for p in n.param("permutation") if src[p] > 1]
            if kept != sorted(kept):
                found.append(
                    f"a transpose of a computed value inside the region (%{i}, permutation "
                    f"{tuple(n.param('permutation'))}): the µGraph has no transpose"
                )
        elif n.op == "broadcast_in_dim" and nodes[n.args[0]].op != "constant":
            src = nodes[n.args[0]].shape
            dims = tuple(n.param("broadcast_dimensions"))
            new = [ax for ax in range(len(n.shape)) if ax not in dims and n.shape[ax] > 1]
            if len(src) == 1 and src[0] > 1 and new and min(new) < dims[0]:
                found.append(
                    f"a rank-1 gain or bias broadcast over rows (%{i}: {src} -> {n.shape})"
                )
        elif n.op == "div":
            c = _constant(program, n.args[1])
            if c not in (None, 0.0) and math.isfinite(c) and not _exact_reciprocal(c):
                found.append(
                    f"a division by {c:.6g}, whose reciprocal is not exact (%{i}): only "
                    "dyadic scales are search vocabulary"
                )
        elif (
            n.op == "sub"
            and _is_mean(program, n.args[1])
            and _reaches_matmul(program, i)
            and "sqrt" not in program.op_counts()  # a LayerNorm's centring is `layer_norm`
        ):
            found.append(f"mean-centering before a matmul (%{i}), outside a LayerNorm")
    if len(matmuls) > MAX_MATMULS:
        found.append(
            f"{len(matmuls)} matmuls in one region: more than the kernel plans cover "
            f"({MAX_MATMULS}); cutting a region into pieces at GEMMs is not implemented yet"
        )
    return list(dict.fromkeys(found))


STRUCTURAL = ("a transposed matmul operand", "a reshape that merges", "a transpose of a computed")
"""The blockers no one-piece µGraph can express (no transpose, no merging reshape in its
vocabulary): every region with one of them, among the unseen model code's on the CPU
(2026-11-29: Qwen's attention, flax nnx's `MultiHeadAttention` in two regions, a top-2 MoE),
got no kernel, and nnx's decode attention spent 49 s of a 60 s budget (H200) finding none."""


def one_piece_dead_ends(found: list[str]) -> list[str]:
    """The `blockers` found (a program's) that make its one-piece enumeration a dead end
    (`STRUCTURAL`); the search then leaves that enumeration out (its pieces are still cut)."""
    return [b for b in found if b.startswith(STRUCTURAL)]
