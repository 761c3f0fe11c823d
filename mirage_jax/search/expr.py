"""Abstract expressions: what a tensor computes, as hash-consed terms, and their algebra.

An abstract expression says *what* a tensor computes, not how it is laid out: inputs are
variables, a matmul is `red(k, a·b)` summed over its contraction dimension k (a logical
dimension of `dims`), a mean is `red(k, x) / count(k)`, `sqrt`, `logistic`, ... are
uninterpreted functions, a softmax shift is `shift(k, x)`. Terms are plain hashable tuples:

    ("var", name) ("const", value) ("count", k) ("add", a, b) ("mul", a, b) ("div", a, b)
    ("exp", a) ("fn", name, a) ("red", k, a) ("shift", k, a)

`TermAlgebra` makes terms one more `lax_ir.Algebra`: the elementwise µGraph ops and Lax ops
get their terms from their one meaning (`OpDef.apply`, `lax_ir.eval_node`), so the search
never restates what an op computes. What the search needs to know of an elementwise op
(`is_scale`, `head`, `commutative`) is read off its term. The saturated targets and the
subexpression lookups are in `targets.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from lax_ir.interpret import eval_node
from lax_ir.program import Program
from mirage_jax.mugraph.opdef import Ctx
from mirage_jax.mugraph.ops import OPS
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


def norm(name: str, k: int, a: Term, eps: float | None) -> Term:
    """The term of norm op `name` ("rms_norm" or "layer_norm") of `a` over dimension k."""
    if name == "layer_norm":
        a = sub(a, mean(k, a))
    return div(a, rms(k, a, eps))


NORMS = ("rms_norm", "layer_norm")

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

    Elementwise and shape ops take their term from their one meaning (`lax_ir.eval_node` over
    `TermAlgebra`); constants, matmuls and reductions need the logical dimensions.
    Raises ValueError naming the op if a node has no abstract meaning (outside the fragment).
    """
    terms: list[Term | None] = []
    for i, n in enumerate(program.nodes):
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
                t = TERMS.constant(n.param("value").array, n.dtype)
        elif op == "matmul":
            t = red(dims.axes[n.args[0]][-1], mul(a[0], a[1]))
        elif op in ("reduce_sum", "reduce_max"):
            t = a[0]
            for ax in n.param("axes"):
                k = dims.axes[n.args[0]][ax]
                t = red(k, t) if op == "reduce_sum" else shift(k, t)
        elif op == "concatenate":
            t = a[0]
            for b in a[1:]:
                t = fn("concat", add(t, b))
        else:
            try:
                t = eval_node(TERMS, n, a)
            except (NotImplementedError, OutsideTerms):
                raise ValueError(
                    f"op `{op}` (node %{i}) has no abstract expression: outside the fragment"
                ) from None
        terms.append(t)
    return terms


def scalar_constants(
    program: Program, dims: Dims, skip: Collection[int] = ()
) -> dict[str, list[float]]:
    """Scalar constants the program multiplies or adds by (the `mul_scalar`/`add_scalar`
    vocabulary), at its nodes not in `skip`."""
    out: dict[str, list[float]] = {"mul": [], "add": []}
    nodes = program.nodes
    for i, n in program.ops():
        if n.op == "neg" and i not in skip and -1.0 not in out["mul"]:
            out["mul"].append(-1.0)  # -x is x · -1 (rotary's rotate-half)
        if i in skip or n.op not in ("mul", "add", "sub", "div"):
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


# ---------------------------------------------------------------------------- the term algebra
class OutsideTerms(ValueError):
    """An op with no abstract expression (a max that is not a shift, an opaque primitive)."""


class TermAlgebra:
    """Terms as a `lax_ir.Algebra`: elementwise and shape ops only (layouts are invisible).

    Reductions and matmuls need logical dimensions, so `program_terms` and the enumerators
    build those terms themselves; `count(k)` is the size of dimension k (a mean's n).
    """

    def constant(self, value: Any, dtype: str) -> Term:
        v = np.asarray(value)
        if v.size == 1 or np.all(v == v.flat[0]):
            return const(float(v.reshape(-1)[0]))
        from lax_ir.program import Const

        return intern(("const", Const(v).digest()))

    add = staticmethod(add)
    sub = staticmethod(sub)
    mul = staticmethod(mul)
    div = staticmethod(div)
    exp = staticmethod(exp)
    count = staticmethod(count)

    def neg(self, a: Term) -> Term:
        return mul(MINUS_ONE, a)

    def unary(self, name: str, a: Term) -> Term:
        return fn(name, a)

    def integer_pow(self, a: Term, y: int) -> Term:
        if y == 0:
            return ONE
        t = a
        for _ in range(abs(y) - 1):
            t = mul(t, a)
        return div(ONE, t) if y < 0 else t

    def convert(self, a: Term, dtype: str) -> Term:
        return a

    def reshape(self, a: Term, shape: Any) -> Term:
        return a

    def transpose(self, a: Term, permutation: Any) -> Term:
        return a

    def broadcast_in_dim(self, a: Term, shape: Any, broadcast_dimensions: Any) -> Term:
        return a

    def _outside(self, *args: Any) -> Term:
        raise OutsideTerms("no abstract expression")

    max = reduce_max = shift_max = reduce_sum = matmul = concatenate = opaque = _outside


TERMS = TermAlgebra()


def elementwise(name: str, t: Any, params: Mapping[str, Any], *more: Term) -> Term | None:
    """The term of elementwise µGraph op `name` on terms `t, *more`: its meaning (`OpDef.apply`)
    over `TermAlgebra`. None for ops that are not elementwise (norms, reductions, ...)."""
    op = OPS.get(name)
    if op is None or op.kind != "elementwise" or op.arity != 1 + len(more):
        return None
    ctx = Ctx(TERMS, "float64", 0, ((),) * (1 + len(more)), (), dict(params))
    return op.apply(ctx, [t, *more])


_X, _Y = var("·x"), var("·y")


@functools.cache
def is_scale(name: str, params: tuple) -> bool:
    """Is unary op `name` a scale x·c (or x/n)? Only a scale may act on a partial sum."""
    t = elementwise(name, _X, dict(params))
    if t is None:
        return True  # not elementwise: the enumerator checks norms and reductions itself
    n = node(t)
    return (
        n[0] in ("mul", "div")
        and _X in n[1:]
        and node(n[2] if n[1] == _X else n[1])[0]
        in (
            "const",
            "count",
        )
    )


@functools.cache
def head(name: str, params: tuple) -> tuple[str, float | None] | None:
    """The top e-node of unary op `name` applied to a value, where a cheap pre-filter can
    check it before the op is built: ("exp", None), (function, None), or ("mul"|"add", c)."""
    t = elementwise(name, _X, dict(params))
    if t is None:
        return None
    n = node(t)
    if n[0] == "exp" and n[1] == _X:
        return ("exp", None)
    if n[0] == "fn" and n[2] == _X:
        return (n[1], None)
    if n[0] in ("mul", "add") and _X in n[1:]:
        other = node(n[2] if n[1] == _X else n[1])
        if other[0] == "const":
            return (n[0], float(other[1]))
    return None


@functools.cache
def commutative(name: str) -> bool:
    """Is binary op `name` commutative (its term unchanged when the arguments swap)?"""
    return elementwise(name, _X, {}, _Y) == elementwise(name, _Y, {}, _X)
