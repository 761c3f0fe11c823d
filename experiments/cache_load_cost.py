"""What the kernel cache's load-time check costs per region (`mirage_jax.cache_check`).

Usage: python -m experiments.cache_load_cost [--backend reference] [--repeats 3]
                                              [--names rmsnorm gqa] [--out FILE.json]

For each benchmark at small and full size (batch 1, the benchmark's fp16 inputs) it stores a
hand-built kernel-level µGraph equal to the region (as an imported entry, so the float check
runs), then times `Cache.lookup` on a fresh process memo `repeats` times: the whole lookup, the
field trial and the float check (`load_check.field_s`/`float_s`), and the lookup again with the
memo warm (what every later use in the process costs). `--backend pallas` or `triton` on a GPU
times the float check of the lowered kernel (its compile included); on a CPU those backends
fall back to the µGraph's reference evaluation, as the check says.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import lax_ir
from experiments import benchmarks
from mirage_jax._env import device_kind
from mirage_jax.cache import Cache
from mirage_jax.cache_check import forget_checks
from mirage_jax.mugraph import MuGraphBuilder


def _rmsnorm(b: MuGraphBuilder, x: Any, w: Any) -> Any:
    eps = float(np.asarray(benchmarks.EPS, b.shape(x)[1]))  # the region adds eps in x's dtype
    return b.op("matmul", b.op("rms_norm", x, eps=eps), w)


def _gqa(b: MuGraphBuilder, q: Any, k: Any, v: Any) -> Any:
    e = b.op("exp", b.op("matmul", q, k))
    return b.op("matmul", b.op("div", e, b.op("reduce_sum", e, dim=2)), v)


MUGRAPHS = {"rmsnorm": _rmsnorm, "gqa": _gqa}
"""Kernel-level µGraphs equal to each benchmark's region."""


def measure(name: str, small: bool, backend: str, repeats: int, work: Path) -> dict[str, Any]:
    """Time the first and a memoised lookup of one benchmark's region (seconds)."""
    bench = benchmarks.get(name)
    bench = bench.small() if small else bench
    (region,) = [
        r for r in lax_ir.partition(lax_ir.capture(bench.fn, *bench.inputs)).regions
        if not r.is_trivial
    ]  # fmt: skip
    program = region.program
    b = MuGraphBuilder()
    ins = [b.input(s.shape, str(s.dtype)) for s in bench.inputs]
    graph = b.build([MUGRAPHS[name](b, *ins)])
    path = work / f"{name}-{'small' if small else 'full'}.sqlite"
    source = Cache(work / "source.sqlite")
    source.clear()
    source.store(program, graph, device_kind=device_kind(), backend=backend)
    source.export(work / "entry.jsonl")
    cache = Cache(path)
    cache.clear()
    assert cache.import_(work / "entry.jsonl").imported == 1
    first, field, floats, warm = [], [], [], []
    how = ""
    for _ in range(repeats):
        forget_checks()
        t0 = time.perf_counter()
        hit = cache.lookup(program.canonical_hash, device_kind(), backend, program=program)
        first.append(time.perf_counter() - t0)
        assert hit is not None, "the entry did not pass"
        check = hit[0].verification["load_check"]
        field.append(check["field_s"])
        floats.append(check["float_s"])
        how = check["float_check"]
        t0 = time.perf_counter()
        cache.lookup(program.canonical_hash, device_kind(), backend, program=program)
        warm.append(time.perf_counter() - t0)
    return {
        "name": name,
        "size": "small" if small else "full",
        "inputs": [f"{s.dtype}{list(s.shape)}" for s in bench.inputs],
        "backend": backend,
        "device": device_kind(),
        "first_lookup_s": first,
        "field_trial_s": field,
        "float_check_s": floats,
        "memoised_lookup_s": warm,
        "float_check": how,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="reference")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--names", nargs="+", default=list(MUGRAPHS))
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.names:
            for small in (True, False):
                row = measure(name, small, args.backend, args.repeats, Path(work))
                rows.append(row)
                med = {k: statistics.median(row[k]) for k in row if k.endswith("_s")}
                print(
                    f"{name:8} {row['size']:5} first lookup {med['first_lookup_s']:.3f} s "
                    f"(field trial {med['field_trial_s']:.3f}, float check "
                    f"{med['float_check_s']:.3f}); memoised {med['memoised_lookup_s'] * 1e3:.2f} "
                    f"ms; {row['float_check'].split(':')[0]}",
                    flush=True,
                )
    info = {
        "jax": jax.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
