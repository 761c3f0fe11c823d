"""The op records: every backend has every rule, and every op's meanings agree.

Generic over `mirage_jax.mugraph.OPS`, so a new op is tested by adding its record: the float
meaning against its lowered Pallas kernel (interpret mode), the field meaning against exact
float arithmetic where the op is rational, and its abstract expression against the field.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fields
from lax_ir import FloatAlgebra
from mirage_jax.lower import backends, lower, registry
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder, evaluate
from mirage_jax.mugraph.ops import OPS, RANK, Ctx
from mirage_jax.search import expr as E

ELEMENTWISE = sorted(n for n, o in OPS.items() if o.kind == "elementwise")
PARAMS = {"mul_scalar": {"scalar": 0.375}, "add_scalar": {"scalar": -1.25}}


def _params(name: str) -> dict:
    return PARAMS.get(name, {})


def test_every_block_op_has_a_rule_on_every_backend():
    modules = {b.module for b in backends.BACKENDS.values() if b.module is not None}
    assert modules, "no GPU backend module registered"
    for module in modules:
        backend = backends.BACKENDS[
            next(n for n, b in backends.BACKENDS.items() if b.module == module)
        ].load()
        for name, op in OPS.items():
            if "block" in op.levels:
                assert registry.has_rule(backend.BACKEND, name), (module, name)


def test_every_record_has_a_rank_and_a_meaning():
    assert list(RANK) == list(OPS)
    for name, op in OPS.items():
        assert callable(op.apply) and callable(op.shape), name
        assert op.levels <= {"kernel", "block"} and op.levels, name


def test_backend_choices_are_the_registry():
    import mirage_jax

    assert set(mirage_jax.BACKENDS) == set(backends.CHOICES)
    assert set(backends.BACKENDS) < set(backends.CHOICES)
    with pytest.raises(backends.UnknownBackend, match="choose one of"):
        backends.get("cuda")


@functools.cache
def _graph(name: str):
    """One graph-defined kernel: `name` on (8, 32) tiles of 2 blocks, then accum_sum."""
    arity = OPS[name].arity
    b = BlockGraphBuilder(grid=(2,), forloop_range=1)
    xs = [b.input((16, 32), "float32", imap=(0,), forloop_dim=None) for _ in range(arity)]
    b.output(b.op("accum_sum", b.op(name, *xs, **_params(name))), (0,))
    mb = MuGraphBuilder()
    ins = [mb.input((16, 32), "float32") for _ in range(arity)]
    return mb.build(mb.graph_defined(ins, b.build()), name=name)


@functools.cache
def _kernel(name: str):
    return lower(_graph(name), backend="pallas-interpret")


@pytest.mark.parametrize("name", ELEMENTWISE)
@settings(max_examples=4, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lo=st.floats(0.25, 2.0),
    width=st.floats(0.0, 3.0),
    special=st.lists(st.floats(0.25, 5.0, width=32), max_size=8),
)
def test_float_meaning_matches_the_pallas_kernel(name, seed, lo, width, special):
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(lo, lo + width, (16, 32)).astype(np.float32) for _ in range(OPS[name].arity)]
    xs[0].reshape(-1)[: len(special)] = special  # values hypothesis picks (and shrinks to)
    want = np.asarray(evaluate(_graph(name), *xs)[0], np.float64)
    got = np.asarray(_kernel(name)(*xs)[0], np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def _rational(name: str) -> bool:
    """Is the op's term built from +, ·, / and constants only (exact in the field)?"""
    a, b = E.var("a"), E.var("b")
    t = E.elementwise(name, a, _params(name), *([b] if OPS[name].arity == 2 else []))
    stack = [t]
    while stack:
        n = E.node(stack.pop())
        if n[0] in ("exp", "fn", "red", "shift"):
            return False
        stack += [c for c in n[1:] if isinstance(c, int) and n[0] in ("add", "mul", "div")]
    return True


RATIONAL = [n for n in ELEMENTWISE if _rational(n)]


def _apply(name: str, alg, dtype: str, *xs):
    op = OPS[name]
    ctx = Ctx(alg, dtype, 0, tuple(np.shape(x) for x in xs), np.shape(xs[0]), _params(name))
    return op.apply(ctx, list(xs))


@pytest.mark.parametrize("name", RATIONAL)
@settings(max_examples=25, deadline=None)
@given(
    a=st.lists(st.integers(-64, 64), min_size=6, max_size=6),
    e=st.lists(st.integers(-4, 4), min_size=6, max_size=6),
)
def test_field_meaning_matches_exact_float_arithmetic(name, a, e):
    # Small integers and powers of two as divisors: float64 arithmetic is exact, so the float
    # result mapped into the field must equal the field result.
    x = np.asarray(a, np.float64)
    y = np.ldexp(1.0, np.asarray(e))
    xs = [x, y][: OPS[name].arity]
    exact = _apply(name, FloatAlgebra(np, "float64"), "float64", *xs)
    alg = fields.FieldAlgebra()
    got = _apply(name, alg, "float64", *[alg.constant(v, "float64") for v in xs])
    p = alg.field.p
    np.testing.assert_array_equal(got.p, fields.to_residues(exact, p))


@pytest.mark.parametrize("name", RATIONAL)
def test_abstract_expression_agrees_with_the_field(name):
    # The term (the search's meaning) evaluated with exact integers mod p equals the field's.
    alg = fields.FieldAlgebra()
    p = alg.field.p
    vals = {"a": 5, "b": 8}
    a, b = E.var("a"), E.var("b")
    t = E.elementwise(name, a, _params(name), *([b] if OPS[name].arity == 2 else []))

    def ev(term):
        n = E.node(term)
        if n[0] == "var":
            return vals[n[1]] % p
        if n[0] == "const":
            return int(fields.to_residues(np.float64(float(n[1])), p))
        u, v = ev(n[1]), ev(n[2])
        if n[0] == "add":
            return (u + v) % p
        if n[0] == "mul":
            return (u * v) % p
        return (u * pow(v, -1, p)) % p

    xs = [np.float64(vals["a"]), np.float64(vals["b"])][: OPS[name].arity]
    got = _apply(name, alg, "float64", *[alg.constant(v, "float64") for v in xs])
    assert int(np.asarray(got.p)) == ev(t)
