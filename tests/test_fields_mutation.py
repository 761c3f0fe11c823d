"""Mutation test: every single-op mutant of a benchmark program that differs in float is rejected.

Each benchmark program is captured at two small shapes (its `small()` shapes and a "cubic" one
where every dim is 8, so that axis and operand mutations stay well-typed). Every single-op
mutation is enumerated (operand swaps, operand rewiring to another value of the same type,
reduction/broadcast/transpose/concatenate axis changes, op substitutions, dropped unary ops,
changed constants and powers); mutants that are ill-typed are discarded. Each remaining mutant is
evaluated in float64 against the original on two random inputs; `fields.verify` must reject
every one that differs. Counts are printed (run with -s to see them).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import jax
import numpy as np
import pytest

import fields
import lax_ir
from lax_ir.interpret import FloatAlgebra, interpret
from lax_ir.program import Const, Node, Program

BINARY = ("add", "sub", "mul", "div")
UNARY = ("neg", "exp", "sqrt", "logistic", "tanh", "erf")
MIN_MUTANTS = 1000


def _programs() -> Iterator[tuple[str, Program]]:
    from experiments import benchmarks

    for name in benchmarks.names():
        bench = benchmarks.get(name, 1)
        cubic = bench.resized({k: (2 if k == "heads" else 8) for k, _ in bench.dims})
        for label, variant in (("small", bench.small()), ("cubic", cubic)):
            specs = [jax.ShapeDtypeStruct(s.shape, np.float32) for s in variant.inputs]
            yield f"{name}/{label}", lax_ir.capture(variant.fn, *specs)


def _replace(program: Program, i: int, node: Node) -> Program:
    nodes = list(program.nodes)
    nodes[i] = node
    return Program.build(nodes, program.inputs, program.outputs)


def _with(node: Node, **changes) -> Node:
    fields_ = {"op": node.op, "args": node.args, "shape": node.shape, "dtype": node.dtype}
    params = dict(node.params)
    for k, v in changes.items():
        if k in fields_:
            fields_[k] = v
        else:
            params[k] = v
    return Node(
        fields_["op"],
        fields_["args"],
        fields_["shape"],
        fields_["dtype"],
        tuple(sorted(params.items())),
    )


def _constant_variants(value: np.ndarray) -> Iterator[np.ndarray]:
    v = value.astype(np.float64) if value.dtype.kind == "f" else value
    if value.dtype.kind != "f":
        yield value + 1
        return
    yield (v * 2).astype(value.dtype)
    yield (-v).astype(value.dtype)
    yield (v + 1).astype(value.dtype)
    yield (v * 10).astype(value.dtype)
    yield (v * (1 + 2.0**-8)).astype(value.dtype)  # a change float tolerances hardly see


def mutations(program: Program) -> Iterator[tuple[str, Program]]:
    """Every single-op mutation of `program` (possibly ill-typed: the caller checks)."""
    nodes = program.nodes
    for i, n in program.ops():
        if n.op in BINARY:
            for op in BINARY:
                if op != n.op:
                    yield f"substitute {n.op}->{op}", _replace(program, i, _with(n, op=op))
        if n.op in (*BINARY, "matmul") and n.args[0] != n.args[1]:
            yield f"swap {n.op}", _replace(program, i, _with(n, args=n.args[::-1]))
        if n.op == "concatenate" and len(set(n.args)) > 1:
            yield "swap concatenate", _replace(program, i, _with(n, args=n.args[::-1]))
            for ax in range(len(n.shape)):
                if ax != n.param("axis"):
                    yield "concatenate axis", _replace(program, i, _with(n, axis=ax))
        if n.op in UNARY:
            for op in UNARY:
                if op != n.op:
                    yield f"substitute {n.op}->{op}", _replace(program, i, _with(n, op=op))
            yield f"drop {n.op}", _drop(program, i)
        if n.op == "integer_pow":
            for y in (n.param("y") + 1, -n.param("y")):
                yield "power y", _replace(program, i, _with(n, y=y))
        if n.op == "reduce_sum":
            rank = len(nodes[n.args[0]].shape)
            for k in range(1, rank + 1):
                for axes in itertools.combinations(range(rank), k):
                    if axes != tuple(n.param("axes")):
                        yield "reduce axes", _replace(program, i, _with(n, axes=axes))
        if n.op == "broadcast_in_dim":
            src = len(nodes[n.args[0]].shape)
            for dims in itertools.permutations(range(len(n.shape)), src):
                if dims != tuple(n.param("broadcast_dimensions")) and list(dims) == sorted(dims):
                    yield (
                        "broadcast dims",
                        _replace(program, i, _with(n, broadcast_dimensions=dims)),
                    )
        if n.op == "transpose":
            for perm in itertools.permutations(range(len(n.shape))):
                if perm != tuple(n.param("permutation")):
                    yield "transpose perm", _replace(program, i, _with(n, permutation=perm))
        if n.op == "constant":
            for v in _constant_variants(n.param("value").array):
                yield (
                    f"constant {n.param('value')!r}->{Const(v)!r}",
                    _replace(program, i, _with(n, value=Const(v))),
                )
        # rewire one operand to another value of the same type
        for pos, a in enumerate(n.args):
            same = [
                j
                for j in range(i)
                if j != a
                and nodes[j].shape == nodes[a].shape
                and nodes[j].dtype == nodes[a].dtype
                and nodes[j].op != "constant"
            ]
            for j in same[:3]:
                args = list(n.args)
                args[pos] = j
                yield f"rewire {n.op}", _replace(program, i, _with(n, args=tuple(args)))


def _drop(program: Program, i: int) -> Program:
    """Replace node i by its (single) argument."""
    nodes = list(program.nodes)
    arg = nodes[i].args[0]
    nodes = [
        Node(n.op, tuple(arg if a == i else a for a in n.args), n.shape, n.dtype, n.params)
        for n in nodes
    ]
    outputs = [arg if o == i else o for o in program.outputs]
    return Program.build(nodes, program.inputs, outputs)


def _float_eval(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """float64 outputs, or None if the program is ill-typed (a value's shape is not declared)."""

    def check(i: int, node: Node, value):
        if tuple(np.shape(value)) != tuple(node.shape):
            raise ValueError("shape")
        return value

    try:
        with np.errstate(all="ignore"):
            return interpret(program, inputs, FloatAlgebra(np, "float64"), hook=check)
    except Exception:
        return None


def _differs(ref: list[np.ndarray], out: list[np.ndarray]) -> bool:
    return any(
        a.shape != b.shape or not np.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(ref, out)
    )


@pytest.mark.slow
def test_every_float_differing_mutant_is_rejected():
    counts: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    failures, notes = [], []
    for name, program in _programs():
        rng = np.random.default_rng(0)
        draws = [[rng.standard_normal(s) for s, _ in program.input_avals] for _ in range(2)]
        refs = [_float_eval(program, d) for d in draws]
        seen = {program.canonical_hash}
        for kind, mutant in mutations(program):
            if mutant.canonical_hash in seen:
                continue
            seen.add(mutant.canonical_hash)
            outs = [_float_eval(mutant, d) for d in draws]
            if any(o is None for o in outs) or mutant.output_avals != program.output_avals:
                counts["ill-typed (discarded)"] += 1
                continue
            counts["generated"] += 1
            differs = any(_differs(r, o) for r, o in zip(refs, outs))
            try:
                verdict = fields.verify(program, mutant)
            except fields.FieldSemanticsError as err:
                counts["no field meaning (raised)"] += 1
                notes.append(f"{name} {kind}: {err}")
                continue
            if differs:
                counts["differ in float"] += 1
                by_kind[kind.split()[0]] += 1
                if verdict:
                    failures.append((name, kind, mutant.pretty()))
                else:
                    counts["differ in float, rejected"] += 1
            elif verdict:
                counts["equal in float, accepted"] += 1
            else:
                counts["equal in float, rejected (exact difference float misses)"] += 1
                notes.append(f"{name} {kind}: rejected, equal in float")
    print("\nmutation counts:", dict(counts), "\ndiffering by kind:", dict(by_kind))
    print("\n".join(notes))
    assert not failures, failures[:3]
    assert counts["generated"] >= MIN_MUTANTS, counts
    assert counts["differ in float, rejected"] == counts["differ in float"]
