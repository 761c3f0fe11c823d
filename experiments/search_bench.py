"""The µGraph search on the paper's benchmarks at full size: times, statistics, structures.

Two phases:

- ``--phase search`` (this CPU machine; needs egglog and galois): for every benchmark of the
  suite (the six workloads, `gqa_scaled` and `gqa_stable`, b = 1 and 8) capture the program,
  search its Lax region with the default budget, check the structures the original reports,
  and write ``experiments/results/search_cpu.json`` and ``.md``: wall time, stop reason, stats
  (generated, pruned by reason, verified, accepted, seconds per phase), the structures, and the
  best µGraphs (JSON) so the GPU phase needs no search.
- ``--phase select`` (the GPU machine; no egglog or galois needed): reads that file, lowers
  the best µGraphs of each benchmark with our backend, times them and XLA with
  `mirage_jax.profile.time_trace` (`mirage_jax.select`'s clock), and writes
  ``search_gpu.json`` and ``.md``.

    python -m experiments.search_bench                       # CPU: search everything
    python -m experiments.search_bench --names rmsnorm --batches 1
    python -m experiments.search_bench --phase select --out $OUT   # on the GPU
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

RESULTS = ROOT / "experiments" / "results"
NAMES = ("rmsnorm", "gated_mlp", "lora", "ntrans", "gqa", "gqa_scaled", "qknorm", "gqa_stable")
KEEP = 6  # µGraphs stored per benchmark for the GPU phase


# ---------------------------------------------------------------------------- structure checks
def _kernels(g):
    return [op for op in g.ops if op.op != "input"]


def _names(op) -> list[str]:
    return [b.op for b in op.block_graph.ops] if op.block_graph is not None else [op.op]


def _rmsnorm(g) -> bool:
    ks = _kernels(g)
    if len(ks) != 1 or ks[0].block_graph is None or ks[0].block_graph.forloop_range < 2:
        return False
    n = _names(ks[0])
    return "accum_rms_last" in n and "matmul" in n and "accum_sum" in n and "div" in n


def _gated_mlp(g) -> bool:
    ks = _kernels(g)
    return len(ks) == 1 and _names(ks[0]).count("matmul") == 2 and "silu" in _names(ks[0])


def _lora(g) -> bool:
    ks = _kernels(g)
    return len(ks) == 1 and "concat_matmul" in _names(ks[0])


def _ntrans(g) -> bool:
    ks = _kernels(g)
    return len(ks) == 1 and ks[0].block_graph is not None


def _gqa(g) -> bool:
    ks = _kernels(g)
    return (
        len(ks) == 2
        and all(k.block_graph is not None for k in ks)
        and len(ks[0].block_graph.outputs) == 2
        and "accum_sum_todimx" in _names(ks[1])
    )


def _online_softmax(g) -> bool:
    ks = _kernels(g)
    return (
        len(ks) == 1
        and ks[0].block_graph is not None
        and {"accum_max", "accum_rescale_sum", "accum_rescale_sum_last"} <= set(_names(ks[0]))
    )


def _online_or_split(g) -> bool:
    ks = _kernels(g)
    if len(ks) == 2 and all(k.block_graph is not None for k in ks):
        return {"accum_max", "accum_rescale_sum"} <= set(_names(ks[1]))
    return _online_softmax(g)


def _pieces(g) -> bool:
    return bool(g.meta.get("cuts")) or len(_kernels(g)) >= 2


EXPECTED = {
    "rmsnorm": ("one kernel: rms and matmul accumulated in one loop, divided after", _rmsnorm),
    "gated_mlp": ("one kernel: both matmuls and the silu-gated product", _gated_mlp),
    "lora": ("one kernel: concatenation then matmul", _lora),
    "ntrans": ("one kernel", _ntrans),
    "gqa": ("a split-over-KV kernel plus a combining kernel", _gqa),
    "gqa_scaled": ("a split-over-KV kernel plus a combining kernel", _gqa),
    "qknorm": ("norm kernel(s) plus attention (cut at a matmul prologue)", _pieces),
    "gqa_stable": (
        "online softmax: running max and rescaled sums (one loop, or split over KV and "
        "rescaled when combined)",
        _online_or_split,
    ),
}


def machine() -> dict[str, Any]:
    import jax

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
    }


# ---------------------------------------------------------------------------- search phase
def search_one(name: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    import lax_ir
    from experiments import benchmarks
    from mirage_jax.mugraph.serialize import to_dict
    from mirage_jax.search import Budget, search

    bm = benchmarks.get(name, batch)
    if args.small:
        bm = bm.small()
    program = lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs)).regions[0].program
    budget = Budget(time_s=args.time_s) if args.time_s else Budget()
    t0 = time.perf_counter()
    r = search(program, budget=budget, seed=args.seed, workers=args.workers, progress=args.progress)
    seconds = time.perf_counter() - t0
    what, check = EXPECTED[name]
    hit = next((g for g in r.mugraphs if check(g)), None)
    stats = dict(r.stats)
    stats.pop("budget", None)
    return {
        "name": name,
        "batch": batch,
        "key": bm.key,
        "shapes": [list(s.shape) for s in bm.inputs],
        "seconds": round(seconds, 2),
        "stop_reason": r.stop_reason,
        "message": r.message,
        "expected": what,
        "expected_found": hit is not None,
        "expected_rank": None if hit is None else list(r.mugraphs).index(hit),
        "best": None
        if r.best is None
        else {
            "structure": r.best.meta.get("structure"),
            "cost_us": r.best.meta.get("cost", {}).get("us"),
            "kernels": len(_kernels(r.best)),
        },
        "structures": list(r.structures),
        "stats": stats,
        "mugraphs": [to_dict(g) for g in r.mugraphs[:KEEP]]
        + ([to_dict(hit)] if hit is not None and list(r.mugraphs).index(hit) >= KEEP else []),
        "program": program.canonical_hash,
    }


def phase_search(args: argparse.Namespace) -> None:
    from mirage_jax.search import Budget

    rows = []
    for batch in args.batches:
        for name in args.names:
            row = search_one(name, batch, args)
            rows.append(row)
            print(
                f"{row['key']:>16}  {row['seconds']:7.1f} s  {row['stop_reason']:<13} "
                f"expected: {'yes' if row['expected_found'] else 'NO '}  "
                f"best: {row['best']['structure'] if row['best'] else '-'}",
                flush=True,
            )
    doc = {
        "date": _dt.date.today().isoformat(),
        "machine": machine(),
        "budget": vars(Budget(time_s=args.time_s)) if args.time_s else vars(Budget()),
        "workers": args.workers,
        "seed": args.seed,
        "small": args.small,
        "results": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "search_cpu" + ("_small" if args.small else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str, ensure_ascii=False))
    (out / f"{stem}.md").write_text(markdown(doc))
    print(f"wrote {out / stem}.json and .md")


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# µGraph search on the CPU ({doc['date']})",
        "",
        f"Machine: {m['processor']}, {m['cpus']} CPUs, Python {m['python']}, jax {m['jax']}. "
        f"Workers: {doc['workers']}. Seed: {doc['seed']}. Budget: time {doc['budget']['time_s']} s, "
        f"{doc['budget']['max_block_ops']} block ops, {doc['budget']['max_kernels']} kernels."
        + (" Reduced shapes." if doc.get("small") else " Full shapes."),
        "",
        "| benchmark | time (s) | stop | expected structure | found (rank) | best (estimate µs) "
        "| generated | pruned | verified | accepted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        s = r["stats"]
        best = r["best"]
        lines.append(
            f"| {r['key']} | {r['seconds']} | {r['stop_reason']} | {r['expected']} | "
            f"{'yes (' + str(r['expected_rank']) + ')' if r['expected_found'] else 'no'} | "
            f"{(best['structure'] + ' (' + str(best['cost_us']) + ')') if best else '-'} | "
            f"{s.get('generated')} | {sum((s.get('pruned') or {}).values())} | "
            f"{s.get('verified')} | {s.get('accepted')} |"
        )
    lines += ["", "Seconds per phase and pruning reasons:", ""]
    for r in doc["results"]:
        s = r["stats"]
        lines.append(
            f"- {r['key']}: {json.dumps(s.get('seconds'))}; pruned {json.dumps(s.get('pruned'))}"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- select phase
def phase_select(args: argparse.Namespace) -> None:
    import lax_ir
    from experiments import benchmarks
    from mirage_jax.mugraph.serialize import from_dict
    from mirage_jax.search import SearchResult
    from mirage_jax.select import select

    doc = json.loads(Path(args.input).read_text())
    rows = []
    for row in doc["results"]:
        if row["name"] not in args.names or row["batch"] not in args.batches:
            continue
        bm = benchmarks.get(row["name"], row["batch"])
        if doc.get("small"):
            bm = bm.small()
        program = lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs)).regions[0].program
        graphs = tuple(from_dict(d) for d in row["mugraphs"])
        result = SearchResult(graphs, row["stop_reason"], {}, tuple(row["structures"]))

        def inputs(seed: int, bm=bm):
            return bm.make_inputs(seed)

        sel = select(result, program, backend=args.backend, top=args.top, inputs=inputs)
        rec = json.loads(sel.to_json())
        rec.update(key=row["key"], name=row["name"], batch=row["batch"])
        rows.append(rec)
        best = [c for c in rec["contenders"] if c["us"] is not None and c["label"] != "xla"]
        best_us = min((c["us"] for c in best), default=None)
        print(f"{row['key']:>16}  xla {rec['contenders'][0]['us']:.2f} µs  best µGraph "
              f"{best_us if best_us is None else round(best_us, 2)} µs  -> {rec['reason']}",
              flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"date": _dt.date.today().isoformat(), "machine": machine(), "results": rows}
    (out / "search_gpu.json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    lines = [
        f"# Searched µGraphs on the GPU ({res['date']}, {res['machine']['device']})",
        "",
        "| benchmark | XLA (µs) | best searched µGraph (µs) | structure | chosen |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cs = [c for c in r["contenders"] if c["us"] is not None and c["label"] != "xla"]
        b = min(cs, key=lambda c: c["us"]) if cs else None
        lines.append(
            f"| {r['key']} | {r['contenders'][0]['us']:.2f} | "
            f"{'-' if b is None else round(b['us'], 2)} | {'-' if b is None else b['structure']} | "
            f"{'XLA' if r['best'] is None else 'µGraph'} |"
        )
    (out / "search_gpu.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/search_gpu.json and .md")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--phase", choices=("search", "select"), default="search")
    p.add_argument("--names", nargs="+", default=list(NAMES), choices=NAMES)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--workers", type=int, default=2, help="search worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-s", type=float, default=None, help="search time budget (default Budget)")
    p.add_argument("--small", action="store_true", help="reduced shapes (Benchmark.small)")
    p.add_argument("--progress", action="store_true", help="progress bars")
    p.add_argument("--out", default=str(RESULTS), help="output directory")
    p.add_argument("--input", default=str(RESULTS / "search_cpu.json"), help="select: search file")
    p.add_argument("--backend", default="pallas", help="select: lowering backend")
    p.add_argument("--top", type=int, default=4, help="select: µGraphs timed per benchmark")
    args = p.parse_args(argv)
    if args.phase == "search":
        phase_search(args)
    else:
        phase_select(args)


if __name__ == "__main__":
    main()
