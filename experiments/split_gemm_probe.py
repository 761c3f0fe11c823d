"""Decode GEMMs (`x @ W`, 1 or 8 rows) alone: every µGraph the search finds, split-K pairs
included, lowered with Triton and timed on the GPU beside XLA.

For issue 16's b=8 projections: whether the search's split-K form (partial sums stacked along
the output's last axis, then a combining kernel) beats its loop form and XLA's GEMM at these
shapes. Device time per call (`mirage_jax.profile.time_trace`, median of 30 calls):

    python -m experiments.split_gemm_probe --out experiments/results
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import lax_ir
from experiments.region_probe import _numbers, write_probe
from mirage_jax.lower import lower
from mirage_jax.profile import time_trace
from mirage_jax.search import Budget, search
from mirage_jax.search.cost import estimate
from mirage_jax.select import random_inputs

SHAPES = ((8, 2816, 1024), (8, 1024, 2816), (1, 1024, 2816), (8, 1024, 1536))
"""(rows, K, N): the realistic Llama block's down, gate (or up) and QKV projections."""


def _gemm(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


def probe(shapes: list[tuple[int, int, int]], calls: int) -> list[dict]:
    """Per shape: XLA's time and kernels, and every µGraph's time, fastest first."""
    return [_one(m, k, n, calls) for m, k, n in shapes]


def _one(m: int, k: int, n: int, calls: int) -> dict:
    specs = (jax.ShapeDtypeStruct((m, k), jnp.float16), jax.ShapeDtypeStruct((k, n), jnp.float16))
    program = lax_ir.partition(lax_ir.capture(_gemm, *specs)).regions[0].program
    res = search(program, budget=Budget(time_s=60, results=64, numbers_per_structure=8), seed=0)
    inputs = functools.cache(lambda s: random_inputs(program, s))

    xla_fn = jax.jit(lambda *xs: tuple(lax_ir.evaluate(program, *xs)))
    xla = time_trace(xla_fn, inputs, calls=calls)
    rows = []
    for g in res.mugraphs:
        row = {
            "structure": g.meta.get("structure"),
            "numbers": _numbers(g),
            "estimate_us": round(estimate(g).seconds * 1e6, 2),
        }
        try:
            t = time_trace(lower(g, backend="triton"), inputs, calls=calls)
            row |= {"us": t.median_us, "kernels": [round(x[1], 2) for x in t.kernels]}
        except Exception as e:  # a µGraph the lowering cannot take is data here
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    rows.sort(key=lambda r: r.get("us", float("inf")))
    best_split = next((r for r in rows if "split" in r["structure"] and "us" in r), None)
    print((m, k, n), f"XLA {xla.median_us:.2f} µs;", "best", rows[0], "best split", best_split)
    return {"shape": [m, k, n], "xla_us": xla.median_us, "xla_kernels": xla.kernels, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", type=Path, default=None, help="a folder for the JSON")
    a = p.parse_args(argv)
    rows = probe(list(SHAPES), a.calls)
    if a.out:
        dev = jax.devices()[0].device_kind.split()[1].lower()
        name = f"split_gemm_probe_{dev}_{time.strftime('%Y-%m-%d')}.json"
        method = "mirage_jax.profile.time_trace (device time per call, median)"
        write_probe(a.out / name, {"calls": a.calls}, {"shapes": rows}, method=method)


if __name__ == "__main__":
    main()
