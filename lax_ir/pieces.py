"""Searchable pieces of real model code: layout ops at the edges, cuts at GEMM boundaries.

A maximal Lax region of a decoder block holds a block's worth of work: projections, rotary
embeddings, the attention, the MLP, with head-splitting reshapes and transposes between them.
The search handles one GEMM group with its prologue and epilogue (the paper's benchmarks), not
a block, and it has no vocabulary for a reshape that splits or merges dimensions. So after the
maximal regions are formed, `refine`:

1. demotes layout ops to XLA (they become residual ops, with a reason): every reshape or
   transpose that restructures non-unit dimensions (a head split, a head merge, `k.T`), and
   every reshape/transpose/broadcast at a region's edge (reading only values from outside the
   region, or read only from outside it), and every concatenation (rotary embeddings'
   rotate-half; the µGraph has none), with a negation feeding it from outside. XLA runs them as bitcasts or copies;
   the region then reads and writes plain row-major tensors;
2. cuts a region with more matmuls than one kernel plan covers (`MAX_MATMULS`) at the end of
   each GEMM group's epilogue: a group is the matmuls that read the same activation (q/k/v, or
   gate/up), its epilogue the elementwise ops that read only the group's results and earlier
   cuts (SiLU and the gating product, a residual add). The epilogue ends where something else
   reads it (a norm's reduction, the next GEMM); an end that is the only reader's function of
   one epilogue value (the norm's `h * h`) moves to the reader's side, so the residual stream
   `h` is the one cut. The attention
   core is never cut: a matmul whose result reaches an `exp` before any other matmul (QKᵀ) has
   no epilogue of its own, so QKᵀ, the scale, the mask, the softmax and PV stay together; its
   computed operands (Q and K after rotary embeddings) are cuts, so the attention piece starts
   at them and the rotary embedding is a piece of its own.

3. cuts before a reshape the capture made to regroup a contraction's axes (flax nnx's output
   projection over (heads, head dim)): it has no traced value for XLA to run it apart, so the
   piece ends at its traced operand instead (`capture_regroups`).

Constants laid out by reshapes and broadcasts are copied into the regions that read them
(`constant_like`), so a zero or a table cuts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scipy.cluster.hierarchy import DisjointSet

from lax_ir.layout_graph import is_bitcast
from lax_ir.ops import ELEMENTWISE, SHAPE_OPS
from lax_ir.program import Program

LAYOUT = ("reshape", "transpose", "broadcast_in_dim")
MAX_MATMULS = 3
"""A region with more matmuls than this is cut at GEMM-group boundaries."""
_DEMOTED = "a layout op at a region's edge or restructuring dimensions: runs in XLA"
_CONCAT = "a concatenation (the search has none): runs in XLA"
_RESTRUCTURES = "a {op} that splits, merges or reorders non-unit dimensions: runs in XLA"


def restructures(program: Program, i: int) -> bool:
    """Does layout node i move data between non-unit dimensions (not a bitcast of the layout)?"""
    n = program.nodes[i]
    src = program.nodes[n.args[0]].shape if n.args else ()
    if n.op == "reshape":
        return not is_bitcast(src, n.shape)
    if n.op == "transpose":
        kept = [p for p in n.param("permutation") if src[p] > 1]
        return kept != sorted(kept)
    return False


def lays_out_product(program: Program, i: int, inside: set[int]) -> bool:
    """Is transpose i the row order of `W @ xᵀ` (equinox's `weight @ x` vmapped over a
    sequence: a dot_general whose result XLA transposes back)? The region keeps it: its layout
    rules make the product `x Wᵀ` and the two swaps cancel (`transpose_layouts`), where XLA
    would otherwise copy the product out and back, and cut the GEMM from its epilogue."""
    nodes = program.nodes

    def unreshaped(v: int) -> int:  # v seen through the region's bitcast reshapes
        while v in inside and nodes[v].op == "reshape" and not restructures(program, v):
            v = nodes[v].args[0]
        return v

    if nodes[i].op != "transpose":
        return False
    m = unreshaped(nodes[i].args[0])
    if m not in inside or nodes[m].op != "matmul":
        return False
    w, x = nodes[m].args
    x = unreshaped(x)
    return w not in inside and x in inside and nodes[x].op == "transpose"


def constant_like(program: Program) -> set[int]:
    """Nodes computed from constants by layout ops and converts (copied into every reader)."""
    out: set[int] = set()
    for i, n in enumerate(program.nodes):
        if n.op == "constant" or (
            n.op in SHAPE_OPS
            and n.args
            and all(a in out for a in n.args)
            and i not in program.outputs
        ):
            out.add(i)
    return out


def array_constants(program: Program) -> set[int]:
    """Constant-like nodes computed from an array literal (a closed-over weight: a µGraph
    reads it as a kernel argument, so a region takes it as an input, not a copy). A broadcast
    that widens one is not: the region reads the literal and broadcasts it itself, so XLA
    does not write the widened copy on every call."""
    out: set[int] = set()
    const = constant_like(program)
    for i, n in enumerate(program.nodes):
        if i not in const:
            continue
        if n.op == "broadcast_in_dim" and n.size > program.nodes[n.args[0]].size:
            continue  # a widened constant (a causal bias over heads) is widened in the region
        if (n.op == "constant" and n.size > 1) or any(a in out for a in n.args):
            out.add(i)
    return out


def demotions(program: Program, group: Sequence[int]) -> dict[int, str]:
    """The layout ops of one region that XLA should run, with the reason for each."""
    nodes, users = program.nodes, program.users
    origins = program.meta.get("origins")

    def placed(*values: int) -> bool:
        """Do the values that would cross the region's edge exist in the traced jaxpr (a
        capture normalisation's own reshapes do not: a kernel could not be put in place)?"""
        return origins is None or all(origins[v] for v in values)

    inside = set(group)
    out: dict[int, str] = {
        i: _RESTRUCTURES.format(op=nodes[i].op)
        for i in group
        if nodes[i].op in LAYOUT
        and restructures(program, i)
        and placed(i, *nodes[i].args)
        and not lays_out_product(program, i, inside)
    }
    out.update(  # the µGraph has no concatenation: rotary's rotate-half joins its halves in XLA
        (i, _CONCAT) for i in group if nodes[i].op == "concatenate" and placed(i, *nodes[i].args)
    )
    inside -= set(out)
    outputs = set(program.outputs)
    changed = True
    while changed:
        changed = False
        for i in sorted(inside):
            n = nodes[i]
            if n.op == "concatenate" or (n.op in ("neg", "convert") and n.args):
                # rotary embeddings' rotate-half, concatenate(-x2, x1), from values outside:
                # the search has no concatenation; XLA builds it and the region reads it
                feeds_concat = (
                    users[i]
                    and all(nodes[u].op == "concatenate" for u in users[i] if u in inside)
                    and all(u in inside for u in users[i])
                )
                if (
                    (n.op == "concatenate" or feeds_concat)
                    and all(a not in inside for a in n.args)
                    and placed(i)
                ):
                    out[i] = _DEMOTED
                    inside.discard(i)
                    changed = True
                continue
            if n.op not in LAYOUT:
                continue
            leading = (
                n.op != "broadcast_in_dim" and all(a not in inside for a in n.args) and placed(i)
            )
            readers = [u for u in users[i] if u in inside]
            trailing = not readers and (users[i] or i in outputs) and placed(*n.args)
            if leading or trailing:
                out[i] = _DEMOTED
                inside.discard(i)
                changed = True
    return out


def reaches_exp(program: Program, m: int, kept: set[int]) -> bool:
    """Is an `exp` reachable from matmul m through kept non-matmul nodes (m is a QKᵀ)?"""
    stack, seen = [m], {m}
    while stack:
        x = stack.pop()
        for u in program.users[x]:
            if u in seen or u not in kept or program.nodes[u].op == "matmul":
                continue
            if program.nodes[u].op == "exp":
                return True
            seen.add(u)
            stack.append(u)
    return False


def _pv_operands(program: Program, kept: set[int], matmuls: Sequence[int]) -> set[int]:
    """The computed V of each P V (a matmul reading the softmax's probabilities): a cut, so the
    attention piece starts at V as at Q and K (flax's V plus its heads' bias runs apart)."""
    soft: set[int] = set()  # what the region computes from an exp, through non-matmul nodes
    stack = [i for i in kept if program.nodes[i].op == "exp"]
    while stack:
        x = stack.pop()
        for u in program.users[x]:
            if u in kept and u not in soft and program.nodes[u].op != "matmul":
                soft.add(u)
                stack.append(u)
    cuts = set()
    for m in matmuls:
        args = [_laid_out(program, a, kept) for a in program.nodes[m].args]
        if sum(a in soft for a in args) != 1:
            continue
        v = next(a for a in args if a not in soft)
        if v in kept and program.nodes[v].op not in ("input", "constant"):
            cuts.add(v)
    return cuts


def _laid_out(program: Program, a: int, kept: set[int]) -> int:
    """The value that the region's layout ops (and converts) before `a` lay out: `a` seen
    through them back to the region's edge."""
    while a in kept and program.nodes[a].op in SHAPE_OPS:
        a = program.nodes[a].args[0]
    return a


def _activation(program: Program, m: int) -> int:
    """The first operand of matmul m, seen through layout ops and converts."""
    a = program.nodes[m].args[0]
    while program.nodes[a].op in SHAPE_OPS:
        a = program.nodes[a].args[0]
    return a


def gemm_cuts(program: Program, kept: Iterable[int]) -> set[int]:
    """Nodes of a large region after which a new piece starts (the ends of GEMM epilogues)."""
    nodes, users = program.nodes, program.users
    kept = set(kept)
    matmuls = sorted(i for i in kept if nodes[i].op == "matmul")
    if len(matmuls) <= MAX_MATMULS:
        return set()
    siblings: dict[int, list[int]] = {}
    cuts: set[int] = set()
    for m in matmuls:
        if not reaches_exp(program, m, kept):
            siblings.setdefault(_activation(program, m), []).append(m)
            continue
        for a in nodes[m].args:  # QKᵀ reads Q and K as computed (rotary embeddings: XLA)
            a = _laid_out(program, a, kept)
            if a in kept:
                cuts.add(a)

    cuts |= _pv_operands(program, kept, matmuls)

    def free(a: int) -> bool:
        """Is a a value from outside the region, seen through layout ops (a bias row)?"""
        a = _laid_out(program, a, kept)
        return a not in kept or nodes[a].op == "constant"

    required = set(cuts)
    for group in sorted(siblings.values()):
        epi = set(group)
        grown = True
        while grown:
            grown = False
            for x in sorted(epi):
                for u in users[x]:
                    n = nodes[u]
                    if u in epi or u not in kept:
                        continue
                    if n.op not in (*ELEMENTWISE, *LAYOUT) or n.op == "matmul":
                        continue
                    if all(a in epi or a in cuts or free(a) for a in n.args):
                        epi.add(u)
                        grown = True
        ends = {x for x in epi if any(u in kept and u not in epi for u in users[x])}
        # An end that is a function of one other epilogue value (h*h, h - 0) is recomputed by
        # its reader: pull the cut back to that value (not an attention operand's: flax's
        # heads' bias on Q, K and V is the projection's epilogue, not an XLA pass of its
        # own). So is a convert read by several (the fp32 copy of a residual stream a norm
        # reads twice): its readers read the stream as stored and widen it in their kernel (an
        # XLA convert of its own cost a launch, 1.1 µs).
        pulled = True
        while pulled:
            pulled = False
            for x in sorted(ends):
                inner = [a for a in nodes[x].args if a in epi]
                if (
                    x not in group
                    and x not in required  # an attention operand (Q, K, V) stays cut
                    and len(set(inner)) == 1
                    and x not in program.outputs
                    and (len(users[x]) == 1 or nodes[x].op == "convert")
                ):
                    ends.discard(x)
                    epi.discard(x)
                    ends.add(inner[0])
                    pulled = True
        cuts |= ends
    return cuts


def capture_regroups(program: Program, kept: Iterable[int]) -> set[int]:
    """Cuts before the capture's own regrouping reshapes: a contraction over several axes (flax
    nnx's output projection over (heads, head dim)) is captured as a reshape and a matmul, and
    that reshape has no traced value, so XLA cannot run it apart (`demotions` keeps it). Where
    it regroups the last axis (the contraction's) and its operand is a traced value, a piece
    starts after the operand: the reshape opens the next piece at its edge, where
    `lax_ir.layouts` moves it to the interface, and the attention before it is a piece of its
    own."""
    origins = program.meta.get("origins")
    if origins is None:
        return set()
    kept = set(kept)
    out: set[int] = set()
    for i in kept:
        n = program.nodes[i]
        src = program.nodes[n.args[0]].shape if n.args else ()
        if n.op != "reshape" or not src or not n.shape or src[-1] == n.shape[-1]:
            continue  # rows flattened for a 2-D matmul (GPT-2's [B, T, D]) are searchable
        if restructures(program, i) and not origins[i]:
            a = n.args[0]
            if a in kept and origins[a]:
                out.add(a)
    return out


def transposed_operand_cuts(program: Program, kept: Iterable[int]) -> set[int]:
    """Cuts at a computed value a matmul reads transposed as its first operand (a weight's
    gradient `gᵀ h` in a backward pass, the capture's own transpose of a dot_general that
    contracts rows): no layout rule moves that swap out of a region (the µGraph reads a
    matmul's first operand by rows), so the piece ends at the value and the transpose opens
    the next piece at its edge, where `lax_ir.layouts` moves it to the interface."""
    nodes = program.nodes
    kept = set(kept)
    out: set[int] = set()
    for m in kept:
        if nodes[m].op != "matmul":
            continue
        a, swapped = nodes[m].args[0], False
        while a in kept and nodes[a].op in SHAPE_OPS:
            swapped = swapped or (nodes[a].op == "transpose" and restructures(program, a))
            a = nodes[a].args[0]
        if swapped and a in kept and nodes[a].op not in ("input", "constant"):
            out.add(a)
            b = nodes[m].args[1]  # what it multiplies (the layer's input, read by its forward
            if b in kept and nodes[b].op != "constant":  # GEMM too) is read as it is stored
                out.add(b)
    return out


def piece_labels(program: Program, kept: Iterable[int], cuts: set[int]) -> dict[int, int]:
    """Piece label per kept node: connected through producer edges that are not cuts."""
    kept = sorted(kept)
    ds = DisjointSet(kept)
    kset = set(kept)
    for i in kept:
        for a in program.nodes[i].args:
            if a in kset and a not in cuts:
                ds.merge(a, i)
    return {i: ds[i] for i in kept}
