"""µGraph node types (kernel graph, block graph), builders, canonical form and structural hash.

A `MuGraph` is a tuple of `KernelOp`s in canonical topological order plus its output refs.
Kernel tensors are referred to by `(op index, output index)` pairs; the graph inputs are the
ops named "input" (param `index` is the position). A "graph_defined" kernel op carries a
`BlockGraph`: a grid of 1–3 axes, a `forloop_range`, `BlockInput`s (one per kernel argument,
each with an `imap` per grid axis and a `forloop_dim`), single-output `BlockOp`s referring to
block tensors by integer id (inputs first, then ops), and `BlockOutput`s with an `omap`.
The thread level (fused elementwise epilogues) is not a separate IR: the elementwise chain
after a block op is the epilogue, and the lowering fuses it.

`MuGraph.build` canonicalises like `lax_ir.Program.build`: Merkle digests bottom-up, dead ops
dropped, duplicates merged, independent ops ordered by digest; inside each graph-defined
kernel the inputs are ordered by (argument digest, imap, forloop_dim) and the outputs by
digest. So two constructions that differ only in order are equal with equal `canonical_hash`.

Design choices (and why):
- A block graph is self-contained: each `BlockInput` carries its device tensor's shape and dtype,
  so a block graph can be shape-checked, evaluated, costed and lowered on its own; the kernel
  graph only checks that its arguments match.
- Shapes are not stored on ops (only on inputs): they are inferred (`validate.block_info`,
  cached), so an op cannot disagree with its own shape and `with_input_shapes` re-sizes a graph.
- Accumulators are ordinary single-output block ops whose output is "after the loop"; other ops
  may not mix loop and accumulated tensors (the original's `after_accum` rule), and outputs must
  be accumulated. No separate loop region object is needed.
- The online-softmax accumulators take their final shift explicitly (`accum_rescale_sum(x, m,
  accum_max(m))`, see `ops.py`) so numerator and denominator share one shift.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mirage_jax.mugraph.evaluate import interpret as _interpret
from mirage_jax.mugraph.render import to_svg, to_text
from mirage_jax.mugraph.validate import GRID_AXES as GRID_AXES
from mirage_jax.mugraph.validate import MuGraphError as MuGraphError
from mirage_jax.mugraph.validate import Ref as Ref
from mirage_jax.mugraph.validate import kernel_shapes

Params = tuple[tuple[str, Any], ...]


def make_params(**kwargs: Any) -> Params:
    return tuple(sorted((k, v) for k, v in kwargs.items() if v is not None))


def _param(params: Params, name: str, default: Any = None) -> Any:
    for k, v in params:
        if k == name:
            return v
    return default


def _digest(obj: Any) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------- block level
@dataclass(frozen=True)
class BlockInput:
    """A kernel argument as seen by one block.

    Arguments:
        shape, dtype: the whole device tensor's shape and numpy dtype name.
        imap: for each grid axis, the tensor dim it splits, or None (replicated).
        forloop_dim: the dim split into `forloop_range` chunks, one per iteration, or None.
    """

    shape: tuple[int, ...]
    dtype: str
    imap: tuple[int | None, ...]
    forloop_dim: int | None = None


@dataclass(frozen=True)
class BlockOp:
    """One block-level op with one output; `args` are block tensor ids (inputs first)."""

    op: str
    args: tuple[int, ...]
    params: Params = ()

    def param(self, name: str, default: Any = None) -> Any:
        return _param(self.params, name, default)


@dataclass(frozen=True)
class BlockOutput:
    """A block tensor written to device memory; `omap[axis]` is the dim blocks concatenate on.
    `dtype`, where set, is the float dtype it is stored in, rounded from its tensor's (a
    stitched norm piece's float32 row stored in the 16 bits the program's convert made)."""

    arg: int
    omap: tuple[int | None, ...]
    dtype: str | None = None

    @property
    def key(self) -> tuple:
        """What identifies it in a graph's hash (the dtype only where set)."""
        return (self.arg, self.omap) + ((self.dtype,) if self.dtype else ())


@dataclass(frozen=True)
class BlockGraph:
    """What one thread block runs, for every block of `grid` and every loop iteration."""

    grid: tuple[int, ...]
    forloop_range: int
    inputs: tuple[BlockInput, ...]
    ops: tuple[BlockOp, ...]
    outputs: tuple[BlockOutput, ...]

    @property
    def num_blocks(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    def op_of(self, tensor: int) -> BlockOp | None:
        """The op producing block tensor `tensor` (None for an input)."""
        k = tensor - len(self.inputs)
        return self.ops[k] if k >= 0 else None

    def canonical(
        self, input_keys: Sequence[str] | None = None
    ) -> tuple[BlockGraph, list[int], list[int], str]:
        """Canonical form: (graph, input order, output order, digest).

        `input_keys` (digests of the kernel arguments) make the input order canonical; without
        them the inputs keep their positions. The orders give, for each new position, the old
        one. Dead ops are dropped, duplicate ops merged, independent ops ordered by digest.
        """
        n_in = len(self.inputs)
        in_key = [
            (input_keys[i] if input_keys is not None else f"{i:08d}", repr(b))
            for i, b in enumerate(self.inputs)
        ]
        in_order = sorted(range(n_in), key=lambda i: in_key[i]) if input_keys else list(range(n_in))
        digest: list[str] = [_digest(("in", in_key[i])) for i in range(n_in)]
        for op in self.ops:
            digest.append(
                _digest((op.op, _params_key(op.params), tuple(digest[a] for a in op.args)))
            )
        out_key = [(digest[o.arg], *o.key[1:]) for o in self.outputs]
        out_order = sorted(range(len(self.outputs)), key=lambda j: out_key[j])
        live: set[int] = set()
        stack = [o.arg for o in self.outputs]
        while stack:
            t = stack.pop()
            if t in live:
                continue
            live.add(t)
            if t >= n_in:
                stack.extend(self.ops[t - n_in].args)
        order, new_id = _kahn(
            [digest[i] for i in in_order],
            {digest[t]: t for t in sorted(live) if t >= n_in},
            lambda t: [digest[a] for a in self.ops[t - n_in].args],
        )
        for pos, i in enumerate(in_order):
            new_id.setdefault(digest[i], pos)
        ops = tuple(
            BlockOp(
                self.ops[t - n_in].op,
                tuple(new_id[digest[a]] for a in self.ops[t - n_in].args),
                self.ops[t - n_in].params,
            )
            for t in order
        )
        outputs = tuple(
            dataclasses.replace(self.outputs[j], arg=new_id[digest[self.outputs[j].arg]])
            for j in out_order
        )
        bg = BlockGraph(
            self.grid, self.forloop_range, tuple(self.inputs[i] for i in in_order), ops, outputs
        )
        return (
            bg,
            in_order,
            out_order,
            _digest(
                (
                    "bg",
                    bg.grid,
                    bg.forloop_range,
                    tuple(out_key[j] for j in out_order),
                    tuple(in_key[i][1] for i in in_order),
                )
            ),
        )


def _kahn(first: list[str], rep: dict[str, int], arg_digests) -> tuple[list[int], dict[str, int]]:
    """Topological order of the ops in `rep` (digest -> representative), smallest digest first."""
    placed = set(first)
    new_id = {d: i for i, d in enumerate(first)}
    users: dict[str, set[str]] = {d: set() for d in rep}
    indeg: dict[str, int] = {}
    for d, t in rep.items():
        ads = {a for a in arg_digests(t) if a not in placed}
        indeg[d] = len(ads)
        for a in ads:
            users[a].add(d)
    heap = [d for d, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        d = heapq.heappop(heap)
        if d in placed:
            continue
        placed.add(d)
        new_id[d] = len(first) + len(order)
        order.append(rep[d])
        for u in users[d]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    return order, new_id


# ---------------------------------------------------------------------------- kernel level
@dataclass(frozen=True)
class KernelOp:
    """One kernel-level op: "input", a pre-defined op, or "graph_defined" (with a BlockGraph)."""

    op: str
    args: tuple[Ref, ...]
    params: Params = ()
    block_graph: BlockGraph | None = None

    def param(self, name: str, default: Any = None) -> Any:
        return _param(self.params, name, default)

    @property
    def num_outputs(self) -> int:
        return len(self.block_graph.outputs) if self.block_graph is not None else 1


ONE_LAUNCH = "one_launch"
"""µGraph meta key (True): its graph-defined kernels run one launch per dependency level, the
kernels of a level launched as one whose grid is theirs one after another (the triton backend;
others launch them one by one). The meaning is unchanged, only the launch: a decode norm
before Q, K and V projections of different widths gets each projection its own tiling in one
kernel (`MuGraph.independent_kernels`: one level); three split projections and their
combining kernels run as two launches (`MuGraph.launch_levels`)."""


@dataclass(frozen=True, eq=False)
class MuGraph:
    """A canonical kernel graph. Build with `MuGraph.build` (or `MuGraphBuilder`).

    Equality and hashing go through `canonical_hash`; `meta` (name, source) does not count.
    """

    ops: tuple[KernelOp, ...]
    outputs: tuple[Ref, ...]
    meta: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def build(
        ops: Sequence[KernelOp], outputs: Sequence[Ref], meta: Mapping[str, Any] | None = None
    ) -> MuGraph:
        """Canonicalise `ops` (topologically ordered: args refer to earlier ops)."""
        ops = list(ops)
        for i, op in enumerate(ops):
            for a in op.args:
                if not (0 <= a[0] < i and 0 <= a[1] < ops[a[0]].num_outputs):
                    raise MuGraphError(f"op {i} ({op.op}) refers to a later or invalid tensor {a}")
        inputs = sorted((op.param("index"), i) for i, op in enumerate(ops) if op.op == "input")
        if [p for p, _ in inputs] != list(range(len(inputs))):
            raise MuGraphError(f"input indices must be 0..n-1, got {[p for p, _ in inputs]}")
        op_digest: list[str] = []
        out_digest: list[list[str]] = []  # per op, per (canonical) output
        canon: list[KernelOp] = []
        out_perm: list[list[int]] = []  # per op: new output position -> old
        for op in ops:
            arg_ds = [out_digest[a[0]][out_perm_inv(out_perm[a[0]], a[1])] for a in op.args]
            if op.block_graph is not None:
                bg, in_order, o_order, bg_d = op.block_graph.canonical(arg_ds)
                args = tuple(op.args[i] for i in in_order)
                arg_ds = [arg_ds[i] for i in in_order]
                d = _digest((op.op, _params_key(op.params), tuple(arg_ds), bg_d))
                canon.append(KernelOp(op.op, args, op.params, bg))
                out_perm.append(o_order)
            else:
                d = _digest((op.op, _params_key(op.params), tuple(arg_ds)))
                canon.append(op)
                out_perm.append([0])
            op_digest.append(d)
            out_digest.append([_digest((d, j)) for j in range(op.num_outputs)])

        live: set[int] = {i for _, i in inputs}
        stack = [r[0] for r in outputs]
        while stack:
            i = stack.pop()
            if i in live and ops[i].op != "input":
                continue
            live.add(i)
            stack.extend(a[0] for a in ops[i].args)
        first = [op_digest[i] for _, i in inputs]
        rep: dict[str, int] = {}
        for i in sorted(live):
            if ops[i].op != "input":
                rep.setdefault(op_digest[i], i)
        order, new_id = _kahn(first, rep, lambda i: [op_digest[a[0]] for a in ops[i].args])
        by_digest = {op_digest[i]: i for _, i in inputs} | rep

        def new_ref(r: Ref) -> Ref:
            old = r[0]
            return (new_id[op_digest[old]], out_perm_inv(out_perm[old], r[1]))

        new_ops = []
        for i in [i for _, i in inputs] + order:
            i = by_digest[op_digest[i]]
            op = canon[i]
            new_ops.append(
                KernelOp(op.op, tuple(new_ref(a) for a in op.args), op.params, op.block_graph)
            )
        return MuGraph(tuple(new_ops), tuple(new_ref(r) for r in outputs), dict(meta or {}))

    # ------------------------------------------------------------------ identity
    @cached_property
    def canonical_hash(self) -> str:
        """A hex digest equal exactly for structurally equal µGraphs."""
        return hashlib.sha256(repr(_key(self)).encode()).hexdigest()

    def __hash__(self) -> int:
        return hash(self.canonical_hash)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MuGraph) and self.canonical_hash == other.canonical_hash

    # ------------------------------------------------------------------ queries
    @cached_property
    def inputs(self) -> tuple[int, ...]:
        """Op indices of the graph inputs, by position."""
        found = sorted((op.param("index"), i) for i, op in enumerate(self.ops) if op.op == "input")
        return tuple(i for _, i in found)

    @cached_property
    def shapes(self) -> dict[Ref, tuple[tuple[int, ...], str]]:
        """(shape, dtype) of every kernel tensor; raises MuGraphError on a broken rule."""

        return kernel_shapes(self)

    @property
    def input_avals(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        return tuple(self.shapes[(i, 0)] for i in self.inputs)

    @property
    def output_avals(self) -> tuple[tuple[tuple[int, ...], str], ...]:
        return tuple(self.shapes[r] for r in self.outputs)

    def graph_defined(self) -> list[tuple[int, KernelOp]]:
        return [(i, op) for i, op in enumerate(self.ops) if op.block_graph is not None]

    def independent_kernels(self) -> tuple[int, ...]:
        """The graph-defined kernels, if there are two or more, the µGraph has no other kernel
        ops, and each reads only its inputs (they can run in any order or at once); else ()."""
        ks = [i for i, op in enumerate(self.ops) if op.op == "graph_defined"]
        if len(ks) < 2 or any(op.op not in ("input", "graph_defined") for op in self.ops):
            return ()
        if any(self.ops[a[0]].op != "input" for i in ks for a in self.ops[i].args):
            return ()
        return tuple(ks)

    def dependency_levels(self) -> tuple[tuple[int, ...], ...]:
        """The graph-defined kernels by dependency level (a kernel's level is one more than the
        highest of the kernels it reads; inputs are below every level), in op order within a
        level, where the µGraph has only graph-defined kernel ops; else ()."""
        if any(op.op not in ("input", "graph_defined") for op in self.ops):
            return ()
        level: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            if op.op == "graph_defined":
                level[i] = 1 + max((level.get(a[0], -1) for a in op.args), default=-1)
        if not level:
            return ()
        return tuple(
            tuple(i for i in level if level[i] == n) for n in range(max(level.values()) + 1)
        )

    def launch_groups(self) -> tuple[tuple[int, ...], ...]:
        """The `launch_levels` of two or more kernels: those launched together."""
        return tuple(lv for lv in self.launch_levels() if len(lv) > 1)

    def grouped_kernels(self) -> frozenset[int]:
        """The kernels of every `launch_groups` level (launched with others, not alone)."""
        return frozenset(i for lv in self.launch_groups() for i in lv)

    def launch_levels(self) -> tuple[tuple[int, ...], ...]:
        """The launches of a µGraph whose meta has `ONE_LAUNCH`: its `dependency_levels`, each
        launched as one (a level of one kernel is that kernel's launch); () without the key,
        or where a kernel op is not graph-defined."""
        return self.dependency_levels() if self.meta.get(ONE_LAUNCH) else ()

    def interpret(self, inputs: Sequence[Any], algebra: Any) -> list[Any]:
        """Evaluate over an Algebra (the interface µGraphs share with lax_ir Programs)."""

        return _interpret(self, inputs, algebra)

    def __repr__(self) -> str:
        name = self.meta.get("name", "mugraph")
        n = len(self.graph_defined())
        return f"<MuGraph {name}: {len(self.inputs)} inputs, {len(self.ops)} ops ({n} graph-defined), {self.canonical_hash[:12]}>"

    def __str__(self) -> str:

        return to_text(self)

    def _repr_svg_(self) -> str:

        return to_svg(self)


def out_perm_inv(perm: list[int], old: int) -> int:
    """New position of old output `old` under `perm` (new position -> old)."""
    return perm.index(old)


def _params_key(params: Params) -> tuple:
    return tuple((k, repr(v)) for k, v in params)


def _key(g: MuGraph) -> tuple:
    ops = []
    for op in g.ops:
        bg = op.block_graph
        bkey = None
        if bg is not None:
            bkey = (
                bg.grid,
                bg.forloop_range,
                tuple((b.shape, b.dtype, b.imap, b.forloop_dim) for b in bg.inputs),
                tuple((o.op, o.args, _params_key(o.params)) for o in bg.ops),
                tuple(o.key for o in bg.outputs),
            )
        ops.append((op.op, op.args, _params_key(op.params), bkey))
    return (tuple(ops), g.outputs)


# ---------------------------------------------------------------------------- builders
class BlockGraphBuilder:
    """Build a BlockGraph op by op; tensors are returned as integer ids.

    >>> b = BlockGraphBuilder(grid=(256,), forloop_range=32)
    >>> x = b.input((2, 4096), "float16", imap=(None,), forloop_dim=1)
    """

    def __init__(self, grid: Sequence[int], forloop_range: int = 1):
        self.grid = tuple(int(g) for g in grid)
        self.forloop_range = int(forloop_range)
        self._inputs: list[BlockInput] = []
        self._ops: list[tuple[str, tuple[int, ...], Params]] = []
        self._outputs: list[BlockOutput] = []

    def input(self, shape, dtype, imap, forloop_dim=None) -> int:
        if self._ops:
            raise MuGraphError("block inputs must be added before block ops")
        self._inputs.append(
            BlockInput(tuple(int(s) for s in shape), str(dtype), tuple(imap), forloop_dim)
        )
        return len(self._inputs) - 1

    def op(self, name: str, *args: int, **params: Any) -> int:
        self._ops.append((name, tuple(args), make_params(**params)))
        return len(self._inputs) + len(self._ops) - 1

    def output(self, tensor: int, omap) -> int:
        self._outputs.append(BlockOutput(tensor, tuple(omap)))
        return len(self._outputs) - 1

    def build(self) -> BlockGraph:
        ops = tuple(BlockOp(n, a, p) for n, a, p in self._ops)
        return BlockGraph(
            self.grid, self.forloop_range, tuple(self._inputs), ops, tuple(self._outputs)
        )


class MuGraphBuilder:
    """Build a MuGraph; tensors are returned as refs `(op index, output index)`."""

    def __init__(self):
        self._ops: list[KernelOp] = []
        self._n_inputs = 0
        self._shapes: dict[Ref, tuple[tuple[int, ...], str]] = {}

    def input(self, shape, dtype="float16") -> Ref:
        p = make_params(index=self._n_inputs, shape=tuple(int(s) for s in shape), dtype=str(dtype))
        self._n_inputs += 1
        self._ops.append(KernelOp("input", (), p))
        return (len(self._ops) - 1, 0)

    def op(self, name: str, *args: Ref, **params: Any) -> Ref:
        self._ops.append(KernelOp(name, tuple(args), make_params(**params)))
        return (len(self._ops) - 1, 0)

    def graph_defined(self, args: Sequence[Ref], block_graph: BlockGraph) -> list[Ref]:
        self._ops.append(KernelOp("graph_defined", tuple(args), (), block_graph))
        i = len(self._ops) - 1
        return [(i, j) for j in range(len(block_graph.outputs))]

    def shape(self, ref: Ref) -> tuple[tuple[int, ...], str]:
        """(shape, dtype) of a tensor built so far (ops are only appended: each op's shapes
        are inferred once)."""
        if ref not in self._shapes:
            self._shapes = kernel_shapes(MuGraph(tuple(self._ops), (ref,)), self._shapes)
        return self._shapes[ref]

    def build(self, outputs: Sequence[Ref], **meta: Any) -> MuGraph:
        return MuGraph.build(self._ops, outputs, meta)
