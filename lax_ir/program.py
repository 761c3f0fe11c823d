"""The Program IR: a frozen, hash-consed, canonically ordered DAG of normalised ops.

A Program is a tuple of `Node`s in a canonical topological order, plus the positions of its
inputs and outputs. Canonicalisation (`Program.build`) removes dead nodes, merges duplicate
sub-computations and orders independent nodes by their structural (Merkle) hash, so two
captures that differ only in variable names or in the order of independent equations produce
equal Programs with equal `canonical_hash`es.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from lax_ir import ops as _ops
from lax_ir.interpret import interpret as _interpret


class Const:
    """An immutable numpy constant that hashes by value (dtype, shape, bytes)."""

    __slots__ = ("_key", "array")

    def __init__(self, value: Any, dtype: Any = None):
        arr = np.array(value, dtype=dtype)
        arr.setflags(write=False)
        self.array = arr
        self._key = (arr.dtype.str, arr.shape, arr.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        a = self.array
        if a.size == 1:
            return repr(a.reshape(()).item())
        if a.size > 1 and np.all(a == a.flat[0]):
            return f"full({a.flat[0].item()!r})"
        return f"array<{a.dtype}{list(a.shape)}>"

    def digest(self) -> str:
        return hashlib.sha256(repr(self._key[:2]).encode() + self._key[2]).hexdigest()[:16]


class Opaque:
    """The payload of an op outside the normalised set: its JAX primitive and params.

    Compared and hashed by a printed key (primitive name and params), since params such as
    nested jaxprs are not hashable themselves.
    """

    __slots__ = ("key", "multiple_results", "params", "primitive")

    def __init__(self, primitive: Any, params: Mapping[str, Any]):
        self.primitive = primitive
        self.params = dict(params)
        self.multiple_results = bool(getattr(primitive, "multiple_results", False))
        body = ", ".join(f"{k}={_short_repr(v)}" for k, v in sorted(self.params.items()))
        self.key = f"{primitive.name}[{body}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return self.primitive.name


def _short_repr(v: Any) -> str:
    s = repr(v)
    if len(s) > 200:  # nested jaxprs: hash the full text, print a digest
        return "<" + hashlib.sha256(s.encode()).hexdigest()[:12] + ">"
    return s


@dataclass(frozen=True)
class Node:
    """One op of a Program.

    Arguments:
        op: the op name (see `lax_ir.ops.OPS`).
        args: indices of the producer nodes in the Program's node tuple.
        shape, dtype: the result's shape and numpy dtype name ("tuple" for multi-result ops).
        params: sorted (name, value) pairs; values are hashable (ints, tuples, str, Const,
            Opaque).
    """

    op: str
    args: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        return default

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def make_params(**kwargs: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(kwargs.items()))


@dataclass(frozen=True, eq=False)
class Program:
    """A canonical DAG of Nodes with positional inputs and outputs.

    Use `Program.build` to construct one; it canonicalises. Equality and hashing go through
    `canonical_hash`. `meta` carries pytree structure and names for calling convenience and
    does not take part in equality.
    """

    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    meta: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def build(
        nodes: Sequence[Node],
        inputs: Sequence[int],
        outputs: Sequence[int],
        meta: Mapping[str, Any] | None = None,
    ) -> Program:
        """Canonicalise: drop dead nodes, merge duplicates, order by structural hash.

        `nodes` must be topologically ordered (args refer to earlier indices). Input nodes
        (op "input") must appear in `inputs`; their `index` param is rewritten to position.
        A `meta["origins"]` aligned with `nodes` (per node, the set of places in the captured
        jaxpr that compute it; see `capture`) is carried to the new nodes, merged duplicates'
        places united.
        """
        nodes = list(nodes)
        for i, n in enumerate(nodes):
            if any(a >= i or a < 0 for a in n.args):
                raise ValueError(f"node {i} ({n.op}) refers to a later or invalid node: {n.args}")
        input_pos = {nid: pos for pos, nid in enumerate(inputs)}
        if len(input_pos) != len(inputs):
            raise ValueError("an input node is listed twice")
        for nid in inputs:
            if nodes[nid].op != "input":
                raise ValueError(f"inputs[{input_pos[nid]}] is node {nid}, a {nodes[nid].op}")
        # Merkle keys, bottom-up; equal keys are the same computation (hash-consing).
        key_of: list[tuple] = []
        digest_of: list[str] = []
        for i, n in enumerate(nodes):
            params = n.params
            if n.op == "input":
                if i not in input_pos:
                    raise ValueError(f"node {i} is an input that is not listed in inputs")
                params = make_params(index=input_pos[i])
            key = (n.op, _params_key(params), n.shape, n.dtype, tuple(digest_of[a] for a in n.args))
            key_of.append(key)
            digest_of.append(hashlib.sha256(repr(key).encode()).hexdigest()[:24])
        # Liveness from outputs (inputs are always live).
        live = set(inputs)
        stack = list(outputs)
        while stack:
            i = stack.pop()
            if i in live and nodes[i].op != "input":
                continue
            live.add(i)
            stack.extend(nodes[i].args)
        # Unique live digests, with one representative node each.
        rep: dict[str, int] = {}
        for i in sorted(live):
            rep.setdefault(digest_of[i], i)
        users: dict[str, set[str]] = {d: set() for d in rep}
        indeg: dict[str, int] = {}
        for d, i in rep.items():
            arg_ds = {digest_of[a] for a in nodes[i].args}
            indeg[d] = len(arg_ds)
            for ad in arg_ds:
                users[ad].add(d)
        # Inputs first in positional order, then Kahn's algorithm by (digest) priority.
        order: list[str] = [digest_of[i] for i in inputs]
        placed = set(order)
        heap: list[str] = []

        def release(d: str) -> None:
            for u in users[d]:
                indeg[u] -= 1
                if indeg[u] == 0 and u not in placed:
                    heapq.heappush(heap, u)

        for d in order:
            release(d)
        for d, k in indeg.items():
            if k == 0 and d not in placed:
                heapq.heappush(heap, d)
        while heap:
            d = heapq.heappop(heap)
            if d in placed:
                continue
            placed.add(d)
            order.append(d)
            release(d)
        new_index = {d: j for j, d in enumerate(order)}
        new_nodes = []
        for d in order:
            n = nodes[rep[d]]
            params = n.params
            if n.op == "input":
                params = make_params(index=input_pos[rep[d]])
            new_nodes.append(
                Node(n.op, tuple(new_index[digest_of[a]] for a in n.args), n.shape, n.dtype, params)
            )
        meta = dict(meta or {})
        if "origins" in meta:
            places: dict[str, set] = {d: set() for d in order}
            for i, where in enumerate(meta["origins"]):
                if digest_of[i] in places:
                    places[digest_of[i]] |= where
            meta["origins"] = tuple(frozenset(places[d]) for d in order)
        return Program(
            tuple(new_nodes),
            tuple(new_index[digest_of[i]] for i in inputs),
            tuple(new_index[digest_of[o]] for o in outputs),
            meta,
        )

    # ------------------------------------------------------------------ identity
    @cached_property
    def canonical_hash(self) -> str:
        """A hex digest that is equal exactly for structurally equal Programs."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(repr((n.op, n.args, n.shape, n.dtype, _params_key(n.params))).encode())
            h.update(b";")
        h.update(repr((self.inputs, self.outputs)).encode())
        return h.hexdigest()

    def __hash__(self) -> int:
        return hash(self.canonical_hash)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and self.canonical_hash == other.canonical_hash

    # ------------------------------------------------------------------ queries
    @property
    def input_avals(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        return tuple((self.nodes[i].shape, self.nodes[i].dtype) for i in self.inputs)

    @property
    def output_avals(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        return tuple((self.nodes[i].shape, self.nodes[i].dtype) for i in self.outputs)

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that use it (each at most once, ascending)."""
        us: list[set[int]] = [set() for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for a in n.args:
                us[a].add(i)
        return tuple(tuple(sorted(u)) for u in us)

    def ops(self) -> Iterable[tuple[int, Node]]:
        """The nodes that compute something (not inputs)."""
        return ((i, n) for i, n in enumerate(self.nodes) if n.op != "input")

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, n in self.ops():
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def interpret(self, inputs: Sequence[Any], algebra: Any) -> list[Any]:
        """Evaluate over an Algebra (the evaluation interface Programs share with µGraphs)."""
        return _interpret(self, inputs, algebra)

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        return self.pretty()

    def __repr__(self) -> str:
        name = self.meta.get("name", "program")
        return f"<Program {name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, {self.canonical_hash[:12]}>"

    def pretty(self) -> str:
        """A readable listing: one line per node, `%i = op args {params} : dtype[shape]`."""
        name = self.meta.get("name", "program")
        ins = ", ".join(f"%{i}: {_aval_str(self.nodes[i])}" for i in self.inputs)
        outs = ", ".join(_aval_str(self.nodes[i]) for i in self.outputs)
        lines = [f"program {name}({ins}) -> ({outs})"]
        for i, n in self.ops():
            args = ", ".join(f"%{a}" for a in n.args)
            ps = [f"{k}={v!r}" for k, v in n.params if not (n.op == "constant" and k == "value")]
            head = f"{n.op} {n.param('value')!r}" if n.op == "constant" else n.op
            body = " ".join(x for x in (head, args, "{" + ", ".join(ps) + "}" if ps else "") if x)
            lines.append(f"  %{i} = {body} : {_aval_str(n)}")
        lines.append("  return " + ", ".join(f"%{o}" for o in self.outputs))
        return "\n".join(lines)


def matmul_flops(program: Program) -> int:
    """The flops of a program's matmuls: 2 · output elements · contracted size per matmul."""
    nodes = program.nodes
    return sum(
        2 * math.prod(n.shape) * int(nodes[n.args[0]].shape[-1]) for n in nodes if n.op == "matmul"
    )


def _aval_str(n: Node) -> str:
    if n.dtype == "tuple":
        return "tuple"
    return f"{_ops.short_dtype(n.dtype)}[{','.join(map(str, n.shape))}]"


def _params_key(params: tuple[tuple[str, Any], ...]) -> tuple:
    out = []
    for k, v in params:
        if isinstance(v, Const):
            v = ("const", v.digest())
        elif isinstance(v, Opaque):
            v = ("opaque", v.key)
        out.append((k, v))
    return tuple(out)
