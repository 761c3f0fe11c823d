"""Lower every imported Mirage µGraph with both backends, check it, and time the best on the GPU.

For each checkpoint file of `--device-dir` (the original's µGraphs, found by `experiments.peer`,
imported with `mirage_jax.mugraph.load_mirage_checkpoint`):
1. check: every distinct µGraph is lowered with each backend (`mirage_jax.lower.lower`), run on
   random inputs (`Benchmark.make_inputs`) and compared with the benchmark's float64 reference
   (relative Frobenius error <= 1e-2, fp16). The qknorm checkpoints do not compute the
   original's QKNorm program (none matches `qknorm_mirage`), so they are compared with their
   own float64 semantics (`evaluate_reference`). Runs in worker processes (compilation is the
   cost; the GPU is shared, nothing is timed there).
2. time (one process, serially): XLA (`jax.jit` of the plain function) and the best-ranked
   passing µGraphs per backend (ranked by `mirage_jax.search.cost.estimate`, top K), by the
   chained device-time method of `mirage_jax.profile`; the copy bandwidth by the same method.
Writes <out>/lowering_<device>.{json,md}. `--quick` is the CPU rehearsal (interpret mode, bs1
files, the two cheapest µGraphs per file, tiny timing), writing lowering_<device>_quick.*.

    python experiments/lowering_bench.py [--quick] [--workers 8] [--top 3] [--files gqa_bs1 ...]

With many workers set OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1: the qknorm checks' float64
references are BLAS-heavy, and 15 workers with a thread per core each ran 4x slower on the H100
machine (238 µGraphs in 480 s; 332 in 108 s with one thread each).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

RESULTS = ROOT / "experiments" / "results"
TOL = 1e-2
BACKENDS = ("pallas", "triton")
# The checkpoint-file -> benchmark mapping is the importer's; one definition serves both.
from experiments.import_mirage import DIMS  # noqa: E402
from experiments.import_mirage import workload_of as file_workload  # noqa: E402


def benchmark_for(stem: str, g: Any) -> Any:
    """The `<workload>_mirage` benchmark at the µGraph's input shapes."""
    from experiments import benchmarks

    workload, batch = file_workload(stem)
    bm = benchmarks.get(f"{workload}_mirage", min(batch, 16) if batch in (1, 8, 16) else 1)
    shapes = [s for s, _ in g.input_avals]
    if [tuple(x.shape) for x in bm.inputs] != shapes:
        bm = bm.resized(DIMS[workload](shapes))
    return bm


def _rel(out: Any, ref: Any) -> float:
    import numpy as np

    out = np.asarray(out, np.float64)
    if out.shape != ref.shape:
        return float("inf")
    if not np.isfinite(out).all():
        return float("nan")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# ---------------------------------------------------------------------------- phase 1: check
def check_task(task: dict) -> list[dict]:
    """Lower, run and check some µGraphs of one file with each backend (one worker's task)."""
    import jax
    import numpy as np

    from mirage_jax.lower import lower
    from mirage_jax.mugraph import evaluate_reference, load_mirage_checkpoint

    graphs = load_mirage_checkpoint(task["path"])
    stem = Path(task["path"]).stem
    workload, _ = file_workload(stem)
    records = []
    cache: dict[tuple, Any] = {}
    for index in task["indices"]:
        g = graphs[index]
        bm = benchmark_for(stem, g)
        rec: dict[str, Any] = {"file": stem, "index": index, "hash": g.canonical_hash[:16]}
        try:
            from mirage_jax.search.cost import estimate

            rec["cost_us"] = round(estimate(g).seconds * 1e6, 3)
        except Exception as e:  # the ranking is optional
            rec["cost_us"] = None
            rec["cost_error"] = repr(e)[:200]
        rec["reference"] = "mugraph" if workload == "qknorm" else bm.name
        # qknorm's own fp16 semantics overflow on the standard draws (its kernel-level exp
        # and sums exceed 65504): retry at smaller input scales; other workloads never retry.
        scales = (1.0, 0.5, 0.25) if workload == "qknorm" else (1.0,)
        for backend in task["backends"]:
            r: dict[str, Any] = {}
            fn = None
            for scale in scales:
                key = (bm.key, tuple(bm.dims), scale)
                if key not in cache:
                    xs = [(x * scale).astype(x.dtype) for x in bm.make_inputs(seed=11)]
                    cache[key] = (xs, bm.reference(*xs), [jax.device_put(x) for x in xs])
                xs, ref, dev = cache[key]
                if workload == "qknorm":  # its own semantics: once per µGraph, not per backend
                    own = (index, scale)
                    if own not in cache:
                        cache[own] = evaluate_reference(g, *xs)[0]
                    ref = cache[own]
                t0 = time.perf_counter()
                try:
                    fn = fn or lower(g, backend=backend, interpret=task["interpret"])
                    (out,) = fn(*dev)
                    out = np.asarray(jax.block_until_ready(out))
                    r = {"first_call_s": round(time.perf_counter() - t0, 3), "scale": scale}
                    r["rel_err"] = _rel(out, ref)
                    r["ok"] = bool(r["rel_err"] <= TOL)
                except Exception as e:
                    r = {"ok": False, "scale": scale}
                    r["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                    r["trace"] = traceback.format_exc()[-1500:]
                    break
                if np.isfinite(out).all():
                    break
            rec[backend] = r
        rec["input_scale"] = min((rec[b].get("scale", 1.0) for b in task["backends"]), default=1.0)
        records.append(rec)
    return records


def plan_tasks(files: list[Path], backends, interpret: bool, quick: bool, chunk: int) -> tuple:
    """Distinct µGraphs per file (by canonical hash) split into worker tasks."""
    from mirage_jax.mugraph import load_mirage_checkpoint

    tasks, inventory = [], {}
    for path in files:
        graphs = load_mirage_checkpoint(path)
        first: dict[str, int] = {}
        for i, g in enumerate(graphs):
            first.setdefault(g.canonical_hash, i)
        indices = sorted(first.values())
        if quick:  # the two cheapest (fewest block-iterations) µGraphs
            work = {
                i: sum(
                    op.block_graph.num_blocks * op.block_graph.forloop_range
                    for _, op in graphs[i].graph_defined()
                )
                for i in indices
            }
            indices = sorted(indices, key=lambda i: (work[i], i))[:2]
        inventory[path.stem] = {"graphs": len(graphs), "distinct": len(first), "checked": indices}
        for k in range(0, len(indices), chunk):
            tasks.append(
                {
                    "path": str(path),
                    "indices": indices[k : k + chunk],
                    "backends": list(backends),
                    "interpret": interpret,
                }
            )
    tasks.sort(key=lambda t: "qknorm" in t["path"])  # the paper's workloads first
    return tasks, inventory


def _worker_init() -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _not_run(task: dict, why: str) -> list[dict]:
    recs = []
    for index in task["indices"]:
        rec: dict[str, Any] = {"file": Path(task["path"]).stem, "index": index, "cost_us": None}
        rec["reference"] = ""
        rec["input_scale"] = 1.0
        for b in task["backends"]:
            rec[b] = {"ok": False, "error": f"not run: {why}"}
        recs.append(rec)
    return recs


def run_checks(tasks: list[dict], workers: int, budget_s: float) -> list[dict]:
    """Run the check tasks (in `workers` processes); tasks past `budget_s` are not run."""
    records: list[dict] = []
    t0 = time.perf_counter()

    def report(t: dict, recs: list[dict]) -> None:
        bad = sum(1 for r in recs for b in t["backends"] if not r[b]["ok"])
        print(f"  checked {Path(t['path']).stem} {t['indices']} ({bad} failures)", flush=True)

    if workers <= 1:
        for t in tasks:
            if time.perf_counter() - t0 > budget_s:
                records.extend(_not_run(t, "check time budget spent"))
                continue
            recs = check_task(t)
            records.extend(recs)
            report(t, recs)
        return records
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, wait

    ex = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_worker_init)
    futures = {ex.submit(check_task, t): t for t in tasks}
    pending = set(futures)
    while pending:
        left = budget_s - (time.perf_counter() - t0)
        if left <= 0:
            break
        done, pending = wait(pending, timeout=min(left, 30), return_when=FIRST_COMPLETED)
        for f in done:
            t = futures[f]
            try:
                recs = f.result()
            except Exception as e:  # a worker died (e.g. a compiler crash)
                recs = _not_run(t, f"worker failed: {type(e).__name__}: {str(e)[:300]}")
            records.extend(recs)
            report(t, recs)
    for f in pending:
        records.extend(_not_run(futures[f], "check time budget spent (compile hang?)"))
    if pending:
        print(f"  {len(pending)} tasks not finished within {budget_s:.0f} s", flush=True)
        for proc in list(getattr(ex, "_processes", {}).values()):
            proc.kill()  # hung compilers: our own worker processes, by handle
    ex.shutdown(wait=not pending, cancel_futures=True)
    return records


# ---------------------------------------------------------------------------- phase 2: time
def run_timing(
    records, files, backends, top, interpret, chain, repeats, warmup=3, on_row=None, stop_at=None
) -> dict:
    import jax

    from mirage_jax import profile
    from mirage_jax.lower import lower
    from mirage_jax.mugraph import load_mirage_checkpoint

    out: dict[str, Any] = {}
    kw = {"chain": chain, "repeats": repeats, "warmup": warmup}
    bw, bw_timing = profile.copy_bandwidth(1 << 28 if not interpret else 1 << 20, **kw)
    out["copy_bandwidth_Bps"] = bw
    out["copy_timing"] = bw_timing.as_dict()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s ({bw_timing})", flush=True)
    rows: dict[str, Any] = {}
    out["rows"] = rows
    for path in files:
        stem = path.stem
        if stop_at is not None and time.perf_counter() > stop_at:
            print(f"deadline: {stem} and later files not timed", flush=True)
            out.setdefault("not_timed", []).append(stem)
            continue
        graphs = load_mirage_checkpoint(path)
        mine = [r for r in records if r["file"] == stem]
        if not mine:
            continue
        bm = benchmark_for(stem, graphs[mine[0]["index"]])
        scale = mine[0]["input_scale"]

        def inputs(seed: int, bm=bm, scale=scale):
            return [(x * scale).astype(x.dtype) for x in bm.make_inputs(seed=100 + seed)]

        row: dict[str, Any] = {
            "benchmark": bm.key,
            "floor_us_3TBps": bm.floor_us(),
            "floor_us_measured_bw": bm.floor_bytes / bw * 1e6,
            "floor_bytes": bm.floor_bytes,
        }
        try:
            t = profile.time_device(jax.jit(bm.fn), inputs, **kw)
            row["xla"] = t.as_dict()
            print(f"{stem}: XLA {t}", flush=True)
        except Exception as e:
            row["xla"] = {"error": repr(e)[:400]}
        for backend in backends:
            ok = [r for r in mine if r[backend]["ok"]]
            ok.sort(key=lambda r: (r["cost_us"] is None, r["cost_us"] or 0.0, r["index"]))
            timed = []
            for r in ok[:top]:
                try:
                    fn = lower(graphs[r["index"]], backend=backend, interpret=interpret)
                    t = profile.time_device(fn, inputs, **kw)
                    timed.append({"index": r["index"], "cost_us": r["cost_us"], **t.as_dict()})
                    print(f"{stem}: {backend} [{r['index']}] {t}", flush=True)
                except Exception as e:
                    timed.append({"index": r["index"], "error": repr(e)[:400]})
            good = [x for x in timed if "median_us" in x]
            row[backend] = {
                "timed": timed,
                "best": min(good, key=lambda x: x["median_us"]) if good else None,
            }
        rows[stem] = row
        if on_row is not None:
            on_row(out)
    return out


# ---------------------------------------------------------------------------- report
def environment() -> dict:
    import jax

    env = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [getattr(d, "device_kind", d.platform) for d in jax.devices()],
    }
    for mod in ("jaxlib", "triton", "jax_triton"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            env[mod] = f"unavailable ({type(e).__name__})"
    return env


def markdown(result: dict) -> str:
    env, timing = result["environment"], result.get("timing", {})
    lines = [
        f"# Lowering imported Mirage µGraphs ({result['device_dir']})",
        "",
        f"Date {env['date']}; devices {env['devices']}; jax {env['jax']}, triton {env['triton']}, "
        f"jax-triton {env['jax_triton']}. Generated by `experiments/lowering_bench.py`"
        + (
            " --quick (CPU rehearsal: interpret mode, NOT device time)." if result["quick"] else "."
        ),
        *[f"Note: {n}" for n in result.get("notes", [])],
        "",
        "## Correctness: every distinct µGraph, both backends",
        "",
        "ok = lowered, ran and matched the float64 reference (relative error <= "
        f"{result['tolerance']:g}); n/r = not run (the check phase's time budget ran out first; "
        "not a failure); the rest failed.",
        "",
        "| file | µGraphs | distinct | pallas ok / n/r | triton ok / n/r | worst rel. err | "
        "reference |",
        "|---|---|---|---|---|---|---|",
    ]
    recs = result["records"]

    def not_run(r: dict, b: str) -> bool:
        return r[b].get("error", "").startswith("not run")

    for stem, inv in result["inventory"].items():
        mine = [r for r in recs if r["file"] == stem]
        cells = []
        for b in result["backends"]:
            ok = sum(r[b]["ok"] for r in mine)
            nr = sum(not_run(r, b) for r in mine)
            cells.append(f"{ok}/{len(mine)}" + (f" ({nr} n/r)" if nr else ""))
        errs = [r[b].get("rel_err", float("nan")) for r in mine for b in result["backends"]]
        worst = max((e for e in errs if e == e), default=float("nan"))
        ref = next((r["reference"] for r in mine if r.get("reference")), "")
        pad = cells + ["-"] * (2 - len(cells))
        lines.append(
            f"| {stem} | {inv['graphs']} | {inv['distinct']} | "
            f"{pad[0]} | {pad[1]} | {worst:.1e} | {ref} |"
        )
    fails = [
        (r, b) for r in recs for b in result["backends"] if not r[b]["ok"] and not not_run(r, b)
    ]
    n_nr = sum(not_run(r, b) for r in recs for b in result["backends"])
    lines += ["", f"Failures: {len(fails)}; not run: {n_nr} (µGraph, backend) pairs.", ""]
    if fails:
        for r, b in fails[:40]:
            why = r[b].get("error") or f"rel. err {r[b].get('rel_err')}"
            lines.append(f"- {r['file']}[{r['index']}] {b}: {why[:300]}")
    if timing:
        bw = timing["copy_bandwidth_Bps"]
        lines += [
            "",
            "## Device time (µs): best imported µGraph per backend, XLA, floor",
            "",
            f"Method: {_row_method(timing)}. Copy bandwidth measured the same way: "
            f"{bw / 1e12:.2f} TB/s. Each backend's best is the fastest of the top-ranked "
            "passing µGraphs (cost model order); [i] is its index in the file; spread p10–p90.",
            "",
            "| benchmark (file) | XLA | pallas best [i] | triton best [i] | floor @3.0 TB/s | "
            "floor @measured | best/XLA |",
            "|---|---|---|---|---|---|---|",
        ]
        for stem, row in timing["rows"].items():

            def cell(x):
                if not x or "median_us" not in x:
                    return "n/a"
                idx = f" [{x['index']}]" if "index" in x else ""
                return f"{x['median_us']:.1f} ({x['p10_us']:.1f}–{x['p90_us']:.1f}){idx}"

            xla = row.get("xla", {})
            bests = [row.get(b, {}).get("best") for b in ("pallas", "triton")]
            ours = [b["median_us"] for b in bests if b]
            ratio = f"{min(ours) / xla['median_us']:.2f}" if ours and "median_us" in xla else "n/a"
            lines.append(
                f"| {row['benchmark']} ({stem}) | {cell(xla)} | {cell(bests[0])} | "
                f"{cell(bests[1])} | {row['floor_us_3TBps']:.1f} | "
                f"{row['floor_us_measured_bw']:.1f} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


def _row_method(timing: dict) -> str:
    """The method string of a benchmark timing (with its input rotation), else the copy's."""
    for row in timing.get("rows", {}).values():
        if "method" in row.get("xla", {}):
            return row["xla"]["method"].replace(
                f"{row['xla']['input_sets']} rotating", "up to chain+1 rotating"
            )
    return timing["copy_timing"]["method"]


def rewrite_markdown(json_path: Path) -> str:
    """Regenerate the .md beside a results JSON (e.g. after a report-format change)."""
    result = json.loads(json_path.read_text())
    md = markdown(result)
    json_path.with_suffix(".md").write_text(md)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU rehearsal (see module doc)")
    p.add_argument("--device-dir", default="h100", help="checkpoint subfolder (h100 or a100)")
    p.add_argument("--peer", type=Path, help="the checkpoints (default: $MIRAGE_PEER_DIR)")
    p.add_argument("--files", nargs="*", help="checkpoint stems to include (default: all)")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--chunk", type=int, default=8, help="µGraphs per worker task")
    p.add_argument("--top", type=int, default=3, help="µGraphs timed per file and backend")
    p.add_argument("--chain", type=int, default=32)
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--check-budget", type=float, default=1e9, help="seconds for the checks")
    p.add_argument("--records", type=Path, help="reuse the checks of an earlier run's JSON")
    p.add_argument("--deadline", type=float, default=1e9, help="stop timing after (s from start)")
    p.add_argument("--time-skip", nargs="*", default=["_old"], help="stems (substrings) not timed")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import jax

    interpret = jax.default_backend() == "cpu"
    backends = tuple(b for b in args.backends.split(",") if b)
    from experiments import peer

    args.peer = peer.find(args.peer)
    if args.peer is None:
        raise SystemExit(f"lowering_bench: {peer.HOW_TO_GET}")
    folder = args.peer / args.device_dir
    files = sorted(folder.glob("*.json"))
    if args.files:
        files = [f for f in files if f.stem in set(args.files)]
    warmup = 3
    if args.quick:
        files = [f for f in files if f.stem.endswith("_bs1")]
        args.chain, args.repeats, args.top, warmup = 1, 1, 1, 1
        # interpret-mode kernels are slow: time only the files with tiny grids
        args.time_skip = [*args.time_skip, "gqa", "rmsnorm", "gated_mlp"]
    t0 = time.perf_counter()
    env = environment()
    print(f"environment: {env}", flush=True)
    tasks, inventory = plan_tasks(files, backends, interpret, args.quick, args.chunk)
    print(
        f"{len(files)} files, {sum(len(v['checked']) for v in inventory.values())} µGraphs "
        f"to check, {len(tasks)} tasks, {args.workers} workers",
        flush=True,
    )
    if args.records:
        records = json.loads(args.records.read_text())["records"]
        names = {f.stem for f in files}
        records = [r for r in records if r["file"] in names]
        print(f"reusing {len(records)} check records from {args.records}", flush=True)
    else:
        records = run_checks(tasks, args.workers, args.check_budget)
    t_check = time.perf_counter() - t0
    print(f"checks done in {t_check:.0f} s", flush=True)
    result: dict[str, Any] = {
        "environment": env,
        "device_dir": args.device_dir,
        "quick": args.quick,
        "backends": list(backends),
        "tolerance": TOL,
        "inventory": inventory,
        "records": records,
        "check_seconds": t_check,
    }
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"lowering_{args.device_dir}{suffix}"
    for r in records:  # keep the JSON small: traces only for failures
        for b in backends:
            if r[b].get("ok"):
                r[b].pop("trace", None)

    def save(timing: dict | None = None) -> str:
        if timing is not None:
            result["timing"] = timing
        result["total_seconds"] = time.perf_counter() - t0
        text = json.dumps(result, indent=1, default=_json_default)
        (args.out / f"{stem}.json").write_text(text)
        md = markdown(result)
        (args.out / f"{stem}.md").write_text(md)
        return md

    save()  # the checks are kept even if the timing is cut off
    timed_files = [f for f in files if not any(s in f.stem for s in args.time_skip)]
    if not args.no_time:
        run_timing(
            records,
            timed_files,
            backends,
            args.top,
            interpret,
            args.chain,
            args.repeats,
            warmup,
            on_row=save,
            stop_at=t0 + args.deadline,
        )
    print(save())
    n_bad = sum(1 for r in records for b in backends if not r[b]["ok"])
    print(f"total {result['total_seconds']:.0f} s; {n_bad} not ok (failed or not run)", flush=True)
    return 0


def _json_default(x: Any) -> Any:
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    return str(x)


if __name__ == "__main__":
    raise SystemExit(main())
