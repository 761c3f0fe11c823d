"""Kernel-level enumeration: pre-defined kernel ops (GEMMs left to XLA) before graph-defined ones.

A *prefix* is a short sequence of pre-defined kernel ops (a kernel-level matmul, and the
elementwise and reduction ops of the op table on a matmul's result) over the region's inputs
and earlier pre-defined outputs. The rest of the region is then searched as graph-defined
kernel(s) by the block-level machinery, with the pre-defined outputs as extra kernel inputs;
the µGraph is the pre-defined kernels followed by the graph-defined ones. The motivating
case is `rms_norm(X) @ W` at a small batch: an XLA/cuBLAS GEMM `X @ W` streams W at full
bandwidth, and one small graph-defined kernel computes rms(X) and divides the GEMM's rows
(`matmul(X/r, W) = matmul(X, W)/r` for a per-row r: the existing axioms give it, a sum
commutes with a divisor free of the summed dimension). Likewise gated_mlp: two GEMMs, then a
fused silu·mul.

Ops are generated depth-first in a canonical order (each op's key, its arguments sorted
descending then its rank and params, is greater than the previous op's, as at the block
level), so no prefix is generated twice, and each is kept only if

1. its labels agree (a matmul contracts equal dimensions; elementwise ops align them);
2. it is not a prologue: a non-matmul op must read a pre-defined output (an elementwise op
   or a reduction on the region's inputs is fused into the graph-defined kernel for free;
   only a GEMM's epilogue is worth a pre-defined kernel);
3. its abstract expression is a subexpression of a target (`Targets.contains`);
4. it is new (no earlier tensor has its e-class and labels) and it is not a whole target
   (the rest would be empty: that µGraph is XLA itself, the baseline `select` times anyway).

The inputs of the graph-defined kernel(s) follow from the e-graph (`Targets.covers`): the
minimal sets of region inputs and pre-defined outputs some form of every target is built
from, keeping those that read every pre-defined output no later pre-defined op reads
(rmsnorm after `X @ W`: {X, X @ W}; W is not needed again). A pre-defined output is read by
the graph-defined kernel as an *epilogue* input: loaded once per block (no loop) and allowed
to meet accumulated tensors (`BlockEnumerator(epilogue=...)`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from mirage_jax.mugraph.ops import RANK
from mirage_jax.search import expr as E
from mirage_jax.search.enumerate import PruneCounts
from mirage_jax.search.structure import KernelSpec, KTensor
from mirage_jax.search.targets import antichain


@dataclass(frozen=True)
class Prefix:
    """Pre-defined kernels and the inputs of the graph-defined kernel(s) after them.

    Arguments:
        kernels: the pre-defined kernel specs, in order (kernel j's output is ("k", j, 0)).
        rest: the inputs of the next kernel (region inputs first, then pre-defined outputs).
        epilogue: positions in `rest` that are pre-defined outputs.
        description: e.g. "matmul(x0,x1) → k0".
    """

    kernels: tuple[KernelSpec, ...]
    rest: tuple[KTensor, ...]
    epilogue: frozenset
    description: str


@dataclass
class KernelCounters(PruneCounts):
    """What the kernel-level enumeration did (reported as `stats["predefined"]`)."""

    generated: int = 0
    kept: int = 0
    prefixes: int = 0


def _ref_name(ref) -> str:
    return f"x{ref[1]}" if ref[0] == "in" else f"k{ref[1]}"


class KernelEnumerator:
    """Depth-first enumeration of pre-defined kernel ops for one prepared problem.

    Arguments:
        problem: the prepared region (`tasks.Problem`: inputs, targets, vocabulary, dims).
        max_ops: pre-defined kernels per prefix.
        counters: statistics to update.
    """

    def __init__(self, problem, max_ops: int, counters: KernelCounters):
        self.p = problem
        self.max_ops = max_ops
        self.c = counters
        self.targets = problem.targets
        self.roots = {self.targets.class_of(t) for t in self.targets.terms}
        self.n_in = len(problem.inputs)

    def run(self) -> list[Prefix]:
        """Every kept prefix, shortest first, each with every choice of the next inputs."""
        if self.max_ops <= 0 or not self.p.vocab.matmul:
            return []
        seen = {(self.targets.class_of(t.term), t.labels) for t in self.p.inputs}
        found = list(self._dfs(list(self.p.inputs), [], None, seen))
        return sorted(found, key=lambda p: len(p.kernels))  # stable: canonical order within

    def _dfs(self, tensors, ops, last_key, seen) -> Iterator[Prefix]:
        if ops:
            yield from self._finish(tensors, ops)
        if len(ops) == self.max_ops:
            return
        for key, name, args, params, kt in self._candidates(tensors, last_key, not ops):
            sig = (self.targets.class_of(kt.term), kt.labels)
            if sig in seen:
                self.c.prune("equivalent")
                continue
            self.c.kept += 1
            seen.add(sig)
            tensors.append(kt)
            ops.append((name, args, params))
            yield from self._dfs(tensors, ops, key, seen)
            ops.pop()
            tensors.pop()
            seen.discard(sig)

    def _candidates(self, tensors, last_key, first: bool) -> list[tuple]:
        """Checked candidate ops whose key follows `last_key`, in key order."""
        out = []
        v = self.p.vocab
        n = len(tensors)

        def push(name, args, params=()):
            key = (tuple(sorted(args, reverse=True)), RANK[name], repr(params))
            if last_key is not None and key <= last_key:
                return  # another order of the same ops (not generated, not counted)
            self.c.generated += 1
            if name != "matmul" and all(a < self.n_in for a in args):
                self.c.prune("prologue")
                return
            got = self._apply(name, [tensors[a] for a in args], dict(params), n)
            if isinstance(got, str):
                self.c.prune(got)
                return
            if not self.targets.contains(got.term):
                self.c.prune("expression")
                return
            if self.targets.class_of(got.term) in self.roots:
                self.c.prune("a whole target")
                return
            out.append((key, name, args, params, got))

        for a, b in itertools.product(range(n), repeat=2):
            push("matmul", (a, b))
        if not first:
            for a in range(n):
                for name, params in v.unary:
                    push(name, (a,), params)
                for d, lab in enumerate(tensors[a].labels):
                    if lab is not None and lab in self.p.dims.reduced:
                        push("reduce_sum", (a,), (("dim", d),))
                for b in range(n):
                    for name in v.binary:
                        if E.commutative(name) and b < a:
                            continue  # commutative: one order
                        push(name, (a, b))
        out.sort(key=lambda c: c[0])
        return out

    def _apply(self, name, ts: list[KTensor], params: dict, index: int) -> KTensor | str:
        ref = ("k", index - self.n_in, 0)
        if name == "matmul":
            a, b = ts
            if len(a.labels) != len(b.labels) or len(a.labels) < 2:
                return "shape"
            k = a.labels[-1]
            if k is None or k != b.labels[-2]:
                return "labels"
            batch = _merge(a.labels[:-2], b.labels[:-2])
            if batch is None:
                return "labels"
            labels = (*batch, a.labels[-2], b.labels[-1])
            return KTensor(ref, E.red(k, E.mul(a.term, b.term)), labels, "")
        if len(ts) == 2:
            a, b = ts
            labels = _merge(a.labels, b.labels)
            if labels is None:
                return "labels"
            term = E.elementwise(name, a.term, params, b.term)
            if term is None:
                return "vocabulary"
            return KTensor(ref, term, labels, "")
        (x,) = ts
        t = x.term
        labels = x.labels
        term = E.elementwise(name, t, params)
        if term is None and name == "reduce_sum":
            d = params["dim"]
            term = E.red(labels[d], t)
            labels = (*labels[:d], None, *labels[d + 1 :])
        elif term is None and name in E.NORMS:
            lab = labels[-1] if labels else None
            if lab is None:
                return "labels"
            term = E.norm(name, lab, t, params.get("eps"))
        elif term is None:
            return "vocabulary"
        return KTensor(ref, term, labels, "")

    def _finish(self, tensors, ops) -> Iterator[Prefix]:
        """The prefix `ops` with every minimal choice of inputs for the graph-defined rest."""
        n_pre = len(ops)
        read = {a for _, args, _ in ops for a in args}
        frontier = frozenset(i for i in range(self.n_in, self.n_in + n_pre) if i not in read)
        leaves = {}
        for i, t in enumerate(tensors):
            c = self.targets.class_of(t.term)
            if c is not None:
                leaves.setdefault(c, i)
        combined = [frozenset()]
        for j in range(len(self.targets.terms)):
            got = self.targets.covers(leaves, j)
            combined = antichain([a | b for a in combined for b in got], 16)
        choices = [s for s in combined if frontier <= s]
        if not choices:
            self.c.prune("rest cannot read every pre-defined output")
            return
        kernels = []
        names = [_ref_name(t.ref) for t in tensors]
        steps = []
        for name, args, params in ops:
            kernels.append(
                KernelSpec(tuple(tensors[a].ref for a in args), predefined=name, params=params)
            )
            p = "".join(f",{k}={v}" for k, v in params)
            steps.append(f"{name}({','.join(names[a] for a in args)}{p})")
        desc = " ; ".join(steps)
        for s in choices:
            order = sorted(s)
            rest = tuple(tensors[i] for i in order)
            epi = frozenset(k for k, i in enumerate(order) if i >= self.n_in)
            self.c.prefixes += 1
            yield Prefix(tuple(kernels), rest, epi, desc)


def _merge(a: tuple, b: tuple) -> tuple | None:
    """Labels of an elementwise result (size-1 axes broadcast), or None if they clash."""
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x is not None and y is not None and x != y:
            return None
        out.append(x if x is not None else y)
    return tuple(out)
