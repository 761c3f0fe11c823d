"""How long `fields.verify(program, program)` takes for each benchmark at full size.

Usage: python -m experiments.verify_bench [--batches 1 8] [--repeats 3] [--names rmsnorm ...]

On a shared machine run it with OPENBLAS_NUM_THREADS=1: with the cores oversubscribed, a second
BLAS thread waits for a core and made every benchmark 2-7x slower here (lora 0.35 s against
0.05 s); the variable is recorded with the results.

Writes experiments/results/verify_times.md and verify_times.json (with machine information).
Each benchmark is captured once with `lax_ir.capture`, verified against itself `repeats` times
(fresh seeds), and reported by wall time (min and median) and process CPU time; the CPU time is
the more stable figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = "?"
    try:
        config = np.show_config(mode="dicts")  # type: ignore[call-arg]
        blas = config["Build Dependencies"]["blas"].get("openblas configuration", "?")
    except Exception:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "blas": blas,
        "platform": platform.platform(),
        "env": {
            k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ
        },
    }


def blas_gflops(n: int = 1024, repeats: int = 3) -> float:
    """A calibration: float64 GFLOP/s of an n³ matmul now (best of `repeats`); on a shared
    machine it says how much of the machine a row had."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _seconds(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_one(program: Any, repeats: int) -> dict[str, Any]:
    import fields

    walls, cpus, verdict = [], [], None
    for seed in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        verdict = fields.verify(program, program, seed=seed)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        if not verdict:
            raise AssertionError(f"{program!r} rejected against itself: {verdict.reason}")
    assert verdict is not None
    return {
        "blas_gflops": blas_gflops(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "wall_min_s": min(walls),
        "wall_median_s": statistics.median(walls),
        "cpu_median_s": statistics.median(cpus),
        "trials": verdict.trials,
        "bound": verdict.bound,
        "per_trial_bound": verdict.per_trial_bound,
        "void_trials": verdict.void_trials,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--names", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_times")
    args = parser.parse_args(argv)

    import lax_ir
    from experiments import benchmarks

    names = args.names or benchmarks.names()
    rows = []
    for name in names:
        for batch in args.batches:
            bench = benchmarks.get(name, batch)
            program = lax_ir.capture(bench.fn, *bench.inputs)
            row = {"benchmark": bench.key, "inputs": [list(s.shape) for s in bench.inputs]}
            row.update(time_one(program, args.repeats))
            rows.append(row)
            print(
                f"{bench.key:22s} wall min {row['wall_min_s']:.3f}s "
                f"median {row['wall_median_s']:.3f}s cpu {row['cpu_median_s']:.3f}s "
                f"trials {row['trials']} bound {row['bound']:.1e} "
                f"load {row['load_average_1min']:.1f} dgemm {row['blas_gflops']:.0f} GFLOP/s",
                flush=True,
            )
    from fields.numbers import FAMILY_Q, FAMILY_SIZE

    family = f"q prime in [{FAMILY_Q[0]}, {FAMILY_Q[1]}), p = 2q + 1 prime (>= {FAMILY_SIZE})"
    record = {
        "what": "fields.verify(program, program) at full size, default trials",
        "field": f"drawn per trial from the family: {family}",
        "machine": machine_info(),
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    lines = [
        "# fields.verify(program, program) at full size",
        "",
        f"Fields drawn per trial ({family}); machine: {record['machine']['cpu']}, "
        f"{record['machine']['cores']} cores, environment {record['machine']['env']}, "
        "load average at the end "
        f"{record['machine']['load_average']}. Repeats: {args.repeats} (seeds 0..). CPU time "
        "counts both BLAS threads; on a shared machine the wall minimum and the CPU time are "
        "the figures to read, with the load average and a 1024³ float64 matmul's GFLOP/s "
        "(measured after each row) beside them.",
        "",
        "| benchmark | wall min (s) | wall median (s) | CPU median (s) | trials | bound "
        "| load (1 min) | dgemm GFLOP/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['wall_min_s']:.3f} | {r['wall_median_s']:.3f} | "
            f"{r['cpu_median_s']:.3f} | {r['trials']} | {r['bound']:.1e} | "
            f"{r['load_average_1min']:.1f} | {r['blas_gflops']:.1f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
