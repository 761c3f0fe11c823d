"""Abstract expressions of tensors and the subexpression test against saturated targets (egglog).

An abstract expression says *what* a tensor computes, not how it is laid out: inputs are
variables, a matmul is `red(k, a·b)` summed over its contraction dimension k (a logical
dimension of `dims`), a mean is `red(k, x) / count(k)`, `sqrt`, `logistic`, ... are
uninterpreted functions, a softmax shift is `shift(k, x)`. Terms are plain hashable tuples:

    ("var", name) ("const", value) ("count", k) ("add", a, b) ("mul", a, b) ("div", a, b)
    ("exp", a) ("fn", name, a) ("red", k, a) ("shift", k, a)

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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lax_ir.program import Program
from mirage_jax.search.dims import Dims

Term = int  # an id in the process-wide table of hash-consed terms
_IDS: dict[tuple, int] = {}
_NODES: list[tuple] = []


def intern(node: tuple) -> Term:
    """The id of a term node (tag, args...) whose sub-terms are ids: equal terms, equal ids."""
    got = _IDS.get(node)
    if got is None:
        got = len(_NODES)
        _IDS[node] = got
        _NODES.append(node)
    return got


def node(t: Term) -> tuple:
    return _NODES[t]


# ---------------------------------------------------------------------------- constructors
def var(name: str) -> Term:
    return intern(("var", name))


def const(value: float) -> Term:
    return intern(("const", repr(float(value))))


def count(k: int) -> Term:
    return intern(("count", k))


MINUS_ONE = const(-1.0)
ONE = const(1.0)


def _ordered(a: Term, b: Term) -> tuple[Term, Term]:
    # By id: cheap, and stable within a process; lookups see commutativity anyway.
    return (a, b) if a <= b else (b, a)


def key(t: Term) -> str:
    """A process-independent sort key of a term (its rendering)."""
    return show(t)


def add(a: Term, b: Term) -> Term:
    return intern(("add", *_ordered(a, b)))


def mul(a: Term, b: Term) -> Term:
    if a == ONE:
        return b
    if b == ONE:
        return a
    return intern(("mul", *_ordered(a, b)))


def div(a: Term, b: Term) -> Term:
    return intern(("div", a, b))


def sub(a: Term, b: Term) -> Term:
    return add(a, mul(MINUS_ONE, b))


def exp(a: Term) -> Term:
    return intern(("exp", a))


def fn(name: str, a: Term) -> Term:
    return intern(("fn", name, a))


def red(k: int | None, a: Term) -> Term:
    """Sum over dimension k; a sum of a sum over the same k is one sum (tiling is invisible)."""
    if k is None:
        return a
    n = _NODES[a]
    if n[0] == "red" and n[1] == k:
        return a
    return intern(("red", k, a))


def shift(k: int | None, a: Term) -> Term:
    if k is None:
        return a
    n = _NODES[a]
    if n[0] == "shift" and n[1] == k:
        return a
    return intern(("shift", k, a))


def mean(k: int, a: Term) -> Term:
    return div(red(k, a), count(k))


def rms(k: int, a: Term, eps: float | None) -> Term:
    m = mean(k, mul(a, a))
    return fn("sqrt", add(m, const(eps)) if eps else m)


_SHOW: dict[Term, str] = {}


def show(t: Term) -> str:
    """A compact infix rendering, for messages, listings and sort keys."""
    got = _SHOW.get(t)
    if got is not None:
        return got
    n = _NODES[t]
    tag = n[0]
    if tag in ("var", "const"):
        out = n[1]
    elif tag == "count":
        out = f"n{n[1]}"
    elif tag in ("add", "mul", "div"):
        sym = {"add": "+", "mul": "·", "div": "/"}[tag]
        out = f"({show(n[1])} {sym} {show(n[2])})"
    elif tag == "exp":
        out = f"exp({show(n[1])})"
    elif tag == "fn":
        out = f"{n[1]}({show(n[2])})"
    else:
        out = f"{'Σ' if tag == 'red' else 'max'}_d{n[1]}({show(n[2])})"
    _SHOW[t] = out
    return out


def export(t: Term) -> tuple:
    """A term as nested tuples (process-independent, picklable)."""
    n = node(t)
    if n[0] in ("add", "mul", "div"):
        return (n[0], export(n[1]), export(n[2]))
    if n[0] == "exp":
        return (n[0], export(n[1]))
    if n[0] in ("fn", "red", "shift"):
        return (n[0], n[1], export(n[2]))
    return n


def import_(x: tuple) -> Term:
    """The inverse of `export`."""
    if x[0] in ("add", "mul", "div"):
        return intern((x[0], import_(x[1]), import_(x[2])))
    if x[0] == "exp":
        return intern((x[0], import_(x[1])))
    if x[0] in ("fn", "red", "shift"):
        return intern((x[0], x[1], import_(x[2])))
    return intern(x)


# ---------------------------------------------------------------------------- programs
def program_terms(program: Program, dims: Dims) -> list[Term | None]:
    """The abstract expression of every node of a region Program (None for non-values).

    Raises ValueError naming the op if a node has no abstract meaning (outside the fragment).
    """
    terms: list[Term | None] = []
    nodes = program.nodes
    for i, n in enumerate(nodes):
        a = [terms[j] for j in n.args]
        op = n.op
        if op == "input":
            t = var(f"x{n.param('index')}")
        elif op == "constant":
            if i in dims.counts:
                classes, is_n = dims.counts[i]
                c = count(classes[0]) if len(classes) == 1 else intern(("count", tuple(classes)))
                t = c if is_n else div(ONE, c)
            else:
                v = np.asarray(n.param("value").array)
                uniform = v.size == 1 or np.all(v == v.flat[0])
                t = (
                    const(float(v.reshape(-1)[0]))
                    if uniform
                    else intern(("const", n.param("value").digest()))
                )
        elif op == "add":
            t = add(*a)
        elif op == "sub":
            t = sub(*a)
        elif op == "mul":
            t = mul(*a)
        elif op == "div":
            t = div(*a)
        elif op == "neg":
            t = mul(MINUS_ONE, a[0])
        elif op == "exp":
            t = exp(a[0])
        elif op in ("sqrt", "logistic", "tanh", "erf"):
            t = fn(op, a[0])
        elif op == "integer_pow":
            y = int(n.param("y"))
            t = a[0]
            for _ in range(abs(y) - 1):
                t = mul(t, a[0])
            if y < 0:
                t = div(ONE, t)
            elif y == 0:
                t = ONE
        elif op == "matmul":
            t = red(dims.axes[n.args[0]][-1], mul(a[0], a[1]))
        elif op in ("reduce_sum", "reduce_max"):
            t = a[0]
            for ax in n.param("axes"):
                k = dims.axes[n.args[0]][ax]
                t = red(k, t) if op == "reduce_sum" else shift(k, t)
        elif op in ("broadcast_in_dim", "reshape", "transpose", "convert"):
            t = a[0]
        elif op == "concatenate":
            t = a[0]
            for b in a[1:]:
                t = fn("concat", add(t, b))
        else:
            raise ValueError(
                f"op `{op}` (node %{i}) has no abstract expression: outside the fragment"
            )
        terms.append(t)
    return terms


def scalar_constants(program: Program, dims: Dims) -> dict[str, list[float]]:
    """Scalar constants the program multiplies or adds by (the `mul_scalar`/`add_scalar` vocabulary)."""
    out: dict[str, list[float]] = {"mul": [], "add": []}
    nodes = program.nodes
    for _, n in program.ops():
        if n.op not in ("mul", "add", "sub", "div"):
            continue
        for pos, a in enumerate(n.args):
            c = nodes[a]
            if c.op != "constant" or a in dims.counts:
                continue
            v = np.asarray(c.param("value").array)
            if v.size != 1 and not np.all(v == v.flat[0]):
                continue
            x = float(v.reshape(-1)[0])
            if n.op == "mul":
                kind, value = "mul", x
            elif n.op == "div" and pos == 1 and x != 0:
                kind, value = "mul", 1.0 / x
                if np.float64(value) * x != 1.0 or not _dyadic(value):
                    continue
            elif n.op == "add":
                kind, value = "add", x
            elif n.op == "sub" and pos == 1:
                kind, value = "add", -x
            else:
                continue
            if value not in out[kind]:
                out[kind].append(value)
    return out


def _dyadic(x: float) -> bool:
    m, _ = np.frexp(x)
    return float(m * 2**53).is_integer()


# ---------------------------------------------------------------------------- e-graph
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
                new = _antichain([*opts.get(c, []), *sets], max_sets)
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


def _antichain(sets: list[frozenset], limit: int) -> list[frozenset]:
    """The minimal sets among `sets` (no superset of another kept), smallest first."""
    out: list[frozenset] = []
    for s in sorted(set(sets), key=lambda s: (len(s), sorted(map(repr, s)))):
        if not any(o <= s for o in out):
            out.append(s)
    return out[:limit]


def elementwise(name: str, t: Any, params: Mapping[str, Any]) -> Any | None:
    """The term of elementwise op `name` on term `t` (the block and kernel levels share it);
    None for ops that are not elementwise on one argument."""
    if name == "exp":
        return exp(t)
    if name == "square":
        return mul(t, t)
    if name == "sqrt":
        return fn("sqrt", t)
    if name == "sigmoid":
        return fn("logistic", t)
    if name == "silu":
        return mul(t, fn("logistic", t))
    if name == "mul_scalar" and isinstance(params["scalar"], tuple):
        return div(t, count(params["scalar"][1]))  # 1/n of a mean: ("inv_size", k)
    if name == "mul_scalar":
        return mul(t, const(params["scalar"]))
    if name == "add_scalar":
        return add(t, const(params["scalar"]))
    return None
