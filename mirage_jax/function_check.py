"""The whole-function check: the function with its kernels against `jax.jit` of the function.

Per-region selection compares a kernel with XLA's code for the same region; cutting the
program there can still cost XLA fusions across the region's boundary. So on the first call
of a signature (on a GPU), the assembled function and the function itself under `jax.jit` are
timed the same way as the results tables (`profile.time_trace`: the GPU's kernel time per
call, rotating random inputs); unless the kernels make it faster by more than `FUNCTION_TIE`,
the signature runs as plain `jax.jit`. The outcome, with both times, is cached under the
function's Program hash.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from lax_ir.dtypes import is_float

FUNCTION_CHECK = "function_check"
"""The cache-key option that marks a whole-function entry (its value: the kernels' keys)."""


FAILS = "fails where jax.jit's runs: "
"""How a `FunctionCheck.mismatch` begins where the function with the kernels raised (a compile
or run error) and jax.jit's own did not: the kernels are left out as for differing values."""


@dataclass(frozen=True)
class FunctionCheck:
    """The outcome: "kernels" (the assembled function is faster) or "xla", with both times."""

    choice: str
    kernels_us: float | None
    xla_us: float | None
    method: str
    source: str = "measured"  # or "cache"
    mismatch: str | None = None  # the assembled function's values differ from jax.jit's

    @property
    def reason(self) -> str:
        if self.mismatch is not None and self.mismatch.startswith(FAILS):
            return f"whole function: with the kernels it {self.mismatch}: runs as XLA"
        if self.mismatch is not None:
            return f"whole function: values differ from jax.jit ({self.mismatch}): runs as XLA"
        if self.kernels_us is None or self.xla_us is None:
            return f"whole function: {self.choice} ({self.method})"
        verdict = "faster" if self.choice == "kernels" else f"not faster by {FUNCTION_TIE:.0%}"
        return (
            f"whole function with kernels {self.kernels_us:.2f} µs against jax.jit "
            f"{self.xla_us:.2f} µs ({self.method}, {self.source}): {verdict}"
        )

    def timings(self) -> dict[str, Any]:
        return {
            "choice": self.choice,
            "kernels_us": self.kernels_us,
            "xla_us": self.xla_us,
            "method": self.method,
            "mismatch": self.mismatch,
        }

    @staticmethod
    def from_timings(t: dict[str, Any]) -> FunctionCheck:
        return FunctionCheck(
            t["choice"], t["kernels_us"], t["xla_us"], t["method"], "cache", t.get("mismatch")
        )


def kernels_key(cache_keys: Sequence[str]) -> str:
    """What the check depends on: the cache keys of the substituted regions' entries."""
    return hashlib.sha256(json.dumps(sorted(cache_keys)).encode()).hexdigest()


def measure(
    program: Any,
    assembled: Callable[[Sequence[Any]], list[Any]],
    seed: int = 0,
    calls: int = 30,
    xla_us: float | None = None,
) -> FunctionCheck:
    """Compare and time `assembled` (flat inputs, as `assemble` returns) and the captured
    function itself under `jax.jit` on the same random inputs; call it eagerly (not inside a
    trace). Values that differ (`mismatch`) make the choice "xla" whatever the times. A given
    `xla_us` (the function itself, timed earlier in this process) is not timed again."""
    from mirage_jax.profile import time_trace

    original, want = _original(program, seed)
    with_kernels = jax.jit(lambda *xs: assembled(xs))

    def inputs(s: int) -> list[Any]:  # the same sets for both, and for every check of program
        return _drawn(program, seed + s)

    xs = inputs(0)
    try:
        got = jax.block_until_ready(with_kernels(*xs))
    except Exception as e:  # jax.jit's own function ran (above): the kernels' fails
        why = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        return FunctionCheck("xla", None, xla_us, "not timed", "measured", f"{FAILS}{why}")
    mismatch = compare(got, want)
    if xla_us is None:
        xla_us = time_trace(original, inputs, calls=calls).median_us
    mine = time_trace(with_kernels, inputs, calls=calls).median_us
    choice = "kernels" if mine < xla_us * (1.0 - FUNCTION_TIE) and mismatch is None else "xla"
    return FunctionCheck(
        choice, mine, xla_us, "mirage_jax.profile.time_trace", "measured", mismatch
    )


@dataclass
class _Kept:
    """What the checks of one program (the full set of kernels and its subsets) share, per
    seed: the input draws (at 7B size each took seconds) and the outputs of `jax.jit` of the
    captured function, kept with that jit (a new `jax.jit` of the same jaxpr compiles again,
    and XLA autotunes a 7B block's GEMMs on each compile)."""

    program: Any
    draws: dict[int, list[Any]] = field(default_factory=dict)
    fn: Callable[..., Any] | None = None
    outputs: dict[int, Any] = field(default_factory=dict)


_KEPT: list[_Kept] = []  # one program's at most: another program's first check drops it


def _kept(program: Any) -> _Kept:
    if not _KEPT or _KEPT[0].program is not program:
        _KEPT[:] = [_Kept(program)]
    return _KEPT[0]


def _drawn(program: Any, seed: int) -> list[Any]:
    """`random_inputs(program, seed)`, kept for the checks of one program."""
    kept = _kept(program)
    if seed not in kept.draws:
        from mirage_jax.select import random_inputs

        kept.draws[seed] = random_inputs(program, seed)
    return kept.draws[seed]


def _original(program: Any, seed: int) -> tuple[Callable[..., Any], Any]:
    """`jax.jit` of the captured function and its outputs on the check's input set `seed`,
    kept for every check of one program."""
    kept = _kept(program)
    if kept.fn is None:
        kept.fn = jax.jit(jex_core.jaxpr_as_fun(program.meta["jaxpr"]))
    if seed not in kept.outputs:
        kept.outputs[seed] = kept.fn(*_drawn(program, seed))
    return kept.fn, kept.outputs[seed]


def forget_draws() -> None:
    """Drop the kept input draws, jitted function and outputs (the end of a trace's checks)."""
    _KEPT.clear()


def checked(
    program: Any,
    kernel_keys: Sequence[str],
    assembled: Callable[[Sequence[Any]], list[Any]],
    backend: str,
    *,
    cache: Any,
    memo: dict[str, Any],
    seed: int = 0,
    strict: bool = False,
    xla_us: float | None = None,
) -> FunctionCheck | None:
    """The whole-function check of a signature with the kernels of these cache entries: from
    `memo` (this function object's), the cache, else measured (eagerly: called at trace time)
    and stored in both. None if it cannot run (reported; strict: raised)."""
    from mirage_jax._env import device_kind, fallback, warn_once
    from mirage_jax.cache import Cache, lib_version, make_key
    from mirage_jax.regions import eagerly

    options = {FUNCTION_CHECK: kernels_key(kernel_keys)}
    key = make_key(program.canonical_hash, device_kind(), backend, lib_version(), options)
    if key in memo:
        return memo[key]
    check = None
    if cache is not None:
        try:
            hit = cache.lookup(program.canonical_hash, device_kind(), backend, options,
                               program=program)  # fmt: skip
            if hit is not None and (hit[0].timings or {}).get("choice"):
                check = FunctionCheck.from_timings(dict(hit[0].timings))
        except Exception as e:  # an unusable cache is never fatal (strict: raised)
            fallback(f"cache:{cache.path}", f"mirage_jax cache: {e}", e, strict)
    if check is None:
        try:
            check = eagerly(functools.partial(measure, xla_us=xla_us), program, assembled, seed)
        except Exception as e:  # a failed check keeps the kernels, with a warning
            fallback(
                f"function-check:{key}",
                f"mirage_jax: the whole-function check failed ({type(e).__name__}: {e}); "
                "the kernels are used unchecked",
                e,
                strict,
            )
            return None
        if cache is not None:
            entry = Cache.entry(program.canonical_hash, device_kind(), backend,
                                timings=check.timings(), options=options)  # fmt: skip
            try:
                cache.put(entry)
            except Exception as e:  # not stored: measured again next process
                warn_once(f"cache-write:{cache.path}", f"mirage_jax cache: {e}")
    memo[key] = check
    return check


FUNCTION_TIE = 0.01
"""The kernels must make the whole function faster than jax.jit by more than this fraction;
within it the function runs as itself (the same HLO as jax.jit), so a gain inside the run-to-run
spread is never taken for one (Llama-7B layer b=1 on the H100, 2026-11-25: kernels kept at
236.31 against 236.42 µs, then measured at 0.995× and 0.999× of jax.jit)."""

MARGINAL_US = 1.5
MARGINAL_FRACTION = 0.10
"""A kernel that beats XLA on its region alone by less than this (µs, or fraction of XLA's
time) is a suspect: its cut may cost XLA a fusion with its neighbours worth more than that
(on the H100, 2026-11-25: equinox b=1, a 1.06 against 1.12 µs kernel beside four others;
llama nnx b=8, a norm + QKV kernel of 8.27 against 9.34 µs that made the function 44.7 µs,
where the attention kernel alone had made it 42.7)."""

KEEP_ALL_TIE = 0.01
"""Where all kernels win, a subset replaces them only if faster by more than this fraction."""

ADD_BACK_S = 3.0
"""Where all kernels won, after the set without the suspects, further sets (suspects tried
back, other kernels left out) are checked while the next one, judged by the last check's
time, ends within this many seconds of the first subset check's start: the suspects together
can cost the function more than each alone (on the H100, 2026-11-26, Llama nnx b=8: four GEMM
kernels that each won their region made the function 44.70 µs, against 42.67 without all
four). A realistic block's check takes under a second, a 7B block's about three: there no
further set is checked, and the first call keeps to its time."""


def marginal(decisions: Sequence[Any]) -> list[int]:
    """The kernels (region indices) whose region-level win is marginal (`MARGINAL_US`,
    `MARGINAL_FRACTION`), from the times their selection measured; the largest win first."""
    out = []
    for d in decisions:
        t = d.timings or {}
        mine, xla = t.get("mugraph_us"), t.get("xla_us")
        if d.status != "kernel" or mine is None or xla is None:
            continue
        if xla - mine < max(MARGINAL_US, MARGINAL_FRACTION * xla):
            out.append((mine - xla, d.index))
    return [k for _, k in sorted(out)]


def region_wins(decisions: Sequence[Any]) -> dict[int, float]:
    """Per kernel (region index): how many µs it beat XLA by on its region alone (where timed)."""
    out = {}
    for d in decisions:
        t = d.timings or {}
        mine, xla = t.get("mugraph_us"), t.get("xla_us")
        if d.status == "kernel" and mine is not None and xla is not None:
            out[d.index] = xla - mine
    return out


SHORT_OF_WINS = 0.5
"""Where every kernel won its region and none narrowly, the whole function is still searched
for a kernel to leave out if it gained less than this fraction of what the regions together
gained (on the H100, 2026-11-26, Gemma b=1: five kernels won their regions by 29.3 µs in
all, and the function ran 49.6 µs against jax.jit's 56.5; without its norm + QKV kernel,
whose weights XLA copies before it, 40.5 µs in an earlier run)."""


def short_of_wins(full: FunctionCheck, wins: Mapping[int, float] | None) -> bool:
    """The function with all kernels (`full`) gained less than `SHORT_OF_WINS` of the sum of
    their region wins (`wins`) over jax.jit."""
    if not wins or full.xla_us is None or full.kernels_us is None:
        return False
    return full.xla_us - full.kernels_us < SHORT_OF_WINS * sum(wins.values())


def best_subset(
    kernels: Sequence[int],
    check: Callable[[frozenset[int]], FunctionCheck | None],
    full: FunctionCheck,
    max_tries: int = 6,
    suspects: Sequence[int] = (),
    clock: Callable[[], float] = time.perf_counter,
    wins: Mapping[int, float] | None = None,
    first: Collection[int] = (),
) -> tuple[frozenset[int], FunctionCheck] | None:
    """The set of kernels (region indices) to keep, given the check of all of them (`full`).

    Kernels that win their regions can lose the whole function (a cut costs XLA a fusion
    across it); small ones most often (`suspects`, from `marginal`, largest win first). Each
    set measured costs a compile and a timing of the whole function on the first call.
    - All of them won: the set without every suspect is measured, and replaces all only if
      faster by `KEEP_ALL_TIE`; then, while another check fits in `ADD_BACK_S` since this
      started (`clock`, judged by the last check's time), the suspects are added back one at
      a time, and the other kernels left out one at a time (smallest region win first,
      `wins`; those in `first`, the regions timed in context, before the rest: XLA's code
      for the layout steps at their edges differs most inside the function), each change
      kept if it makes the function faster by `KEEP_ALL_TIE`.
      With no suspect, where the function gained less than `SHORT_OF_WINS` of the regions'
      wins, the kernels are left out one at a time in that order (the first check always,
      later ones within `ADD_BACK_S`).
    - All lost: the set without every suspect first; if it beats jax.jit, the suspects are
      added back one at a time (at most `max_tries`, while another check fits in
      `ADD_BACK_S`), each kept if it makes the function faster by `KEEP_ALL_TIE`.
      Otherwise one round of leave-one-out over at most `max_tries` kernels, then the set
      without every kernel whose removal helped; the fastest measured set that beats jax.jit
      wins.
    - Values differ with all of them (`full.mismatch`: a kernel unfaithful on these inputs,
      such as one that does not overflow where the program does): one round of leave-one-out
      over at most `max_tries` kernels, then the set without every kernel whose removal made
      the function faster; the fastest set that matches and beats jax.jit runs.
    `check(subset)` measures (or recalls) one set; None: it could not run. Returns None where
    no set wins, where values differ with every set tried, or where a subset's differ while
    all of them together matched (nothing is trusted then), so all run as XLA.
    """
    started = clock()
    took: list[float] = []

    def timed(subset: frozenset[int]) -> FunctionCheck | None:
        t0 = clock()
        c = check(subset)
        took.append(clock() - t0)
        return c

    def affordable() -> bool:
        """Another check fits in `ADD_BACK_S` (a 7B block's take seconds each: there the
        first call keeps to its time)."""
        return bool(took) and clock() - started + took[-1] <= ADD_BACK_S

    everything = frozenset(kernels)
    suspects = [k for k in suspects if k in everything]
    core = everything - set(suspects)

    def leave_out_order(ks: Collection[int]) -> list[int]:
        """Kernels to leave out one at a time: those timed in context, then smallest win."""
        return sorted(ks, key=lambda k: (k not in first, (wins or {}).get(k, 0.0), k))

    if full.choice == "kernels":  # all won: one set without the suspects, for a clear gain
        if full.kernels_us is None:
            return everything, full
        if not suspects and short_of_wins(full, wins) and len(everything) > 1:
            # no kernel won narrowly, yet the function gained far less than the regions
            # did: one of them costs it across its cut; leave them out one at a time
            first_then_affordable = lambda: not took or affordable()  # noqa: E731
            return _toggled(
                everything, full, leave_out_order(everything), timed, first_then_affordable, False
            )
        if not suspects or not core:
            return everything, full
        c = timed(core)
        best = _fastest({core: c}) if c is not None else None
        if best is None or best[1].kernels_us >= full.kernels_us * (1.0 - KEEP_ALL_TIE):
            best = (everything, full)
        else:
            best = _toggled(core, best[1], suspects[:max_tries], timed, affordable) or best
        others = leave_out_order(best[0] - set(suspects))
        return _toggled(*best, others, timed, affordable, differ_stops=False)
    if len(everything) < 2 or full.kernels_us is None:
        return None
    if full.mismatch is not None:  # which kernel? the sets without one, those that match
        measured = _leave_each_out(everything, sorted(everything)[:max_tries], check)
        _without_helped(everything, measured, check, full.kernels_us)
        return _fastest(measured)
    if core and core != everything:
        c = timed(core)
        if c is not None and c.mismatch is not None:
            return None
        if c is not None and c.choice == "kernels" and c.kernels_us is not None:
            return _toggled(core, c, suspects[:max_tries], timed, affordable)
    measured = _leave_each_out(everything, sorted(everything)[:max_tries], check)
    if any(c.mismatch is not None for c in measured.values()):
        return None
    _without_helped(everything, measured, check, full.kernels_us)
    return _fastest(measured)


def _toggled(
    kept: frozenset[int],
    best: FunctionCheck,
    candidates: Sequence[int],
    check: Callable[[frozenset[int]], FunctionCheck | None],
    affordable: Callable[[], bool] = lambda: True,
    differ_stops: bool = True,
) -> tuple[frozenset[int], FunctionCheck] | None:
    """`kept` (its check `best`) with each candidate in turn added where it is out and left
    out where it is in, each change kept if it makes the function faster by `KEEP_ALL_TIE`,
    while `affordable()`. A set whose values differ: None where `differ_stops`, else passed
    over. Leaving a kernel out matters too: one that wins its region clearly can still cost
    the function more across its cut (on the H100, 2026-11-26, Llama nnx b=8's norm + QKV
    kernel: 7.6 against 9.7 µs alone, and the function 40.42 µs with it, 38.85 without it in
    an earlier run)."""
    for k in candidates:
        trial = kept ^ {k}
        if not trial:
            continue
        if not affordable():
            break
        c = check(trial)
        if c is None or c.kernels_us is None:
            continue
        if c.mismatch is not None:
            if differ_stops:
                return None
            continue
        if c.kernels_us < best.kernels_us * (1.0 - KEEP_ALL_TIE):
            kept, best = trial, c
    return kept, best


def _leave_each_out(
    everything: frozenset[int],
    tries: Sequence[int],
    check: Callable[[frozenset[int]], FunctionCheck | None],
) -> dict[frozenset[int], FunctionCheck]:
    """The checks of the set without each of `tries` (those that could run)."""
    measured = {}
    for k in tries:
        c = check(everything - {k})
        if c is not None:
            measured[everything - {k}] = c
    return measured


def _without_helped(
    everything: frozenset[int],
    measured: dict[frozenset[int], FunctionCheck],
    check: Callable[[frozenset[int]], FunctionCheck | None],
    full_us: float,
) -> None:
    """Adds to `measured` the set without every kernel whose leaving out helped (two or more):
    made the function faster, whether or not that set's values matched (a set is timed either
    way, and the kernel at fault for different values is then left out too)."""
    helped = {k for k in everything if (c := measured.get(everything - {k})) is not None
              and c.kernels_us is not None and c.kernels_us < full_us}  # fmt: skip
    rest = everything - helped
    if len(helped) > 1 and rest and rest not in measured:
        c = check(rest)
        if c is not None and (c.mismatch is None and c.kernels_us is not None):
            measured[rest] = c


def _fastest(
    measured: Mapping[frozenset[int], FunctionCheck],
) -> tuple[frozenset[int], FunctionCheck] | None:
    """The fastest measured set that beats jax.jit with the same values (ties: by region indices)."""
    winners = [
        (c.kernels_us, sorted(s), s, c)
        for s, c in measured.items()
        if c.choice == "kernels" and c.mismatch is None and c.kernels_us is not None
    ]
    if not winners:
        return None
    _, _, subset, c = min(winners)
    return subset, c


def compare(got: Any, want: Any) -> str | None:
    """None if `got` matches `want` leaf by leaf (same non-finite places, finite values within
    a tolerance scaled by the output's magnitude: 2e-2 for 16-bit floats, 2e-3 otherwise, wide
    enough for a kernel's summation order); else what differs."""
    got_l, want_l = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    if len(got_l) != len(want_l):
        return f"{len(got_l)} outputs, jax.jit has {len(want_l)}"
    for k, (g, w) in enumerate(zip(got_l, want_l)):
        g, w = (x if hasattr(x, "dtype") else np.asarray(x) for x in (g, w))
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape}, jax.jit's {w.shape}"
        dtype = np.dtype(w.dtype)
        floating = is_float(dtype)  # bfloat16 too
        if floating and dtype.itemsize <= 4:  # where the outputs are (a 7B block's: 4 s on
            same, scale, err = map(float, _float_diff(g, w))  # the host)
        elif not floating and dtype.kind != "c":
            g, w = np.asarray(g), np.asarray(w)
            if not np.array_equal(g, w):
                return f"output {k}: {int(np.sum(g != w))} of {w.size} values differ"
            continue
        else:
            g64, w64 = np.asarray(g, np.complex128), np.asarray(w, np.complex128)
            fin = np.isfinite(w64)
            same = float(np.array_equal(fin, np.isfinite(g64)))
            scale = float(np.max(np.abs(w64[fin]), initial=0.0))
            err = float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0))
        if not same:
            return f"output {k}: non-finite values in other places"
        scale += 1e-6
        tol = 2e-2 if dtype.itemsize <= 2 else 2e-3
        if err > tol * scale:
            return f"output {k}: max error {err:.3g} against a tolerance of {tol * scale:.3g}"
    return None


@jax.jit
def _float_diff(got: Any, want: Any) -> tuple[Any, Any, Any]:
    """(whether both are finite in the same places, max |want| and max |got - want| where
    want is finite), in float32 on the device the outputs are on."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    fin = jax.numpy.isfinite(w)
    same = jax.numpy.array_equal(fin, jax.numpy.isfinite(g))
    scale = jax.numpy.max(jax.numpy.where(fin, jax.numpy.abs(w), 0.0), initial=0.0)
    err = jax.numpy.max(jax.numpy.where(fin, jax.numpy.abs(g - w), 0.0), initial=0.0)
    return same, scale, err
