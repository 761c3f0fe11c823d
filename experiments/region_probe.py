"""One region of a real model: its µGraphs, each lowered and timed on the GPU against XLA.

For looking into a region whose kernels lose (issue 16): the search's candidates in the cost
model's order, with the model's estimate beside the measured device time per call
(`mirage_jax.profile.time_trace`) for each backend, and XLA's time for the region, in one run.

    python -m experiments.region_probe llama_decode_nnx --size realistic --batch 8 \
        --region 2 --backends triton pallas --top 8 --out experiments/results
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path

import jax

import lax_ir
from experiments import models as M
from mirage_jax.search import Budget, search
from mirage_jax.search.cost import estimate
from mirage_jax.select import select


def _region(name: str, size: str, batch: int, region: int) -> lax_ir.Program:
    """Region `region` of model `name`, or of benchmark `name` (`experiments.benchmarks`)."""
    from experiments import benchmarks

    if name in benchmarks.names():
        bm = benchmarks.get(name, batch)
        part = lax_ir.partition(lax_ir.capture(bm.fn, *bm.inputs))
    else:
        m = M.get(name, batch=batch, size=size)
        part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    return part.regions[region].program


def _numbers(g) -> str:
    """Each graph-defined kernel's grid and loop range, e.g. "grid(16, 4, 8) loop 4"."""
    return " ; ".join(
        f"grid{tuple(op.block_graph.grid)} loop {op.block_graph.forloop_range}"
        for op in g.ops
        if op.block_graph is not None
    )


def probe(name: str, size: str, batch: int, region: int, backends: list[str], top: int) -> dict:
    """Search region `region` of model (or benchmark) `name` and time its first `top` µGraphs
    per backend."""
    program = _region(name, size, batch, region)
    res = search(program, budget=Budget(time_s=60, results=max(16, top)), seed=0)
    rows = {"program": program.pretty(), "stop": res.stop_reason, "candidates": []}
    for g in res.mugraphs[:top]:
        cost = estimate(g)
        rows["candidates"].append(
            {"structure": g.meta.get("structure"), "estimate_us": round(cost.seconds * 1e6, 2)}
        )
    for backend in backends:
        sel = select(res, program, backend=backend, top=top)
        rows[backend] = [
            {
                "label": c.label,
                "us": c.us,
                "estimate_us": c.estimate_us,
                "error": c.error[:200],
                "structure": c.mugraph.meta.get("structure") if c.mugraph else None,
                "numbers": _numbers(c.mugraph) if c.mugraph else None,
            }
            for c in sel.contenders
        ]
        print(backend, json.dumps(rows[backend], indent=1), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--size", default="realistic")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--region", type=int, required=True)
    p.add_argument("--backends", nargs="*", default=["triton", "pallas"])
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    result = probe(args.model, args.size, args.batch, args.region, args.backends, args.top)
    tag = f"{args.model}_{args.size}_b{args.batch}_r{args.region}"
    write_probe(Path(args.out) / f"region_probe_{tag}.json", vars(args), result)


def write_probe(path: Path, args: dict, result: dict, **extra: str) -> None:
    """A probe's result as JSON at `path`, with the date, the device, jax and its arguments."""
    doc = {
        "date": _dt.date.today().isoformat(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        **extra,
        "args": args,
        "result": result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
