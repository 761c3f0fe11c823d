"""The number system Z_p × Z_q: primes, exact constants and fast vectorised modular arithmetic.

Choice of primes (`default_field`, found by `find_field` with galois). p = 2q + 1 is the largest
safe prime below 2^31 and q the Sophie Germain prime under it:

    p = 2147483579 = 2^31 − 69,   q = 1073741789 = 2^30 − 35,   ω = 4 (order q in Z_p*).

- p < 2^31 keeps every elementwise product of residues below 2^62, exact in int64.
- q | p − 1 and ω = g^2 for the primitive root g = 2, so exp(x) = ω^(x mod q) is a
  homomorphism from (Z_q, +) into (Z_p*, ·): exp(x + y) = exp(x)·exp(y) holds exactly.
- q is as large as p < 2^31 allows (the brief asked for q ≥ ~1e6): an exponent collision then
  costs degree/2^30 per trial instead of degree/1e6. It is free because the q-component is only
  computed where an exp needs it (`fields.array`), and there the q-matmuls have small K.
- Random p-residues are uniform on S = [0, 2^30) ⊂ Z_p (exact and fast to draw); Schwartz–Zippel
  needs only a uniform draw from some set S, with error degree/|S|. One trial of the benchmark
  programs errs with probability at most 2.5e-8 (3.1e-5 for qknorm_mirage, whose V is normalised
  along the contraction, so its sum has 4096 distinct denominators); `fields.verify` states the
  bound, from the degrees `fields.degree` computes, and two trials reach 1e-9.

Matmul. Residues are < 2^31, so one product already exceeds 2^53 and float64 BLAS is not exact
on residues directly. `matmul_mod` splits the smaller operand into L limbs of s bits, the widest
with K·(2^s − 1)·(bound − 1) < 2^53, where bound is the other operand's largest entry + 1 (2^30
for random inputs, which saves a limb): every partial sum is then an exact integer in float64,
whatever order BLAS adds in. The limbs are stacked along M (or N), so one BLAS call reads the
large operand once (X[8,4096] @ W[4096,4096] is one [24,4096] @ [4096,4096] call); K is chunked
when it is too long for 8-bit limbs. Limb products are recombined by Horner's rule in int64.

Inverses: one product tree per array (about three multiplications per element, one scalar
inverse), on the distinct part of broadcast views only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lax_ir.dtypes import is_float

MAX_EXACT_BITS = 53
"""float64 represents every integer below 2^53 exactly."""
MIN_LIMB_BITS = 8
"""K is chunked so that limbs carry at least this many bits."""


class FieldSemanticsError(ValueError):
    """An op (or a value) has no sound meaning in the finite-field semantics."""


class VoidTrial(ArithmeticError):
    """A division by zero (or a zero base raised to a negative power): redraw the inputs."""


# ---- primes ------------------------------------------------------------------------------------


def is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3·10^24 (cheap; galois finds, this checks)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n in bases:
        return True
    if any(n % b == 0 for b in bases):
        return False
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for b in bases:
        x = pow(b, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Field:
    """The moduli of one verification: Z_p × Z_q with q | p − 1 and ω of order q in Z_p.

    Arguments:
        p: prime, p < 2^31.
        q: prime dividing p − 1.
        omega: an element of order q in Z_p*.
        sample_bits: random p-residues are uniform on [0, 2**sample_bits) ⊆ [0, p).
    """

    p: int
    q: int
    omega: int
    sample_bits: int

    def __post_init__(self) -> None:
        if not (2 < self.p < 2**31 and is_prime(self.p) and is_prime(self.q)):
            raise ValueError(f"need primes p < 2^31 and q, got p={self.p}, q={self.q}")
        if (self.p - 1) % self.q:
            raise ValueError(f"q={self.q} does not divide p-1={self.p - 1}")
        if self.omega % self.p in (0, 1) or pow(self.omega, self.q, self.p) != 1:
            raise ValueError(f"omega={self.omega} does not have order q={self.q} mod p={self.p}")
        if self.sample_bits < 1 or 2**self.sample_bits > self.p:
            raise ValueError(f"2**sample_bits must be at most p, got {self.sample_bits}")

    @property
    def sample_size(self) -> int:
        """|S|, the size of the set random p-residues are drawn from."""
        return 2**self.sample_bits

    @staticmethod
    def from_primes(p: int, q: int) -> Field:
        """The field for primes p, q (q | p − 1), with ω = g^((p−1)/q) for a primitive root g."""
        import galois

        g = int(galois.primitive_root(p))
        return Field(p, q, pow(g, (p - 1) // q, p), p.bit_length() - 1)


def find_field(below: int = 2**31) -> Field:
    """The largest safe prime p = 2q + 1 < `below`, found with galois (`default_field`'s origin)."""
    import galois

    q = (below - 1) // 2
    while True:
        q = int(galois.prev_prime(q - 1))
        if galois.is_prime(2 * q + 1):
            return Field.from_primes(2 * q + 1, q)


# ---- the family fields are drawn from, one per trial ----------------------------------------
FAMILY_Q = (2**29, 2**30)
"""q is drawn uniformly among the primes in [2^29, 2^30) with p = 2q + 1 prime (safe primes)."""
FAMILY_SIZE = 1_400_000
"""A lower bound on the family's size: 2,411 of 400,000 uniformly drawn odd q in the range were
members (estimate 1.62 million; this is 4.9 standard deviations below; `fields.verify`'s module
docstring and docs/verification.md use it)."""
_SMALL_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73)


def _is_safe_q(q: int) -> bool:
    p = 2 * q + 1
    if any(q % s == 0 or p % s == 0 for s in _SMALL_PRIMES):
        return False
    return is_prime(q) and is_prime(p)


@functools.lru_cache(maxsize=64)
def drawn_field(seed: int, trial: int) -> Field:
    """The field of trial `trial` of a verification with `seed`: q uniform in the family (by
    rejection: uniform odd q until q and 2q + 1 are prime, ~150 tries), p = 2q + 1, and ω a
    uniform element of order q (the square of a uniform g ≠ ±1). Deterministic per (seed,
    trial); no constant can be chosen to alias in a field it cannot predict."""
    rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, trial, 0x5AFE])))
    lo, hi = FAMILY_Q
    while True:
        q = 2 * int(rng.integers(lo // 2, hi // 2)) + 1
        if _is_safe_q(q):
            break
    p = 2 * q + 1
    while True:
        omega = pow(int(rng.integers(2, p - 1)), 2, p)
        if omega != 1:
            return Field(p, q, omega, sample_bits=30)


@functools.cache
def default_field() -> Field:
    """p = 2^31 − 69, q = (p − 1)/2, ω = 4: `find_field()`, stored so galois is not imported."""
    return Field(p=2147483579, q=1073741789, omega=4, sample_bits=30)


# ---- vectorised modular arithmetic on int64 residues ----------------------------------------


def add_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    s = np.asarray(np.add(a, b, dtype=np.int64))
    np.subtract(s, m, out=s, where=s >= m)
    return s


def sub_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    d = np.asarray(np.subtract(a, b, dtype=np.int64))
    np.add(d, m, out=d, where=d < 0)
    return d


def mul_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    r = np.asarray(np.multiply(a, b, dtype=np.int64))
    np.remainder(r, m, out=r)
    return r


def neg_mod(a: np.ndarray, m: int) -> np.ndarray:
    return np.where(a == 0, 0, m - a).astype(np.int64)


def pow_mod(a: np.ndarray, e: int, m: int) -> np.ndarray:
    """a**e mod m elementwise for an integer e ≥ 0 (square and multiply)."""
    if e < 0:
        raise ValueError("pow_mod needs e >= 0; invert first")
    result = np.ones(np.shape(a), dtype=np.int64)
    base = np.array(a, dtype=np.int64)
    while e:
        if e & 1:
            result = mul_mod(result, base, m)
        e >>= 1
        if e:
            base = mul_mod(base, base, m)
    return result


def compact(x: np.ndarray) -> np.ndarray:
    """The distinct part of a broadcast view: length 1 along every stride-0 axis."""
    index = tuple(
        slice(0, 1) if stride == 0 and dim > 1 else slice(None)
        for stride, dim in zip(x.strides, x.shape)
    )
    return x[index]


def inv_mod(a: np.ndarray, m: int) -> np.ndarray:
    """Elementwise inverse mod a prime m; VoidTrial if any element is 0.

    Batch inversion through a product tree (vectorised per level): about 3 multiplications per
    element and one scalar inverse. Broadcast (stride-0) axes are inverted once.
    """
    base = compact(np.asarray(a))
    if not base.all():
        raise VoidTrial("division by zero")
    flat = np.ascontiguousarray(base, dtype=np.int64).ravel()
    levels = []
    cur = flat
    while cur.size > 1:
        if cur.size % 2:
            cur = np.append(cur, 1)
        levels.append(cur)
        cur = mul_mod(cur[0::2], cur[1::2], m)
    inv = np.array([pow(int(cur[0]), -1, m)], dtype=np.int64)
    for level in reversed(levels):
        inv = inv[: level.size // 2]  # drop the parent level's padding
        nxt = np.empty_like(level)
        nxt[0::2] = mul_mod(inv, level[1::2], m)
        nxt[1::2] = mul_mod(inv, level[0::2], m)
        inv = nxt
    return np.broadcast_to(inv[: flat.size].reshape(base.shape), np.shape(a))


def reduce_sum_mod(a: np.ndarray, axes: Sequence[int], m: int) -> np.ndarray:
    axes = tuple(axes)
    count = math.prod(a.shape[ax] for ax in axes)
    if count * (m - 1) >= 2**63:
        raise OverflowError(f"reduce_sum over {count} elements overflows int64")
    return np.remainder(np.sum(a, axis=axes, dtype=np.int64), m)


def limb_bits(k: int, big_bound: int) -> int:
    """The widest limb s with k·(2^s − 1)·(big_bound − 1) < 2^53 (exact float64 dot products)."""
    s = 0
    while k * (2 ** (s + 1) - 1) * (big_bound - 1) < 2**MAX_EXACT_BITS:
        s += 1
    return s


def split_first(a_shape: Sequence[int], b_shape: Sequence[int]) -> bool:
    """Whether `matmul_mod` splits its first operand (the one with fewer elements) into limbs."""
    return math.prod(a_shape) <= math.prod(b_shape)


def matmul_mod(
    a: np.ndarray,
    b: np.ndarray,
    m: int,
    *,
    a_bound: int | None = None,
    b_bound: int | None = None,
) -> np.ndarray:
    """Exact batched a[..., M, K] @ b[..., K, N] mod m via float64 BLAS with limb splitting.

    The operand with fewer elements (`split_first`) is split into L limbs of s bits, stacked
    into one BLAS call against the other operand in float64; s is the widest with
    K·(2^s − 1)·(bound − 1) < 2^53, so every partial sum is an exact integer.

    Arguments:
        a, b: residues, 0 ≤ a < a_bound ≤ m and 0 ≤ b < b_bound ≤ m, as int64 or as exact
            float64 (pass the split operand as int64 and the other as float64 to save a
            conversion).
        m: the modulus (< 2^31).
        a_bound, b_bound: exclusive bounds on the entries (default m; random inputs are smaller,
            which saves a limb).
    """
    k = a.shape[-1]
    a_bound, b_bound = a_bound or m, b_bound or m
    split_a = split_first(a.shape, b.shape)
    small, small_bound, big_bound = (a, a_bound, b_bound) if split_a else (b, b_bound, a_bound)
    small = np.asarray(small).astype(np.int64, copy=False)
    big = np.asarray(b if split_a else a).astype(np.float64, copy=False)
    bits = max(1, (small_bound - 1).bit_length())
    chunk = k
    while chunk > 1 and limb_bits(chunk, big_bound) < min(MIN_LIMB_BITS, bits):
        chunk = (chunk + 1) // 2
    out = None
    for start in range(0, k, chunk):  # long contractions: exact per chunk, summed mod m
        stop = min(k, start + chunk)
        if split_a:
            part = _limb_matmul(
                small[..., start:stop], big[..., start:stop, :], True, bits, m, big_bound
            )
        else:
            part = _limb_matmul(
                small[..., start:stop, :], big[..., start:stop], False, bits, m, big_bound
            )
        out = part if out is None else add_mod(out, part, m)
    assert out is not None
    return out


def _limb_matmul(
    small: np.ndarray, big: np.ndarray, split_a: bool, bits: int, m: int, big_bound: int
) -> np.ndarray:
    k = big.shape[-2] if split_a else big.shape[-1]
    s = min(limb_bits(k, big_bound), bits)
    n_limbs = -(-bits // s)
    mask = (1 << s) - 1
    limbs = [((small >> (s * i)) & mask).astype(np.float64) for i in range(n_limbs)]
    if split_a:  # stack along M: [..., L·M, K] @ [..., K, N]
        prod = np.matmul(np.concatenate(limbs, axis=-2) if n_limbs > 1 else limbs[0], big)
        parts = prod.astype(np.int64).reshape(
            *prod.shape[:-2], n_limbs, small.shape[-2], prod.shape[-1]
        )
    else:  # stack along N: [..., M, K] @ [..., K, L·N]
        prod = np.matmul(big, np.concatenate(limbs, axis=-1) if n_limbs > 1 else limbs[0])
        parts = prod.astype(np.int64).reshape(*prod.shape[:-1], n_limbs, small.shape[-1])
        parts = np.moveaxis(parts, -2, -3)
    # Horner from the top limb: acc < m < 2^31, so (acc << s) + limb < 2^63.
    acc = np.remainder(parts[..., n_limbs - 1, :, :], m)
    for i in range(n_limbs - 2, -1, -1):
        acc <<= s
        acc += parts[..., i, :, :]
        np.remainder(acc, m, out=acc)
    return acc


# ---- exp, hashing, constants ------------------------------------------------------------------

_EXP_SPLIT = 16


@functools.cache
def _exp_tables(p: int, omega: int, q: int) -> tuple[np.ndarray, np.ndarray]:
    """ω^lo and ω^(hi·2^16) for all 16-bit lo and all hi < q / 2^16."""

    def powers(base: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        acc = 1
        for i in range(n):
            out[i] = acc
            acc = acc * base % p
        return out

    lo = powers(omega, 1 << _EXP_SPLIT)
    hi = powers(pow(omega, 1 << _EXP_SPLIT, p), (q >> _EXP_SPLIT) + 1)
    return lo, hi


def exp_mod(x: np.ndarray, field: Field) -> np.ndarray:
    """ω^x mod p for exponents x in [0, q), by two table lookups."""
    lo, hi = _exp_tables(field.p, field.omega, field.q)
    return mul_mod(lo[x & ((1 << _EXP_SPLIT) - 1)], hi[x >> _EXP_SPLIT], field.p)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keyed_hash(x: np.ndarray, key: int, m: int) -> np.ndarray:
    """A keyed pseudo-random function of int64 residues into [0, m); broadcasts are hashed once."""
    base = compact(np.asarray(x))
    z = _mix64(base.astype(np.uint64) ^ np.uint64(key & (2**64 - 1)))
    z = _mix64(z ^ np.uint64((key >> 64) & (2**64 - 1)))
    out = (z % np.uint64(m)).astype(np.int64)
    return np.broadcast_to(out, np.shape(x))


@functools.cache
def _pow2_table(m: int) -> tuple[int, np.ndarray]:
    """(e0, t) with t[e − e0] = 2^e mod m for every exponent a float64 mantissa·2^e can need."""
    e0 = -1074 - 60
    return e0, np.array([pow(2, e, m) for e in range(e0, 1100)], dtype=np.int64)


def to_residues(value: Any, m: int) -> np.ndarray:
    """An exact constant (float, int or bool array) as int64 residues mod m.

    A float is a dyadic rational M·2^e with an integer M < 2^53; it maps to M·2^e mod m, with
    2^e for e < 0 the inverse of 2^−e. inf and nan have no field value.
    """
    arr = np.asarray(value)
    if arr.dtype == np.bool_:
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        if arr.dtype == np.uint64:
            return (arr % np.uint64(m)).astype(np.int64)
        return np.remainder(arr.astype(np.int64), m)
    if not is_float(arr.dtype):
        raise FieldSemanticsError(f"constant of dtype {arr.dtype} has no field value")
    f = arr.astype(np.float64)
    if not np.isfinite(f).all():
        bad = f[~np.isfinite(f)].ravel()[0]
        raise FieldSemanticsError(
            f"constant {bad} has no field value (inf and nan are not field elements)"
        )
    mantissa, exponent = np.frexp(f)
    integer = (mantissa * 2.0**53).astype(np.int64)  # exact: |mantissa| in [0.5, 1)
    e0, table = _pow2_table(m)
    scale = table[exponent.astype(np.int64) - 53 - e0]
    return mul_mod(np.remainder(integer, m), scale, m)
