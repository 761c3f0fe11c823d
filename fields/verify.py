"""Random field inputs, field evaluation, and `verify`: exact probabilistic equivalence checking.

The false-accept bound (`Verdict.bound`). Per trial, two programs A and B whose real semantics
differ still agree on a fresh random input with probability at most

    ε = (d_A + d_B + u_A + u_B) / |S| + (e_A + e_B) / q

where d is the output degree, u the uninterpreted-argument degree and e the exponent degree of
each program (`fields.degree`), and |S| = 2^30 the set p-residues are drawn from. The first
term is the Schwartz–Zippel lemma applied to the numerator of the difference of the two
rational functions (exact for programs built from +, −, ·, / and shape ops); the u term covers
one collision of distinct arguments of an uninterpreted function and the e term one collision
of distinct exponents mod q. Counting one collision each, and treating distinct exponentials as
independent, is the heuristic Mirage's own argument rests on (MIRAGE.md §4; see arXiv 2506.04529
for the theory of identity testing with exponentiation gates). Trials are independent, so an
accepted pair carries `bound = ε ** trials`; void trials (a zero denominator) are redrawn and
conditioning on them changes ε by a factor 1/(1 − P(void)), negligible at these sizes.

Sound in one direction only: a reject is always a real difference of the exact semantics, or a
constant spelled differently (`x * 0.1` against `x / 10` are different rationals).

Inputs. Every input element gets an independent uniform p-residue in S (float and integer and
bool dtypes alike: an identity that holds for all reals, or all integers, is a polynomial
identity, so treating every input as a formal variable is sound; identities special to booleans
such as x·x = x are rejected, never accepted) and a uniform q-residue, drawn only if needed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fields.algebra import FieldAlgebra
from fields.degree import DegreeReport, degree_bound
from fields.numbers import Field, FieldArray, VoidTrial, _Lazy, default_field

DEFAULT_TRIALS = 3
MAX_VOID_TRIALS = 20


def _random_p(rng: np.random.Generator, size: int, bits: int) -> np.ndarray:
    """`size` uniform integers in [0, 2**bits) as exact float64 (bits ≤ 32), from raw bits."""
    raw = rng.bit_generator.random_raw((size + 1) // 2).view(np.uint32)[:size]
    if bits < 32:
        raw = raw & np.uint32((1 << bits) - 1)
    return raw.astype(np.float64)


def random_inputs(
    avals: Sequence[tuple[tuple[int, ...], str]],
    rng: np.random.Generator,
    field: Field | None = None,
) -> list[FieldArray]:
    """Uniform random field inputs for `avals` ((shape, dtype) pairs).

    The p-residues are uniform on [0, 2**field.sample_bits) and drawn now; the q-residues are
    uniform on Z_q and drawn from the input's own stream when first needed, so they do not
    depend on evaluation order.
    """
    field = field or default_field()
    out = []
    for (shape, dtype), child in zip(avals, rng.spawn(len(avals))):
        size = math.prod(shape)
        p = _random_p(child, size, field.sample_bits).reshape(shape)
        q_seed = child.integers(0, 2**63)

        def draw_q(shape: tuple[int, ...] = tuple(shape), seed: int = int(q_seed)) -> np.ndarray:
            gen = np.random.Generator(np.random.SFC64(seed))
            return gen.integers(0, field.q, size=shape, dtype=np.int64)

        out.append(FieldArray(p, _Lazy(draw_q), dtype))
    return out


def evaluate(
    program: Any, inputs: Sequence[Any], algebra: FieldAlgebra | None = None
) -> list[FieldArray]:
    """Evaluate a Program (or anything with `interpret(inputs, algebra)`) on field inputs.

    Inputs are `FieldArray`s, or exact numbers (ints, dyadic floats) mapped into both components.
    """
    algebra = algebra or FieldAlgebra()
    avals = list(getattr(program, "input_avals", [(None, None)] * len(inputs)))
    xs = []
    for x, (_, dtype) in zip(inputs, avals):
        if isinstance(x, FieldArray):
            xs.append(x)
        else:
            xs.append(FieldArray.from_ints(x, algebra.field, dtype))
    return list(program.interpret(xs, algebra))


@dataclass(frozen=True)
class Verdict:
    """The result of `verify`. `bool(verdict)` is `equal`.

    Arguments:
        equal: every output of `a` equals a distinct output of `b` in every trial.
        p, q: the moduli.
        trials: completed (non-void) trials.
        seed: the seed the trials were drawn from.
        void_trials: draws discarded for a zero denominator.
        matching: matching[i] = j when output i of `a` equals output j of `b` (None if rejected).
        mismatched_outputs: outputs of `a` that no output of `b` matched.
        bound: false-accept probability bound for an accepted pair (ε ** trials).
        per_trial_bound: ε, the bound for one trial.
        degrees: the degree reports of `a` and `b` the bound was computed from.
        reason: why the pair was rejected ("" when accepted).
    """

    equal: bool
    p: int
    q: int
    trials: int
    seed: int
    void_trials: int
    matching: tuple[int, ...] | None
    mismatched_outputs: tuple[int, ...]
    bound: float
    per_trial_bound: float
    degrees: tuple[DegreeReport, DegreeReport]
    reason: str = ""

    def __bool__(self) -> bool:
        return self.equal

    def to_json(self) -> str:
        """A JSON record (for caches and result files)."""
        return json.dumps(asdict(self), sort_keys=True)


def trial_bound(da: DegreeReport, db: DegreeReport, field: Field) -> float:
    """ε, the false-accept probability of one trial (see the module docstring)."""
    p_term = (da.output + db.output + da.uninterpreted + db.uninterpreted) / field.sample_size
    q_term = (da.exponent + db.exponent) / field.q
    return min(1.0, p_term + q_term)


def _perfect_matching(compat: np.ndarray) -> tuple[int, ...] | None:
    """A matching of every row to a distinct column (augmenting paths), or None."""
    n_rows, n_cols = compat.shape
    match_col = [-1] * n_cols

    def augment(row: int, seen: set[int]) -> bool:
        for col in range(n_cols):
            if compat[row, col] and col not in seen:
                seen.add(col)
                if match_col[col] < 0 or augment(match_col[col], seen):
                    match_col[col] = row
                    return True
        return False

    for row in range(n_rows):
        if not augment(row, set()):
            return None
    result = [0] * n_rows
    for col, row in enumerate(match_col):
        if row >= 0:
            result[row] = col
    return tuple(result)


def _compare(out_a: Sequence[FieldArray], out_b: Sequence[FieldArray]) -> np.ndarray:
    compat = np.zeros((len(out_a), len(out_b)), dtype=bool)
    for i, x in enumerate(out_a):
        for j, y in enumerate(out_b):
            compat[i, j] = x.shape == y.shape and np.array_equal(x.p, y.p)
    return compat


def verify(
    a: Any,
    b: Any,
    *,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    field: Field | None = None,
    max_void_trials: int = MAX_VOID_TRIALS,
) -> Verdict:
    """Test two programs for equality of their exact semantics, up to a permutation of outputs.

    Arguments:
        a, b: Programs, or anything with `input_avals`, `output_avals` and
            `interpret(inputs, algebra)` (µGraphs); their input avals must agree.
        trials: independent trials, each on fresh random inputs with fresh uninterpreted
            functions and shifts.
        seed: makes the verdict reproducible.
        field: the moduli (default `default_field()`).
        max_void_trials: void draws tolerated before the pair is rejected.

    Raises:
        TypeError: the input avals differ.
        FieldSemanticsError: an op has no field meaning (it names the op).
    """
    field = field or default_field()
    avals_a, avals_b = tuple(a.input_avals), tuple(b.input_avals)
    if avals_a != avals_b:
        raise TypeError(f"input avals differ: {avals_a} against {avals_b}")
    deg_a, deg_b = degree_bound(a), degree_bound(b)
    eps = trial_bound(deg_a, deg_b, field)

    def verdict(equal: bool, done: int, void: int, matching=None, mismatched=(), reason=""):
        return Verdict(
            equal=equal,
            p=field.p,
            q=field.q,
            trials=done,
            seed=seed,
            void_trials=void,
            matching=matching,
            mismatched_outputs=tuple(int(i) for i in mismatched),
            bound=eps**done if equal else 1.0,
            per_trial_bound=eps,
            degrees=(deg_a, deg_b),
            reason=reason,
        )

    n_a, n_b = len(a.output_avals), len(b.output_avals)
    if n_a != n_b:
        return verdict(False, 0, 0, mismatched=range(n_a), reason=f"{n_a} outputs against {n_b}")
    compat = np.array(
        [[sa == sb for sb, _ in b.output_avals] for sa, _ in a.output_avals], dtype=bool
    ).reshape(n_a, n_b)
    done = void = attempt = 0
    matching = _perfect_matching(compat)
    if matching is None:
        return verdict(False, 0, 0, mismatched=_unmatched(compat), reason="output shapes differ")
    while done < trials:
        rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, attempt])))
        attempt += 1
        key = int(rng.integers(0, 2**63)) << 64 | int(rng.integers(0, 2**63))
        algebra = FieldAlgebra(field, key=key, rng=rng.spawn(1)[0])
        inputs = random_inputs(avals_a, rng, field)
        try:
            out_a = a.interpret(inputs, algebra)
            out_b = b.interpret(inputs, algebra)
        except VoidTrial:
            void += 1
            if void > max_void_trials:
                return verdict(
                    False, done, void, reason=f"{void} void draws: a denominator is always zero"
                )
            continue
        compat &= _compare(out_a, out_b)
        done += 1
        matching = _perfect_matching(compat)
        if matching is None:
            bad = _unmatched(compat)
            return verdict(
                False, done, void, mismatched=bad, reason=f"outputs {list(bad)} of a differ from b"
            )
    return verdict(True, done, void, matching=matching)


def _unmatched(compat: np.ndarray) -> tuple[int, ...]:
    rows = tuple(i for i in range(compat.shape[0]) if not compat[i].any())
    return rows or tuple(range(compat.shape[0]))
