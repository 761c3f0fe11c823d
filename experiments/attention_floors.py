"""The attention regions of the real-model set and their floors (CPU: nothing is timed).

Issue 16 asks every attention region of the set to run within 2× of its floor where the floor
is above 5 µs. Per model × size × batch, each attention region (an `exp` between two matmuls)
is listed with its bytes (its inputs as the region receives them and its outputs, each read or
written once), its matmul flops (as written: a causal mask's masked half is counted), and its
floor: the larger of bytes at a copy bandwidth and flops at a peak rate. Both rates are
arguments: the copy bandwidth a GPU run measured (`never_slower` records it per run, 2.93 TB/s
on the H100 on 2026-11-27), and the H100 SXM's dense fp16 tensor-core rate from NVIDIA's data
sheet (989 Tflop/s), which no kernel reaches (ours at most 281,
`mirage_jax.compute_gate.CEILING_FLOPS`). Nothing is timed here: with `--results` (GPU runs'
`real_baselines.json` / `never_slower.json`), each region's device time within its whole
function (`in_function_us`: its kernels, told apart by their name scope; a decode loop's
donated run where there is one) is set against its floor.

    python -m experiments.attention_floors --models all --sizes realistic llama7b \
        --batches 1 8 --out experiments/results [--results RUN.json ...]
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

import numpy as np

H100_BANDWIDTH = 2.93e12
"""Bytes per second: the copy bandwidth measured on the H100 (2026-11-27, `never_slower`)."""

H100_PEAK_FLOPS = 989e12
"""Flop per second: the H100 SXM's dense fp16/bf16 tensor-core rate (NVIDIA data sheet)."""

MIN_FLOOR_US = 5.0
"""The issue's threshold: regions with a lower floor are not held to 2× of it."""


def _bytes(avals: Sequence[tuple[Sequence[int], Any]]) -> int:
    return sum(math.prod(s) * np.dtype(d).itemsize for s, d in avals)


def attention_regions(program: Any) -> list[Any]:
    """The regions of a partitioned program that are attention (`pieces_search.role`: an
    `exp` between two matmuls)."""
    import lax_ir
    from experiments.models.pieces_search import role

    part = lax_ir.partition(program)
    return [r for r in part.regions if role([n.op for _, n in r.program.ops()]) == "attention"]


def floors(
    name: str,
    size: str,
    batch: int,
    bandwidth: float = H100_BANDWIDTH,
    peak_flops: float = H100_PEAK_FLOPS,
) -> list[dict[str, Any]]:
    """One row per attention region of model `name`: its bytes, flops and floor (µs)."""
    import lax_ir
    from experiments import models as M
    from mirage_jax.compute_gate import matmul_flops

    m = M.get(name, batch=batch, size=size)
    program = lax_ir.capture(m.fn, *m.abstract_args())
    rows = []
    for region in attention_regions(program):
        p = region.program
        shapes = (p.meta.get("interface") or {}).get("shapes")
        ins = list(zip(shapes, (d for _, d in p.input_avals))) if shapes else p.input_avals
        moved = _bytes(ins) + _bytes(p.output_avals)
        flops = matmul_flops(p)
        memory_us, compute_us = moved / bandwidth * 1e6, flops / peak_flops * 1e6
        rows.append(
            {
                "model": name,
                "size": size,
                "batch": batch,
                "region": region.index,
                "inputs": [[list(s), str(d)] for s, d in ins],
                "bytes": moved,
                "flops": flops,
                "memory_us": round(memory_us, 3),
                "compute_us": round(compute_us, 3),
                "floor_us": round(max(memory_us, compute_us), 3),
                "bound": "memory" if memory_us >= compute_us else "compute",
                "held_to_2x": max(memory_us, compute_us) > MIN_FLOOR_US,
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]], bandwidth: float, peak_flops: float) -> str:
    """The rows as markdown, with the rates they assume."""
    head = [
        "# Attention regions of the real-model set and their floors",
        "",
        f"Floor = max(bytes / {bandwidth / 1e12:.2f} TB/s, matmul flops / "
        f"{peak_flops / 1e12:.0f} Tflop/s): inputs as the region receives them and outputs, "
        "each moved once; the flop rate is the data sheet's dense fp16 peak, not a measurement. "
        f"Regions whose floor is above {MIN_FLOOR_US:g} µs are held to 2× of it (issue 16).",
        "",
        "| model | size | batch | region | MB | Gflop | memory µs | compute µs | floor µs "
        "| held to 2× |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    body = [
        f"| {r['model']} | {r['size']} | {r['batch']} | {r['region']} | {r['bytes'] / 1e6:.1f} "
        f"| {r['flops'] / 1e9:.2f} | {r['memory_us']:.2f} | {r['compute_us']:.2f} "
        f"| **{r['floor_us']:.2f}** ({r['bound']}) | {'yes' if r['held_to_2x'] else 'no'} |"
        for r in rows
    ]
    return "\n".join(head + body) + "\n"


_KEY = re.compile(r"^(?P<model>.+)_(?P<size>tiny|realistic|llama7b)_b(?P<batch>\d+)$")


def _attention_time(row: dict[str, Any]) -> tuple[float, str] | None:
    """A results row's attention region (the kernel region whose structure has an `exp`): its
    device µs within the whole function and which run gave it (donated decode loop or not)."""
    donated = row.get("donated") or {}
    times = donated.get("region_us") or {}
    for k, structure in (donated.get("kernel_regions") or {}).items():
        if " exp " in f" {structure or ''} " and k in times:
            return times[k], "donated caches"
    for r in row.get("regions") or []:
        if r.get("status") != "kernel" or " exp " not in f" {r.get('structure') or ''} ":
            continue
        if str(r["index"]) in times:  # (files before the donated run named its own choice)
            return times[str(r["index"])], "donated caches"
        if r.get("in_function_us") is not None:
            return r["in_function_us"], "whole function"
    return None


def measured(paths: Sequence[str | Path]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The attention regions' device times from GPU results files (`real_baselines.json` rows of
    mirage_jax.jit, `never_slower.json` rows), by (model, size, batch); a later file's row
    replaces an earlier one's."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for row in doc["rows"] if isinstance(doc, dict) else doc:
            if "contender" in row:
                if row["contender"] != "mirage_jax.jit":
                    continue
                key = (row["model"], row["size"], int(row["batch"]))
            elif m := _KEY.match(row.get("key", "")):
                key = (m["model"], m["size"], int(m["batch"]))
            else:
                continue
            got = _attention_time(row)
            if got is not None:
                out[key] = {"us": got[0], "run": got[1], "file": Path(path).name}
    return out


def against_floors(
    rows: Sequence[dict[str, Any]], times: dict[tuple[str, str, int], dict[str, Any]]
) -> str:
    """The regions held to 2× with a measured time: time, floor, ratio, whether within 2×."""
    head = [
        "# Attention regions held to 2× of their floor, as measured",
        "",
        "Device time of the attention region's kernels within the whole `mirage_jax.jit` "
        "function (told apart by their name scope, `mirage_jax.profile.region_times`), from "
        "the results files named; floors as in `attention_floors`.",
        "",
        "| model | size | batch | µs | floor µs | × floor | within 2× | run | file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for r in rows:
        t = times.get((r["model"], r["size"], r["batch"]))
        if not r["held_to_2x"]:
            continue
        if t is None:
            body.append(
                f"| {r['model']} | {r['size']} | {r['batch']} | not measured | "
                f"{r['floor_us']:.2f} | - | - | - | - |"
            )
            continue
        ratio = t["us"] / r["floor_us"]
        body.append(
            f"| {r['model']} | {r['size']} | {r['batch']} | {t['us']:.2f} | {r['floor_us']:.2f} "
            f"| {ratio:.2f}× | {'yes' if ratio <= 2 else '**no**'} | {t['run']} | {t['file']} |"
        )
    return "\n".join(head + body) + "\n"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    from experiments import models as M

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["all"], help="model names, or 'all'")
    p.add_argument("--sizes", nargs="+", default=["realistic", "llama7b"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--bandwidth", type=float, default=H100_BANDWIDTH, help="bytes/s")
    p.add_argument("--peak-flops", type=float, default=H100_PEAK_FLOPS, help="flop/s")
    p.add_argument("--out", help="write attention_floors.json and .md here")
    p.add_argument(
        "--results",
        nargs="*",
        default=[],
        help="GPU results (real_baselines.json, never_slower.json): write attention_measured.md",
    )
    args = p.parse_args(argv)
    names = M.names() if args.models == ["all"] else args.models
    rows = []
    for size in args.sizes:
        for batch in args.batches:
            for name in names:
                try:
                    rows += floors(name, size, batch, args.bandwidth, args.peak_flops)
                except ValueError as e:  # a model without this size
                    print(f"{name} {size} b={batch}: skipped ({e})")
    text = table(rows, args.bandwidth, args.peak_flops)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention_floors.json").write_text(json.dumps(rows, indent=1) + "\n")
        (out / "attention_floors.md").write_text(text)
    if args.results:
        measured_text = against_floors(rows, measured(args.results))
        print(measured_text)
        if args.out:
            (Path(args.out) / "attention_measured.md").write_text(measured_text)
    return rows


if __name__ == "__main__":
    main()
