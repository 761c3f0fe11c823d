"""Static slices of stored arrays at a region's edge, taken into the region's interface.

`p["gating"][0].T` (Gemma's gate weight, one of two stacked in one parameter) reaches a region
as a static `slice` (outside the Lax fragment), a reshape and a transpose that XLA runs. With
the region a kernel, XLA then writes the sliced, transposed weight on every call (at Llama-7B
size 90 MB each way, 44-49 µs, on the H200 2026-11-28). `absorb_slices` makes such a chain
part of the region's interface instead: the region takes the stored parameter and applies
("slice", ...), ("reshape", ...), ("transpose", ...) steps itself, so a kernel that reads
views in place reads the block where it lies (`lax_ir.views.input_view`: an `OffsetView`), and
a region XLA keeps computes the same values from the same steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lax_ir.interface import Ops, identity_interface, merged
from lax_ir.program import Program
from lax_ir.views import contiguous_block


def _step(program: Program, i: int) -> tuple[str, tuple[int, ...]] | None:
    """Node i as an interface step of its operand: a reshape, a transpose, or a static slice
    of contiguous elements (unit strides, a contiguous block); None for anything else."""
    n = program.nodes[i]
    if n.op == "reshape":
        return ("reshape", tuple(int(d) for d in n.shape))
    if n.op == "transpose":
        return ("transpose", tuple(int(p) for p in n.param("permutation")))
    payload = n.param("payload") if n.op == "opaque" else None
    if payload is None or getattr(payload.primitive, "name", None) != "slice":
        return None
    params = payload.params
    if any(s != 1 for s in params.get("strides") or ()):
        return None
    arg = (*map(int, params["start_indices"]), *map(int, params["limit_indices"]))
    source = program.nodes[n.args[0]].shape
    return ("slice", arg) if contiguous_block(source, arg) is not None else None


def stored_chain(program: Program, value: int) -> tuple[int, Ops] | None:
    """(the function input, the steps that make `value` from it) where `value` is a function
    input with at least one static slice and then only reshapes and transposes applied; else
    None."""
    steps: list[tuple[str, tuple[int, ...]]] = []
    x = value
    while program.nodes[x].op != "input":
        step = _step(program, x)
        if step is None:
            return None
        steps.append(step)
        x = program.nodes[x].args[0]
    if not any(op == "slice" for op, _ in steps):
        return None
    return x, tuple(reversed(steps))


def absorb_slices(program: Program, region: Any) -> Any:
    """`region` (a `lax_ir.partition.Region`) reading, for each of its inputs that is a static
    slice of a function input (`stored_chain`), that input instead, with the slice and the
    layout steps after it as the first steps of its interface; inputs that become the same
    function input are one input. Unchanged where no input is such a slice."""
    chains = {pos: stored_chain(program, a) for pos, a in enumerate(region.inputs)}
    chains = {pos: c for pos, c in chains.items() if c is not None}
    if not chains:
        return region
    sub = region.program
    interface = sub.meta.get("interface") or identity_interface(sub)
    inputs: list[int] = []
    shapes: list[tuple[int, ...]] = []
    where: dict[int, int] = {}  # old position -> new
    for pos, a in enumerate(region.inputs):
        node = chains[pos][0] if pos in chains else a
        if node not in inputs:
            inputs.append(node)
            shapes.append(
                tuple(program.nodes[node].shape) if pos in chains else interface["shapes"][pos]
            )
        where[pos] = inputs.index(node)
    canonical = tuple(
        (where[pos], merged((*chains[pos][1], *ops)) if pos in chains else ops)
        for pos, ops in interface["inputs"]
    )
    meta = {**sub.meta, "interface": {**interface, "inputs": canonical, "shapes": tuple(shapes)}}
    sub = Program.build(list(sub.nodes), list(sub.inputs), list(sub.outputs), meta)
    return replace(region, inputs=tuple(inputs), program=sub)
