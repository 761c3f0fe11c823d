"""gqa b=1 on the GPU: our first-ranked µGraph, our structure at the original's numbers, the original's.

A one-off check behind docs/perf_log.md (2026-11-21 ~21:16 UTC). The variant µGraph is our
split-KV-with-loop structure instantiated at the original's grid (2×4×16, 4 loop steps),
written as JSON by the search internals (see the perf log); each is lowered with both backends
and timed by the profiler-trace method.

    python -m experiments.gqa_b1_check PLAN.json VARIANT.json PEER_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax

from experiments import benchmarks as B
from experiments.errors import max_rel_error as rel_err
from mirage_jax import profile
from mirage_jax.lower import lower
from mirage_jax.mugraph.mirage_import import load_mirage_checkpoint
from mirage_jax.mugraph.serialize import from_dict


def main(plan_path: str, variant_path: str, peer: str, out: str) -> None:
    bm = B.get("gqa", 1)
    plan = json.loads(Path(plan_path).read_text())
    e = next(e for e in plan["benchmarks"] if e["key"] == "gqa_b1")
    graphs = {
        "ours #1 (2,2,32) loop 2": from_dict(e["regions"][0]["candidates"][0]["mugraph"]),
        "ours, structure at (2,4,16) loop 4": from_dict(
            json.loads(Path(variant_path).read_text())[0]
        ),
        "original's [24]": load_mirage_checkpoint(f"{peer}/h100/gqa_bs1.json")[24],
    }
    sets = [tuple(jax.device_put(x) for x in bm.make_inputs(s)) for s in range(8)]
    ref = bm.reference(*bm.make_inputs(0))
    rows = []
    for label, g in graphs.items():
        for backend in ("pallas", "triton"):
            impl = lower(g, backend=backend)
            fn = jax.jit(lambda *xs, impl=impl: impl(*xs)[0])
            err = rel_err(fn(*sets[0]), ref)
            t = profile.time_trace(fn, lambda s: sets[s], calls=50, max_sets=8)
            rows.append({"label": label, "backend": backend, "trace_us": t.median_us,
                         "p10": t.p10_us, "p90": t.p90_us, "rel_err": err,
                         "kernels": t.kernels})  # fmt: skip
            print(f"{label:40} {backend:7} {t.median_us:6.2f} [{t.p10_us:.2f}-{t.p90_us:.2f}]")
    device = jax.devices()[0].device_kind
    Path(out).write_text(json.dumps({"device": device, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:5])
