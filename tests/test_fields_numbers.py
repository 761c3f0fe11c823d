"""fields.numbers and fields.algebra: field axioms, agreement with galois, exact constants, exp."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fields
from fields.array import FieldArray
from fields.numbers import (
    Field,
    FieldSemanticsError,
    VoidTrial,
    default_field,
    exp_mod,
    find_field,
    inv_mod,
    is_prime,
    matmul_mod,
    reduce_sum_mod,
    to_residues,
)

F = default_field()
P, Q = F.p, F.q
SETTINGS = settings(max_examples=40, deadline=None)


@functools.cache
def gf(m: int):
    import galois

    return galois.GF(m)


def residues(m: int, shape=None):
    """int64 arrays of residues mod m, edge values (0, 1, m-1) included."""
    shape = st.integers(1, 6) if shape is None else shape
    elements = st.one_of(st.sampled_from([0, 1, m - 1]), st.integers(0, m - 1))
    return hnp.arrays(np.int64, st.tuples(shape, shape), elements=elements)


def pair(x_p: np.ndarray, x_q: np.ndarray | None = None) -> FieldArray:
    return FieldArray(x_p, x_p % Q if x_q is None else x_q, "float32")


# ---- primes -------------------------------------------------------------------------------------


def test_default_field_is_what_galois_finds():
    import galois

    f = find_field()
    assert f == default_field()
    assert galois.is_prime(f.p) and galois.is_prime(f.q) and (f.p - 1) % f.q == 0
    assert f.p < 2**31 and f.q > 1e6
    assert pow(f.omega, f.q, f.p) == 1 and f.omega != 1
    assert 2**f.sample_bits <= f.p


def test_is_prime_agrees_with_galois():
    import galois

    rng = np.random.default_rng(0)
    for n in [*range(0, 200), *map(int, rng.integers(2, 2**40, 300)), P, Q, 2**31 - 1]:
        assert is_prime(n) == galois.is_prime(n), n


def test_field_rejects_bad_parameters():
    with pytest.raises(ValueError, match="divide"):
        Field(167, 7, 3, 7)
    with pytest.raises(ValueError, match="order"):
        Field(167, 83, 166, 7)  # -1 has order 2
    assert Field.from_primes(167, 83).omega in {pow(g, 2, 167) for g in range(2, 167)}


# ---- elementwise against galois ---------------------------------------------------------------


@SETTINGS
@given(residues(P), residues(P))
def test_elementwise_ops_agree_with_galois(a, b):
    gfp = gf(P)
    alg = fields.FieldAlgebra()
    x, y = pair(a), pair(np.resize(b, a.shape))
    ga, gb = gfp(x.p), gfp(y.p)
    assert np.array_equal(alg.add(x, y).p, np.asarray(ga + gb))
    assert np.array_equal(alg.sub(x, y).p, np.asarray(ga - gb))
    assert np.array_equal(alg.mul(x, y).p, np.asarray(ga * gb))
    assert np.array_equal(alg.neg(x).p, np.asarray(-ga))
    assert np.array_equal(alg.integer_pow(x, 5).p, np.asarray(ga**5))
    if np.all(y.p != 0):
        assert np.array_equal(alg.div(x, y).p, np.asarray(ga / gb))
        assert np.array_equal(alg.integer_pow(y, -3).p, np.asarray(gb**-3))
    else:
        quotient = alg.div(x, y)  # lazy: the zero denominator is found when it is read
        with pytest.raises(VoidTrial):
            quotient.p_raw()


@SETTINGS
@given(residues(Q), residues(Q))
def test_q_component_agrees_with_galois(a, b):
    gfq = gf(Q)
    alg = fields.FieldAlgebra()
    b = np.resize(b, a.shape)
    x, y = FieldArray(a, a, "float32"), FieldArray(b, b, "float32")
    assert np.array_equal(alg.add(x, y).q, np.asarray(gfq(a) + gfq(b)))
    assert np.array_equal(alg.mul(x, y).q, np.asarray(gfq(a) * gfq(b)))
    assert np.array_equal(alg.sub(x, y).q, np.asarray(gfq(a) - gfq(b)))
    assert np.array_equal(alg.reduce_sum(x, (0,)).q, np.asarray(np.sum(gfq(a), axis=0)))


@SETTINGS
@given(st.integers(1, 3000), st.integers(0, 2**32 - 1))
def test_batch_inverse_agrees_with_galois(n, seed):
    x = np.random.default_rng(seed).integers(1, P, n)
    assert np.array_equal(inv_mod(x, P), np.asarray(np.reciprocal(gf(P)(x))))


def test_inverse_of_broadcast_is_computed_once_and_zero_is_void():
    base = np.arange(1, 5, dtype=np.int64).reshape(4, 1)
    view = np.broadcast_to(base, (4, 1000))
    inv = inv_mod(view, P)
    assert inv.shape == (4, 1000) and inv.strides[1] == 0
    assert np.all(inv * view % P == 1)
    with pytest.raises(VoidTrial):
        inv_mod(np.array([3, 0, 5]), P)


# ---- field axioms -----------------------------------------------------------------------------


@SETTINGS
@given(residues(P, st.just(3)), residues(P, st.just(3)), residues(P, st.just(3)))
def test_field_axioms(a, b, c):
    alg = fields.FieldAlgebra()
    x, y, z = pair(a), pair(b), pair(c)
    eq = np.array_equal
    assert eq(alg.add(x, y).p, alg.add(y, x).p)
    assert eq(alg.mul(x, y).p, alg.mul(y, x).p)
    assert eq(alg.add(alg.add(x, y), z).p, alg.add(x, alg.add(y, z)).p)
    assert eq(alg.mul(alg.mul(x, y), z).p, alg.mul(x, alg.mul(y, z)).p)
    assert eq(alg.mul(x, alg.add(y, z)).p, alg.add(alg.mul(x, y), alg.mul(x, z)).p)
    assert eq(alg.add(x, alg.neg(x)).p, np.zeros_like(a))
    assert eq(alg.sub(x, y).p, alg.add(x, alg.neg(y)).p)
    one = alg.constant(np.float32(1.0), "float32")
    assert eq(alg.mul(x, one).p, a)
    if np.all(a != 0):
        assert eq(alg.mul(x, alg.div(one, x)).p, np.ones_like(a))
    # the q-component obeys the same laws
    assert eq(alg.mul(x, alg.add(y, z)).q, alg.add(alg.mul(x, y), alg.mul(x, z)).q)


# ---- matmul -----------------------------------------------------------------------------------


def _exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    return np.asarray((a.astype(object) @ b.astype(object)) % m, dtype=np.int64)


@SETTINGS
@given(
    st.integers(1, 6),
    st.sampled_from([1, 2, 63, 64, 700, 4096, 20000]),
    st.integers(1, 6),
    st.sampled_from([P, Q, 167]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_matmul_is_exact(m_rows, k, n_cols, modulus, small_bound, seed):
    rng = np.random.default_rng(seed)
    bound = min(modulus, 2**30) if small_bound else modulus
    a = rng.integers(0, bound, (m_rows, k))
    b = rng.integers(0, modulus, (k, n_cols))
    a[0, 0], b[0, 0] = bound - 1, modulus - 1  # worst case magnitudes
    out = matmul_mod(a, b, modulus, a_bound=bound)
    assert np.array_equal(out, _exact_matmul(a, b, modulus))
    # either operand may be the split one, and either may come as exact float64
    out_t = matmul_mod(b.T.astype(np.float64), a.T, modulus, b_bound=bound)
    assert np.array_equal(out_t, out.T)


def test_matmul_agrees_with_galois_at_limb_splitting_sizes():
    gfp = gf(P)
    rng = np.random.default_rng(1)
    for shape_a, shape_b in [
        ((5, 300), (300, 7)),
        ((3, 5000), (5000, 4)),
        ((2, 17000), (17000, 3)),
    ]:
        a, b = rng.integers(0, P, shape_a), rng.integers(0, P, shape_b)
        assert np.array_equal(matmul_mod(a, b, P), np.asarray(gfp(a) @ gfp(b)))


def test_batched_matmul_through_the_algebra():
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, P, (3, 4, 900)), rng.integers(0, P, (3, 900, 5))
    aq, bq = a % Q, b % Q
    alg = fields.FieldAlgebra()
    out = alg.matmul(FieldArray(a, aq), FieldArray(b, bq), "float32")
    for i in range(3):
        assert np.array_equal(out.p[i], _exact_matmul(a[i], b[i], P))
        assert np.array_equal(out.q[i], _exact_matmul(aq[i], bq[i], Q))


def test_reduce_sum_agrees_with_galois():
    x = np.random.default_rng(3).integers(0, P, (7, 50, 9))
    expected = np.asarray(np.sum(np.sum(gf(P)(x), axis=2), axis=0))
    assert np.array_equal(reduce_sum_mod(x, (0, 2), P), expected)


# ---- exp --------------------------------------------------------------------------------------


@SETTINGS
@given(residues(Q, st.just(4)), residues(Q, st.just(4)))
def test_exp_is_a_homomorphism(a, b):
    alg = fields.FieldAlgebra()
    x, y = FieldArray(a % P, a), FieldArray(b % P, b)
    lhs = alg.exp(alg.add(x, y))
    rhs = alg.mul(alg.exp(x), alg.exp(y))
    assert np.array_equal(lhs.p, rhs.p)
    assert np.array_equal(
        alg.exp(alg.neg(x)).p, alg.div(alg.constant(np.float32(1), "f"), alg.exp(x)).p
    )
    assert not lhs.q_valid


def test_exp_matches_powers_of_omega():
    e = np.random.default_rng(4).integers(0, Q, 500)
    e[:3] = [0, 1, Q - 1]
    assert np.array_equal(exp_mod(e, F), [pow(F.omega, int(k), P) for k in e])


def test_nested_exp_has_no_field_meaning():
    alg = fields.FieldAlgebra()
    x = FieldArray(np.array([1, 2]), np.array([3, 4]))
    e = alg.exp(x)
    with pytest.raises(FieldSemanticsError, match="exp nested inside exp"):
        alg.exp(e)
    with pytest.raises(FieldSemanticsError, match="exp nested inside exp"):
        alg.exp(alg.add(alg.div(e, alg.reduce_sum(e, (0,))), x))
    # an uninterpreted function of an exp output is a fresh value: exp of it is fine
    assert alg.exp(alg.unary("tanh", e)).p.shape == (2,)


# ---- constants --------------------------------------------------------------------------------


@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_float_constants_are_exact_dyadic_rationals(v):
    num, den = float(v).as_integer_ratio()
    for m in (P, Q):
        assert int(to_residues(np.float64(v), m)) == num * pow(den, -1, m) % m


def test_constants_tell_close_numbers_apart():
    assert to_residues(np.float32(1e-6), P) != to_residues(np.float32(1e-5), P)
    assert to_residues(np.float32(0.1), P) != to_residues(np.float64(0.1), P)
    # a mean over 4096 is an exact inverse
    assert int(to_residues(np.float32(1 / 4096), P)) * 4096 % P == 1
    half = to_residues(np.array([0.5, -2.0, 3, 0.0], np.float16), P)
    assert list(half) == [pow(2, -1, P), P - 2, 3, 0]
    assert list(to_residues(np.array([-1, 7], np.int32), P)) == [P - 1, 7]
    assert list(to_residues(np.array([True, False]), P)) == [1, 0]


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_constants_raise(bad):
    with pytest.raises(FieldSemanticsError, match="no field value"):
        to_residues(np.array([1.0, bad], np.float32), P)


def test_large_constant_arrays_are_vectorised():
    x = np.random.default_rng(5).standard_normal(200_000).astype(np.float32)
    r = to_residues(x, P)
    for i in (0, 1, 99_999):
        num, den = float(x[i]).as_integer_ratio()
        assert r[i] == num * pow(den, -1, P) % P


# ---- uninterpreted functions, shifts, errors ---------------------------------------------------


def test_uninterpreted_functions_are_keyed_and_shared():
    x = FieldArray(np.array([5, 6, 5]), np.array([1, 2, 1]))
    one, other = fields.FieldAlgebra(key=1), fields.FieldAlgebra(key=2)
    s1 = one.unary("sqrt", x).p
    assert s1[0] == s1[2] and s1[0] != s1[1]
    assert np.array_equal(s1, fields.FieldAlgebra(key=1).unary("sqrt", x).p)
    assert not np.array_equal(s1, other.unary("sqrt", x).p)
    assert not np.array_equal(s1, one.unary("tanh", x).p)
    assert one.unary("erf", x).q_valid


def test_shift_max_draws_fresh_values_of_the_reduced_shape():
    alg = fields.FieldAlgebra(key=3)
    x = FieldArray(np.zeros((2, 3, 4), np.int64), np.zeros((2, 3, 4), np.int64))
    s1, s2 = alg.shift_max(x, (2,)), alg.shift_max(x, (2,))
    assert s1.shape == (2, 3) and not np.array_equal(s1.p, s2.p)


def test_ops_without_field_meaning_name_themselves():
    alg = fields.FieldAlgebra()
    x = FieldArray(np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(FieldSemanticsError, match="reduce_max"):
        alg.reduce_max(x, (0,))
    with pytest.raises(FieldSemanticsError, match="max"):
        alg.max(x, x)
    with pytest.raises(FieldSemanticsError, match="truncates"):
        alg.convert(x, "int32")
    xi = FieldArray(np.array([1, 2]), np.array([1, 2]), "int32")
    with pytest.raises(FieldSemanticsError, match="integer division"):
        alg.div(xi, xi)
    with pytest.raises(FieldSemanticsError, match="wraps"):
        alg.convert(xi, "int8")
    assert alg.convert(xi, "float32").dtype == "float32"


def test_lazy_q_is_forced_iteratively_through_long_chains():
    alg = fields.FieldAlgebra()
    x = FieldArray(np.array([3]), np.array([3]))
    y = x
    for _ in range(5000):  # deeper than Python's recursion limit
        y = alg.add(y, x)
    assert int(y.q[0]) == 3 * 5001 % Q


def test_negative_power_of_zero_is_void():
    alg = fields.FieldAlgebra()
    x = FieldArray(np.array([2, 0]), np.array([2, 0]))
    with pytest.raises(VoidTrial):
        alg.integer_pow(x, -2).p_raw()
    assert alg.integer_pow(x, 0).p.tolist() == [1, 1]


def test_random_inputs_are_uniform_deterministic_and_lazy_in_q():
    avals = [((3, 1000), "float32"), ((4_500_000,), "float16"), ((5,), "int32")]
    a = fields.random_inputs(avals, np.random.default_rng(9))
    b = fields.random_inputs(avals, np.random.default_rng(9))
    for x, y, (shape, dtype) in zip(a, b, avals):
        assert x.shape == shape and x.dtype == dtype and x.bound == 2**F.sample_bits
        assert x.p.min() >= 0 and x.p.max() < 2**F.sample_bits
        assert np.array_equal(x.p, y.p)
    big = a[1].p
    assert abs(big.mean() / 2**F.sample_bits - 0.5) < 1e-3  # two threads, two streams
    assert not np.array_equal(big[:1000], big[2_250_000:2_251_000])
    # q-residues: drawn on first read, the same whatever the order of reads
    q_late = b[0].q
    assert np.array_equal(a[2].q, b[2].q) and np.array_equal(a[0].q, q_late)
    assert a[0].q.max() < Q
