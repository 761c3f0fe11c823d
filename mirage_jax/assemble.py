"""Kernels in place of their regions, everything else as the user's own traced equations.

`assemble` re-binds the jaxpr the function traced to (`lax_ir.capture` keeps it, with where each
Program node's value lives in it: `meta["origins"]`) equation by equation, as `jax.jit` would
trace it: the same primitives with the same params, effects included and in their order (but
for the equations `glue` binds in a cheaper exact form). A
region that gets a kernel is substituted where its outputs were computed; the equations that
computed them are then dead and XLA drops them. Calls (`pjit`, `custom_jvp_call`, ...) are
bound whole, except those a substituted value lives inside: their bodies are inlined. A region
none of whose values can be found in the jaxpr (a value only the normalisation made) is not
substituted (`Assembly.skipped` says why); with nothing substituted, callers run the
function itself, so it compiles exactly as under `jax.jit`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src import source_info_util  # names and tracebacks of re-bound equations
from jax.extend import core as jex_core

from lax_ir.capture import call_body
from mirage_jax import copy_update, glue
from mirage_jax.log import logger
from mirage_jax.lower.registry import LoweringError

Place = tuple  # ("in", k) or (equation path, output k)
Key = tuple  # a value of the flattened jaxpr: (scope path, id of the Var)


@dataclass(frozen=True)
class Assembly:
    """The assembled flat function (inputs: the dynamic leaves), what was substituted, and why
    any replacement was not."""

    fn: Callable[[Sequence[Any]], list[Any]]
    substituted: tuple[int, ...]
    skipped: Mapping[int, str]


def _choose(places: frozenset, inputs_first: bool) -> Place | None:
    """The shallowest place of a value (an input of the function first, for an input)."""
    if not places:
        return None
    ins = sorted(p for p in places if p[0] == "in")
    if ins and inputs_first:
        return ins[0]
    eqs = sorted((p for p in places if p[0] != "in"), key=lambda p: (len(p[0]), p))
    return eqs[0] if eqs else (ins[0] if ins else None)


@dataclass
class _Op:
    """One equation of the flattened jaxpr (or a kernel): what it reads and writes."""

    eqn: Any  # None for a kernel
    ins: list  # Key, or ("lit", value)
    outs: list[Key]
    order: int
    kernel: int | None = None
    effectful: bool = False


class _Flattener:
    """The jaxpr as one list of equations, inlining the calls on `inline` paths."""

    def __init__(self, inline: set[tuple[int, ...]]):
        self.inline = inline
        self.ops: list[_Op] = []
        self.alias: dict[Key, Key] = {}
        self.place: dict[Place, Key] = {}
        self.consts: dict[Key, Any] = {}

    def key(self, scope: tuple[int, ...], v: Any) -> Any:
        if isinstance(v, jex_core.Literal):
            return ("lit", v.val)
        k = (scope, id(v))
        while k in self.alias:
            k = self.alias[k]
        return k

    def run(self, closed: Any, scope: tuple[int, ...], args: Sequence[Key] | None) -> list:
        jaxpr = closed.jaxpr
        for v, c in zip(jaxpr.constvars, closed.consts):
            self.consts[(scope, id(v))] = c
        if args is not None:
            for v, a in zip(jaxpr.invars, args):
                if a[0] != "lit":
                    self.alias[(scope, id(v))] = a
                else:  # a literal passed into an inlined call: a constant inside it
                    self.consts[(scope, id(v))] = a[1]
        for e, eqn in enumerate(jaxpr.eqns):
            path = (*scope, e)
            ins = [self.key(scope, v) for v in eqn.invars]
            body = call_body(eqn)
            if body is not None and path in self.inline:
                body = body if hasattr(body, "consts") else jex_core.ClosedJaxpr(body, ())
                outs = self.run(body, path, ins)
                for k, (v, o) in enumerate(zip(eqn.outvars, outs)):
                    if o[0] == "lit":  # a body that returns a literal: a constant value
                        self.consts[(scope, id(v))] = o[1]
                    else:
                        self.alias[(scope, id(v))] = o
                    self.place[(path, k)] = self.key(scope, v)
                continue
            outs = [(scope, id(v)) for v in eqn.outvars]
            for k, o in enumerate(outs):
                self.place[(path, k)] = o
            effectful = bool(getattr(eqn, "effects", None))
            self.ops.append(_Op(eqn, ins, outs, len(self.ops), effectful=effectful))
        return [self.key(scope, v) for v in jaxpr.outvars]


def assemble(
    program: Any,
    part: Any,
    replacements: Mapping[int, Callable],
    copied_inputs: Collection[int] = (),
    interpret: bool = False,
) -> Assembly:
    """The function of `program` (captured with `lax_ir.capture`) with `replacements[k]`
    computing region k's outputs from its inputs; everything else bound as it was traced (or in
    `glue`'s cheaper form). `copied_inputs`: the inputs XLA must copy to update them (not
    donated); those that updates write into are copied by one `copy_update` kernel (in
    Triton's interpreter with `interpret`), whose copies the updates write into in place."""
    closed = program.meta["jaxpr"]
    origins = program.meta["origins"]
    chosen: dict[int, tuple[list[Place], list[Place]]] = {}
    skipped: dict[int, str] = {}
    calls: dict[int, Callable] = {}
    made: set[int] = set()  # nodes with no place that a kernel chosen so far computes
    for k in sorted(replacements):  # regions in program order: producers first
        region = part.regions[k]
        derived = _derive(program, region.inputs, origins, made)
        if derived is None:
            skipped[k] = "a value the region reads has no place in the traced jaxpr"
            continue
        anchors, prepare = derived
        ins = [_choose(origins[i], True) or _made(i, made) for i in anchors]
        # an output with no place (a value the capture's normalisation made, such as the
        # [N, 1] matmul behind an equinox vmapped Linear) gets one of its own, which later
        # kernels read (`made`); XLA's equations read the places they always had
        outs = [_choose(origins[o], False) or ("node", o) for o in region.outputs]
        if None in ins or any(o[0] == "in" for o in outs):
            skipped[k] = "a value of the region has no place in the traced jaxpr"
            continue
        unplaced = [o for o, p in zip(region.outputs, outs) if p[0] == "node"]
        layouts = _layout_places(program, unplaced, origins)
        outs += [_choose(origins[u], False) for u, _ in layouts]
        chosen[k] = (ins, outs)
        made.update(unplaced)
        calls[k] = _kernel_call(k, replacements[k], prepare, program, region.outputs, layouts)
    inline = {
        p[0][:j]
        for ins, outs in chosen.values()
        for p in (*ins, *outs)
        if p[0] not in ("in", "node")
        for j in range(1, len(p[0]))
    }
    flat = _Flattener(inline)
    top_in = [((), id(v)) for v in closed.jaxpr.invars]
    for k, key in enumerate(top_in):
        flat.place[("in", k)] = key
    for o in made:
        flat.place[("node", o)] = ("node", o)
    top_out = flat.run(closed, (), None)
    ops = flat.ops
    producer: dict[Key, int] = {}
    for j, op in enumerate(ops):
        for o in op.outs:
            producer[o] = j
    for k, (ins, outs) in chosen.items():
        out_keys = [flat.place[p] for p in outs]
        first = min(producer.get(o, len(ops)) for o in out_keys)
        kop = _Op(None, [flat.place[p] for p in ins], out_keys, first, kernel=k)
        ops.append(kop)
        for o in out_keys:
            producer[o] = len(ops) - 1
    if copied_inputs and chosen:
        _write_copies(ops, producer, {top_in[k] for k in copied_inputs}, calls, interpret)
    fn = _schedule(ops, producer, top_in, top_out, flat.consts, calls)
    return Assembly(fn, tuple(sorted(chosen)), skipped)


COPIES = -1
"""The key of the `copy_update` kernel among the replacements."""


REGION_SCOPE = "mirage_jax.region{}"
"""The name scope a region's kernel is traced under: its HLO ops' op_name carries it, so a
profiler trace can tell the region's kernels apart (`profile.TraceTiming.regions`)."""


LAYOUT_OPS = ("reshape", "transpose", "convert")
"""Steps that only re-lay (or re-type) a value: a placed value that is such a step of a kernel's
output is written by the kernel op too (`_layout_places`)."""


def _layout_places(
    program: Any, unplaced: Sequence[int], origins: Sequence[frozenset]
) -> list[tuple[int, list[int]]]:
    """The placed nodes that are layout steps (`LAYOUT_OPS`, at most 4) of a region output
    with no place of its own, with the steps from the output: (node, steps).

    Such an output is a value the capture's normalisation made: equinox's vmapped `Linear`
    traces `dot_general` to a [N, 1, 1] value, which the Program holds as a [N, 1] matmul
    and a reshape. XLA's equations read the placed reshape; unless the kernel writes it too,
    the traced `dot_general` stays alive and XLA computes the projection a second time
    (equinox, Llama-7B size, b=1, on the H200, 2026-11-28: a 28.1 µs GEMV beside the
    kernel's own, with gate/up as a kernel and the down projection in XLA)."""
    found: list[tuple[int, list[int]]] = []
    stack = [(o, []) for o in unplaced]
    while stack:
        x, steps = stack.pop()
        for u in program.users[x]:
            nd = program.nodes[u]
            if nd.op not in LAYOUT_OPS or len(nd.args) != 1:
                continue
            if origins[u] and _choose(origins[u], False)[0] != "in":
                found.append((u, [*steps, u]))
            elif len(steps) < 3:
                stack.append((u, [*steps, u]))
    return found


def _kernel_call(
    k: int,
    f: Callable,
    prepare: Callable,
    program: Any,
    outputs: Sequence[int],
    layouts: Sequence[tuple[int, list[int]]],
) -> Callable:
    """Region k's kernel op: `f` on the prepared inputs under its name scope, and after its
    outputs the `layouts` (`_layout_places`) computed from them."""

    def call(*vals: Any) -> list[Any]:
        outs = list(_scoped(k, f, prepare(vals)))
        if not layouts:
            return outs
        from lax_ir.interpret import FloatAlgebra, eval_node

        env, algebra = dict(zip(outputs, outs)), FloatAlgebra()
        for _, steps in layouts:
            for i in steps:
                if i not in env:
                    nd = program.nodes[i]
                    env[i] = eval_node(algebra, nd, [env[a] for a in nd.args])
        return outs + [env[u] for u, _ in layouts]

    return call


def _scoped(k: int, f: Callable, vals: Sequence[Any]) -> Any:
    """Region k's replacement `f` applied to `vals` under its name scope (`REGION_SCOPE`)."""
    with jax.named_scope(REGION_SCOPE.format(k)):
        return f(*vals)


def _write_copies(ops: list, producer: dict, copied: set, calls: dict, interpret: bool) -> None:
    """The `copied` inputs that an update (a `dynamic_update_slice` or a scatter) writes into,
    copied by one `copy_update` kernel (an op appended to `ops`); the updates then read its
    copies, which XLA updates in place."""
    members = [
        j
        for j, op in enumerate(ops)
        if op.kernel is None
        and op.ins
        and op.ins[0][0] != "lit"
        and op.ins[0] in copied
        and glue.updates_operand(op.eqn)
    ]
    avals = [ops[j].eqn.invars[0].aval for j in members]
    if not copy_update.worth_it(avals):
        return
    try:
        calls[COPIES] = copy_update.copier(avals, interpret)
    except LoweringError as e:  # no jax-triton here: XLA copies them
        logger.debug("the copies of updated inputs are XLA's: %s", e)
        return
    outs = [("copy", j) for j in members]
    ops.append(_Op(None, [ops[j].ins[0] for j in members], outs, -1, kernel=COPIES))
    for j, o in zip(members, outs):
        producer[o] = len(ops) - 1
        ops[j].ins = [o, *ops[j].ins[1:]]


MAX_DERIVED = 8
"""At most this many Program nodes are re-evaluated to derive a region input with no place."""


def _made(node: int, made: set[int]) -> Place | None:
    """The place of a node with none in the jaxpr that an earlier kernel computes."""
    return ("node", node) if node in made else None


def _derive(
    program: Any, inputs: Sequence[int], origins: Sequence[frozenset], made: set[int] = frozenset()
) -> tuple[list[int], Callable[[Sequence[Any]], list[Any]]] | None:
    """The placed values a region's inputs come from, and how to compute the inputs from them.

    An input the capture's normalisation made (the 0/-inf fill of a mask folded into an
    additive mask, a layout of a value) has no place in the jaxpr; it is recomputed from the
    nearest placed values by evaluating the few Program nodes between (XLA fuses them into
    the kernel's producer). A node in `made` (one an earlier kernel computes, with a place of
    its own) is read from there. None if that needs more than `MAX_DERIVED` nodes or a program
    input.
    """
    from lax_ir.interpret import FloatAlgebra, eval_node

    nodes = program.nodes
    anchors: list[int] = []
    steps: set[int] = set()
    stack = list(inputs)
    while stack:
        x = stack.pop()
        if x in steps or x in anchors:
            continue
        if (origins[x] and (nodes[x].op != "constant" or x in inputs)) or x in made:
            anchors.append(x)
            continue
        if nodes[x].op == "input" or len(steps) >= MAX_DERIVED:
            return None
        steps.add(x)
        stack.extend(nodes[x].args)
    if not steps:
        return list(inputs), lambda vals: list(vals)
    anchors.sort()
    order = sorted(steps)

    def prepare(vals: Sequence[Any]) -> list[Any]:
        env = dict(zip(anchors, vals))
        algebra = FloatAlgebra()
        for i in order:
            env[i] = eval_node(algebra, nodes[i], [env[a] for a in nodes[i].args])
        return [env[i] for i in inputs]

    return anchors, prepare


def _schedule(ops, producer, top_in, top_out, consts, replacements) -> Callable:
    """The ops that outputs and effects need, in the traced order where data allows."""
    deps: list[set[int]] = [set() for _ in ops]
    for j, op in enumerate(ops):
        for a in op.ins:
            if a[0] != "lit" and a in producer and producer[a] != j:
                deps[j].add(producer[a])
    last = None
    for j in sorted((j for j, op in enumerate(ops) if op.effectful), key=lambda j: ops[j].order):
        if last is not None:
            deps[j].add(last)  # effects keep their order
        last = j
    needed: set[int] = set()
    stack = [producer[o] for o in top_out if o[0] != "lit" and o in producer]
    stack += [j for j, op in enumerate(ops) if op.effectful]
    while stack:
        j = stack.pop()
        if j in needed:
            continue
        needed.add(j)
        stack.extend(deps[j])
    users: dict[int, list[int]] = {j: [] for j in needed}
    indeg = {j: 0 for j in needed}
    for j in needed:
        for d in deps[j]:
            users[d].append(j)
            indeg[j] += 1
    heap = [(ops[j].order, j) for j in needed if indeg[j] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, j = heapq.heappop(heap)
        order.append(j)
        for u in users[j]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (ops[u].order, u))
    if len(order) != len(needed):
        raise RuntimeError("assemble: the substituted regions make the program cyclic")

    def run(xs: Sequence[Any]) -> list[Any]:
        env: dict[Key, Any] = dict(consts)
        env.update(zip(top_in, xs))

        def read(a: Any) -> Any:
            return a[1] if a[0] == "lit" else env[a]

        for j in order:
            op = ops[j]
            vals = [read(a) for a in op.ins]
            if op.kernel is not None:
                outs = list(replacements[op.kernel](*vals))
            else:
                outs = bind_equation(op.eqn, vals)
            env.update(zip(op.outs, outs))
        return [read(o) for o in top_out]

    return run


def bind_equation(eqn: Any, vals: Sequence[Any]) -> list[Any]:
    """Bind one traced equation to `vals` as `jax.core.eval_jaxpr` does (its source info and
    context kept), in its cheaper exact form where `glue` has one; its outputs as a list."""
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with (
        source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    ):
        cheaper = glue.bind_cheaper(eqn, vals)
        if cheaper is not None:
            return cheaper
        got = eqn.primitive.bind(*vals, **eqn.primitive.get_bind_params(eqn.params))
    return list(got) if eqn.primitive.multiple_results else [got]
