"""The best µGraphs of one region under several Triton configs, timed on the GPU.

For looking into how the generated kernels' knobs (warps, pipelining stages, loop unrolling)
move a region's device time (`mirage_jax.profile.time_trace`, per kernel), beside XLA's, in one
run:

    python -m experiments.config_probe gqa_stable --batch 8 --top 2 --out experiments/results
    python -m experiments.config_probe gpt2_prefill --batch 1 --region 1 --top 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

import lax_ir
from experiments.region_probe import _numbers, _region, write_probe
from mirage_jax.lower import lower
from mirage_jax.lower.triton import TritonConfig
from mirage_jax.profile import time_trace
from mirage_jax.search import Budget, search
from mirage_jax.select import random_inputs

CONFIGS = {
    "default": {},
    "unroll2": {"loop_unroll": 2},
    "unroll4": {"loop_unroll": 4},
    "unroll8": {"loop_unroll": 8},
    "stages2": {"num_stages": 2},
    "stages4": {"num_stages": 4},
    "warps2": {"num_warps": 2},
    "stages1": {"num_stages": 1},
    "warps8": {"num_warps": 8},
    "warps8_stages4": {"num_warps": 8, "num_stages": 4},
    "split2": {"loop_split": 2},
    "split4": {"loop_split": 4},
}


def probe(
    name: str, batch: int, top: int, configs: list[str], calls: int, size: str, region: int
) -> dict:
    """Search region `region` of benchmark or model `name` at `batch`; time its first `top`
    µGraphs under `configs`."""
    program = _region(name, size, batch, region)
    res = search(program, budget=Budget(time_s=60), seed=0)
    cached: dict = {}

    def sets(seed: int):
        if seed not in cached:
            cached[seed] = random_inputs(program, seed)
        return cached[seed]

    xla_fn = jax.jit(lambda *xs: tuple(lax_ir.evaluate(program, *xs)))
    xla = time_trace(xla_fn, sets, calls=calls)
    rows = [{"label": "xla", "us": xla.median_us, "kernels": xla.kernels}]
    print("xla", round(xla.median_us, 2), flush=True)
    for rank, g in enumerate(res.mugraphs[:top]):
        for c in configs:
            try:
                fn = lower(g, backend="triton", config=TritonConfig(**CONFIGS[c]))
                t = time_trace(fn, sets, calls=calls)
            except Exception as e:  # a config the device cannot run (shared memory)
                why = f"{type(e).__name__}: {e}"[:300]
                rows.append({"label": f"#{rank} {c}", "error": why})
                print(f"#{rank} {c:8s} failed: {why[:120]}", flush=True)
                continue
            rows.append(
                {
                    "label": f"#{rank} {c}",
                    "structure": g.meta.get("structure"),
                    "numbers": _numbers(g),
                    "us": t.median_us,
                    "kernels": t.kernels,
                }
            )
            ks = ", ".join(f"{k[1]:.2f}" for k in t.kernels)
            print(f"#{rank} {c:8s} {t.median_us:7.2f} µs ({ks}) {_numbers(g)}", flush=True)
    return {"program": name, "batch": batch, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("name")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", default="realistic", help="model size (models only)")
    p.add_argument("--region", type=int, default=0)
    p.add_argument("--top", type=int, default=2)
    p.add_argument("--configs", nargs="*", default=list(CONFIGS))
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    result = probe(
        args.name, args.batch, args.top, args.configs, args.calls, args.size, args.region
    )
    tag = f"{args.name}_b{args.batch}" + (f"_r{args.region}" if args.region else "")
    method = "mirage_jax.profile.time_trace (device time per call, median)"
    write_probe(Path(args.out) / f"config_probe_{tag}.json", vars(args), result, method=method)


if __name__ == "__main__":
    main()
