"""Lax-fragment classification and partitioning of a Program into kernel regions.

`classify` decides per node whether it is inside the Lax fragment (and if not, why).
`partition` groups the Lax nodes into maximal connected regions such that no region reaches
itself through the residual part (so each region can become one kernel call), and leaves
everything else to XLA. `rebuild` turns a partition back into a `jax.jit`-able function,
optionally with some regions replaced by other implementations (the kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.cluster.hierarchy import DisjointSet

from lax_ir.canonical import flatten_rows, squeeze_leading
from lax_ir.dtypes import is_float
from lax_ir.interface import adapt
from lax_ir.interpret import FloatAlgebra, eval_node, evaluate
from lax_ir.layouts import hoist_layouts
from lax_ir.ops import OPS
from lax_ir.pieces import (
    array_constants,
    capture_regroups,
    constant_like,
    demotions,
    gemm_cuts,
    piece_labels,
    transposed_operand_cuts,
)
from lax_ir.program import Node, Program, make_params
from lax_ir.slices import absorb_slices

SHIFT_PASS_THROUGH = ("broadcast_in_dim", "reshape", "convert", "transpose")


# ---------------------------------------------------------------------- softmax shifts
def _shift_chain(program: Program, m: int) -> bool:
    """True if reduce_max node `m` is only used as a stabilising shift before exp."""
    users = program.users
    nodes = program.nodes
    if m in program.outputs:
        return False
    stack, seen = [m], {m}
    while stack:
        s = stack.pop()
        if s in program.outputs:
            return False
        for u in users[s]:
            un = nodes[u]
            if un.op in SHIFT_PASS_THROUGH and un.args == (s,):
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
            elif un.op == "sub" and un.args[1] == s and un.args[0] != s:
                if u in program.outputs or not users[u]:
                    return False
                for e in users[u]:
                    en = nodes[e]
                    if en.op == "exp":
                        continue
                    if (
                        en.op == "convert"
                        and users[e]
                        and all(nodes[x].op == "exp" for x in users[e])
                    ):
                        continue
                    return False
            else:
                return False
    return True


def mark_softmax_shifts(program: Program) -> Program:
    """Set `shift=True` on each reduce_max whose only role is a softmax shift."""
    marks = [
        i
        for i, n in program.ops()
        if n.op == "reduce_max" and not n.param("shift") and _shift_chain(program, i)
    ]
    if not marks:
        return program
    nodes = list(program.nodes)
    for i in marks:
        n = nodes[i]
        nodes[i] = Node(n.op, n.args, n.shape, n.dtype, make_params(**dict(n.params), shift=True))
    return Program.build(nodes, program.inputs, program.outputs, program.meta)


# ---------------------------------------------------------------------- classification
@dataclass(frozen=True)
class Classification:
    """Per node: `kind` is "lax", "structural" or "residual"; `reason` says why not Lax."""

    kinds: tuple[str, ...]
    reasons: Mapping[int, str]


def classify(program: Program) -> Classification:
    """Classify every node of `program` against the Lax fragment (see lax_ir.ops)."""
    kinds: list[str] = []
    reasons: dict[int, str] = {}
    tainted: list[bool] = []  # depends on an exp output through Lax nodes
    for i, n in enumerate(program.nodes):
        info = OPS[n.op]
        arg_lax_taint = any(kinds[a] == "lax" and tainted[a] for a in n.args)
        kind, reason = "lax", None
        if info.kind == "structural":
            kind = "structural"
        elif info.kind == "residual":
            name = n.param("payload").primitive.name if n.op == "opaque" else "tuple projection"
            kind, reason = "residual", f"primitive `{name}` is outside the Lax fragment"
        elif not is_float(n.dtype) or any(not is_float(program.nodes[a].dtype) for a in n.args):
            kind, reason = (
                "residual",
                f"`{n.op}` on non-float data ({n.dtype}) is outside the Lax fragment",
            )
        elif n.op == "exp" and arg_lax_taint:
            kind, reason = "residual", "exp nested inside another exp is outside the Lax fragment"
        elif n.op == "reduce_max" and not n.param("shift"):
            kind, reason = (
                "residual",
                "reduce_max that is not a softmax shift is outside the Lax fragment",
            )
        elif n.op == "max":
            kind, reason = "residual", "elementwise max (e.g. relu) is outside the Lax fragment"
        kinds.append(kind)
        if reason:
            reasons[i] = reason
        tainted.append(kind == "lax" and (n.op == "exp" or arg_lax_taint))
    return Classification(tuple(kinds), reasons)


# ---------------------------------------------------------------------- partition
@dataclass(frozen=True)
class Region:
    """A maximal connected set of Lax nodes that becomes one kernel call.

    `inputs`/`outputs` are node ids of the enclosing Program, in the positional order of
    `program` (the region as a standalone Program; constants are copied into it).
    """

    index: int
    nodes: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    program: Program
    neighbours: tuple[tuple[int, str], ...] = ()  # residual nodes adjacent, with reasons

    @property
    def is_trivial(self) -> bool:
        """Only shape/dtype plumbing: nothing worth a kernel."""
        return all(
            self.program.nodes[i].op
            in ("reshape", "transpose", "convert", "broadcast_in_dim", "constant")
            for i, _ in self.program.ops()
        )


@dataclass(frozen=True)
class Partition:
    program: Program
    regions: tuple[Region, ...]
    residual: tuple[int, ...]
    classification: Classification
    order: tuple[tuple[str, int], ...] = field(repr=False)  # ("region", k) or ("node", id)

    def region_of(self, node: int) -> Region | None:
        for r in self.regions:
            if node in r.nodes:
                return r
        return None

    def explain(self) -> str:
        """Regions, their sizes, and which residual ops kept what out of them."""
        p = self.program
        lines = [
            f"partition of {p.meta.get('name', 'program')}: {len(self.regions)} Lax region(s), "
            f"{len(self.residual)} residual op(s)"
        ]
        for r in self.regions:
            own: dict[str, int] = {}
            for i in r.nodes:
                own[_node_label(p.nodes[i])] = own.get(_node_label(p.nodes[i]), 0) + 1
            searched = r.program.op_counts()
            consts = searched.pop("constant", 0)
            copied = f" and {consts} constant(s) copied in" if consts else ""
            lines.append(
                f"  region {r.index}: {n_ops(len(r.nodes))} ({_counts(own)}){copied}; "
                f"{len(r.inputs)} in, {len(r.outputs)} out{' (trivial)' if r.is_trivial else ''}"
            )
            if searched != own:  # lax_ir.layouts moved layout steps to the region's edges
                n = sum(searched.values())
                moved = len(r.nodes) - n
                why = (
                    f"; the other {moved} are layout steps at its edges"
                    if moved > 0 and r.program.meta.get("interface")
                    else ""
                )
                lines.append(f"    as searched: {n_ops(n)} ({_counts(searched)}){why}")
            for nid, why in r.neighbours:
                lines.append(f"    bounded by %{nid} {_node_label(p.nodes[nid])}: {why}")
        for nid in self.residual:
            lines.append(
                f"  residual %{nid} {_node_label(p.nodes[nid])}: {self.classification.reasons.get(nid, '')}"
            )
        return "\n".join(lines)

    __str__ = explain


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items()))


def _node_label(n: Node) -> str:
    if n.op == "opaque":
        return n.param("payload").primitive.name
    return n.op


def partition(program: Program, pieces: bool = True) -> Partition:
    """Split `program` into acyclic Lax regions plus residual XLA ops.

    The regions are maximal; with `pieces` (the default) they are then refined into searchable
    pieces (`lax_ir.pieces`): layout ops at their edges or restructuring dimensions go to XLA,
    and a region with more matmuls than one kernel plan covers is cut at GEMM-group boundaries.
    """
    cls = classify(program)
    const = constant_like(program)
    kinds = ["structural" if i in const and k == "lax" else k for i, k in enumerate(cls.kinds)]
    cls = Classification(tuple(kinds), cls.reasons)
    groups = _group(program, cls, None)
    if pieces:
        reasons = dict(cls.reasons)
        labels: dict[int, int] = {}
        for g in groups.values():
            demoted = demotions(program, g)
            for i, why in demoted.items():
                kinds[i], reasons[i] = "residual", why
            kept = [i for i in g if i not in demoted]
            cuts = gemm_cuts(program, kept) | capture_regroups(program, kept)
            cuts |= transposed_operand_cuts(program, kept)
            labels.update(piece_labels(program, kept, cuts))
        cls = Classification(tuple(kinds), reasons)
        groups = _group(program, cls, labels)
    return _assemble(program, cls, groups)


def _group(
    program: Program, cls: Classification, labels: Mapping[int, int] | None
) -> dict[int, list[int]]:
    """Lax nodes merged into acyclic groups along producer edges (within equal labels)."""
    nodes = program.nodes
    n = len(nodes)
    active = [i for i in range(n) if cls.kinds[i] != "structural"]
    groups_of = DisjointSet(range(n))  # node -> its region so far (merged below)

    def group_edges() -> dict[int, set[int]]:
        succ: dict[int, set[int]] = {}
        for i in active:
            gi = groups_of[i]
            for a in nodes[i].args:
                if cls.kinds[a] == "structural":
                    continue
                ga = groups_of[a]
                if ga != gi:
                    succ.setdefault(ga, set()).add(gi)
        return succ

    def creates_cycle(ga: int, gb: int, succ: dict[int, set[int]]) -> bool:
        # A path ga -> X -> ... -> gb through some other group X makes the merge cyclic.
        stack = [x for x in succ.get(ga, ()) if x != gb]
        seen = set(stack)
        while stack:
            x = stack.pop()
            for y in succ.get(x, ()):
                if y == gb:
                    return True
                if y not in seen and y != ga:
                    seen.add(y)
                    stack.append(y)
        return False

    for i in active:
        if cls.kinds[i] != "lax":
            continue
        for a in nodes[i].args:
            if cls.kinds[a] != "lax":
                continue
            if labels is not None and labels.get(a) != labels.get(i):
                continue
            ga, gi = groups_of[a], groups_of[i]
            if ga == gi:
                continue
            if not creates_cycle(ga, gi, group_edges()):
                groups_of.merge(ga, gi)

    groups: dict[int, list[int]] = {}
    for i in active:
        if cls.kinds[i] == "lax":
            groups.setdefault(groups_of[i], []).append(i)
    return groups


def _assemble(program: Program, cls: Classification, groups: dict[int, list[int]]) -> Partition:
    """Regions from node groups, residual nodes, and a topological order of both."""
    nodes = program.nodes
    active = [i for i in range(len(nodes)) if cls.kinds[i] != "structural"]
    residual = tuple(i for i in active if cls.kinds[i] == "residual")

    # Order units (regions and residual nodes) topologically.
    unit_of: dict[int, tuple[str, int]] = {}
    region_roots = sorted(groups, key=lambda g: min(groups[g]))
    for k, g in enumerate(region_roots):
        for i in groups[g]:
            unit_of[i] = ("region", k)
    for i in residual:
        unit_of[i] = ("node", i)
    succ: dict[tuple[str, int], set[tuple[str, int]]] = {}
    indeg: dict[tuple[str, int], int] = {u: 0 for u in set(unit_of.values())}
    for i in active:
        for a in nodes[i].args:
            if (
                a in unit_of
                and unit_of[a] != unit_of[i]
                and unit_of[i] not in succ.setdefault(unit_of[a], set())
            ):
                succ[unit_of[a]].add(unit_of[i])
                indeg[unit_of[i]] += 1
    ready = sorted(
        [u for u, d in indeg.items() if d == 0], key=lambda u: _unit_key(u, groups, region_roots)
    )
    order: list[tuple[str, int]] = []
    while ready:
        u = ready.pop(0)
        order.append(u)
        for v in sorted(succ.get(u, ()), key=lambda u: _unit_key(u, groups, region_roots)):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) != len(indeg):
        raise AssertionError("partition produced a cyclic unit graph (a bug)")

    outputs = set(program.outputs)
    weights = array_constants(program)  # closed-over arrays: region inputs, not copies
    regions = []
    for k, g in enumerate(region_roots):
        members = tuple(sorted(groups[g]))
        mset = set(members)
        ins: list[int] = []
        for i in members:
            for a in nodes[i].args:
                if a in mset or a in ins:
                    continue
                if nodes[a].op == "input" or cls.kinds[a] != "structural" or a in weights:
                    ins.append(a)
        ins.extend(_weights_under_copies(program, members, ins, weights))
        # A convert of another input (a float32 copy of a float16 stream) is recomputed
        # inside, so the region sees one value, not two unrelated inputs.
        recomputed = {a for a in ins if nodes[a].op == "convert" and nodes[a].args[0] in ins}
        ins = sorted(a for a in ins if a not in recomputed)  # program inputs first, in order
        outs = [i for i in members if i in outputs or any(u not in mset for u in program.users[i])]
        neighbours = sorted(
            {
                (x, cls.reasons[x])
                for i in members
                for x in (*nodes[i].args, *program.users[i])
                if cls.kinds[x] == "residual"
            }
        )
        sub = _subprogram(
            program, members, ins, outs, name=f"{program.meta.get('name', 'program')}.region{k}",
            copies=recomputed,
        )  # fmt: skip
        region = Region(k, members, tuple(ins), tuple(outs), sub, tuple(neighbours))
        regions.append(absorb_slices(program, region))
    return Partition(program, tuple(regions), residual, cls, tuple(order))


def _weights_under_copies(
    program: Program, members: Sequence[int], ins: Sequence[int], weights: set[int]
) -> list[int]:
    """Array literals read by the constant-like values a region copies in (a causal bias
    under its broadcast): they are region inputs too, not copies."""
    nodes, const, mset = program.nodes, constant_like(program), set(members)
    found: list[int] = []
    stack = [a for m in members for a in nodes[m].args if a in const and a not in mset]
    seen: set[int] = set()
    while stack:
        a = stack.pop()
        if a in seen or a in ins:
            continue
        seen.add(a)
        if a in weights:
            found.append(a)
        else:
            stack.extend(nodes[a].args)
    return sorted(found)


def _unit_key(u: tuple[str, int], groups: dict[int, list[int]], roots: list[int]) -> int:
    return min(groups[roots[u[1]]]) if u[0] == "region" else u[1]


def _subprogram(
    program: Program,
    members: Sequence[int],
    ins: Sequence[int],
    outs: Sequence[int],
    name: str,
    squeeze: bool = True,
    copies: set[int] | frozenset[int] = frozenset(),
) -> Program:
    """The region as a standalone Program: external values become inputs, constants and
    `copies` copied; with `squeeze`, in the ranks the search works in (`lax_ir.canonical`)."""
    nodes = program.nodes
    new: list[Node] = []
    remap: dict[int, int] = {}
    for a in ins:
        remap[a] = len(new)
        new.append(Node("input", (), nodes[a].shape, nodes[a].dtype, ()))
    mset = set(members)
    const = constant_like(program)
    copied: set[int] = set(copies)
    stack = [a for m in members for a in nodes[m].args if a in const and a not in ins]
    while stack:
        a = stack.pop()
        if a not in copied:
            copied.add(a)
            stack.extend(nodes[a].args)
    for i in sorted(mset | copied):
        if i in remap:
            continue
        nd = nodes[i]
        remap[i] = len(new)
        new.append(Node(nd.op, tuple(remap[a] for a in nd.args), nd.shape, nd.dtype, nd.params))
    sub = Program.build(new, [remap[a] for a in ins], [remap[o] for o in outs], {"name": name})
    for _ in range(3 if squeeze else 0):  # hoisting can make squeezing possible, and back
        nxt = hoist_layouts(flatten_rows(squeeze_leading(sub)))
        if nxt is sub:
            break
        sub = nxt
    return sub


# ---------------------------------------------------------------------- rebuild
RegionImpl = Callable[..., Sequence[Any]]


def run_partition(
    part: Partition,
    inputs: Sequence[Any],
    replacements: Mapping[int, RegionImpl] | None = None,
) -> list[Any]:
    """Evaluate a partition with jnp; regions run through `replacements[k]` when given."""
    program = part.program
    replacements = replacements or {}
    algebra = FloatAlgebra()
    env: dict[int, Any] = dict(zip(program.inputs, inputs))
    for i in sorted(constant_like(program)):
        nd = program.nodes[i]
        env[i] = eval_node(algebra, nd, [env[a] for a in nd.args])
    for kind, idx in part.order:
        if kind == "node":
            nd = program.nodes[idx]
            env[idx] = eval_node(algebra, nd, [env[a] for a in nd.args])
        else:
            region = part.regions[idx]
            args = [env[a] for a in region.inputs]
            impl = replacements.get(idx)
            if impl is None:
                impl = adapt(lambda *xs, p=region.program: evaluate(p, *xs), region.program)
            outs = impl(*args)
            for o, v in zip(region.outputs, outs):
                env[o] = v
    return [env[o] for o in program.outputs]


def as_function(
    program: Program, flat_fn: Callable[[Sequence[Any]], list[Any]] | None = None
) -> Callable[..., Any]:
    """A function with the captured function's pytree signature that runs `flat_fn`.

    By default `flat_fn` evaluates the Program with jnp. Static arguments must be passed
    again (they are checked to match what was captured).
    """
    meta = program.meta
    if flat_fn is None:

        def flat_fn(xs: Sequence[Any]) -> list[Any]:
            return evaluate(program, *xs)

    def fn(*args: Any, **kwargs: Any) -> Any:
        import jax

        leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        if "in_tree" in meta and in_tree != meta["in_tree"]:
            raise TypeError(f"arguments have structure {in_tree}, captured with {meta['in_tree']}")
        dyn = meta.get("dynamic_leaves", tuple(range(len(leaves))))
        for i, v in meta.get("static_leaves", ()):
            if not _same_static(leaves[i], v):
                raise TypeError(f"static argument leaf {i} is {leaves[i]!r}, captured with {v!r}")
        outs = flat_fn([leaves[i] for i in dyn])
        if "out_tree" not in meta:
            return outs
        flat: list[Any] = [None] * meta["out_tree"].num_leaves
        for j, v in zip(meta["dynamic_outputs"], outs):
            flat[j] = v
        for j, v in meta["static_outputs"]:
            flat[j] = v
        return jax.tree_util.tree_unflatten(meta["out_tree"], flat)

    return fn


def rebuild(
    part: Partition, replacements: Mapping[int, RegionImpl] | None = None
) -> Callable[..., Any]:
    """The partitioned program as a function of the original's arguments (jittable)."""
    return as_function(part.program, lambda xs: run_partition(part, xs, replacements))


def _same_static(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def n_ops(n: int) -> str:
    """'1 op', '3 ops'."""
    return f"{n} op" if n == 1 else f"{n} ops"
