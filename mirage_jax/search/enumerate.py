"""Block-level enumeration: block ops in canonical order, each checked before it is built.

Inside one graph-defined kernel with a fixed mapping class, a depth-first search adds block
ops from the region's vocabulary. A candidate op `(name, args, params)` is kept only if, in
this order (cheapest first):

1. canonical order: its key (args sorted descending, op rank, params) is greater than the
   previous op's, so every set of ops is generated in one order only (as Mirage's `Order`);
2. dead ends: the tensors still unused cannot all be consumed in the remaining depth;
3. labels and shapes: logical dimensions agree (a matmul contracts equal dimensions,
   elementwise ops align equal dimensions) and the mugraph shape rule accepts the tiles;
4. linearity ("partial"): a tile that is a partial sum over the loop (or over a split grid
   dimension) may only be scaled, added to another partial sum of the same kind, or
   accumulated: exp, sqrt, +const or a product of two partial sums would be summed wrongly;
   means and norms need full rows; accumulators must complete exactly the loop's sum;
5. abstract expression: the op's expression must be a subexpression of a target
   (`Targets.contains`, an e-graph lookup, memoised).

A graph closes when every unused tensor is accumulated and they equal the targets (final
kernels; an e-graph equality) or are partial sums over the split dimension (the first kernel
of a split-K pair). Closed graphs are handed to the verifier by the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from mirage_jax.mugraph.ops import OPS, RANK
from mirage_jax.search import expr as E
from mirage_jax.search.block_rules import BT, BlockRules, epilogue_pair
from mirage_jax.search.structure import KTensor, MappingClass, is_stack, omap_of
from mirage_jax.search.targets import Targets
from mirage_jax.search.vocab import Vocabulary

# What the enumeration knows of an op comes from its record (`mugraph/ops.py`): the canonical
# rank, whether a constant scale may follow it (`SearchProps.scale_result`: a scale goes on a
# factor, never on a product or quotient where commutativity would put it on every factor in
# turn, nor on another scale), and, read off its term, whether it is a scale (the only unary op
# a partial sum allows: `expr.is_scale`), its top e-node (`expr.head`, checked against the
# e-graph before the op is built) and whether it commutes (`expr.commutative`).


@dataclass
class PruneCounts:
    """Candidates pruned, by reason."""

    pruned: dict[str, int] = field(default_factory=dict)

    def prune(self, why: str) -> None:
        self.pruned[why] = self.pruned.get(why, 0) + 1


@dataclass
class Counters(PruneCounts):
    """What the enumeration did (merged into the search statistics)."""

    nodes: int = 0
    generated: int = 0
    closed: int = 0


@dataclass(frozen=True)
class Goal:
    """What closes a kernel: `targets` (indices) to equal, or partial sums over `split`."""

    targets: tuple[int, ...] = ()
    split: int | None = None
    max_outputs: int = 2
    output_labels: tuple = ()


@dataclass(frozen=True)
class Closed:
    """A closed block graph: ops (name, args, params), outputs (tensor, omap), their tensors."""

    ops: tuple
    outputs: tuple
    tensors: tuple[BT, ...]


class BlockEnumerator(BlockRules):
    """Depth-first enumeration of block graphs for one kernel and one mapping class.

    Arguments:
        inputs: the kernel's input tensors.
        mapping: the mapping class (grid dimensions, loop dimension, split dimensions).
        small: size of every logical dimension at the representative.
        rep_grid: the representative's grid size per grid dimension (2 where it divides).
        vocab: the ops to try.
        targets: the saturated targets (subexpression and equality lookups).
        goal: what closes a graph.
        counters: statistics to update.
        should_stop: polled between nodes (budgets).
        epilogue: positions of inputs read after the loop (pre-defined kernels' outputs): their
            `accum_sum` without a loop may meet accumulated tensors in a binary op (a GEMM's
            rows divided by a norm the kernel accumulates).
        optional: positions of inputs a closed graph may leave unused (a split-K kernel leaves
            the residual to its combining kernel, which adds it after its loop).
    """

    def __init__(
        self,
        inputs: Sequence[KTensor],
        mapping: MappingClass,
        small: dict[int, int],
        rep_grid: dict[int, int],
        rep_loop: int,
        vocab: Vocabulary,
        targets: Targets,
        goal: Goal,
        counters: Counters,
        should_stop: Callable[[], bool] = lambda: False,
        epilogue: frozenset = frozenset(),
        optional: frozenset = frozenset(),
    ):
        self.mapping = mapping
        self.small = small
        self.rep_grid = rep_grid
        self.rep_loop = rep_loop
        self.vocab = vocab
        self.targets = targets
        self.goal = goal
        self.c = counters
        self.should_stop = should_stop
        self.loop = mapping.loop
        self.pclasses = frozenset(mapping.split) | ({mapping.loop} - {None})
        self.inputs = [
            replace(self._input(t), epilogue=True) if i in epilogue else self._input(t)
            for i, t in enumerate(inputs)
        ]
        self.n_out = len(goal.targets) if goal.split is None else None
        self.optional = frozenset(optional)

    # ------------------------------------------------------------------ inputs
    def _input(self, t: KTensor) -> BT:
        tile, labels = [], []
        for lab in t.labels:
            if lab is None:
                tile.append(1)
            elif is_stack(lab):
                _, base, split = lab
                size = 1 if base is None else self.small[base]
                if split == self.mapping.loop:  # the loop walks the blocks' partial results
                    tile.append(size)
                    labels.append(base)
                    continue
                tile.append(size * self.rep_grid.get(split, 2))
            else:
                n = self.small[lab]
                if lab in self.mapping.grid:
                    n //= self.rep_grid[lab]
                if lab == self.mapping.loop:
                    n //= self.rep_loop
                tile.append(n)
            labels.append(lab)
        return BT(
            t.term, tuple(tile), tuple(labels), False, frozenset(t.partial), t.shift,
            shifted=t.shifted_by, varies=frozenset(t.varies),
        )  # fmt: skip

    # ------------------------------------------------------------------ search
    def run(self, max_ops: int, shard: tuple[int, int] = (0, 1)) -> Iterator[Closed]:
        """Every closable graph with at most `max_ops` block ops (canonical order); with
        `shard=(k, n)`, those whose first op is the root's candidate i with i % n == k (the
        n shards partition the graphs; `root` says which root candidate the current one has)."""
        self.root = -1
        tensors = list(self.inputs)
        uses = [0] * len(tensors)
        self._pairs: list[tuple[int, int, BT]] = []  # valid matmul operand pairs on the path
        self._sigs: dict[tuple, int] = {}  # values on the path (see `_signature`)
        self._src = ["input"] * len(tensors)  # the op that made each tensor on the path
        for t in tensors:
            self._sigs[self._signature(t)] = 1
        pending: list[tuple] = []
        for n in range(len(tensors)):
            pending += self._new_candidates(tensors, n)
        pending.sort(key=lambda c: c[0])
        yield from self._dfs(tensors, uses, [], pending, max_ops, shard)

    def _dfs(self, tensors, uses, ops, pending, max_ops, shard=None) -> Iterator[Closed]:
        """`pending`: checked candidates (key, name, args, params, tensor), sorted by key;
        `shard` (the root only): which of the root's candidates to follow."""
        self.c.nodes += 1
        closed = self._try_close(tensors, uses, ops)
        if closed is not None:
            if shard is None or shard[0] == 0:  # the graph of no op: the first shard's
                yield closed
            return
        remaining = max_ops - len(ops)
        if remaining <= 0:
            return
        unused = sum(1 for i, u in enumerate(uses) if u == 0 and i not in self.optional)
        if unused - (self.n_out or 1) > remaining * (self.vocab.max_arity - 1):
            self.c.prune("dead end")
            return
        n = len(tensors)
        n_pairs = len(self._pairs)
        for idx, (_, name, args, params, bt) in enumerate(pending):
            if shard is not None:
                if idx % shard[1] != shard[0]:
                    continue
                self.root = idx
            if self.should_stop():
                return
            sig = self._signature(bt)
            if sig in self._sigs:
                self.c.prune("equivalent")
                continue
            self._sigs[sig] = self._sigs.get(sig, 0) + 1
            self._src.append(name)
            tensors.append(bt)
            uses.append(0)
            for a in args:
                uses[a] += 1
            ops.append((name, args, params))
            child = pending[idx + 1 :] + self._new_candidates(tensors, n)
            yield from self._dfs(tensors, uses, ops, child, max_ops)
            del self._sigs[sig]
            self._src.pop()
            del self._pairs[n_pairs:]
            ops.pop()
            for a in args:
                uses[a] -= 1
            uses.pop()
            tensors.pop()

    def _signature(self, t: BT) -> tuple:
        """What a tensor is, up to the axioms: a second tensor with the same is redundant."""
        return (
            self.targets.class_of(t.term), t.labels, t.post, t.partial, t.shift, t.shifted,
            t.transfer,
        )  # fmt: skip

    def _new_candidates(self, tensors, top: int) -> list[tuple]:
        """Checked candidates whose largest argument is tensor `top`, sorted by key."""
        out: list[tuple] = []
        v = self.vocab
        t = tensors[top]

        def push(name, args, params=()):
            self.c.generated += 1
            if name == "sub":  # its term is known before the rules run, and most pairs' is
                # no subexpression (a tiny attention region: 183k of 300k ops tried were subs)
                term = E.sub(tensors[args[0]].term, tensors[args[1]].term)
                if not self.targets.contains(term):
                    self.c.prune("expression")
                    return "expression"
            got = self._apply(name, args, params, tensors)
            if isinstance(got, str):
                self.c.prune(got)
                return got
            if not self.targets.contains(got.term):
                self.c.prune("expression")
                return "expression"
            key = (tuple(sorted(args, reverse=True)), RANK[name], repr(params))
            out.append((key, name, args, params, got))
            return got

        cls = [self.targets.class_of(x.term) for x in tensors]
        ct = cls[top]
        ok = self.targets.unary_ok
        if not t.transfer:
            src = self._src[top]
            scalable = src == "input" or OPS[src].search.scale_result
            for name, params in v.unary:
                if t.shift or (name == "mul_scalar" and not scalable):
                    continue
                pre = E.head(name, params)
                if pre is not None and not ok(pre[0], ct, pre[1]):
                    self.c.generated += 1
                    self.c.prune("expression")
                    continue
                push(name, (top,), params)
            if not t.shift:
                last = len(t.labels) - 1
                for d, lab in enumerate(t.labels):
                    if lab is None or is_stack(lab) or t.tile[d] <= 1:
                        continue
                    if (
                        (d != last or lab in v.row_sum_dims)
                        and lab in v.reduce_dims
                        and ok("red", ct, lab)
                    ):
                        push("reduce_sum", (top,), (("dim", d),))
                    if lab in v.shift_dims and ok("shift", ct, lab):
                        push("reduce_max", (top,), (("dim", d),))
            if not t.post:
                for name, params in v.accumulators:
                    if name == "accum_sum_todimx":
                        lab = t.labels[-1] if t.labels else None
                        if not is_stack(lab) or lab[1] is None:
                            continue
                        params = (("dimx", ("size", lab[1])),)
                    push(name, (top,), params)
            for other in range(top + 1):
                o = tensors[other]
                if o.post != t.post or o.transfer:
                    continue
                ew, ab, ba = _compatible(t.labels, o.labels)
                co = cls[other]
                if ew and not o.shift and not t.shift:
                    for name in v.binary:
                        if name == "sub":
                            push(name, (top, other))
                            if other != top:
                                push(name, (other, top))
                            continue
                        if name == "mul" and other == top and v.square:
                            continue  # square(x) says it
                        fwd, rev = self.targets.partners(name, ct)
                        if co in fwd:
                            push(name, (top, other))
                        if not E.commutative(name) and other != top and co in rev:
                            push(name, (other, top))
                elif ew and v.shifts and o.shift != t.shift and "sub" in v.binary:
                    push("sub", (other, top) if t.shift else (top, other))
                if (
                    v.matmul
                    and not o.shift
                    and not t.shift
                    and co in self.targets.partners("mul", ct)[0]
                ):
                    pairs = (
                        (((top, other), ab), ((other, top), ba))
                        if other != top
                        else (((top, top), ab),)
                    )
                    for args, ok in pairs:
                        if not ok:
                            continue
                        got = push("matmul", args)
                        if v.concat_matmul and not isinstance(got, str):
                            self._pairs.append((*args, got))
                        elif v.concat_matmul and got == "expression":
                            bt = self._apply("matmul", args, (), tensors)
                            if not isinstance(bt, str):
                                self._pairs.append((*args, bt))
            if v.concat_matmul:
                self._concat_candidates(top, push)
            if v.shifts:
                self._rescale_candidates(tensors, top, push)
        if any(x.epilogue for x in tensors):
            for other in range(top + 1):
                o = tensors[other]
                if not epilogue_pair("mul", (t, o)):
                    continue
                for name in v.binary:
                    push(name, (top, other))
                    if not E.commutative(name):
                        push(name, (other, top))
        out.sort(key=lambda c: c[0])
        return out

    def _rescale_candidates(self, tensors, top, push) -> None:
        # accum_rescale_sum(x, m, M): M = accum_max(m); x computed with shift m.
        for i, big in enumerate(tensors):
            if not (big.shift and big.post):
                continue
            for j, m in enumerate(tensors):
                if not m.shift or m.post:
                    continue
                for x in range(len(tensors)):
                    if tensors[x].shifted != j or max(x, j, i) != top:
                        continue
                    push("accum_rescale_sum", (x, j, i))
                    push("accum_rescale_sum_last", (x, j, i))

    def _concat_candidates(self, top, push) -> None:
        # concat_matmul(a, b, c, d) = a@c + b@d: two valid matmul pairs, one of them new.
        pairs = self._pairs
        for i, (a, c, ac) in enumerate(pairs):
            for b, d, bd in pairs[i + 1 :]:
                if max(a, b, c, d) != top or {a, c} == {b, d}:
                    continue
                if ac.labels != bd.labels or ac.post or bd.post:
                    continue
                push("concat_matmul", (a, b, c, d))
                push("concat_matmul", (b, a, d, c))

    # ------------------------------------------------------------------ closing
    def _try_close(self, tensors, uses, ops) -> Closed | None:
        if not ops:
            return None
        n_in = len(self.inputs)
        if any(uses[i] == 0 for i in range(n_in) if i not in self.optional):
            return None
        dangling = [i for i in range(n_in, len(tensors)) if uses[i] == 0]
        goal = self.goal
        if not dangling or any(not tensors[i].post or tensors[i].shift for i in dangling):
            return None
        if goal.split is None:
            if len(dangling) != len(goal.targets):
                return None
            order = self._match_targets(tensors, dangling)
            if order is None:
                return None
            dangling = order
        else:
            if len(dangling) > goal.max_outputs:
                return None
            if any(tensors[i].partial != frozenset({goal.split}) for i in dangling):
                return None
            # partial sums rescaled to a partial max take that max along (online softmax)
            for i in list(dangling):
                m = tensors[i].rescaled
                if m is not None and m not in dangling:
                    if tensors[m].varies != frozenset({goal.split}):
                        return None
                    dangling.append(m)
        outputs = []
        for i in dangling:
            omap = self._omap(tensors[i])
            if omap is None:
                self.c.prune("omap")
                return None
            outputs.append((i, omap))
        self.c.closed += 1
        return Closed(tuple(ops), tuple(outputs), tuple(tensors))

    def _match_targets(self, tensors, dangling) -> list[int] | None:
        order = []
        left = list(dangling)
        for j, target in enumerate(self.goal.targets):
            want = self.goal.output_labels[j] if self.goal.output_labels else None
            for i in left:
                t = tensors[i]
                if want is not None and tuple(t.labels) != tuple(want):
                    continue
                if t.partial or not self.targets.equals(t.term, target):
                    continue
                order.append(i)
                left.remove(i)
                break
            else:
                self.c.prune("not the target")
                return None
        return order

    def _omap(self, t: BT) -> tuple | None:
        return omap_of(self.mapping, t.labels)


_COMPAT: dict[tuple, tuple[bool, bool, bool]] = {}


def _compatible(a: tuple, b: tuple) -> tuple[bool, bool, bool]:
    """(elementwise, a @ b, b @ a) allowed by the labels of two tiles (a cheap pre-filter)."""
    key = (a, b)
    got = _COMPAT.get(key)
    if got is None:
        same_rank = len(a) == len(b)
        # elementwise: numpy broadcasting, aligned from the right (a canonical region drops
        # leading unit axes, so a bias or a mask may have fewer axes than what it meets)
        ew = all(x is None or y is None or x == y for x, y in zip(a[::-1], b[::-1]))
        mm = same_rank and len(a) >= 2
        batch = mm and all(x is None or y is None or x == y for x, y in zip(a[:-2], b[:-2]))
        ab = batch and a[-1] == b[-2] and a[-1] is not None
        ba = batch and b[-1] == a[-2] and b[-1] is not None
        got = _COMPAT[key] = (ew, ab, ba)
    return got
