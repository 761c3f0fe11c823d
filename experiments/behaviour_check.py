"""A fingerprint of what the search does on every benchmark, to prove a refactor changed nothing.

For each program of `experiments/benchmarks.py` (every name, b = 1 and 8, full size) this
captures the region, runs `mirage_jax.search.search` with the default budget, and records what
must not change under a behaviour-preserving change: the stop reason, the counts (generated,
pruned by reason, verified, accepted, closed, nodes; not the seconds), the accepted structures
and the canonical hash of every returned µGraph in order (the first is the chosen one).

    python -m experiments.behaviour_check --out before.json          # on the old code
    python -m experiments.behaviour_check --out after.json           # on the new code
    python -m experiments.behaviour_check --compare before.json after.json --md table.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import time
from pathlib import Path
from typing import Any

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

_TIMING_KEYS = ("seconds", "budget", "saturation_s", "lookups", "memo")
# "lookups" and "memo" are a per-process counter and cache size of e-graph lookups, sampled
# when a task starts, so they depend on which worker ran which task first: three runs on one
# commit gave lookups 357, 429, 710 (ntrans_mirage_b8) and memo 94, 94, 89 (rmsnorm_b8).


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    """The statistics without anything that measures time."""
    out = {}
    for k, v in stats.items():
        if k in _TIMING_KEYS:
            continue
        if isinstance(v, dict):
            v = {kk: vv for kk, vv in v.items() if kk not in _TIMING_KEYS}
        out[k] = v
    return out


def fingerprint(name: str, batch: int, workers: int) -> dict[str, Any]:
    import lax_ir
    from experiments import benchmarks
    from mirage_jax.search import search

    bm = benchmarks.get(name, batch)
    part = lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs))
    program = part.regions[0].program
    t0 = time.perf_counter()
    r = search(program, seed=0, workers=workers)
    return {
        "key": bm.key,
        "regions": len(part.regions),
        "stop_reason": r.stop_reason,
        "counts": _counts(dict(r.stats)),
        "structures": list(r.structures),
        "mugraphs": [g.canonical_hash for g in r.mugraphs],
        "chosen": r.best.canonical_hash if r.best is not None else None,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def run(args: argparse.Namespace) -> None:
    from experiments import benchmarks

    rows = []
    for batch in args.batches:
        for name in args.names or benchmarks.names():
            row = fingerprint(name, batch, args.workers)
            rows.append(row)
            print(f"{row['key']:>22} {row['seconds']:7.1f} s  {row['stop_reason']:<11} "
                  f"{len(row['mugraphs'])} µGraphs  chosen {row['chosen'] and row['chosen'][:12]}",
                  flush=True)  # fmt: skip
    doc = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1, ensure_ascii=False))


def compare(before: Path, after: Path, md: Path | None) -> bool:
    a = {r["key"]: r for r in json.loads(before.read_text())["rows"]}
    b = {r["key"]: r for r in json.loads(after.read_text())["rows"]}
    lines = [
        f"# Search behaviour before and after ({before.name} vs {after.name})",
        "",
        "Every benchmark of `experiments/benchmarks.py` at full size, default budget, seed 0, "
        "2 workers, on the 2-core CPU machine. 'same' means equal stop reason, counts "
        "(generated, pruned by reason, verified, accepted, ...; not the seconds, nor the "
        "e-graph lookup counter and memo size, which depend on worker scheduling), "
        "structures, and the "
        "canonical hash of every returned µGraph in order.",
        "",
        "| benchmark | stop | µGraphs | chosen µGraph | counts | structures | order | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ok = True
    for key in a:
        x, y = a[key], b.get(key)
        if y is None:
            lines.append(f"| {key} | missing after | | | | | | DIFFERENT |")
            ok = False
            continue
        same = {
            "counts": _counts(x["counts"]) == _counts(y["counts"]),
            "structures": x["structures"] == y["structures"],
            "order": x["mugraphs"] == y["mugraphs"],
            "chosen": x["chosen"] == y["chosen"],
            "stop": x["stop_reason"] == y["stop_reason"],
        }
        verdict = all(same.values())
        ok &= verdict
        chosen = (x["chosen"] or "-")[:12]
        lines.append(
            f"| {key} | {y['stop_reason']} | {len(y['mugraphs'])} | {chosen} "
            f"{'=' if same['chosen'] else '≠ ' + (y['chosen'] or '-')[:12]} | "
            f"{'same' if same['counts'] else 'differ'} | "
            f"{'same' if same['structures'] else 'differ'} | "
            f"{'same' if same['order'] else 'differ'} | {'same' if verdict else 'DIFFERENT'} |"
        )
        if not same["counts"]:
            cx, cy = _counts(x["counts"]), _counts(y["counts"])
            for k in sorted(set(cx) | set(cy)):
                if cx.get(k) != cy.get(k):
                    print(f"{key}: {k}: {cx.get(k)} -> {cy.get(k)}")
    text = "\n".join(lines) + "\n"
    if md is not None:
        md.write_text(text)
    print(text)
    return ok


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--names", nargs="*", default=None, help="default: every benchmark name")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="behaviour.json")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    p.add_argument("--md", type=Path, default=None, help="compare: write the table here")
    args = p.parse_args(argv)
    if args.compare:
        raise SystemExit(0 if compare(*args.compare, args.md) else 1)
    run(args)


if __name__ == "__main__":
    main()
