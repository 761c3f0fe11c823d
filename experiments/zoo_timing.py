"""The timing phase of `mirage_jax.zoo` on one GPU and on all GPUs of a machine (issue 18).

Searches every distinct region of the real-model set (`experiments.models`, default realistic
size at batches 1 and 8) once, on the CPUs, then runs the selection phase (lower, check and
time the searched µGraphs against XLA, one GPU per task) with 1 GPU and with all of them,
from the same search results. It prints each task's GPU and seconds as it goes (the log shows
the work spread over the GPUs), the wall time of each timing phase and their ratio, checks that
every region gets the same choice (XLA, or the same µGraph), and writes
`zoo_timing_<device>_<date>.json` (method, machine, versions, every region's choice and time per
run) and a `.md` table to `--out` (default `$OUT`, else experiments/results).

    python -m experiments.zoo_timing --out "$OUT"                     # everything, one command
    python -m experiments.zoo_timing --phase search --state "$OUT/zoo_state.pkl"   # or in two:
    python -m experiments.zoo_timing --phase time --gpus 1,2 --state zoo_state.pkl --out "$OUT"

(between the two, copy zoo_state.pkl from what came back into the repository root, so that it
travels with the working tree; `--models A B` takes a part of the set where a run would pass
the device machine's 10 minutes.)

Executors: `--executor local` (default where Ray is not installed) runs the searches in a
spawned process pool and the selections in one process per GPU (`CUDA_VISIBLE_DEVICES` set to
its index); `--executor ray` starts a local Ray cluster with `num_gpus` GPUs for each run.
On a machine with no GPU, `--fake-gpus N --backend pallas-interpret --size tiny` exercises the
same path untimed (the GPU processes see no GPU; nothing is timed; figures mean nothing).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax: the driver and
# the GPU processes share GPU 0, and the driver needs only a context there

import argparse
import dataclasses
import hashlib
import json
import pickle
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_RATIO = 0.6
"""Issue 18: the all-GPU timing phase in at most 0.6x the wall time of one GPU."""


def gpu_count() -> int:
    """GPUs on this machine by `nvidia-smi -L` (not by JAX: the driver stays off the GPUs)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def machine() -> dict[str, Any]:
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        names = gpus.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        names = []
    return {"host": socket.gethostname(), "cpus": os.cpu_count(), "gpus": names,
            "platform": platform.platform()}  # fmt: skip


def versions() -> dict[str, str]:
    import jax

    from mirage_jax._version import __version__

    out = {"python": sys.version.split()[0], "jax": jax.__version__, "mirage_jax": __version__}
    for name in ("jaxlib", "triton", "jax_triton", "ray"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # not installed here
            out[name] = "-"
    return out


def executor(kind: str, gpus: int, cpus: int) -> Any:
    if kind == "ray":
        from mirage_jax.ray_backend import RayExecutor

        return RayExecutor("local", num_cpus=cpus, num_gpus=gpus)
    from mirage_jax.local_backend import LocalExecutor

    return LocalExecutor(workers=cpus, gpus=gpus)


def owner(args: argparse.Namespace) -> Any:
    """The options-carrying MirageJit (no cache: nothing measured here is stored)."""
    from mirage_jax.api import MirageJit
    from mirage_jax.zoo import _nothing

    return MirageJit(_nothing, backend=args.backend, budget_s=args.budget_s, cache=False,
                     seed=args.seed, progress=False)  # fmt: skip


def search_phase(args: argparse.Namespace, total_gpus: int) -> dict[str, Any]:
    from mirage_jax import zoo

    jobs = zoo.model_jobs(args.models, tuple(args.batches), args.size)
    ex = executor(args.executor, min(1, total_gpus), args.cpus)
    o = owner(args)
    t0 = time.perf_counter()
    try:
        device, backend, why = ex.target(args.backend)
        plan = zoo.plan(jobs, o, backend, why, device)
    except BaseException:
        ex.close()
        raise
    if backend is None:
        ex.close()
        raise SystemExit(f"zoo_timing: nothing to time: {why}")
    report = zoo.run(plan, o, ex, progress=args.progress, stop_after_search=True)
    wall = time.perf_counter() - t0
    n_mug = sum(not _is_outcome(v) for v in report.search_results.values())
    print(f"# search: {len(plan.regions)} distinct regions of {len(jobs)} jobs, {n_mug} with "
          f"µGraphs to time, {wall:.1f} s on {ex.name}; device {device}, backend {backend}")  # fmt: skip
    failed = [r.key[:12] + ": " + r.reason for r in report.failed]
    for line in failed:
        print(f"#   search failed: {line}")
    return {"plan": plan, "searched": report.search_results, "search_s": wall, "device": device,
            "backend": backend, "jobs": [j.name for j in jobs], "runs": [],
            "search_failed": failed}  # fmt: skip


def _is_outcome(value: Any) -> bool:
    from mirage_jax.regions import SearchOutcome

    return isinstance(value, SearchOutcome)


def time_phase(args: argparse.Namespace, state: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The selection phase of every searched region on `gpus` GPUs; per region: its choice,
    the GPU and seconds of its task."""
    from mirage_jax import zoo

    ex = executor(args.executor, gpus, args.cpus)
    print(f"# timing on {gpus} GPU(s) with {ex.name} ...", flush=True)
    plan = state["plan"]  # only the searched regions (a failed search is not run again here)
    plan = dataclasses.replace(plan, regions={k: v for k, v in plan.regions.items()
                                              if k in state["searched"]})  # fmt: skip
    report = zoo.run(plan, owner(args), ex, progress=args.progress, searched=state["searched"])
    rows = []
    per_gpu: dict[str, dict[str, float]] = {}
    for r in report.results:
        gpu = str(r.where.get("gpus", "")) if r.where else ""
        entry = r.entry
        t = entry.timings if entry is not None else {}
        mugraph = None
        if entry is not None and entry.mugraph_json:
            mugraph = hashlib.sha256(entry.mugraph_json.encode()).hexdigest()[:16]
        rows.append({"key": r.key, "region": r.origin, "status": r.status, "mugraph": mugraph,
                     "structure": r.structure, "reason": r.reason, "gpu": gpu,
                     "task_s": r.where.get("seconds"), "pid": r.where.get("pid"),
                     "xla_us": t.get("xla_us"), "mugraph_us": t.get("mugraph_us")})  # fmt: skip
        if r.where:
            w = per_gpu.setdefault(gpu or "-", {"tasks": 0, "seconds": 0.0})
            w["tasks"] += 1
            w["seconds"] = round(w["seconds"] + float(r.where.get("seconds") or 0), 3)
            print(f"[gpu {gpu or '-'}] {r.key[:12]} {r.origin}: {r.status} "
                  f"in {r.where.get('seconds')} s (pid {r.where.get('pid')})")  # fmt: skip
    print(f"# timing on {gpus} GPU(s): wall {report.seconds:.1f} s; per GPU: "
          + ", ".join(f"gpu {k}: {v['tasks']} tasks, {v['seconds']:.1f} s" for k, v in
                      sorted(per_gpu.items())))  # fmt: skip
    return {"gpus": gpus, "executor": ex.name, "wall_s": round(report.seconds, 3),
            "per_gpu": per_gpu, "failed": len(report.failed), "regions": rows}  # fmt: skip


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratio of the widest run's wall time to the 1-GPU run's, and the regions whose
    choice differs between them (XLA or kernel; which µGraph)."""
    one = next((r for r in runs if r["gpus"] == 1), None)
    wide = max(runs, key=lambda r: r["gpus"]) if runs else None
    if one is None or wide is None or wide is one:
        return {}
    choice = lambda run: {x["key"]: (x["status"], x["mugraph"]) for x in run["regions"]}  # noqa: E731
    a, b = choice(one), choice(wide)
    differ = [
        {"key": k, "one_gpu": a.get(k), f"{wide['gpus']}_gpus": b.get(k)}
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
    ratio = wide["wall_s"] / one["wall_s"] if one["wall_s"] else None
    return {"gpus": wide["gpus"], "ratio": ratio, "target": TARGET_RATIO,
            "meets_target": ratio is not None and ratio <= TARGET_RATIO,
            "same_choices": not differ, "differences": differ}  # fmt: skip


def write(args: argparse.Namespace, state: dict[str, Any]) -> Path:
    out = Path(args.out or os.environ.get("OUT") or Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    device = "".join(c if c.isalnum() else "-" for c in str(state["device"]).lower()).strip("-")
    stem = out / f"zoo_timing_{device}_{time.strftime('%Y-%m-%d')}"
    cmp = compare(state["runs"])
    doc = {
        "what": "issue 18: mirage_jax.zoo's timing phase (select: lower, float-check, time "
        "against XLA with mirage_jax.profile.time_trace) of every distinct region of the "
        "real-model set, on 1 GPU and on all GPUs, from one search",
        "method": "searches once on the CPUs (seed, budget below); then for each GPU count a "
        f"fresh {args.executor} executor runs one selection task per region, one GPU per task; "
        "wall_s: from the first task submitted to the last result (the GPU processes' start "
        "included); per_gpu: tasks and the sum of their seconds on each GPU; "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false in every process (the driver shares GPU 0)",
        "command": " ".join(sys.argv),
        "machine": machine(),
        "versions": versions(),
        "args": {k: v for k, v in vars(args).items() if k != "progress"},
        "device": state["device"],
        "backend": state["backend"],
        "jobs": state["jobs"],
        "regions": len(state["plan"].regions),
        "search_s": round(state["search_s"], 3),
        "search_failed": state["search_failed"],
        "runs": state["runs"],
        "comparison": cmp,
    }
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    lines = [f"# zoo timing: {state['device']}, {len(state['plan'].regions)} regions", ""]
    lines += ["| GPUs | wall s | per GPU (tasks, s) | failed |", "|---|---|---|---|"]
    for r in state["runs"]:
        per = "; ".join(f"{k}: {v['tasks']}, {v['seconds']:.1f}" for k, v in r["per_gpu"].items())
        lines.append(f"| {r['gpus']} | {r['wall_s']:.1f} | {per} | {r['failed']} |")
    if cmp:
        lines += ["", f"ratio {cmp['gpus']} GPUs / 1 GPU: {cmp['ratio']:.3f} (target <= "
                  f"{TARGET_RATIO}); same choices: {cmp['same_choices']}"]  # fmt: skip
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.zoo_timing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--phase", choices=("all", "search", "time"), default="all")
    p.add_argument("--models", nargs="*", default=None, help="model names (default: all)")
    p.add_argument("--size", default="realistic")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--budget-s", type=float, default=20.0, help="search budget per region")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--gpus", default=None, help="GPU counts to time with, e.g. 1,2 "
                   "(default: 1 and all)")  # fmt: skip
    p.add_argument("--fake-gpus", type=int, default=0, help="pretend this many GPUs (CPU test)")
    p.add_argument("--executor", choices=("local", "ray"), default=None)
    p.add_argument("--cpus", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--state", default=None, help="pickle of the search (split runs)")
    p.add_argument("--out", default=None)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    if args.executor is None:
        try:
            import ray  # noqa: F401

            args.executor = "ray"
        except ImportError:
            args.executor = "local"
    total = args.fake_gpus or gpu_count()
    counts = sorted({int(c) for c in args.gpus.split(",")}) if args.gpus else sorted({1, total})
    if total == 0:
        raise SystemExit("zoo_timing: no GPU here (nvidia-smi -L lists none); --fake-gpus N "
                         "runs the same path untimed on the CPU")  # fmt: skip
    if max(counts) > total:
        raise SystemExit(f"zoo_timing: --gpus {args.gpus}: this machine has {total} GPU(s)")
    state_path = Path(args.state) if args.state else None
    if args.phase == "time":
        if state_path is None or not state_path.exists():
            raise SystemExit("zoo_timing: --phase time needs --state from a --phase search run")
        state = pickle.loads(state_path.read_bytes())
    else:
        state = search_phase(args, total)
    if args.phase != "search":
        for k in counts:
            state["runs"] = [r for r in state["runs"] if r["gpus"] != k] + [
                time_phase(args, state, k)
            ]
    if state_path is not None:
        state_path.write_bytes(pickle.dumps(state))
    if args.phase == "search":
        return 0
    path = write(args, state)
    cmp = compare(state["runs"])
    if cmp:
        print(f"# {cmp['gpus']} GPUs / 1 GPU wall time: {cmp['ratio']:.3f} (target <= "
              f"{TARGET_RATIO}: {'met' if cmp['meets_target'] else 'NOT met'}); same choices: "
              f"{cmp['same_choices']}")  # fmt: skip
        for d in cmp["differences"]:
            print(f"#   differs: {d}")
    print(f"# wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
