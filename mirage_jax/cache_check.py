"""The check a cached µGraph passes against its region before its first use in a process.

Nothing in a cache record is trusted for what it says: from the region Program and the µGraph
alone, `check_against_region`

1. runs a fresh one-trial `fields.verify` on a random seed: the µGraph must still be equal to
   the region, and the verdict's `output_order` (never the stored one) says which µGraph
   output is which region output;
2. compares the stored record with that verification (output order, field, degree bounds):
   a record that disagrees is reported (`LoadCheck.mismatches`);
3. for an entry that did not come from this machine's search (`origin` "import", "store" or
   "unknown"), whose record disagrees, or always when asked (`float_check="always"`), runs a
   float check: the kernel, lowered for the entry's backend (or the µGraph's reference
   evaluation `mirage_jax.mugraph.evaluate` where that backend cannot run here, e.g. pallas
   without a GPU; the result says which), on random inputs against the region run in float64
   (`lax_ir.evaluate_reference`), within `mirage_jax.select.FLOAT_TOL` per output dtype.

The float check catches what the field trial cannot: constants that alias modulo the prime,
and µGraphs equal in exact arithmetic but not in floating point. A failure raises StaleEntry
naming the reason; a pass is remembered for the rest of the process (keyed by the row's
content, so a changed row is checked again). What it costs per region is measured in
`mirage_jax.cache`'s docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage_jax.cache_entry import StaleEntry

FLOAT_CHECK_MODES = ("auto", "always")
"""auto: imported, stored or unknown-origin entries and mismatching records; always: every entry."""

_PASSED: dict[str, LoadCheck] = {}


@dataclass(frozen=True)
class LoadCheck:
    """What `check_against_region` found for an entry that passed.

    Arguments:
        output_order: order[j] = i when µGraph output i is region output j (re-derived).
        seed: the seed of the field trial and of the float check's inputs.
        mismatches: how the stored record disagreed with the fresh verification.
        order_disagreed: the stored output order was not the re-derived one (the first of
            `mismatches` says how).
        float_check: what the float check ran and its error, or why it did not run.
        field_s, float_s: seconds spent on the field trial and on the float check.
        instance: "" where the field trial ran at full size; else the reduced instance it ran
            on (a region too large for the machine, `search.recipe`).
    """

    output_order: tuple[int, ...]
    seed: int
    mismatches: tuple[str, ...]
    order_disagreed: bool
    float_check: str
    field_s: float
    float_s: float
    instance: str = ""

    def as_record(self) -> dict[str, Any]:
        """The `load_check` part of the verification record `Cache.lookup` returns."""
        return {
            "field_trials": 1,
            "seed": self.seed,
            "output_order": list(self.output_order),
            "mismatches": list(self.mismatches),
            "float_check": self.float_check,
            "field_s": round(self.field_s, 4),
            "float_s": round(self.float_s, 4),
        } | ({"instance": self.instance} if self.instance else {})


def check_against_region(
    mugraph: Any,
    program: Any,
    *,
    record: Mapping[str, Any],
    origin: str,
    backend: str,
    float_check: str = "auto",
    memo_key: str | None = None,
) -> tuple[LoadCheck, bool]:
    """Check a cached µGraph against its region; returns (the LoadCheck, whether it is new).

    `record` is the stored verification record (compared, never trusted), `origin` where the
    entry came from, `backend` what it is lowered for. A LoadCheck from earlier in this
    process is returned again when `memo_key` (the row's content) matches. Raises StaleEntry.
    """
    if float_check not in FLOAT_CHECK_MODES:
        raise ValueError(f"float_check must be one of {FLOAT_CHECK_MODES}, got {float_check!r}")
    memo = None
    if memo_key is not None:
        memo = hashlib.sha256(
            json.dumps([memo_key, program.canonical_hash, float_check]).encode()
        ).hexdigest()
        if memo in _PASSED:
            return _PASSED[memo], False
    seed = random.SystemRandom().randrange(2**31)
    t0 = time.perf_counter()
    verdict = _field_trial(mugraph, program, seed)
    order = tuple(int(i) for i in verdict.output_order)
    if not _outputs_fit(mugraph, program, order):
        raise StaleEntry("its µGraph's output shapes or dtypes do not match the region's")
    field_s = time.perf_counter() - t0
    stored_order = record.get("output_order")
    stored_order = tuple(range(len(order))) if stored_order is None else tuple(stored_order)
    mismatches = _mismatches(record, verdict, stored_order, order)
    t0 = time.perf_counter()
    if float_check == "always" or origin != "search" or mismatches:
        how = _float_check(mugraph, program, order, backend, seed)
    else:
        how = f"not run (origin: {origin})"
    float_s = time.perf_counter() - t0
    check = LoadCheck(
        order, seed, mismatches, stored_order != order, how, field_s, float_s, verdict.instance
    )
    if memo is not None:
        _PASSED[memo] = check
    return check, True


def _outputs_fit(mugraph: Any, program: Any, order: Sequence[int]) -> bool:
    """Does each region output get the µGraph output of its shape, in its dtype or in another
    float one (the kernel stores it in the region's: `regions.region_out_dtypes`)?"""
    from mirage_jax.lower.kernel_graph import other_float

    outs = mugraph.output_avals
    return len(order) == len(program.output_avals) and all(
        tuple(outs[i][0]) == tuple(shape)
        and (outs[i][1] == dtype or other_float(outs[i][1], dtype))
        for i, (shape, dtype) in zip(order, program.output_avals)
    )


def forget_checks() -> None:
    """Forget which entries passed in this process (each is checked again on its next use)."""
    _PASSED.clear()


def _field_trial(mugraph: Any, program: Any, seed: int) -> Any:
    """One fresh field trial; the verdict (raises StaleEntry if it is not equal)."""
    try:
        import fields
    except ImportError as e:
        raise StaleEntry(f"it cannot be re-verified: fields does not import ({e})") from e
    from fields import memory

    a, b, instance = mugraph, program, None
    if memory.trial_bytes(program, program) > memory.room():
        # too large for one trial here: the reduced instance its recipe gives, as the search did
        from mirage_jax.search.recipe import reduced_from_recipe

        r = reduced_from_recipe(mugraph, program)
        if r is not None:
            a, b, instance = r.mugraph, r.program, "reduced: " + r.describe()
    try:
        verdict = fields.verify(a, b, trials=1, seed=seed)
        if instance is not None:
            verdict = dataclasses.replace(verdict, instance=instance)
    except Exception as e:
        raise StaleEntry(f"re-verification failed to run ({type(e).__name__}: {e})") from e
    if not verdict.equal or verdict.output_order is None:
        raise StaleEntry(f"re-verification rejected it ({verdict.reason})")
    return verdict


def _mismatches(
    record: Mapping[str, Any], verdict: Any, stored_order: Sequence[int], order: Sequence[int]
) -> tuple[str, ...]:
    """Where the stored record disagrees with the fresh verification (the order first)."""
    found = []
    if tuple(stored_order) != tuple(order):
        found.append(
            f"its stored output order {list(stored_order)} disagrees with the order "
            f"{list(order)} re-derived by a fresh field verification"
        )
    fresh = json.loads(verdict.to_json())
    stored = record.get("verdict") or {}
    if not _from_family(stored):
        found.append(
            f"its record was not verified over fields drawn from the family "
            f"(p={stored.get('p')}, q={stored.get('q')}, fields={stored.get('fields')})"
        )
    elif stored.get("degrees") != fresh["degrees"]:
        found.append("its record's degree bounds are not the µGraph's and region's")
    return tuple(found)


def _from_family(verdict: Mapping[str, Any]) -> bool:
    """Were the trials of a stored verdict run over fields of `fields.verify`'s family?"""
    from fields.numbers import FAMILY_Q, is_prime

    trials = verdict.get("fields") or []
    if not trials or len(trials) != verdict.get("trials"):
        return False
    try:
        return all(
            FAMILY_Q[0] <= int(q) < FAMILY_Q[1] and int(p) == 2 * int(q) + 1 and is_prime(int(q))
            for p, q, _ in trials
        )
    except (TypeError, ValueError):
        return False


def _float_check(mugraph: Any, program: Any, order: Sequence[int], backend: str, seed: int) -> str:
    """Run the kernel against the region in float64; what ran and its error, or StaleEntry."""
    # Called at trace time: JAX's trace state is per thread, so a fresh thread runs the
    # kernel eagerly instead of staging it into the caller's trace.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirage_jax-cache-check") as pool:
        return pool.submit(_float_check_here, mugraph, program, order, backend, seed).result()


def _float_check_here(
    mugraph: Any, program: Any, order: Sequence[int], backend: str, seed: int
) -> str:
    from mirage_jax.float_check import FloatErrors, float_reference
    from mirage_jax.select import FLOAT_TOL, random_inputs

    run, how = _runner(mugraph, backend)
    xs = random_inputs(program, seed)
    errors = FloatErrors([np.asarray(r, np.float64) for r in float_reference(program, *xs)])
    try:
        outs = list(run(*xs))
    except Exception as e:
        raise StaleEntry(f"its float check failed to run ({how}; {type(e).__name__}: {e})") from e
    worst = 0.0
    errs = errors([outs[order[j]] for j in range(len(program.output_avals))])
    for j, (err, (_, dtype)) in enumerate(zip(errs, program.output_avals)):
        tol = FLOAT_TOL.get(str(dtype), 2e-2)
        if not err <= tol:  # NaN fails too
            raise StaleEntry(
                f"its float check failed: output {j} differs from the region run in float64 "
                f"by a relative error of {err:.3g} (tolerance {tol:g} for {dtype}; {how}; "
                f"random inputs, seed {seed})"
            )
        worst = max(worst, err)
    return f"{how}: max relative error {worst:.2e} against the region in float64 (seed {seed})"


def _runner(mugraph: Any, backend: str) -> tuple[Callable[..., Sequence[Any]], str]:
    """The µGraph as a function for `backend`, or its reference evaluation; and what it is."""
    import jax

    from mirage_jax._env import has_gpu
    from mirage_jax.lower import backends, lower
    from mirage_jax.mugraph import evaluate

    reference = jax.jit(functools.partial(evaluate, mugraph))
    try:
        b = backends.get(backend)
    except backends.UnknownBackend as e:
        return reference, f"the µGraph's reference evaluation (jnp), because {e}"
    if b.module is None:
        return reference, f"backend {backend!r}: the µGraph's reference evaluation (jnp)"
    ok, why = b.available(has_gpu())
    if not ok:
        return reference, f"the µGraph's reference evaluation (jnp), because {why}"
    try:
        kernel = lower(mugraph, backend=backend)
    except Exception as e:  # any failure to build the kernel condemns the entry, with its cause
        raise StaleEntry(
            f"its kernel does not lower for {backend} ({type(e).__name__}: {e})"
        ) from e
    return kernel, f"the {backend} kernel"
