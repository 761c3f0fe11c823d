"""Random field inputs, field evaluation, and `verify`: exact probabilistic equivalence checking.

The field of each trial is drawn afresh (`fields.numbers.drawn_field`): q uniform among the
~1.6 million primes in [2^29, 2^30) with p = 2q + 1 prime, ω uniform of order q. With one fixed
prime, constants alias (2^31 ≡ 69 mod 2^31 − 69, so `x·69·2^-31` passed for `x`); no constant
can be chosen against a field it cannot predict. docs/verification.md states the argument.

The false-accept bound (`Verdict.bound`). Per trial, two programs A and B whose real semantics
differ still agree on a fresh random input with probability at most

    ε = (d_A + d_B + u_A + u_B) / |S| + (e_A + e_B) / q_min + α

where d is the output degree, u the uninterpreted-argument degree and e the exponent degree of
each program (`fields.degree`), and |S| = 2^30 the set p-residues are drawn from. The first
term is the Schwartz–Zippel lemma applied to the numerator of the difference of the two
rational functions (exact for programs built from +, −, ·, / and shape ops); the u term covers
one collision of distinct arguments of an uninterpreted function and the e term one collision
of distinct exponents mod q; α (`alias_bound`) is the chance that the drawn field makes two of
the programs' constants (or a constant and zero) coincide. Counting one collision each, and
treating distinct exponentials as independent, is the heuristic Mirage's own argument rests on
(MIRAGE.md §4; see arXiv 2506.04529 for the theory of identity testing with exponentiation
gates). Trials are independent, so an
accepted pair carries `bound = ε ** trials`; void trials (a zero denominator) are redrawn and
conditioning on them changes ε by a factor 1/(1 − P(void)), negligible at these sizes.

Trials: by default the fewest (at least two) that bring the bound to 1e-9: two for every
benchmark but qknorm_mirage, which takes three (experiments/results/verify_times.md);
`trials=` overrides.

Errors go one way. An accept of unequal programs has probability ≤ `bound`. A reject means the
two differ in the field semantics: a real difference, or one the field sees and the reals do
not: constants spelled differently (`x * 0.1` against `x / 10` are different rationals), an
identity of an uninterpreted function (sqrt(x)·sqrt(x) = x is not claimed), a result that
depends on a softmax shift, or an identity special to integers or booleans.

Inputs. Every input element gets an independent uniform p-residue in S and a uniform
q-residue (drawn only if an exp needs it), for float, integer and bool dtypes alike: programs
that differ as functions of reals (or of integers) differ as polynomials, so treating every
input as a formal variable is sound; identities special to booleans, such as x·x = x, are
rejected, never accepted. Outputs are compared on their p-components, which carry the bound.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fields.algebra import FieldAlgebra
from fields.array import Cell, FieldArray
from fields.degree import DegreeReport, degree_bound
from fields.memory import GATE, trial_bytes
from fields.numbers import FAMILY_Q, FAMILY_SIZE, Field, VoidTrial, default_field, drawn_field

TARGET_BOUND = 1e-9
MIN_TRIALS = 2
MAX_TRIALS = 10
MAX_VOID_TRIALS = 20


PARALLEL_FILL = 1 << 21
"""Inputs with at least this many elements are drawn by two threads (numpy releases the GIL)."""
_POOL: ThreadPoolExecutor | None = None


def _fill_uniform(rng: np.random.Generator, out: np.ndarray, bits: int) -> np.ndarray:
    """Fill float64 `out` in place with integers uniform on [0, 2**bits) (bits ≤ 53).

    `Generator.random` returns k/2^53 with k uniform on 53 bits, so floor(x·2^bits) = k >> (53 −
    bits) is exactly uniform; filling in place lets `verify` reuse one buffer across trials.
    Large arrays are filled in two halves from two child streams, in two threads.
    """
    global _POOL

    def fill(gen: np.random.Generator, part: np.ndarray) -> None:
        gen.random(out=part)
        np.multiply(part, float(2**bits), out=part)
        np.floor(part, out=part)

    flat = out.reshape(-1)
    if flat.size < PARALLEL_FILL:
        fill(rng, flat)
        return out
    if _POOL is None:
        _POOL = ThreadPoolExecutor(2, thread_name_prefix="fields-rng")
    half = flat.size // 2
    gens = rng.spawn(2)
    jobs = [_POOL.submit(fill, gens[0], flat[:half]), _POOL.submit(fill, gens[1], flat[half:])]
    for job in jobs:
        job.result()
    return out


def random_inputs(
    avals: Sequence[tuple[tuple[int, ...], str]],
    rng: np.random.Generator,
    field: Field | None = None,
    *,
    buffers: dict[int, np.ndarray] | None = None,
) -> list[FieldArray]:
    """Uniform random field inputs for `avals` ((shape, dtype) pairs).

    The p-residues are uniform on [0, 2**field.sample_bits) and drawn now; the q-residues are
    uniform on Z_q and drawn from the input's own stream when first needed, so they do not
    depend on evaluation order.

    Arguments:
        buffers: a pool of float64 arrays, by input position, refilled in place (the caller
            guarantees that the inputs of the previous call are no longer in use).
    """
    field = field or default_field()
    out = []
    for i, ((shape, dtype), child) in enumerate(zip(avals, rng.spawn(len(avals)))):
        shape = tuple(shape)
        buf = None if buffers is None else buffers.get(i)
        if buf is None or buf.shape != shape:
            buf = np.empty(shape, dtype=np.float64)
            if buffers is not None:
                buffers[i] = buf
        p = _fill_uniform(child, buf, field.sample_bits)
        q_seed = int(child.integers(0, 2**63))

        def draw_q(shape: tuple[int, ...] = shape, seed: int = q_seed) -> np.ndarray:
            gen = np.random.Generator(np.random.SFC64(seed))
            return gen.integers(0, field.q, size=shape, dtype=np.int64)

        out.append(FieldArray(p, Cell(draw_q), dtype, field.sample_size))
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
    outputs = list(program.interpret(xs, algebra))
    for out in outputs:  # compute the p-components now, so a VoidTrial is raised here
        out.p_raw()
    return outputs


@dataclass(frozen=True)
class Verdict:
    """The result of `verify`. `bool(verdict)` is `equal`.

    Arguments:
        equal: every output of `a` equals a distinct output of `b` in every trial.
        p, q: the moduli of the first trial.
        fields: (p, q, ω) of each completed trial (drawn per trial from the family).
        trials: completed (non-void) trials.
        seed: the seed the trials were drawn from.
        void_trials: draws discarded for a zero denominator.
        matching: matching[i] = j when output i of `a` equals output j of `b` (None if rejected).
        mismatched_outputs: outputs of `a` that no output of `b` matched.
        bound: false-accept probability bound for an accepted pair (ε ** trials).
        per_trial_bound: ε, the bound for one trial.
        degrees: the degree reports of `a` and `b` the bound was computed from.
        reason: why the pair was rejected ("" when accepted).
        instance: "" where the trials ran on `a` and `b` themselves; else the smaller instance
            of both they ran on, which the caller proved equivalent to them (e.g.
            `mirage_jax.search.reduced`: "reduced: d0 8→2, d1 16→2").
    """

    equal: bool
    p: int
    q: int
    fields: tuple[tuple[int, int, int], ...]
    trials: int
    seed: int
    void_trials: int
    matching: tuple[int, ...] | None
    mismatched_outputs: tuple[int, ...]
    bound: float
    per_trial_bound: float
    degrees: tuple[DegreeReport, DegreeReport]
    reason: str = ""
    instance: str = ""

    def __bool__(self) -> bool:
        return self.equal

    def to_json(self) -> str:
        """A JSON record (for caches and result files)."""
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def output_order(self) -> tuple[int, ...] | None:
        """order[j] = i when output i of `a` equals output j of `b` (the matching inverted)."""
        if self.matching is None:
            return None
        order = [0] * len(self.matching)
        for i, j in enumerate(self.matching):
            order[j] = i
        return tuple(order)

    def record(self, b_hash: str, a_hash: str) -> str:
        """The JSON kept with an accepted `a` (a µGraph) for `b` (its region): hashes, output
        order (`output_order`) and this verdict."""
        order = self.output_order
        return json.dumps(
            {
                "region_hash": b_hash,
                "mugraph_hash": a_hash,
                "output_order": list(order) if order is not None else None,
                "verdict": json.loads(self.to_json()),
            },
            sort_keys=True,
        )


def trial_bound(da: DegreeReport, db: DegreeReport, field: Field | None = None) -> float:
    """ε, the false-accept probability of one trial (see the module docstring): the
    Schwartz–Zippel terms for the inputs and the exponents, plus, for a field drawn from the
    family (`field=None`), the chance that the draw makes two of the programs' constants alias.
    A fixed `field` gives no such protection: its ε leaves that term out."""
    sample = field.sample_size if field is not None else 2**30
    q_min = field.q if field is not None else FAMILY_Q[0]
    p_term = (da.output + db.output + da.uninterpreted + db.uninterpreted) / sample
    q_term = (da.exponent + db.exponent) / q_min
    alias = 0.0 if field is not None else alias_bound(da, db)
    return min(1.0, p_term + q_term + alias)


def alias_bound(da: DegreeReport, db: DegreeReport) -> float:
    """The chance that the drawn field makes constants of the two programs alias.

    For each constant c and each pair c1 ≠ c2, the integer N = numerator of c (of c1 − c2)
    has at most ⌈bits(N)/29⌉ prime factors in [2^29, 2^31), so a q (or p = 2q + 1) drawn
    uniformly from a family of `FAMILY_SIZE` primes divides it with probability at most
    2⌈bits/29⌉ / FAMILY_SIZE; ω uniform of order q meets ω^c1 = c2 with probability at most
    1/(q − 1) per ordered pair.
    """
    consts = [Fraction(c) for c in {*da.constants, *db.constants} if math.isfinite(c)]
    k = len(consts) + (64 if da.many_constants or db.many_constants else 0)
    scale = max((c.denominator for c in consts), default=1)  # powers of two: one divides all
    ints = [c.numerator * (scale // c.denominator) for c in consts]
    bits = max([abs(n).bit_length() for n in ints] + [1]) + 1  # a difference adds a bit
    events = k + k * (k - 1) // 2
    return events * 2 * math.ceil(bits / 29) / FAMILY_SIZE + k * k / (FAMILY_Q[0] - 1)


def trials_for(eps: float, target_bound: float = TARGET_BOUND) -> int:
    """The fewest trials (MIN_TRIALS..MAX_TRIALS) with eps ** trials ≤ target_bound."""
    if eps <= 0:
        return MIN_TRIALS
    if eps >= 1:
        return MAX_TRIALS
    return min(MAX_TRIALS, max(MIN_TRIALS, math.ceil(math.log(target_bound) / math.log(eps))))


def _perfect_matching(compat: np.ndarray) -> tuple[int, ...] | None:
    """A matching of every row to a distinct column (scipy's Hopcroft–Karp), or None."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    if compat.shape[0] == 0:
        return ()
    match = maximum_bipartite_matching(csr_matrix(compat.astype(np.int8)), perm_type="column")
    return None if np.any(match < 0) else tuple(int(j) for j in match)


def _compare(out_a: Sequence[FieldArray], out_b: Sequence[FieldArray]) -> np.ndarray:
    compat = np.zeros((len(out_a), len(out_b)), dtype=bool)
    for i, x in enumerate(out_a):
        for j, y in enumerate(out_b):
            compat[i, j] = x.shape == y.shape and np.array_equal(x.p, y.p)
    return compat


_MEMO: dict[tuple, Verdict] = {}
SMALL_TRIAL = 256 * 2**20
"""Trials estimated below this many bytes run without asking `fields.memory.GATE`."""

MEMO_SIZE = 4096
"""Verdicts kept per process: the search verifies its best µGraphs at full size and the
selection would verify the same pairs again (at prefill sizes, seconds each)."""


def _memo_key(a: Any, b: Any, trials, seed, field, target_bound, max_void) -> tuple | None:
    """What a verdict depends on, or None where a program has no canonical hash (or a fixed
    field is given): then nothing is remembered."""
    try:
        ha, hb = a.canonical_hash, b.canonical_hash
    except AttributeError:
        return None
    if field is not None or not isinstance(ha, str) or not isinstance(hb, str):
        return None
    return (type(a).__name__, ha, type(b).__name__, hb, trials, seed, target_bound, max_void)


def verify(
    a: Any,
    b: Any,
    *,
    trials: int | None = None,
    seed: int = 0,
    field: Field | None = None,
    target_bound: float = TARGET_BOUND,
    max_void_trials: int = MAX_VOID_TRIALS,
    outcomes: dict[int, TrialOutcome] | None = None,
) -> Verdict:
    """Test two programs for equality of their exact semantics, up to a permutation of outputs.

    The verdict is a function of the two programs' structure (canonical hashes) and the
    arguments, so the same question asked twice in a process is answered from memory.

    Arguments:
        a, b: Programs, or anything with `input_avals`, `output_avals` and
            `interpret(inputs, algebra)` (µGraphs); their input avals must agree.
        trials: independent trials, each on fresh random inputs with fresh uninterpreted
            functions and shifts; by default the fewest (at least 2, at most 10) that bring the
            bound to `target_bound`.
        seed: makes the verdict reproducible.
        field: fixed moduli for every trial (tests; no protection against constants that
            alias modulo it); by default each trial draws its own (`fields.drawn_field`).
        target_bound: the false-accept bound the default number of trials aims at.
        max_void_trials: void draws tolerated before the pair is rejected.
        outcomes: attempts already run (`run_trial`, e.g. in a pool: attempt → outcome); the
            verdict is the one the trials run here in order would give (the rest run here).

    Raises:
        TypeError: the input avals differ.
        FieldSemanticsError: an op has no field meaning (it names the op).
        TooLarge: one trial needs more memory than verification may take here
            (`fields.memory`); trials that fit wait for room beside others.
    """
    key = _memo_key(a, b, trials, seed, field, target_bound, max_void_trials)
    if key is not None and key in _MEMO:
        return _MEMO[key]
    need = trial_bytes(a, b)
    with GATE.admit(need) if need > SMALL_TRIAL else contextlib.nullcontext():
        v = _verify(a, b, trials, seed, field, target_bound, max_void_trials, outcomes)
    _keep(key, v)
    return v


def remember(
    a: Any,
    b: Any,
    v: Verdict,
    *,
    trials: int | None = None,
    seed: int = 0,
    target_bound: float = TARGET_BOUND,
    max_void_trials: int = MAX_VOID_TRIALS,
) -> None:
    """Answer `verify(a, b, …)` with `v` from now on in this process: the verdict of that very
    question computed elsewhere (another process: a search's pool or a Ray task), or on a
    smaller instance of the pair that its caller proved decides it (`v.instance` names it)."""
    _keep(_memo_key(a, b, trials, seed, None, target_bound, max_void_trials), v)


def known(
    a: Any,
    b: Any,
    *,
    trials: int | None = None,
    seed: int = 0,
    target_bound: float = TARGET_BOUND,
    max_void_trials: int = MAX_VOID_TRIALS,
) -> Verdict | None:
    """The verdict `verify(a, b, …)` would answer from memory (computed or `remember`ed), or
    None where it would run trials."""
    key = _memo_key(a, b, trials, seed, None, target_bound, max_void_trials)
    return None if key is None else _MEMO.get(key)


def verify_to_bound(
    a: Any,
    b: Any,
    *,
    trials: int | None,
    seed: int = 0,
    outcomes: dict[int, TrialOutcome] | None = None,
) -> Verdict:
    """`verify` with `trials`, or with the fewest trials that reach `TARGET_BOUND` where those
    leave the bound above it (the bound a cache trusts). Where `trials` cannot reach it and no
    verdict is known for them, only the trials that reach it run (a full-size trial at 7B takes
    seconds), not `trials` first and then those."""
    if trials is None or trials >= verify_plan(a, b) or known(a, b, trials=trials, seed=seed):
        v = verify(a, b, trials=trials, seed=seed, outcomes=outcomes)
        if not (v.equal and v.bound > TARGET_BOUND):
            return v
    return verify(a, b, seed=seed, outcomes=outcomes)


def _keep(key: tuple | None, v: Verdict) -> None:
    if key is None:
        return
    if len(_MEMO) >= MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = v


def verify_plan(
    a: Any,
    b: Any,
    trials: int | None = None,
    field: Field | None = None,
    target_bound: float = TARGET_BOUND,
) -> int:
    """The trials `verify(a, b, trials=trials)` completes when none is void and all agree."""
    if trials is not None:
        return trials
    return trials_for(trial_bound(degree_bound(a), degree_bound(b), field), target_bound)


TrialOutcome = tuple[np.ndarray | None, Field]
"""One trial's output compatibility matrix (None: a void draw) and its field."""


def run_trial(a: Any, b: Any, seed: int, attempt: int, field: Field | None = None) -> TrialOutcome:
    """Attempt `attempt` of `verify(a, b, seed=seed)`, alone: which outputs of `a` equal which
    of `b` on its draw (None where a denominator was zero). Attempts are independent, so a pool
    can run them at once (`verify(..., outcomes=...)` combines them)."""
    rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, attempt])))
    field = field or drawn_field(seed, attempt)  # a fresh field per trial (module docstring)
    key = int(rng.integers(0, 2**63)) << 64 | int(rng.integers(0, 2**63))
    algebra = FieldAlgebra(field, key=key, rng=rng.spawn(1)[0])
    inputs = random_inputs(tuple(a.input_avals), rng, field)
    try:
        out_a = a.interpret(inputs, algebra)
        out_b = b.interpret(inputs, algebra)
        for out in (*out_a, *out_b):  # force the p-components here: zero denominators
            out.p_raw()
    except VoidTrial:
        return None, field
    return _compare(out_a, out_b), field


def _verify(
    a: Any,
    b: Any,
    trials: int | None,
    seed: int,
    field: Field | None,
    target_bound: float,
    max_void_trials: int,
    outcomes: dict[int, TrialOutcome] | None = None,
) -> Verdict:
    """`verify` without the memo; `outcomes`: attempts already run elsewhere (`run_trial`)."""
    fixed = field
    avals_a, avals_b = tuple(a.input_avals), tuple(b.input_avals)
    if avals_a != avals_b:
        raise TypeError(f"input avals differ: {avals_a} against {avals_b}")
    deg_a, deg_b = degree_bound(a), degree_bound(b)
    eps = trial_bound(deg_a, deg_b, fixed)
    used: list[Field] = []
    if trials is None:
        trials = trials_for(eps, target_bound)

    def verdict(equal: bool, done: int, void: int, matching=None, mismatched=(), reason=""):
        first = used[0] if used else (fixed or drawn_field(seed, 0))
        return Verdict(
            equal=equal,
            p=first.p,
            q=first.q,
            fields=tuple((f.p, f.q, f.omega) for f in used),
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
        if outcomes is not None and attempt in outcomes:
            agree, drawn = outcomes[attempt]
        else:
            agree, drawn = run_trial(a, b, seed, attempt, fixed)
        attempt += 1
        if agree is None:
            void += 1
            if void > max_void_trials:
                return verdict(
                    False, done, void, reason=f"{void} void draws: a denominator is always zero"
                )
            continue
        compat &= agree
        done += 1
        used.append(drawn)
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
