"""One call's kernels, in order, under `jax.jit` and under `mirage_jax.jit` (GPU).

For finding where a block's time goes once its kernels are fast: the XLA glue between them (a
cache copy, an update, a mask) shows as kernels of its own. For each model (`name:size:batch`,
the real-model set of `experiments/models`): `mirage_jax.jit` with a fresh cache and its own
search makes its first call; then both jits run 20 calls over 4 input sets under one profiler
trace (`profile.trace_events`), and each kernel position's median duration is printed and
appended, with the regions' decisions, to `<out>/kernel_timeline.jsonl`.

    python -m experiments.kernel_timeline llama_decode_eqx:realistic:1 \
        llama_decode_nnx:realistic:8 --out experiments/results
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

import mirage_jax
from experiments import models as M
from experiments import never_slower
from mirage_jax import profile


def positions(events: Sequence[Any], calls: int) -> list[tuple[str, float]]:
    """(kernel name, median µs) per position of a trace of `calls` identical calls; [] where
    the trace does not divide into them."""
    if not events or len(events) % calls:
        return []
    k = len(events) // calls
    rows = []
    for j in range(k):
        ds = sorted(events[i * k + j].duration_ns / 1e3 for i in range(calls))
        rows.append((events[j].name, ds[len(ds) // 2]))
    return rows


def timeline(fn: Callable[..., Any], sets: Sequence[tuple], calls: int = 20) -> list:
    """`positions` of `calls` calls of `fn` rotating over `sets`, after three warm-up calls."""
    for i in range(3):
        jax.block_until_ready(fn(*sets[i % len(sets)]))

    def run() -> None:
        for i in range(calls):
            jax.block_until_ready(fn(*sets[i % len(sets)]))

    return positions(profile.trace_events(run), calls)


def one(spec: str, keep_all: bool = False, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The timelines of model `spec` ("name:size:batch") under both jits, and its decisions.
    `keep_all`: keep every kernel that won its region (no whole-function check)."""
    name, size, batch = spec.split(":")
    m = M.get(name, batch=int(batch), size=size)
    sets = [m.make(s).args for s in range(4)]
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(
            m.fn, cache=Path(d) / "c.sqlite", function_check=not keep_all, options=options or {}
        )
        t0 = time.perf_counter()
        jax.block_until_ready(f(*sets[0]))
        first = time.perf_counter() - t0
        row: dict[str, Any] = {"spec": spec, "first_call_s": round(first, 2), "keep_all": keep_all}
        row["options"] = dict(options or {})
        for label, fn in (("jax.jit", jax.jit(m.fn)), ("mirage", f)):
            row[label] = timeline(fn, sets)
        row["regions"] = [(d.index, d.status, d.reason) for d in f.last.decisions]
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("specs", nargs="+", help="name:size:batch, e.g. llama_decode_eqx:realistic:1")
    p.add_argument("--out", default="experiments/results")
    p.add_argument(
        "--keep-all",
        action="store_true",
        help="keep every kernel that won its region alone (function_check=False): shows what a "
        "kernel the whole-function check leaves out costs around it",
    )
    never_slower.add_reread(p)
    args = p.parse_args(argv)
    machine = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for spec in args.specs:
        row = one(spec, args.keep_all, never_slower.options(args))
        row.update(date=_dt.date.today().isoformat(), machine=machine)
        for label in ("jax.jit", "mirage"):
            total = sum(us for _, us in row[label])
            print(f"== {spec} {label}: {total:.2f} µs in {len(row[label])} kernels", flush=True)
            for kernel, us in row[label]:
                print(f"   {us:7.2f}  {kernel[:100]}")
        with open(out / "kernel_timeline.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
