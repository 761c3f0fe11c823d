"""A region's Program in the ranks the search works in: leading unit dimensions dropped.

Model code carries a batch and a sequence axis of size 1 through a decode step (`[1, 1, d]`),
and jnp's matmul works on 2-D operands, so a captured block mixes ranks: a `[1, 1, d]` norm,
a reshape to `[1, d]`, a matmul, a reshape back, a residual add. The µGraph has no reshape op,
so each such reshape in the middle of a region left it without candidates. `squeeze_leading`
rewrites a region so that every tensor of rank > 2 loses its leading size-1 dimensions (down to
rank 2): numpy broadcasting aligns shapes from the right, so elementwise ops keep their meaning,
and reductions, broadcasts, transposes and concatenations get their axes renumbered. Reshapes
and transposes that only move unit dimensions become reshapes, and those between equal shapes
disappear, as do additions and subtractions of a constant zero; a division by a constant
becomes a multiplication by its reciprocal (exact for a power of two such as attention's
1/sqrt(64); otherwise the reciprocal rounded once, well inside any float tolerance: the
verifier proves the µGraph equal to this form, and the float check compares the kernel with
the region as written). Inputs and outputs take the
squeezed shapes too; `meta["interface"]` (see `lax_ir.layouts`) says how the region's own
values map to them, and `interface.adapt` wraps a function of the squeezed Program (its kernel)
to take and return the region's values (reshapes: bitcasts in XLA). A Program the rewrite does
not cover is returned unchanged.
"""

from __future__ import annotations

import numpy as np

from lax_ir.dtypes import is_float
from lax_ir.interface import compose
from lax_ir.layout_graph import is_bitcast
from lax_ir.ops import ELEMENTWISE, broadcast_shapes, matmul_shape
from lax_ir.program import Const, Node, Program, make_params


class _Unsupported(Exception):
    pass


def _kept(shape: tuple[int, ...], last: int = 2) -> tuple[int, ...]:
    """The axes of `shape` the canonical form keeps: every unit axis before the `last` ones
    goes (front first) while the rank stays at least 2."""
    drop = [p for p in range(len(shape) - last) if shape[p] == 1]
    drop = drop[: max(0, len(shape) - 2)]
    return tuple(p for p in range(len(shape)) if p not in drop)


def _target(shape: tuple[int, ...], last: int = 2) -> tuple[int, ...]:
    return tuple(shape[p] for p in _kept(tuple(shape), last))


def _aligned(
    shape: tuple[int, ...], arg_kept: tuple[int, ...], offset: int, out_kept: tuple[int, ...]
) -> bool:
    """Does an operand of `shape`, its kept axes right-aligned into the output by `offset`,
    still meet the output's kept axes where it has a size above 1 (its unit axes broadcast
    wherever they land), so numpy broadcasting means the same after squeezing?"""
    if len(arg_kept) > len(out_kept):
        return False
    pairs = zip(arg_kept, out_kept[len(out_kept) - len(arg_kept) :])
    return all(shape[a] == 1 or a + offset == o for a, o in pairs)


def _moves_units(src: Node, n: Node) -> bool:
    """Is transpose n of src a bitcast: only unit axes move, the others keep their order?

    Equal shapes are not enough: a transpose that swaps two axes of equal size (the (T, T)
    scores of a prefill) has the shape of a bitcast and is not one.
    """
    kept = [p for p in n.param("permutation") if src.shape[p] > 1]
    return kept == sorted(kept)


def _invertible(c: Node) -> bool:
    """A float constant with no zero, whose reciprocal is a float again."""
    arr = np.asarray(c.param("value").array)
    return is_float(arr.dtype) and bool(np.all(arr != 0)) and bool(np.all(np.isfinite(arr)))


def squeeze_leading(program: Program) -> Program:
    """`program` with leading unit dimensions dropped inside (same interface); see module doc."""
    for last in (1, 2):
        # First also the unit axis before the last (a decode step's T = 1 in [B, 1, D] at
        # batch B > 1); where a matmul needs it as its M, only those before the last two.
        if all(_target(n.shape, last) == tuple(n.shape) for n in program.nodes):
            continue
        try:
            return _rewrite(program, last)
        except _Unsupported:
            continue
    if any(_constant_division(program, n) or _scales_a_scale(program, n) for _, n in program.ops()):
        try:  # no axis to drop, but a division by a constant, which the search spells as a
            # product (its vocabulary scales by constants: 1/sqrt(d) on attention scores),
            # or a scale of a scale (`_scale_of_scale`)
            return _rewrite(program, 2)
        except _Unsupported:
            pass
    return program


def _inexact_division(program: Program, n: Node) -> bool:
    """Is n a division by a constant whose reciprocal is not a power of two?"""
    if n.op != "div" or program.nodes[n.args[1]].op != "constant":
        return False
    arr = np.asarray(program.nodes[n.args[1]].param("value").array, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr == 0):
        return False
    mant, _ = np.frexp(np.abs(arr))
    return bool(np.any(mant != 0.5))


def _constant_division(program: Program, n: Node) -> bool:
    """Is n a division by a constant the search cannot spell: one whose reciprocal is not a
    power of two, or any other than a mean's division by its count (which the search reads
    as it is)? `_rewrite` makes it a product."""
    if n.op != "div" or program.nodes[n.args[1]].op != "constant":
        return False
    if _inexact_division(program, n):
        return True
    if not _invertible(program.nodes[n.args[1]]):
        return False
    x = program.nodes[n.args[0]]
    while x.op in ("reshape", "convert", "broadcast_in_dim"):
        x = program.nodes[x.args[0]]
    return x.op != "reduce_sum"


def _scales_a_scale(program: Program, n: Node) -> bool:
    """Is n a product or quotient by a scalar constant of a product by one (`_scale_of_scale`)?"""
    if n.op not in ("mul", "div") or len(n.args) != 2:
        return False
    nodes = program.nodes
    scaled = [a for a in n.args if _scalar(nodes[a]) is None]
    if len(scaled) != 1 or nodes[scaled[0]].op != "mul":
        return False
    return any(_scalar(nodes[a]) is not None for a in nodes[scaled[0]].args)


def _scalar(n: Node) -> np.ndarray | None:
    """The value of a scalar constant node (shape ()), else None."""
    return np.asarray(n.param("value").array) if n.op == "constant" and not n.shape else None


def _scale_of_scale(new: list[Node], a: int, b: int, add) -> Node | None:
    """`(x · c1) · c2` with scalar constants c1, c2 as `x · (c1 c2)`, the product rounded once
    (`add` makes its constant): a score scaled by 1/√d then by a soft cap's 1/c (Gemma-2),
    which a convert before the first keeps from moving onto Q. None where it is not that."""
    for inner, outer in ((a, b), (b, a)):
        c2, m = _scalar(new[outer]), new[inner]
        if c2 is None or m.op != "mul":
            continue
        for x, c in (m.args, m.args[::-1]):
            c1 = _scalar(new[c])
            if c1 is not None and c1.dtype == c2.dtype and new[x].shape == m.shape:
                value = np.asarray(c1.astype(np.float64) * c2.astype(np.float64), c1.dtype)
                k = add(Node("constant", (), (), new[c].dtype, make_params(value=Const(value))))
                return Node("mul", (x, k), m.shape, m.dtype, make_params())
    return None


def _rewrite(program: Program, last: int) -> Program:
    old = program.nodes
    new: list[Node] = []
    value: dict[int, int] = {}  # old node -> new node holding its value, canonical shape
    zero: set[int] = set()  # new nodes that are constant zeros (through layout ops)

    def add(node: Node) -> int:
        new.append(node)
        return len(new) - 1

    def reshape(i: int, shape: tuple[int, ...]) -> int:
        n = new[i]
        if n.shape == tuple(shape):
            return i
        if n.op == "reshape":  # a reshape of a reshape is one reshape
            i = n.args[0]
            if new[i].shape == tuple(shape):
                return i
        return add(Node("reshape", (i,), tuple(shape), n.dtype, make_params()))

    inputs = []
    keep: dict[int, tuple[int, ...]] = {}  # old node -> its axes the canonical form keeps
    for i, n in enumerate(old):
        args = tuple(value[a] for a in n.args)
        shapes = [new[a].shape for a in args]
        kin = [keep[a] for a in n.args]
        kout = _kept(n.shape, last)
        if n.op in ("reduce_sum", "reduce_max"):  # the operand's kept axes, less the reduced
            red = tuple(n.param("axes"))
            kout = tuple(a - sum(r < a for r in red) for a in kin[0] if a not in red)
        elif n.op == "transpose" and not _moves_units(old[n.args[0]], n):
            # the axes whose source axis stays (a dropped unit axis stays dropped)
            perm = tuple(n.param("permutation"))
            moved = tuple(q for q in range(len(perm)) if perm[q] in kin[0])
            kout = moved if len(moved) >= 2 else kout
        elif n.op in ELEMENTWISE:  # an operand of the result's own shape sets its axes
            same = [keep[a] for a in n.args if tuple(old[a].shape) == tuple(n.shape)]
            kout = same[0] if same else kout
        keep[i] = kout
        t = tuple(n.shape[p] for p in kout)
        if n.op == "input":
            j = add(Node(n.op, (), t, n.dtype, n.params))
            inputs.append(j)
            value[i] = j
        elif n.op == "constant":
            c = n.param("value")
            if t != n.shape:
                if c.array.size != int(np.prod(n.shape)):
                    raise _Unsupported(n.op)
                arr = np.asarray(c.array).reshape(t)
                n = Node(n.op, (), t, n.dtype, make_params(value=Const(arr, n.dtype)))
            value[i] = add(n)
            if not np.any(np.asarray(c.array)):
                zero.add(value[i])
        elif n.op in ELEMENTWISE:
            for a, k in zip(n.args, kin):
                off = len(n.shape) - len(old[a].shape)
                if old[a].shape and not _aligned(old[a].shape, k, off, kout):
                    raise _Unsupported(n.op)
            shape = broadcast_shapes(*shapes)
            if shape != t:
                raise _Unsupported(n.op)
            if n.op in ("add", "sub") and args[-1] in zero and shapes[0] == shape:
                value[i] = args[0]
            elif n.op == "add" and args[0] in zero and shapes[-1] == shape:
                value[i] = args[-1]
            elif n.op == "div" and new[args[1]].op == "constant" and _invertible(new[args[1]]):
                c = new[args[1]]
                arr = np.asarray(c.param("value").array)
                recip = (1.0 / arr.astype(np.float64)).astype(arr.dtype)
                r = add(Node("constant", (), c.shape, c.dtype, make_params(value=Const(recip))))
                value[i] = add(
                    _scale_of_scale(new, args[0], r, add)
                    or Node("mul", (args[0], r), shape, n.dtype, make_params())
                )
            elif n.op == "mul" and (folded := _scale_of_scale(new, *args, add)) is not None:
                value[i] = add(folded)
            else:
                value[i] = add(Node(n.op, args, shape, n.dtype, n.params))
        elif n.op in ("reduce_sum", "reduce_max"):
            if any(a not in kin[0] for a in red) or len(kout) < 1:
                raise _Unsupported(n.op)
            axes = tuple(kin[0].index(a) for a in red)
            params = tuple((k, axes if k == "axes" else v) for k, v in n.params)
            value[i] = add(Node(n.op, args, t, n.dtype, params))
        elif n.op == "reshape" or (n.op == "transpose" and _moves_units(old[n.args[0]], n)):
            if not is_bitcast(old[n.args[0]].shape, n.shape):
                raise _Unsupported(n.op)
            value[i] = reshape(args[0], t)
        elif n.op == "transpose":
            perm = tuple(n.param("permutation"))
            src = [perm[q] for q in kout]
            if sorted(src) != sorted(kin[0]):
                raise _Unsupported(n.op)
            params = make_params(permutation=tuple(kin[0].index(p) for p in src))
            value[i] = add(Node(n.op, args, t, n.dtype, params))
        elif n.op == "broadcast_in_dim":
            dims = tuple(n.param("broadcast_dimensions"))
            if any(dims[k] not in kout for k in kin[0]):
                raise _Unsupported(n.op)
            new_dims = tuple(kout.index(dims[k]) for k in kin[0])
            if list(new_dims) != sorted(new_dims):
                raise _Unsupported(n.op)
            params = tuple(
                (name, new_dims if name == "broadcast_dimensions" else v) for name, v in n.params
            )
            if "shape" in dict(n.params):
                params = tuple((name, t if name == "shape" else v) for name, v in params)
            value[i] = add(Node(n.op, args, t, n.dtype, params))
        elif n.op == "matmul":
            for a, k in zip(n.args, kin):
                lead = len(n.shape) - len(old[a].shape)
                if not _aligned(old[a].shape, k[:-2], lead, kout[:-2]):
                    raise _Unsupported(n.op)
            shape = matmul_shape(*shapes)
            if shape != t:
                raise _Unsupported(n.op)
            value[i] = add(Node(n.op, args, shape, n.dtype, n.params))
        elif n.op == "concatenate":
            axis = n.param("axis")
            if any(k != kout for k in kin) or axis not in kout:
                raise _Unsupported(n.op)
            params = tuple((k, kout.index(axis) if k == "axis" else v) for k, v in n.params)
            value[i] = add(Node(n.op, args, t, n.dtype, params))
        else:
            raise _Unsupported(n.op)
        if n.op in ("reshape", "transpose", "broadcast_in_dim") and args[0] in zero:
            zero.add(value[i])
    return _reshaped(program, new, inputs, [value[o] for o in program.outputs])


def _reshaped(program: Program, new: list[Node], inputs: list[int], outputs: list[int]) -> Program:
    """The rewritten Program (`new` nodes, its `inputs` and `outputs`, one per `program`'s):
    its interface reshapes each input and output whose shape changed, after `program`'s own."""
    old = program.nodes
    interface = {
        "inputs": tuple(
            (k, () if new[j].shape == old[i].shape else (("reshape", new[j].shape),))
            for k, (i, j) in enumerate(zip(program.inputs, inputs))
        ),
        "outputs": tuple(
            () if new[j].shape == old[o].shape else (("reshape", old[o].shape),)
            for o, j in zip(program.outputs, outputs)
        ),
        "shapes": tuple(tuple(old[i].shape) for i in program.inputs),
    }
    meta = {
        "name": program.meta.get("name", "region"),
        "interface": compose(program.meta.get("interface"), interface),
    }
    return Program.build(new, inputs, outputs, meta)


def flatten_rows(program: Program) -> Program:
    """`program` with the leading axes of its activations merged into one row axis, where it
    already merges them itself before a matmul (`x @ w` on a `[B, T, D]` activation captures as
    a reshape to `[B·T, D]`, a 2-D matmul and a reshape back): every tensor shaped `[*L, ...]`
    becomes `[prod L, ...]`, those with unit leading axes `[1, ...]`, so the merging reshapes
    vanish. Elementwise ops and reductions over trailing axes keep their meaning (each op is
    checked); anything else (a transpose, a batched matmul) leaves the Program unchanged."""
    lead = _merged_leading(program)
    if lead is None:
        return program
    try:
        return _flatten(program, lead)
    except _Unsupported:
        return program


def _merged_leading(program: Program) -> tuple[int, ...] | None:
    """The leading axes L a reshape `[*L, d] -> [prod L, d]` feeding a matmul merges, if all
    such reshapes agree (and L has at least two axes)."""
    found: set[tuple[int, ...]] = set()
    for _, n in program.ops():
        if n.op != "matmul":
            continue
        for a in n.args:
            r = program.nodes[a]
            if r.op != "reshape":
                continue
            src = program.nodes[r.args[0]].shape
            if len(src) >= 3 and len(r.shape) == 2 and r.shape == (int(np.prod(src[:-1])), src[-1]):
                found.add(tuple(src[:-1]))
    return found.pop() if len(found) == 1 else None


def _flatten(program: Program, lead: tuple[int, ...]) -> Program:
    k, rows = len(lead), int(np.prod(lead))
    old = program.nodes

    def target(shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = tuple(shape)
        if len(shape) >= k and shape[:k] == lead:
            return (rows, *shape[k:])
        if len(shape) > k and all(d == 1 for d in shape[:k]):
            return (1, *shape[k:])
        return shape  # weights, vectors: each op's check below says if they still fit

    new: list[Node] = []
    value: dict[int, int] = {}
    inputs: list[int] = []

    def add(node: Node) -> int:
        new.append(node)
        return len(new) - 1

    def merged(i: int) -> bool:  # does old node i's shape carry the merged leading axes?
        s = old[i].shape
        return len(s) >= k and tuple(s[:k]) == lead

    for i, n in enumerate(old):
        args = tuple(value[a] for a in n.args)
        shapes = [new[a].shape for a in args]
        if n.op == "input":
            inputs.append(add(Node(n.op, (), target(n.shape), n.dtype, n.params)))
            value[i] = inputs[-1]
        elif n.op == "constant":
            t = target(n.shape)
            c = n.param("value")
            arr = np.asarray(c.array)
            if t != n.shape:
                n = Node(n.op, (), t, n.dtype, make_params(value=Const(arr.reshape(t), n.dtype)))
            value[i] = add(n)
        elif n.op in ELEMENTWISE:
            t = target(n.shape)
            for a in n.args:  # an operand either carries the merged axes or is 1 along them
                s, off = old[a].shape, len(n.shape) - len(old[a].shape)
                part = [s[p - off] for p in range(min(k, len(n.shape))) if p - off >= 0]
                if not (off == 0 and merged(a)) and any(d != 1 for d in part):
                    raise _Unsupported(n.op)
            if broadcast_shapes(*shapes) != t:
                raise _Unsupported(n.op)
            value[i] = add(Node(n.op, args, t, n.dtype, n.params))
        elif n.op in ("reduce_sum", "reduce_max"):
            axes = tuple(n.param("axes"))
            if not merged(n.args[0]) or any(a < k for a in axes):
                raise _Unsupported(n.op)
            new_axes = tuple(a - k + 1 for a in axes)
            params = tuple((p, new_axes if p == "axes" else v) for p, v in n.params)
            value[i] = add(Node(n.op, args, target(n.shape), n.dtype, params))
        elif n.op == "reshape":
            t = target(n.shape)
            if shapes[0] == t:
                value[i] = args[0]
            elif is_bitcast(shapes[0], t):
                value[i] = add(Node(n.op, args, t, n.dtype, n.params))
            else:
                raise _Unsupported(n.op)
        elif n.op == "broadcast_in_dim":
            dims = tuple(n.param("broadcast_dimensions"))
            t = target(n.shape)
            src = old[n.args[0]].shape
            if merged(n.args[0]) and dims[:k] == tuple(range(k)):
                new_dims = (0, *(d - k + 1 for d in dims[k:]))
            elif not src or (not merged(n.args[0]) and min(dims, default=k) >= k):
                new_dims = tuple(d - k + 1 for d in dims) if len(t) < len(n.shape) else dims
            else:
                raise _Unsupported(n.op)
            params = tuple(
                (p, new_dims if p == "broadcast_dimensions" else (t if p == "shape" else v))
                for p, v in n.params
            )
            value[i] = add(Node(n.op, args, t, n.dtype, params))
        elif n.op == "matmul":
            t = target(n.shape)
            if len(shapes[0]) != 2 or len(shapes[1]) != 2 or matmul_shape(*shapes) != t:
                raise _Unsupported(n.op)
            value[i] = add(Node(n.op, args, t, n.dtype, n.params))
        else:
            raise _Unsupported(n.op)
    return _reshaped(program, new, inputs, [value[o] for o in program.outputs])
