"""Skinny GEMMs (decode: a few rows) on the GPU: every tiling the search offers, timed.

For looking into issue 16's b=8 regions, whose per-output GEMM kernels lose to cuBLAS: a
region `rms_norm(x) · g @ W` (or `x @ W`) with x of M rows, searched with many instances kept
per structure; each instance is lowered with Triton at 4 and 8 warps and timed by device
time (`mirage_jax.profile.time_trace`), beside XLA on the same inputs. The table gives the
cost model's estimate next to the measurement, which is what calibrates the model.

    python -m experiments.skinny_sweep --m 8 --n 256 2816 --k 1024 --out experiments/results
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp

import lax_ir
from mirage_jax.lower import lower
from mirage_jax.mugraph import MuGraph
from mirage_jax.profile import time_trace
from mirage_jax.search import Budget, search
from mirage_jax.select import random_inputs


def _normed(x, g, w):
    xf = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-5)
    return (xf * r * g.astype(jnp.float32)).astype(w.dtype) @ w


def _plain(x, w):
    return x @ w


def program_for(kind: str, m: int, k: int, n: int):
    """The region: `norm` (rms norm with gain, then the GEMM) or `plain` (the GEMM)."""
    f16 = jnp.float16
    x = jax.ShapeDtypeStruct((m, k), f16)
    w = jax.ShapeDtypeStruct((k, n), f16)
    if kind == "norm":
        args = (x, jax.ShapeDtypeStruct((1, k), f16), w)
        fn = _normed
    else:
        args, fn = (x, w), _plain
    part = lax_ir.partition(lax_ir.capture(fn, *args))
    return next(r.program for r in part.regions if not r.is_trivial)


def _kernels(g: MuGraph) -> list[dict]:
    out = []
    for _, op in g.graph_defined():
        bg = op.block_graph
        out.append({"grid": list(bg.grid), "loop": bg.forloop_range})
    return out


def sweep(kind: str, m: int, k: int, n: int, keep: int, warps: list[int]) -> dict:
    program = program_for(kind, m, k, n)
    budget = Budget(time_s=60, numbers_per_structure=keep, results=4 * keep, confirm=1)
    res = search(program, budget=budget, seed=0, workers=8)
    inputs = lambda seed: random_inputs(program, seed)  # noqa: E731
    xla = time_trace(jax.jit(lambda *xs: tuple(lax_ir.evaluate(program, *xs))), inputs, calls=30)
    rows = {"program": f"{kind} M={m} K={k} N={n}", "xla_us": xla.median_us, "candidates": []}
    print(rows["program"], "xla", round(xla.median_us, 2), "µs;", len(res.mugraphs), "µGraphs")
    for g in res.mugraphs:
        for w in warps:
            row = {
                "structure": g.meta.get("structure"),
                "kernels": _kernels(g),
                "estimate_us": (g.meta.get("cost") or {}).get("us"),
                "warps": w,
            }
            try:
                cfg = None
                if w != 4:
                    g = MuGraph(g.ops, g.outputs, {**g.meta, "num_warps": w})
                fn = lower(g, backend="triton", config=cfg)
                row["us"] = time_trace(fn, inputs, calls=30).median_us
            except Exception as e:  # a tiling that does not build: say why
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            print(json.dumps(row), flush=True)
            rows["candidates"].append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kind", nargs="*", default=["norm"], choices=["norm", "plain"])
    p.add_argument("--m", nargs="*", type=int, default=[8])
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--n", nargs="*", type=int, default=[256, 2816])
    p.add_argument("--keep", type=int, default=12, help="instances kept per structure")
    p.add_argument("--warps", nargs="*", type=int, default=[4, 8])
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for kind in args.kind:
        for m in args.m:
            for n in args.n:
                results.append(sweep(kind, m, args.k, n, args.keep, args.warps))
                _write(out, args, results)


def _write(out: Path, args: argparse.Namespace, results: list[dict]) -> None:
    doc = {
        "date": _dt.date.today().isoformat(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "method": "device time per call (profiler trace), median of 30, rotating inputs",
        "args": vars(args),
        "results": results,
    }
    (out / f"skinny_sweep_{doc['date']}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
