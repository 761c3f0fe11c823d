"""Which inputs of a Program must be drawn non-negative for its float meaning to be real.

A region cut out of a real model can take a value only its function keeps in domain: flax
linen's LayerNorm computes the variance (plus epsilon) in one region and its square root in
the next, so that region's input is a variance. Random inputs of either sign made its float64
reference NaN, and every candidate failed the float check ("wrong result: nan"). Inputs that
reach the operand of an op whose meaning needs a non-negative operand (`OpInfo.nonnegative`:
sqrt) through ops that keep non-negative values non-negative are drawn as |N(0, s²)| instead;
squares (x * x, even powers) are non-negative whatever their operand's sign.
"""

from __future__ import annotations

from lax_ir.ops import OPS, SHAPE_OPS
from lax_ir.program import Program

_KEEPS_SIGN = (*SHAPE_OPS, "add", "mul", "div", "reduce_sum", "max", "reduce_max")
"""Ops whose result is >= 0 where every operand is (constants included)."""


def nonnegative_inputs(program: Program) -> frozenset[int]:
    """Positions of the inputs drawn non-negative (see the module docstring)."""
    nodes = program.nodes
    position = {nid: pos for pos, nid in enumerate(program.inputs)}
    need = [a for n in nodes if OPS[n.op].nonnegative for a in n.args]
    seen: set[int] = set()
    found: set[int] = set()
    while need:
        i = need.pop()
        if i in seen:
            continue
        seen.add(i)
        n = nodes[i]
        if i in position:
            found.add(position[i])
        elif n.op == "integer_pow" and int(n.param("y", 1)) % 2 == 0:
            continue  # an even power is non-negative whatever its operand
        elif n.op == "mul" and len(n.args) == 2 and n.args[0] == n.args[1]:
            continue  # so is a square, x * x (rms_norm's; drawn of both signs, H100 2026-11-27:
            # qknorm's Q and K drawn |N| overflowed jax's fp16 softmax sum, and the
            # whole-function check then kept XLA on a correct kernel)
        elif n.op == "relu":
            continue  # max(x, 0) is non-negative whatever x
        elif n.op in _KEEPS_SIGN and not any(_negative_constant(nodes[a]) for a in n.args):
            need.extend(n.args)
    return frozenset(found)


def _negative_constant(n) -> bool:
    return n.op == "constant" and bool((n.param("value").array < 0).any())
