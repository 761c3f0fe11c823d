"""Attention cores in one layout: the einsum forms of real attention code rewritten as QKᵀ, a
softmax over the last axis, and PV, with the layout moves at the core's edges.

`jax.nn.dot_product_attention` and einsum-style model code (Gemma's `BTKGH,BSKH->BKGTS`) lay
their scores out as the einsums produce them: a key-cache-times-query column form, grouped
query heads split and merged by reshapes, and transposes between the two matmuls that move the
softmax's axes around. Each of those layout ops restructures non-unit dimensions, so the
partitioner hands it to XLA and the attention falls apart into pieces no µGraph covers.

`canonical_attention` finds each attention core (a matmul whose result reaches an `exp`, the
row-wise softmax work after it, and the one matmul that reads the probabilities) and, where
layout ops restructure dimensions inside it, recomputes the core in one layout:
``[batch..., rows, keys]``, rows being the query-side axes (query tokens and grouped heads,
merged) and keys the softmax's axes (the last). Every value is described by *atoms*: the
dimensions of the scores matmul, split where a reshape splits them. The core's outside operands
(Q, K, V, masks) are laid out for it by reshape → transpose → reshape steps, and the result is
laid back out as the original PV matmul's value (that value keeps its place in the traced
jaxpr). The new layout steps touch no traced value, so the partitioner keeps them inside the
region and `lax_ir.layouts` moves them to its interface, where XLA applies them. A core the
rewrite does not cover is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lax_ir.ops import ELEMENTWISE, broadcast_shapes, matmul_shape
from lax_ir.program import Node, Program, make_params

Groups = tuple[tuple[str, ...], ...]
"""A value's layout: per dimension, the atoms merged into it (row-major); () for a unit."""

MAX_REFINEMENTS = 16
"""Atom splits found before a core is given up."""
MAX_CORES = 16
"""Attention cores rewritten in one Program."""
_LAYOUT = ("reshape", "transpose", "broadcast_in_dim")
_REDUCE = ("reduce_sum", "reduce_max")


class _Skip(Exception):
    """The core is not one this rewrite covers."""


class _Split(Exception):
    """An atom must be split in two (a reshape splits it): restart with the finer atoms."""

    def __init__(self, atom: str, sizes: tuple[int, int]):
        self.atom, self.sizes = atom, sizes


class _Atoms:
    """Atom sizes, with the splits found so far (atom `a` split into `a.0` and `a.1`)."""

    def __init__(self, splits: dict[str, tuple[int, int]]):
        self.splits = splits
        self.size: dict[str, int] = {}

    def fresh(self, name: str, size: int) -> tuple[str, ...]:
        """The atoms of a new dimension named `name` of `size` (() for a unit)."""
        if size == 1:
            return ()
        if name in self.splits:
            a, b = self.splits[name]
            if a * b != size:
                raise _Skip(f"inconsistent split of {name}")
            return self.fresh(name + ".0", a) + self.fresh(name + ".1", b)
        self.size[name] = size
        return (name,)

    def prod(self, group: Sequence[str]) -> int:
        return int(np.prod([self.size[a] for a in group], dtype=np.int64))


def _reshape_groups(atoms: _Atoms, src: Groups, shape: Sequence[int]) -> Groups:
    """The groups of a row-major reshape of a value laid out as `src` to `shape`."""
    flat = [a for g in src for a in g]
    out: list[tuple[str, ...]] = []
    k = 0
    for d in shape:
        group: list[str] = []
        have = 1
        while have < d:
            if k == len(flat):
                raise _Skip("reshape sizes do not match")
            s = atoms.size[flat[k]]
            if have * s <= d and d % (have * s) == 0:
                group.append(flat[k])
                have *= s
                k += 1
            elif d % have == 0 and s % (d // have) == 0:
                raise _Split(flat[k], (d // have, s // (d // have)))
            else:
                raise _Skip("a reshape that does not split dimensions evenly")
        out.append(tuple(group))
    if k != len(flat):
        raise _Skip("reshape sizes do not match")
    return tuple(out)


def _aligned(shape: Sequence[int], out: Groups) -> Groups:
    """The groups of an operand of shape `shape` broadcast (right-aligned) to a value laid out
    as `out`: the output's group where the operand's dimension is not a unit."""
    lead = len(out) - len(shape)
    if lead < 0:
        raise _Skip("operand of higher rank than the result")
    return tuple(() if d == 1 else out[lead + j] for j, d in enumerate(shape))


class _Core:
    """One attention core: the scores matmul `m1`, the nodes after it, the PV matmul `m2`."""

    def __init__(self, program: Program, m1: int, m2: int, nodes: list[int]):
        self.program, self.m1, self.m2, self.nodes = program, m1, m2, nodes
        self.inside = set(nodes)

    def layout(self, atoms: _Atoms) -> dict[str, object]:
        """Atoms of every value the rewrite touches; raises _Split / _Skip."""
        p = self.program
        nodes = p.nodes
        a_id, b_id = nodes[self.m1].args
        a, b, out = nodes[a_id].shape, nodes[b_id].shape, nodes[self.m1].shape
        if len(a) != len(b) or len(a) != len(out):
            raise _Skip("scores matmul operands of different ranks")
        batch = tuple(atoms.fresh(f"b{j}", d) for j, d in enumerate(out[:-2]))
        rows, cols, red = (
            atoms.fresh("m", out[-2]),
            atoms.fresh("n", out[-1]),
            atoms.fresh("h", a[-1]),
        )
        groups: dict[int, Groups] = {self.m1: (*batch, rows, cols)}
        a_groups = (*(() if d == 1 else g for d, g in zip(a[:-2], batch)), rows, red)
        b_groups = (*(() if d == 1 else g for d, g in zip(b[:-2], batch)), red, cols)
        side: dict[tuple[int, int], Groups] = {}
        reduced: set[tuple[str, ...]] = set()
        for i in self.nodes:
            n = nodes[i]
            ins = [x for x in n.args if x in groups]
            if n.op == "reshape":
                groups[i] = _reshape_groups(atoms, groups[n.args[0]], n.shape)
            elif n.op == "transpose":
                src = groups[n.args[0]]
                groups[i] = tuple(src[q] for q in n.param("permutation"))
            elif n.op == "broadcast_in_dim":
                src, dims = groups[n.args[0]], tuple(n.param("broadcast_dimensions"))
                g: list[tuple[str, ...]] = []
                for j, d in enumerate(n.shape):
                    if j in dims:
                        q = dims.index(j)
                        if nodes[n.args[0]].shape[q] != d:
                            raise _Skip("a core value broadcast along a non-unit axis")
                        g.append(src[q])
                    elif d != 1:
                        raise _Skip("a core value broadcast along a new axis")
                    else:
                        g.append(())
                groups[i] = tuple(g)
            elif n.op in _REDUCE:
                src, axes = groups[n.args[0]], set(n.param("axes"))
                reduced.add(tuple(sorted(x for q in axes for x in src[q])))
                groups[i] = tuple(g for q, g in enumerate(src) if q not in axes)
            elif n.op in ELEMENTWISE:
                res: list[tuple[str, ...] | None] = [None] * len(n.shape)
                for x in ins:
                    lead = len(n.shape) - len(nodes[x].shape)
                    for j, g in enumerate(groups[x]):
                        if nodes[x].shape[j] == 1:
                            continue
                        if res[lead + j] is not None and res[lead + j] != g:
                            raise _Skip("core operands laid out differently")
                        res[lead + j] = g
                if any(r is None and d != 1 for r, d in zip(res, n.shape)):
                    raise _Skip("a core value broadcast by an outside operand")
                groups[i] = tuple(() if r is None else r for r in res)
                for pos, x in enumerate(n.args):
                    if x not in groups and nodes[x].op != "constant":
                        side[(i, pos)] = _aligned(nodes[x].shape, groups[i])
            else:
                raise _Skip(f"`{n.op}` inside the attention core")
        if len(reduced) != 1:
            raise _Skip("the softmax reduces over more than one set of axes")
        keys = next(iter(reduced))
        if keys == tuple(sorted(cols)):
            q_rows, key_cols = rows, cols
        elif keys == tuple(sorted(rows)):
            q_rows, key_cols = cols, rows
        else:
            raise _Skip("the softmax axis is not one matmul operand's free axis")
        canon = (*(g for g in batch if g), q_rows, key_cols)
        return {
            "groups": groups,
            "operands": (a_groups, b_groups),
            "side": side,
            "canon": canon,
            "column": q_rows is cols,
            "head": red,
        }


def _toposort(
    nodes: list[Node], origins: list[frozenset] | None
) -> tuple[list[Node], list | None, dict[int, int]]:
    """Nodes reordered so that every node follows its arguments (stable otherwise)."""
    order: list[int] = []
    state = [0] * len(nodes)
    for root in range(len(nodes)):
        stack = [(root, False)]
        while stack:
            i, done = stack.pop()
            if done:
                state[i] = 2
                order.append(i)
                continue
            if state[i]:
                continue
            state[i] = 1
            stack.append((i, True))
            stack.extend((a, False) for a in reversed(nodes[i].args) if not state[a])
    index = {old: new for new, old in enumerate(order)}
    out = [
        Node(n.op, tuple(index[a] for a in n.args), n.shape, n.dtype, n.params)
        for n in (nodes[i] for i in order)
    ]
    return out, ([origins[i] for i in order] if origins is not None else None), index


def _restrict(groups: Groups, present: set[str]) -> Groups:
    """`groups` without the atoms a value lacks; a group must be there whole or not at all."""
    out = []
    for g in groups:
        kept = tuple(a for a in g if a in present)
        if kept and len(kept) != len(g):
            raise _Skip("a value holds part of a merged axis")
        out.append(kept)
    return tuple(out)


def _atoms_of(groups: Groups) -> set[str]:
    return {a for g in groups for a in g}


class _Emit:
    """New nodes appended to a node list, and the layout steps between atom layouts."""

    def __init__(self, nodes: list[Node], atoms: _Atoms):
        self.nodes, self.atoms = nodes, atoms
        self.first_new = len(nodes)

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def reshape(self, x: int, shape: tuple[int, ...]) -> int:
        """`x` reshaped to `shape` (itself if it has that shape)."""
        n = self.nodes[x]
        if n.shape == shape:
            return x
        return self.add(Node("reshape", (x,), shape, n.dtype, make_params()))

    def relayout(self, x: int, src: Groups, dst: Groups) -> int:
        """Value `x`, laid out as `src`, laid out as `dst` (the same atoms, in any grouping)."""
        flat_src = [a for g in src for a in g]
        flat_dst = [a for g in dst for a in g]
        if sorted(flat_src) != sorted(flat_dst):
            raise _Skip("a relayout between different atoms")
        size = self.atoms.size
        perm = tuple(flat_src.index(a) for a in flat_dst)
        if perm != tuple(range(len(perm))):
            x = self.reshape(x, tuple(size[a] for a in flat_src))
            n = self.nodes[x]
            x = self.add(
                Node(
                    "transpose",
                    (x,),
                    tuple(n.shape[q] for q in perm),
                    n.dtype,
                    make_params(permutation=perm),
                )
            )
        return self.reshape(x, tuple(self.atoms.prod(g) for g in dst))

    def op(self, like: Node, args: Sequence[int], shape: tuple[int, ...], **params: object) -> int:
        """`like`'s op on new arguments, with `params` overriding its own."""
        merged = make_params(**{**dict(like.params), **params}) if params else like.params
        return self.add(Node(like.op, tuple(args), shape, like.dtype, merged))


def _repeat_source(
    program: Program, atoms: _Atoms, x: int, groups: Groups
) -> tuple[int, Groups, frozenset[str]]:
    """The value that layout ops (reshapes, transposes, broadcasts) before operand `x` lay out,
    with its groups and the atoms a broadcast on the way added (a KV head repeated for grouped
    queries: `jnp.repeat(k, g, axis=2)`); `x` itself where no broadcast adds an atom."""
    nodes = program.nodes
    dropped: set[str] = set()
    cur, g = x, groups
    while nodes[cur].op in _LAYOUT:
        n = nodes[cur]
        src = n.args[0]
        shape = nodes[src].shape
        if n.op == "transpose":
            back: list[tuple[str, ...]] = [()] * len(shape)
            for j, q in enumerate(n.param("permutation")):
                back[q] = g[j]
            g = tuple(back)
        elif n.op == "reshape":
            g = _reshape_groups(atoms, g, shape)
        else:  # broadcast_in_dim: atoms of new or widened axes are not in the source
            dims = tuple(n.param("broadcast_dimensions"))
            g2 = []
            for q, d in enumerate(dims):
                same = shape[q] == n.shape[d]
                g2.append(g[d] if same else ())
                if not same:
                    dropped.update(g[d])
            dropped.update(a for j, grp in enumerate(g) if j not in dims for a in grp)
            g = tuple(g2)
        cur = src
    if not dropped:
        return x, groups, frozenset()
    return cur, g, frozenset(dropped)


def _has_repeat(program: Program, x: int) -> bool:
    """Do layout ops before `x` include a broadcast that adds a non-unit axis?"""
    nodes = program.nodes
    while nodes[x].op in _LAYOUT:
        n = nodes[x]
        if n.op == "broadcast_in_dim" and math.prod(n.shape) > math.prod(nodes[n.args[0]].shape):
            return True
        x = n.args[0]
    return False


def _pv_operands(program: Program, core: _Core, atoms: _Atoms, info: dict, keys, batch):
    """PV's operands: (probabilities' position, its id, V's id, V's groups, V's free atom)."""
    nodes, groups = program.nodes, info["groups"]
    m2 = nodes[core.m2]
    p_pos = 0 if m2.args[0] in groups else 1
    p_id, v_id = m2.args[p_pos], m2.args[1 - p_pos]
    pg, vshape = groups[p_id], nodes[v_id].shape
    if len(vshape) != len(pg):
        raise _Skip("PV operands of different ranks")
    if p_pos == 1:
        p_batch, p_con = pg[:-2], pg[-2]
    else:
        p_batch, p_con = pg[:-2], pg[-1]
    if set(p_con) != set(keys):
        raise _Skip("PV does not contract over the softmax axis")
    v_free = atoms.fresh("v", vshape[-2] if p_pos == 1 else vshape[-1])  # V is A or B
    v_batch = []
    for d, g in zip(vshape[:-2], p_batch):
        if d != 1 and atoms.prod(g) != d:
            raise _Skip("V has batch axes the probabilities lack")
        v_batch.append(() if d == 1 else g)
    if not _atoms_of(tuple(v_batch)) <= _atoms_of(batch):
        raise _Skip("V varies over query-side axes")
    v_g = (*v_batch, v_free, p_con) if p_pos == 1 else (*v_batch, p_con, v_free)
    return p_pos, p_id, v_id, v_g, v_free


def _rewrite(program: Program, core: _Core, atoms: _Atoms, info: dict) -> Program:
    """`program` with `core` recomputed in its canonical layout (see the module docstring).

    K and V repeated over grouped query heads (a broadcast before them adds the group atoms)
    are read from the values before the repeat; the group atoms move from the batch axes to
    the rows (each KV head's queries stacked), so the KV cache is read once, as stored.
    """
    nodes = program.nodes
    groups: dict[int, Groups] = info["groups"]
    canon: Groups = info["canon"]
    batch, rows, keys, head = canon[:-2], canon[-2], canon[-1], info["head"]
    e = _Emit(list(nodes), atoms)
    a_id, b_id = nodes[core.m1].args
    a_g, b_g = info["operands"]
    (x, x_g), (y, y_g) = (
        ((b_id, b_g), (a_id, a_g)) if info["column"] else ((a_id, a_g), (b_id, b_g))
    )
    p_pos, p_id, v_id, v_g, v_free = _pv_operands(program, core, atoms, info, keys, batch)
    y, y_g, dropped_k = _repeat_source(program, atoms, y, y_g)
    v_id, v_g, dropped_v = _repeat_source(program, atoms, v_id, v_g)
    grouped = dropped_k | dropped_v
    if grouped:
        if not grouped <= _atoms_of(batch) or dropped_k != dropped_v:
            raise _Skip("K and V repeated over different axes")
        rows = tuple(a for g in batch for a in g if a in grouped) + rows
        batch = tuple(kept for g in batch if (kept := tuple(a for a in g if a not in grouped)))
        canon = (*batch, rows, keys)
    x_c = e.relayout(x, x_g, _restrict((*batch, rows, head), _atoms_of(x_g)))
    y_c = e.relayout(y, y_g, _restrict((*batch, head, keys), _atoms_of(y_g)))
    m1 = nodes[core.m1]
    canon_of = {core.m1: e.op(m1, (x_c, y_c), matmul_shape(e.nodes[x_c].shape, e.nodes[y_c].shape))}
    for i in core.nodes:
        n = nodes[i]
        if n.op in _LAYOUT:
            canon_of[i] = canon_of[n.args[0]]
        elif n.op in _REDUCE:
            src = canon_of[n.args[0]]
            red = _atoms_of(tuple(groups[n.args[0]][q] for q in n.param("axes")))
            axes = tuple(j for j, g in enumerate(canon) if set(g) & red)
            if _atoms_of(tuple(canon[j] for j in axes)) != red:
                raise _Skip("a reduction over part of a merged axis")
            shape = e.nodes[src].shape
            kept = tuple(d for j, d in enumerate(shape) if j not in axes)
            r = e.op(n, (src,), kept, axes=axes)
            canon_of[i] = e.reshape(r, tuple(1 if j in axes else d for j, d in enumerate(shape)))
        else:  # elementwise
            args = []
            for pos, a in enumerate(n.args):
                if a in canon_of:
                    args.append(canon_of[a])
                elif not nodes[a].shape:
                    args.append(a)
                else:
                    a_groups = info["side"].get((i, pos), _aligned(nodes[a].shape, groups[i]))
                    args.append(e.relayout(a, a_groups, _restrict(canon, _atoms_of(a_groups))))
            shape = broadcast_shapes(*(e.nodes[a].shape for a in args))
            canon_of[i] = e.op(n, args, shape)
    m2 = nodes[core.m2]
    pg = groups[p_id]
    p_batch, p_free = pg[:-2], (pg[-1] if p_pos == 1 else pg[-2])
    if _atoms_of(p_batch) | set(p_free) != _atoms_of(batch) | set(rows):
        raise _Skip("PV's rows are not the scores' rows")
    p_c = canon_of[p_id]
    if e.nodes[p_c].shape != tuple(atoms.prod(g) for g in canon):
        raise _Skip("the probabilities do not cover the scores' axes")
    v_c = e.relayout(v_id, v_g, _restrict((*batch, keys, v_free), _atoms_of(v_g)))
    out_c = e.op(m2, (p_c, v_c), matmul_shape(e.nodes[p_c].shape, e.nodes[v_c].shape))
    out_g = (*p_batch, v_free, p_free) if p_pos == 1 else (*p_batch, p_free, v_free)
    final = e.relayout(out_c, (*batch, rows, v_free), out_g)
    if e.nodes[final].shape != m2.shape:
        raise _Skip("the relaid result does not have PV's shape")
    return _replace(program, e, core.m2, final)


def _replace(program: Program, e: _Emit, old: int, new: int) -> Program:
    """The program with `e`'s nodes added and `old`'s readers reading `new` (which takes
    `old`'s place in the traced jaxpr)."""
    nodes = [
        n
        if old not in n.args
        else Node(n.op, tuple(new if a == old else a for a in n.args), n.shape, n.dtype, n.params)
        for n in e.nodes
    ]
    nodes[new] = e.nodes[new]
    meta = dict(program.meta)
    origins = None
    if "origins" in meta:
        origins = list(meta["origins"]) + [frozenset()] * (len(nodes) - e.first_new)
        origins[new] = origins[old]
    ordered, origins, index = _toposort(nodes, origins)
    if origins is not None:
        meta["origins"] = tuple(origins)
    outputs = tuple(index[new if o == old else o] for o in program.outputs)
    return Program.build(ordered, tuple(index[i] for i in program.inputs), outputs, meta)


def _cores(program: Program) -> list[_Core]:
    """Each matmul whose result reaches an `exp`, with the one matmul reading the softmax and
    the nodes between (not through other matmuls)."""
    nodes, users = program.nodes, program.users
    cores = []
    for m1, n in program.ops():
        if n.op != "matmul":
            continue
        fwd: set[int] = set()
        mms: set[int] = set()
        stack = [m1]
        while stack:
            for u in users[stack.pop()]:
                if nodes[u].op == "matmul":
                    mms.add(u)
                elif u not in fwd:
                    fwd.add(u)
                    stack.append(u)
        after_exp = {i for i in fwd if nodes[i].op == "exp"}
        for i in sorted(fwd):
            if any(a in after_exp for a in nodes[i].args):
                after_exp.add(i)
        reads = [m for m in mms if any(a in after_exp for a in nodes[m].args)]
        if len(reads) != 1:
            continue
        m2 = reads[0]
        back: set[int] = set()
        stack = [a for a in nodes[m2].args if a in fwd]
        while stack:
            i = stack.pop()
            if i not in back:
                back.add(i)
                stack.extend(a for a in nodes[i].args if a in fwd)
        if sum(a in back for a in nodes[m2].args) != 1:
            continue
        cores.append(_Core(program, m1, m2, sorted(back)))
    return cores


def _relaid(program: Program, core: _Core) -> Program | None:
    """`program` with `core` recomputed in its canonical layout, or None if not covered."""
    splits: dict[str, tuple[int, int]] = {}
    try:
        for _ in range(MAX_REFINEMENTS):
            atoms = _Atoms(splits)
            try:
                return _rewrite(program, core, atoms, core.layout(atoms))
            except _Split as s:
                splits[s.atom] = s.sizes
    except _Skip:
        pass
    return None


def canonical_attention(program: Program) -> Program:
    """`program` with every attention core whose layout ops restructure dimensions recomputed
    in the ``[batch..., rows, keys]`` layout; cores the rewrite does not cover stay as they are."""
    from lax_ir.pieces import restructures

    for _ in range(MAX_CORES):
        for core in _cores(program):
            layout_ops = [i for i in core.nodes if program.nodes[i].op in _LAYOUT]
            operands = (*program.nodes[core.m1].args, *program.nodes[core.m2].args)
            if any(restructures(program, i) for i in layout_ops) or any(
                _has_repeat(program, x) for x in operands if x not in core.inside
            ):
                relaid = _relaid(program, core)
                if relaid is not None:
                    program = relaid
                    break
        else:
            return program
    return program
