"""Which kernels a signature runs, settled on the whole function (the first call, on a GPU).

After each region's selection, `FunctionChoice.settle` times the function with the kernels
that won their regions against `jax.jit` (`function_check.checked`), looks for a better
subset where they lose or some won narrowly (`function_check.best_subset`), and then tries the
regions' runner-ups (`runner_up.try_runner_ups`). Every set measured is cached under the
function's Program hash and the kernels' entries, so a later call recalls the same choice.
Used by `mirage_jax.api.MirageJit`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lax_ir
from mirage_jax.function_check import (
    FunctionCheck,
    best_subset,
    checked,
    marginal,
    region_wins,
    short_of_wins,
)
from mirage_jax.log import logger
from mirage_jax.runner_up import in_context, try_runner_ups


def left_out_reason(full: FunctionCheck, kept: FunctionCheck, left: Sequence[Any]) -> str:
    """Why the kernels `left` were left out: where values differed with all kernels (`full`),
    that; else the check of those `kept` and the function's time with all of them. With one
    left out that won its region alone, how much XLA's part grew around it: equinox's gate/up
    kernel (50.8 µs against XLA's 57.5 alone) made the whole function 25 µs slower, because
    XLA then computed the up projection a second time (fixed in `assemble`)."""
    if full.mismatch is not None:  # values differed with all kernels: the left-out one is why
        return f"left out by the whole-function check: {full.reason}"
    why = f"left out by the whole-function check: {kept.reason}"
    if full.kernels_us is None or kept.kernels_us is None:
        return why
    why += f"; with all kernels {full.kernels_us:.2f} µs"
    t = (left[0].timings or {}) if len(left) == 1 else {}
    mine, xla = t.get("mugraph_us"), t.get("xla_us")
    if mine and xla and xla > mine:
        grew = (full.kernels_us - kept.kernels_us) + (xla - mine)
        if grew > 0:
            why += (
                f": alone its region ran {mine:.2f} µs against XLA's {xla:.2f}, so XLA's part "
                f"of the function grew by {grew:.2f} µs around it (a value computed twice, or "
                "a copy: `experiments.kernel_timeline --keep-all` lists the kernels)"
            )
    return why


class FunctionChoice:
    """The whole-function checks of one trace of `owner` (a `MirageJit`)."""

    def __init__(self, owner: Any, program: Any, part: Any, backend: str, clock: Any):
        self.owner, self.program, self.part, self.backend = owner, program, part, backend
        self.clock = clock
        self.name = owner._name

    def settle(
        self, decisions: Sequence[Any], replacements: Mapping[int, Callable], asm: Any
    ) -> tuple[Sequence[Any], Callable | None, FunctionCheck | None]:
        """The decisions, the function to run (None: the function itself, as under
        `jax.jit`) and the check it rests on (None where none ran). `asm`: the assembly of
        all the kernels that won their regions (None where there are none)."""
        program, owner, name = self.program, self.owner, self.name
        run = None if asm is None else lax_ir.as_function(program, asm.fn)
        check = None
        if asm is not None:
            check = self.check(decisions, asm.fn)
            self.clock.lap("function_check")
        replacements = dict(replacements)
        if (asm is None or check is not None) and any(d.runner_up is not None for d in decisions):
            # on top of the kernels that won their regions, before any is left out: a region
            # XLA runs beside a kernel can cost the function more than either (Llama-7B-size
            # equinox, b=1: four kernels 212.5 µs against jax.jit's 188.0; with the fifth, a
            # runner-up, 175.9)
            tried = self._runner_ups(decisions, replacements, check)
            if tried is not None:
                decisions, run, check = tried
            self.clock.lap("runner_ups")
        # all kernels lost, or their values differ: the subset that wins (and matches), if
        # any; all won: without the marginal ones, if faster still (`best_subset`)
        suspects = marginal(decisions) if check is not None and run is not None else []
        short = check is not None and short_of_wins(check, region_wins(decisions))
        if check is not None and run is not None and (check.choice == "xla" or suspects or short):
            kernels = [d.index for d in decisions if d.status == "kernel"]
            logger.info("%s: all %d kernels: %s", name, len(kernels), check.reason)
            kept = self._kept_kernels(decisions, replacements, check, suspects)
            if kept is None:
                reasons = dict.fromkeys(kernels, check.reason)
                run = None
            else:
                subset, kept_check, better = kept
                left = [d for d in decisions if d.status == "kernel" and d.index not in subset]
                why = left_out_reason(check, kept_check, left)
                check = kept_check
                reasons = {k: why for k in kernels if k not in subset}
                if better is not None:
                    run = lax_ir.as_function(program, better.fn)
            decisions = owner._demote(self.part, decisions, reasons)
            self.clock.lap("function_check_subsets")
        return decisions, run, check

    def check(
        self, decisions: Sequence[Any], flat: Callable, xla_us: float | None = None
    ) -> FunctionCheck | None:
        """The whole-function check of this signature with the kernels of `decisions`
        (`function_check.checked`: memo, cache, else measured and stored; `xla_us`: jax.jit's
        time, already measured). None if it cannot run (reported; strict: raised)."""
        owner = self.owner
        keys = [d.cache_key for d in decisions if d.status == "kernel"]
        return checked(
            self.program, keys, flat, self.backend, cache=owner.cache, memo=owner._checks,
            seed=owner.opts.seed, strict=owner.opts.strict, xla_us=xla_us,
        )  # fmt: skip

    def _kept_kernels(
        self,
        decisions: Sequence[Any],
        replacements: Mapping[int, Callable],
        full: FunctionCheck,
        suspects: Sequence[int] = (),
    ) -> tuple[frozenset[int], FunctionCheck, Any] | None:
        """The kernels to keep after the whole-function check of all of them (`full`), with
        their check and assembly (None: all of them, already assembled)
        (`function_check.best_subset`; each subset's check cached like the full one)."""
        kernel = {d.index: d for d in decisions if d.status == "kernel"}
        assembled: dict[frozenset[int], Any] = {}

        def check(subset: frozenset[int]) -> FunctionCheck | None:
            asm = assembled[subset] = self.owner._assemble(
                self.program, self.part, {k: replacements[k] for k in subset}, self.backend
            )
            if asm.skipped or not asm.substituted:
                return None
            c = self.check([kernel[k] for k in subset], asm.fn, xla_us=full.xla_us)
            if c is not None:
                logger.debug("%s: kernels of regions %s: %s", self.name, sorted(subset), c.reason)
            return c

        first = [k for k, d in kernel.items() if in_context(d)]
        kept = best_subset(
            sorted(kernel), check, full, suspects=suspects, wins=region_wins(decisions), first=first
        )
        return None if kept is None else (*kept, assembled.get(kept[0]))

    def _runner_ups(
        self,
        decisions: Sequence[Any],
        replacements: dict[int, Callable],
        base: FunctionCheck | None,
    ) -> tuple[Sequence[Any], Callable, FunctionCheck | None] | None:
        """Runner-ups tried in the whole function (`runner_up.try_runner_ups`): the
        decisions, the function to run and its check where one was kept, else None; the
        runner-ups' kernels are added to `replacements`."""
        owner, part = self.owner, self.part
        impls, assembled = replacements, {}  # the runner-ups' kernels are added to it
        known = {"xla_us": None if base is None else base.xla_us}  # jax.jit timed once

        def check(subset: frozenset[int], as_kernels: Mapping[int, Any]) -> Any:
            for k, d in as_kernels.items():
                if k not in impls:
                    impls[k] = owner._kernel(part, part.regions[k], d, self.backend)
            failed = {k: impls[k] for k in subset if isinstance(impls[k], str)}
            if failed:
                for k, why in failed.items():
                    logger.info("%s: region %d's runner-up not tried: %s", self.name, k, why)
                return None
            asm = assembled[subset] = owner._assemble(
                self.program, part, {k: impls[k] for k in subset}, self.backend
            )
            if asm.skipped or not asm.substituted:
                why = "; ".join(f"region {k}: {w}" for k, w in asm.skipped.items()) or "none"
                logger.info("%s: runner-ups %s not tried: not substituted (%s)", self.name,
                            sorted(as_kernels), why)  # fmt: skip
                return None
            chosen = [as_kernels.get(d.index, d) for d in decisions if d.index in subset]
            c = self.check(chosen, asm.fn, xla_us=known["xla_us"])
            if c is not None:
                known["xla_us"] = known["xla_us"] or c.xla_us
                logger.debug("%s: kernels of regions %s: %s", self.name, sorted(subset), c.reason)
            return c

        tried = try_runner_ups(decisions, base, check)
        if not tried.changed:
            return None
        added = sum(d.status == "kernel" for d in tried.decisions) - sum(
            d.status == "kernel" for d in decisions
        )
        owner.stats.kernels += added
        owner.stats.xla_regions -= added
        run = lax_ir.as_function(self.program, assembled[tried.kept].fn)
        return tried.decisions, run, tried.check
