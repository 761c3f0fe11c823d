"""@mirage_jax.jit against the lowered best µGraph alone and jax.jit: results and device time.

For each benchmark of `experiments/benchmarks.py` this resolves the program's regions the way
the decorator does (the cache; `--search auto` searches on a miss; `--from-checkpoints DIR`
first seeds the cache for the `*_mirage` forms with the original system's µGraphs, each
verified over the finite field, lowered and timed, the fastest kept if it beats XLA). Then it
times, with `mirage_jax.profile.time_device` (the chained method of `mirage_jax/profile.py`):

- `jax.jit(fn)`;
- `mirage_jax.jit(fn, search="cached")`: the assembled function users run;
- the lowered best µGraph alone (`mirage_jax.lower.lower`), on the region's inputs;

checks that the decorator's outputs match `jax.jit`'s (tolerance by dtype), and reports
jit / µGraph, which must be at most 1.05 (the decorator adds no device time of its own).
Writes `experiments/results/jit_bench.json` (or `--out`). Needs a GPU for device times; on a
CPU it runs with `--backend pallas-interpret` and reports CPU wall times, labelled as such.

    python -m experiments.jit_bench rmsnorm_mirage gated_mlp_mirage --from-checkpoints \\
        /tmp/mirage    # a clone of the original's evaluation branch: experiments/peer.py
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import lax_ir
import mirage_jax
from experiments import benchmarks
from experiments.errors import max_rel_error
from mirage_jax import api
from mirage_jax.cache import Cache

TOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 2e-4}
LIMIT = 1.05
FREE_OPS = ("parameter", "tuple", "get-tuple-element", "bitcast", "constant")
"""HLO instructions that launch no kernel."""
RESULTS = Path(__file__).resolve().parent / "results" / "jit_bench.json"


rel_error = max_rel_error
"""(`experiments.errors.max_rel_error`)."""


def region_of(bench: benchmarks.Benchmark) -> Any:
    part = lax_ir.partition(lax_ir.capture(bench.fn, *bench.inputs))
    regions = [r for r in part.regions if not r.is_trivial]
    return part, regions


def seed_from_checkpoints(
    bench: benchmarks.Benchmark,
    directory: Path,
    cache: Cache,
    backend: str,
    max_candidates: int,
    chain: int,
    repeats: int,
) -> str:
    """Verify, lower and time the original's µGraphs for `bench`; store the fastest (or XLA)."""
    import fields
    from mirage_jax.mugraph import load_mirage_checkpoint
    from mirage_jax.profile import time_device

    if not bench.checkpoint:
        return "no checkpoint for this form"
    kind = api.device_kind()
    key_backend = api.effective_backend(backend)[0] or backend
    sub = "a100" if "A100" in kind else "h100"
    path = directory / sub / bench.checkpoint
    if not path.exists():
        return f"{path} not found"
    part, regions = region_of(bench)
    if len(regions) != 1:
        return f"{len(regions)} regions; checkpoints cover whole programs"
    program = regions[0].program
    inputs = lambda seed: bench.make_inputs(seed)  # noqa: E731
    xla = time_device(jax.jit(bench.fn), inputs, chain=chain, repeats=repeats)
    best = None
    for g in load_mirage_checkpoint(path)[:max_candidates]:
        verdict = fields.verify(g, program, trials=3)
        if not verdict.equal:
            continue
        try:
            fn = api.lower_mugraph(g, key_backend)
            t = time_device(fn, inputs, chain=chain, repeats=repeats)
        except Exception as e:  # a µGraph the lowering cannot build is skipped, with a note
            print(f"  {g!r}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if best is None or t.median_us < best[2].median_us:
            best = (g, verdict, t)
    if best is None or best[2].median_us >= xla.median_us:
        cache.store(program, None, device_kind=kind, backend=key_backend,
                    timings={"xla_us": xla.median_us, "device": xla.device})  # fmt: skip
        return f"no checkpoint µGraph beat XLA ({xla.median_us:.2f} µs)"
    g, verdict, t = best
    timings = {"mugraph_us": t.median_us, "xla_us": xla.median_us, "device": t.device,
               "method": t.method}  # fmt: skip
    cache.store(program, g, device_kind=kind, backend=key_backend, verdict=verdict,
                timings=timings)  # fmt: skip
    return f"stored {g!r}: {t.median_us:.2f} µs against XLA {xla.median_us:.2f} µs"


def bench_one(
    bench: benchmarks.Benchmark, args: argparse.Namespace, cache: Cache
) -> dict[str, Any]:
    from mirage_jax.profile import time_device

    row: dict[str, Any] = {"benchmark": bench.key, "dtype": str(bench.dtype)}
    if args.from_checkpoints:
        from experiments import peer

        found = peer.find(args.from_checkpoints)
        if found is None:
            raise SystemExit(f"jit_bench: nothing at {args.from_checkpoints}; {peer.HOW_TO_GET}")
        row["seeded"] = seed_from_checkpoints(
            bench, found, cache, args.backend, args.max_candidates,
            args.chain, args.repeats,
        )  # fmt: skip
    if args.search == "auto":
        mirage_jax.superoptimize(bench.fn, *bench.inputs, backend=args.backend,
                                 budget_s=args.budget_s, cache=cache)  # fmt: skip
    f = mirage_jax.jit(bench.fn, backend=args.backend, search="cached", cache=cache)
    xs = bench.make_inputs(seed=0)
    got, want = f(*xs), jax.jit(bench.fn)(*xs)
    err = rel_error(got, want)
    row["error_vs_jax_jit"] = err
    row["matches_jax_jit"] = err <= TOL.get(str(bench.dtype), 2e-2)
    record = f.last
    decisions = record.decisions if record else ()
    row["regions"] = [{"index": d.index, "status": d.status, "reason": d.reason} for d in decisions]
    inputs = lambda seed: bench.make_inputs(seed)  # noqa: E731
    fns: dict[str, tuple[Any, Any]] = {
        "jax_jit": (jax.jit(bench.fn), inputs),
        "mirage_jit": (f, inputs),
    }
    kernels = [d for d in decisions if d.status == "kernel"]
    if len(kernels) == 1 and len(decisions) == 1 and record is not None:
        region = record.partition.regions[kernels[0].index]
        pos = {nid: i for i, nid in enumerate(record.program.inputs)}
        if all(nid in pos for nid in region.inputs):
            order = [pos[nid] for nid in region.inputs]
            backend = api.effective_backend(args.backend)[0] or "pallas"
            alone = api.lower_mugraph(kernels[0].mugraph, backend)
            fns["mugraph_alone"] = (alone, lambda s: [inputs(s)[i] for i in order])
            row["launches_jit"] = launches(f.lower(*xs).compile().as_text())
            row["launches_mugraph"] = launches(
                jax.jit(alone).lower(*[xs[i] for i in order]).compile().as_text()
            )
            row["same_launches"] = row["launches_jit"] == row["launches_mugraph"]
    # Interleaved rounds: device time drifts (clocks, neighbours) by more than 5% between
    # back-to-back measurements of one program, so every program is timed in every round.
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, (fn, ins) in fns.items():
            t = time_device(fn, ins, chain=args.chain, repeats=args.repeats)
            samples[k].append(t.median_us)
            row[k] = t.as_dict() | {"rounds_us": samples[k]}
    for k in fns:
        row[k]["median_us"] = float(np.median(samples[k]))
    if "mugraph_alone" in fns:
        row["jit_over_mugraph"] = row["mirage_jit"]["median_us"] / row["mugraph_alone"]["median_us"]
        row["within_limit"] = row["jit_over_mugraph"] <= LIMIT
    row["jit_over_xla"] = row["mirage_jit"]["median_us"] / row["jax_jit"]["median_us"]
    row["device_time"] = row["mirage_jit"]["device_time"]
    return row


def launches(hlo_text: str) -> list[str]:
    """The device work of a compiled HLO module: one entry per kernel the entry computation
    runs (custom calls by target and kernel name, fusions by kind), names of values dropped."""
    entry = hlo_text[hlo_text.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}")]
    out = []
    for line in entry.splitlines()[1:]:
        m = re.search(r"=.*?\s([a-z][a-z0-9-]*)\(", line)
        if m is None or m.group(1) in FREE_OPS:
            continue
        op = m.group(1)
        if op == "custom-call":
            target = line.split('custom_call_target="')[1].split('"')[0]
            name = line.split('name = "')[1].split('"')[0] if 'name = "' in line else ""
            op = f"custom-call {target} {name}".strip()
        elif op == "fusion":
            op = "fusion " + line.split("kind=")[1].split(",")[0]
        out.append(op)
    return sorted(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="benchmark names (default: the paper suite)")
    parser.add_argument("--batch", "-b", type=int, nargs="+", default=[1], help="batch sizes")
    parser.add_argument("--small", action="store_true", help="reduced shapes (CPU smoke runs)")
    parser.add_argument("--backend", default="auto", choices=mirage_jax.BACKENDS)
    parser.add_argument("--search", default="cached", choices=("cached", "auto"))
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--cache", help="cache database (default: mirage_jax's default)")
    parser.add_argument("--from-checkpoints", metavar="DIR",
                        help="seed the cache from the original's µGraphs (mirage forms)")  # fmt: skip
    parser.add_argument("--max-candidates", type=int, default=8)
    parser.add_argument("--chain", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--out", default=str(RESULTS), help="results JSON")
    args = parser.parse_args(argv)
    names = args.names or list(benchmarks.PAPER_NAMES)
    cache = Cache(args.cache)
    warnings.simplefilter("default", mirage_jax.MirageWarning)
    rows = []
    for name in names:
        for b in args.batch:
            bench = benchmarks.get(name, b)
            bench = bench.small() if args.small else bench
            row = bench_one(bench, args, cache)
            rows.append(row)
            ratio = row.get("jit_over_mugraph")
            print(
                f"{row['benchmark']:24} jax.jit {row['jax_jit']['median_us']:9.2f} µs  "
                f"mirage_jax.jit {row['mirage_jit']['median_us']:9.2f} µs  "
                + (f"µGraph alone {row['mugraph_alone']['median_us']:9.2f} µs  "
                   f"ratio {ratio:.3f} {'ok' if row['within_limit'] else 'OVER'}"
                   if ratio is not None else "(no kernel chosen)")
                + f"  error {row['error_vs_jax_jit']:.1e}"
                + ("" if "same_launches" not in row
                   else "  same kernels" if row["same_launches"] else "  DIFFERENT kernels")
                + ("" if row["device_time"] else "  [CPU wall, not device time]"),
                flush=True,
            )  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"limit": LIMIT, "rows": rows}, indent=1, default=str))
    print(f"wrote {out}")
    bad = [r for r in rows if not r["matches_jax_jit"] or r.get("within_limit") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
