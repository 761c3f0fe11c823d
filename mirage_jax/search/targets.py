"""The region's outputs saturated once in egglog; candidates are checked by table lookup.

Targets (the outputs of the region Program) are added to one egglog e-graph and saturated once
with the axioms below (Mirage §3: commutativity, associativity, distributivity, division rules,
reductions over +, · and /, merging and commuting reductions, exp of a sum). The e-graph then
holds every term equal to a target under the axioms and every subterm of those. It is dumped
once into a Python table (op, child e-classes) -> e-class, so "is this candidate a
subexpression of some output" is one dict lookup per new op (its arguments' e-classes are
already known): about 1 µs, against 1-20 ms for an egglog `check` call (measured on ntrans).

Distributivity and x/z + y/z = (x+y)/z are used in the factoring direction only. Expanding
puts every monomial of every expansion into the e-graph, and each of them then passes as a
"subexpression": on ntrans the saturated e-graph has 74,916 nodes with both directions and 67
with factoring only, and a depth-5 block enumeration drops from 136k nodes (113 s) to 1.3k
(1.1 s). The cost: the search never computes a more expanded form than the program's own (it
still finds factored ones, which are cheaper). A block tensor's expression does not see tiling: a partial sum over a chunk of k is still
`red(k, ·)` (`red(k, red(k, x)) = red(k, x)`), which is what lets a one-kernel schedule match
a program that reduces in one go.

A sum commutes with a factor or divisor only when that factor does not depend on the summed
dimension (`red(k, a·b) = red(k, a)·b` if b is free of k). The e-graph computes "free of k"
as a relation alongside the rewrites (facts for the inputs, whose dimensions are known; rules
for every other e-node). The original applies the rule unconditionally; then Σ_k X passes as
a part of X @ W and floods the search: on qknorm the conditional rule halves the depth-7
enumeration of one schedule class (4,115 nodes to 2,036), the placement rule for constant
scales in `enumerate` takes it to 659.

"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from mirage_jax.search.expr import Term, const, export, import_, node

_BINARY_OPS = {"add": "· + ·", "mul": "· * ·", "div": "· / ·"}


def _egglog_module():
    import egglog as eg

    class T(eg.Expr):
        def __init__(self, name: eg.StringLike) -> None: ...

        @classmethod
        def c(cls, v: eg.StringLike) -> T: ...

        def __add__(self, o: T) -> T: ...

        def __mul__(self, o: T) -> T: ...

        def __truediv__(self, o: T) -> T: ...

    @eg.function
    def red(d: eg.StringLike, x: T) -> T: ...

    @eg.function
    def shift(d: eg.StringLike, x: T) -> T: ...

    @eg.function
    def ex(x: T) -> T: ...

    @eg.function
    def fn(n: eg.StringLike, x: T) -> T: ...

    # free(x, d): x does not depend on dimension d (facts for the inputs, rules for the rest)
    free = eg.relation("free", T, eg.String)
    dim = eg.relation("dim", eg.String)

    a, b, c, x = eg.vars_("a b c x", T)
    d, e, s = eg.vars_("d e s", eg.String)
    one = T.c("1.0")
    analysis = [
        eg.rule(eg.eq(x).to(T.c(s)), dim(d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(a + b), free(a, d), free(b, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(a * b), free(a, d), free(b, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(a / b), free(a, d), free(b, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(ex(a)), free(a, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(fn(s, a)), free(a, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(red(e, a)), free(a, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(shift(e, a)), free(a, d)).then(free(x, d)),
        eg.rule(eg.eq(x).to(red(d, a))).then(free(x, d)),
        eg.rule(eg.eq(x).to(shift(d, a))).then(free(x, d)),
    ]
    conditional = [
        # a sum commutes with a factor or divisor that does not depend on the summed dimension
        eg.rule(eg.eq(x).to(red(d, a * b)), free(b, d)).then(eg.union(x).with_(red(d, a) * b)),
        eg.rule(eg.eq(x).to(red(d, a) * b), free(b, d)).then(eg.union(x).with_(red(d, a * b))),
        eg.rule(eg.eq(x).to(red(d, a / b)), free(b, d)).then(eg.union(x).with_(red(d, a) / b)),
        eg.rule(eg.eq(x).to(red(d, a) / b), free(b, d)).then(eg.union(x).with_(red(d, a / b))),
    ]
    rules = eg.ruleset(
        *analysis,
        *conditional,
        # commutativity, associativity
        eg.rewrite(a + b).to(b + a),
        eg.rewrite(a * b).to(b * a),
        eg.rewrite((a + b) + c).to(a + (b + c)),
        eg.rewrite(a + (b + c)).to((a + b) + c),
        eg.rewrite((a * b) * c).to(a * (b * c)),
        eg.rewrite(a * (b * c)).to((a * b) * c),
        eg.rewrite(one * a).to(a),
        # distributivity, factoring only (see the module docstring)
        eg.rewrite(a * b + a * c).to(a * (b + c)),
        # division: x/z + y/z = (x+y)/z, x·(y/z) = xy/z
        eg.rewrite(a / c + b / c).to((a + b) / c),
        eg.rewrite(a * (b / c)).to((a * b) / c),
        eg.rewrite((a * b) / c).to(a * (b / c)),
        # reductions: over +; merging (tiling) and commuting; over · and / above (conditional)
        eg.rewrite(red(d, a + b)).to(red(d, a) + red(d, b)),
        eg.rewrite(red(d, a) + red(d, b)).to(red(d, a + b)),
        eg.rewrite(red(d, red(d, a))).to(red(d, a)),
        eg.rewrite(red(d, red(e, a))).to(red(e, red(d, a))),
        # exp of a sum
        eg.rewrite(ex(a + b)).to(ex(a) * ex(b)),
        eg.rewrite(ex(a) * ex(b)).to(ex(a + b)),
    )
    return eg, T, red, shift, ex, fn, rules, free, dim


class Targets:
    """The target outputs of one region, saturated once; candidates are checked by lookup.

    Arguments:
        terms: the abstract expressions of the program's outputs.
        max_iterations, max_nodes, max_seconds: saturation limits (like egg's runner); the
            reason saturation stopped is kept in `stop_reason`.
    """

    def __init__(
        self,
        terms: Sequence[Term],
        var_dims: dict[str, frozenset] | None = None,
        *,
        max_iterations: int = 40,
        max_nodes: int = 150_000,
        max_seconds: float = 20.0,
    ):
        self.terms = tuple(terms)
        self.var_dims = dict(var_dims or {})
        self.limits = (max_iterations, max_nodes, max_seconds)
        self._egraph: Any = None
        self._classes: dict[Term, str | None] = {}
        self.stop_reason = ""
        self.nodes = 0
        self.seconds = 0.0
        self.lookups = 0

    def __getstate__(self):  # workers re-saturate: e-graphs do not pickle; ids are per process
        return {
            "terms": [export(t) for t in self.terms],
            "var_dims": self.var_dims,
            "limits": self.limits,
        }

    def __setstate__(self, state):
        self.__init__([import_(t) for t in state["terms"]], state["var_dims"])
        self.limits = state["limits"]

    def _build(self) -> None:
        eg, T, red_, shift_, ex, fn_, rules, free, dim = _egglog_module()
        self._mod = (eg, T, red_, shift_, ex, fn_)
        self._conv: dict[Term, Any] = {}
        egraph = eg.EGraph()
        for t in self.terms:
            egraph.register(self._to_egg(t))
        all_dims = sorted({d for ds in self.var_dims.values() for d in ds})
        for d in all_dims:
            egraph.register(dim(f"d{d}"))
        for name, ds in self.var_dims.items():
            for d in all_dims:
                if d not in ds:
                    egraph.register(free(T(name), f"d{d}"))
        t0 = time.perf_counter()
        max_it, max_nodes, max_s = self.limits
        self.stop_reason = "iterations"
        for _ in range(max_it):
            report = egraph.run(rules * 1)
            self.nodes = sum(n for _, n in egraph.all_function_sizes())
            if not report.updated:
                self.stop_reason = "saturated"
                break
            if self.nodes > max_nodes:
                self.stop_reason = "nodes"
                break
            if time.perf_counter() - t0 > max_s:
                self.stop_reason = "time"
                break
        self._index(egraph)
        self.seconds = time.perf_counter() - t0
        self._egraph = egraph
        self._conv = {}
        self._roots = [self._class_of(t) for t in self.terms]

    def _to_egg(self, t: Term) -> Any:
        got = self._conv.get(t)
        if got is not None:
            return got
        eg, T, red_, shift_, ex, fn_ = self._mod
        n = node(t)
        tag = n[0]
        if tag == "var":
            out = T(n[1])
        elif tag == "const":
            out = T.c(n[1])
        elif tag == "count":
            out = T.c(f"n{n[1]}")
        elif tag == "add":
            out = self._to_egg(n[1]) + self._to_egg(n[2])
        elif tag == "mul":
            out = self._to_egg(n[1]) * self._to_egg(n[2])
        elif tag == "div":
            out = self._to_egg(n[1]) / self._to_egg(n[2])
        elif tag == "exp":
            out = ex(self._to_egg(n[1]))
        elif tag == "fn":
            out = fn_(n[1], self._to_egg(n[2]))
        elif tag == "red":
            out = red_(f"d{n[1]}", self._to_egg(n[2]))
        elif tag == "shift":
            out = shift_(f"d{n[1]}", self._to_egg(n[2]))
        else:
            raise ValueError(f"not an abstract expression: {n!r}")
        self._conv[t] = out
        return out

    def _index(self, egraph: Any) -> None:
        """The saturated e-graph as a hash table: (op, child e-classes) -> e-class."""
        data = json.loads(egraph._serialize(split_primitive_outputs=False).to_json())
        nodes = data["nodes"]
        self._prim: dict[str, str] = {}
        self._table: dict[tuple, str] = {}
        for n in nodes.values():
            op = n["op"]
            if op.startswith('"'):
                self._prim[json.loads(op)] = n["eclass"]
        for n in nodes.values():
            op = n["op"]
            if op.startswith('"') or op in ("free", "dim"):
                continue
            key = (op, tuple(nodes[c]["eclass"] for c in n["children"]))
            self._table[key] = n["eclass"]
        fwd: dict[tuple, set] = {}
        rev: dict[tuple, set] = {}
        for op, children in self._table:
            if op in _BINARY_OPS.values():
                a, b = children
                fwd.setdefault((op, a), set()).add(b)
                rev.setdefault((op, b), set()).add(a)
        self._partners = {
            k: (frozenset(fwd.get(k, ())), frozenset(rev.get(k, ()))) for k in {*fwd, *rev}
        }

    def _class_of(self, t: Term) -> str | None:
        """The e-class of term `t` in the saturated e-graph, or None (a lookup per node)."""
        if t in self._classes:
            return self._classes[t]
        n = node(t)
        tag = n[0]
        prim = self._prim
        key: tuple | None
        if tag == "var":
            key = ("T", (prim.get(n[1]),))
        elif tag == "const":
            key = ("T.c", (prim.get(n[1]),))
        elif tag == "count":
            key = ("T.c", (prim.get(f"n{n[1]}"),))
        elif tag in ("add", "mul", "div"):
            key = (_BINARY_OPS[tag], (self._class_of(n[1]), self._class_of(n[2])))
        elif tag == "exp":
            key = ("ex", (self._class_of(n[1]),))
        elif tag == "fn":
            key = ("fn", (prim.get(n[1]), self._class_of(n[2])))
        else:  # red, shift
            key = (tag, (prim.get(f"d{n[1]}"), self._class_of(n[2])))
        got = None if None in key[1] else self._table.get(key)
        self._classes[t] = got
        return got

    @property
    def egraph(self) -> Any:
        if self._egraph is None:
            self._build()
        return self._egraph

    def partners(self, op: str, c: str | None) -> tuple[frozenset, frozenset]:
        """E-classes b with op(c, b) in the e-graph, and those with op(b, c) ("add", "mul", "div")."""
        if self._egraph is None:
            self._build()
        return self._partners.get((_BINARY_OPS[op], c), (frozenset(), frozenset()))

    def unary_ok(self, name: str, c: str | None, arg: Any = None) -> bool:
        """Can a unary op on e-class `c` be a subexpression at all? (a cheap pre-filter)

        `name`: "exp", a function name ("sqrt", "logistic"), "red"/"shift" (arg: the dimension),
        "mul"/"add" (arg: a constant's value).
        """
        if self._egraph is None:
            self._build()
        if name == "exp":
            return ("ex", (c,)) in self._table
        if name in ("red", "shift"):
            return (name, (self._prim.get(f"d{arg}"), c)) in self._table
        if name in ("mul", "add"):
            k = self._class_of(const(arg))
            return k is not None and k in self.partners(name, c)[0]
        return ("fn", (self._prim.get(name), c)) in self._table

    def class_of(self, t: Term) -> str | None:
        """The e-class of `t` (None if `t` is not a subexpression of any target)."""
        if self._egraph is None:
            self._build()
        return self._class_of(t)

    def contains(self, t: Term) -> bool:
        """Is `t` a subexpression of some target (up to the axioms)? A table lookup."""
        if self._egraph is None:
            self._build()
        self.lookups += 1
        return self._class_of(t) is not None

    def equals(self, t: Term, index: int) -> bool:
        """Is `t` equal to target `index` under the axioms (the same e-class)?"""
        if self._egraph is None:
            self._build()
        self.lookups += 1
        c = self._class_of(t)
        return c is not None and c == self._roots[index]

    def covers(self, leaves: dict[str, Any], index: int, max_sets: int = 8) -> list[frozenset]:
        """The minimal sets of leaves some term equal to target `index` can be built from.

        `leaves` maps e-classes (`class_of`) to tokens: the region inputs' variables and the
        tensors a kernel may read (pre-defined kernels' outputs). Constants cost nothing; a
        variable that is not a leaf cannot be used. A fixpoint over the saturated e-graph,
        keeping per e-class an antichain of at most `max_sets` sets (smallest first); used to
        pick the inputs of the graph-defined kernel after pre-defined ones.
        """
        if self._egraph is None:
            self._build()
        prims = set(self._prim.values())
        opts: dict[str, list[frozenset]] = {c: [frozenset({t})] for c, t in leaves.items()}
        changed = True
        while changed:
            changed = False
            for (op, children), c in self._table.items():
                if op == "T":
                    continue  # a variable: usable only as a leaf
                sets = [frozenset()]
                for ch in children:
                    if ch in prims:
                        continue
                    got = opts.get(ch)
                    if not got:
                        sets = []
                        break
                    sets = [a | b for a in sets for b in got]
                if not sets:
                    continue
                new = antichain([*opts.get(c, []), *sets], max_sets)
                if new != opts.get(c):
                    opts[c] = new
                    changed = True
        return opts.get(self._roots[index], [])

    def stats(self) -> dict[str, Any]:
        return {
            "egraph_nodes": self.nodes,
            "saturation_s": round(self.seconds, 3),
            "saturation_stop": self.stop_reason,
            "lookups": self.lookups,
            "memo": len(self._classes),
            "table": len(getattr(self, "_table", ())),
        }


def antichain(sets: list[frozenset], limit: int) -> list[frozenset]:
    """The minimal sets among `sets` (no superset of another kept), smallest first."""
    out: list[frozenset] = []
    for s in sorted(set(sets), key=lambda s: (len(s), sorted(map(repr, s)))):
        if not any(o <= s for o in out):
            out.append(s)
    return out[:limit]
