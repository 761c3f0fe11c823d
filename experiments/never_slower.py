"""mirage_jax.jit against jax.jit, end to end, with a fresh cache and its own search (GPU).

For each benchmark of `experiments/benchmarks.py` (every name, `--batches`) and each program of
the real-model set (`experiments/models`, `--models` at `--sizes`), as a user would run it:

- `mirage_jax.jit(fn)` with an empty cache: the first call (capture, search, verification,
  selection by device time, the whole-function check) is timed by wall clock;
- its outputs are compared with `jax.jit(fn)`'s (tolerance by dtype);
- both are timed by the results tables' method (`profile.time_trace`: the GPU's kernel time per
  call, rotating input sets), in the same run;
- per region: the choice (kernel or XLA), with the µGraph's and XLA's region times where timed;
- with `--donate-caches`, the decode models again with their KV caches donated to both jits and
  each call's caches fed to the next (a decode loop), against the in-place floor at the copy
  bandwidth measured in the run.

Rows are appended to `<out>/never_slower.json` and `.md` as they finish, so a run cut short by a
time limit keeps what it measured (`--resume` skips rows already there).

    python -m experiments.never_slower --batches 1 8 16 --models all --sizes realistic
    python -m experiments.never_slower --names --models llama_decode_nnx --sizes llama7b \
        --donate-caches
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import platform
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from experiments import reproduce_common
from experiments.errors import max_rel_error
from mirage_jax.search.workers import default_workers

TOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 2e-3}


_max_rel = max_rel_error
"""Kept for callers that name it so (`experiments.errors.max_rel_error`)."""


def _cases(args: argparse.Namespace) -> list[tuple[str, Any, Any, str, Any]]:
    """(key, fn, inputs(seed) -> args, dtype, model or None) for every requested program."""
    from experiments import benchmarks
    from experiments import models as M

    out = []
    for batch in args.batches:
        for name in benchmarks.names() if args.names is None else args.names:
            bm = benchmarks.get(name, batch)
            out.append((bm.key, bm.fn, bm.make_inputs, str(np.dtype(bm.inputs[0].dtype)), None))
    names = M.names() if args.models == ["all"] else (args.models or [])
    for size in args.sizes:
        for batch in args.model_batches:
            for name in names:
                m = M.get(name, batch=batch, size=size)
                out.append((m.key, m.fn, lambda s, m=m: m.make(s).args, str(m.dtype), m))
    return out


def measure(
    key: str,
    fn: Any,
    inputs: Any,
    dtype: str,
    args: argparse.Namespace,
    timer: Any = None,
    model: Any = None,
) -> dict:
    """One row: `mirage_jax.jit(fn)` (fresh cache, own search) against `jax.jit(fn)`, both timed
    by `timer` (default `profile.time_trace`; `experiments.real_baselines` reuses this); with
    `args.donate_caches` and a decode `model`, both again with its KV caches donated
    (`donated`)."""
    import mirage_jax
    from mirage_jax.profile import time_trace

    timer = time_trace if timer is None else timer

    xs = inputs(0)
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(
            fn, cache=Path(d) / "c.sqlite", workers=args.workers, options=options(args)
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = jax.block_until_ready(f(*xs))
        first_s = time.perf_counter() - t0
        ref = jax.jit(fn)
        err = _max_rel(got, ref(*xs))
        t_jax = timer(ref, inputs, calls=args.calls)
        t_mine = timer(f, inputs, calls=args.calls)
        rec = f.last
        donation = None
        if getattr(args, "donate_caches", False) and model is not None and caches_of(model):
            donation = donated(model, inputs, Path(d) / "c.sqlite", args)
    regions = []
    in_function = _region_us(t_mine)
    for dcs in rec.decisions:
        t = dcs.timings or {}
        regions.append(
            {
                "index": dcs.index,
                "status": dcs.status,
                "reason": dcs.reason[:200],
                "mugraph_us": t.get("mugraph_us"),
                "in_function_us": in_function.get(str(dcs.index)),
                "xla_us": t.get("xla_us"),
                "search_s": t.get("search_s"),
                "select_s": t.get("select_s"),
                "select_phases_s": t.get("select_phases_s"),
                "search_phases_s": t.get("search_phases_s"),
                "structure": None if dcs.mugraph is None else dcs.mugraph.meta.get("structure"),
            }
        )
    fc = rec.function_check
    return {
        "key": key,
        "first_call_s": round(first_s, 2),
        "jax_jit_us": t_jax.median_us,
        "jax_jit_p10_p90": [t_jax.p10_us, t_jax.p90_us],
        "mirage_us": t_mine.median_us,
        "mirage_p10_p90": [t_mine.p10_us, t_mine.p90_us],
        "speedup": t_jax.median_us / t_mine.median_us,
        "max_rel_error": err,
        "tolerance": TOL.get(dtype, 2e-2),
        "matches": bool(err <= TOL.get(dtype, 2e-2)),
        "kernels": sum(r["status"] == "kernel" for r in regions),
        "regions": regions,
        "function_check": None if fc is None else fc.timings(),
        # where each whole function's device time goes: (kernel, µs per call, launches per call)
        "jax_jit_kernels": _top_kernels(t_jax),
        "mirage_kernels": _top_kernels(t_mine),
        "warnings": sorted({str(w.message)[:160] for w in caught}),
        **({"donated": donation} if donation is not None else {}),
    }


CACHES = ("k_cache", "v_cache")
"""The arguments a decode step returns updated (as outputs of the same names)."""


def caches_of(model: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(argument indices, output indices) of a decode model's KV caches, or None."""
    if not all(n in model.arg_names and n in model.output_names for n in CACHES):
        return None
    return (
        tuple(model.arg_names.index(n) for n in CACHES),
        tuple(model.output_names.index(n) for n in CACHES),
    )


def decode_loop(model: Any, inputs: Any) -> tuple[Any, Any]:
    """(inputs, feed) for `profile.time_trace` of a decode step with donated KV caches: each
    input set owns copies of its caches (a donated buffer is consumed), and `feed` passes a
    call's updated caches on to the next call, as a decode loop does."""
    import jax.numpy as jnp

    ci, co = caches_of(model)
    drawn = functools.cache(inputs)  # a 7B block's draw takes seconds

    def fresh(s: int) -> tuple:
        return tuple(jnp.copy(a) if i in ci else a for i, a in enumerate(drawn(s)))

    def feed(xs: tuple, out: Any) -> tuple:
        xs = list(xs)
        for i, o in zip(ci, co):
            xs[i] = out[o]
        return tuple(xs)

    return fresh, feed


def donated(model: Any, inputs: Any, cache_path: Path, args: argparse.Namespace) -> dict:
    """Both jits with the KV caches donated, as a decode loop runs a step: each call's
    updated caches are the next call's (`profile.time_trace(feed=...)`), so an in-place
    update needs no copy. `mirage_jax.jit` reuses the row's cache (no second search). The
    floor counts the caches read once and only the new rows written
    (`Model.floor_us(in_place_cache=True)`) at the run's measured copy bandwidth."""
    import mirage_jax
    from mirage_jax.profile import time_trace

    ci, _ = caches_of(model)
    fresh, feed = decode_loop(model, inputs)
    f = mirage_jax.jit(
        model.fn, cache=cache_path, workers=args.workers, donate_argnums=ci, options=options(args)
    )
    jax.block_until_ready(f(*fresh(0)))
    t_jax = time_trace(jax.jit(model.fn, donate_argnums=ci), fresh, calls=args.calls, feed=feed)
    t_mine = time_trace(f, fresh, calls=args.calls, feed=feed)
    from experiments.models import H100_BANDWIDTH

    bw = getattr(args, "bandwidth", None) or H100_BANDWIDTH
    floor = model.floor_us(bw, in_place_cache=True)
    return {
        "jax_jit_us": t_jax.median_us,
        "mirage_us": t_mine.median_us,
        "speedup": t_jax.median_us / t_mine.median_us,
        "floor_us": floor,
        "of_floor": t_mine.median_us / floor,
        "bandwidth_bytes_per_s": bw,
        "kernels": sum(d.status == "kernel" for d in f.last.decisions),
        "mirage_kernels": _top_kernels(t_mine),
        "region_us": _region_us(t_mine),
        # its own choice (the whole-function check runs again with the caches donated)
        "kernel_regions": {
            str(d.index): d.mugraph.meta.get("structure")
            for d in f.last.decisions
            if d.status == "kernel" and d.mugraph is not None
        },
    }


def _region_us(timing: Any) -> dict[str, float]:
    """Each kernel region's device µs per call within the whole function (`profile.region_times`:
    by the name scope its ops carry), by region index; empty where the trace has no op names."""
    return {str(k): round(us, 3) for k, us in getattr(timing, "regions", ())}


def _top_kernels(timing: Any, top: int = 16) -> list | None:
    """The `top` longest kernels of a `profile.TraceTiming`, rounded (None for other timers)."""
    kernels = getattr(timing, "kernels", None)
    if not kernels:
        return None
    return [[name[:120], round(us, 3), round(n, 2)] for name, us, n in kernels[:top]]


def _with(doc: dict) -> str:
    """The run's `mirage_jax.jit` options, for the method line ("" for none)."""
    return f", options {doc['options']}" if doc.get("options") else ""


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        f"# mirage_jax.jit against jax.jit, fresh cache ({doc['date']}, {m['device']})",
        "",
        f"Method: device time per call, `mirage_jax.profile.time_trace` (the sum of the GPU's "
        f"kernel durations per call from a profiler trace, rotating input sets, median of "
        f"{doc['calls']} calls); `mirage_jax.jit` with an empty cache and its own search "
        f"({doc['workers']} workers, default budget{_with(doc)}), jax {m['jax']}, "
        f"Python {m['python']}"
        + (
            f", commit {reproduce_common.commit_label(doc['versions'])}."
            if doc.get("versions")
            else "."
        ),
        "",
        "| program | first call (s) | jax.jit (µs) | mirage_jax.jit (µs) | speedup | kernels | "
        "per region (µGraph / XLA µs) | whole-function check | matches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        regs = "; ".join(
            f"{g['index']}: {g['status']}"
            + (
                f" ({g['mugraph_us']:.1f}/{g['xla_us']:.1f})"
                if g["mugraph_us"] is not None and g["xla_us"] is not None
                else ""
            )
            for g in r["regions"]
        )
        fc = r["function_check"]
        fcs = "-" if fc is None else f"{fc['choice']} ({fc['kernels_us']:.1f}/{fc['xla_us']:.1f})"
        lines.append(
            f"| {r['key']} | {r['first_call_s']} | {r['jax_jit_us']:.2f} | {r['mirage_us']:.2f} "
            f"| {r['speedup']:.3f}× | {r['kernels']} | {regs} | {fcs} | "
            f"{'yes' if r['matches'] else 'NO ' + format(r['max_rel_error'], '.2e')} |"
        )
    donated_rows = [r for r in doc["rows"] if "donated" in r]
    if donated_rows:
        bw = doc["machine"].get("copy_bandwidth_bytes_per_s")
        lines += [
            "",
            "KV caches donated (`--donate-caches`: both jits with `donate_argnums` on the caches, "
            "each call's updated caches fed to the next, as a decode loop runs). Floor: weights "
            "and caches read once, only the new cache rows written, at the copy bandwidth "
            + (f"measured in this run ({bw / 1e12:.2f} TB/s)." if bw else "of 3.0 TB/s."),
            "",
            "| program | jax.jit (µs) | mirage_jax.jit (µs) | speedup | floor (µs) | × floor |",
            "|---|---|---|---|---|---|",
        ]
        for r in donated_rows:
            g = r["donated"]
            lines.append(
                f"| {r['key']} | {g['jax_jit_us']:.2f} | {g['mirage_us']:.2f} | "
                f"{g['speedup']:.3f}× | {g['floor_us']:.1f} | {g['of_floor']:.2f}× |"
            )
    return "\n".join(lines) + "\n"


def options(args: argparse.Namespace) -> dict:
    """`mirage_jax.jit`'s options for a run (`--no-reread`: `search.Budget.reread` off)."""
    return {"reread": False} if getattr(args, "no_reread", False) else {}


def add_reread(p: argparse.ArgumentParser) -> None:
    """The `--no-reread` flag (shared with `real_baselines`)."""
    p.add_argument(
        "--no-reread",
        action="store_true",
        help="no split norm + projections (options={'reread': False}; on by default)",
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--names", nargs="*", default=None, help="benchmarks (default: all; `--names` alone: none)"
    )
    p.add_argument("--batches", nargs="*", type=int, default=[1, 8, 16])
    p.add_argument("--models", nargs="*", default=[], help="model names, or 'all'")
    p.add_argument("--sizes", nargs="*", default=["realistic"])
    p.add_argument("--model-batches", nargs="*", type=int, default=[1, 8])
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),  # mirage_jax.jit's, recorded as the number it is here
        help="search workers (default: mirage_jax.jit's, %(default)s here)",
    )
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--out", default="experiments/results")
    p.add_argument("--stop-after-s", type=float, default=None, help="start no case after this")
    p.add_argument("--resume", action="store_true", help="keep rows already in the file")
    p.add_argument(
        "--donate-caches",
        action="store_true",
        help="decode models: also time both jits with the KV caches donated (a decode loop)",
    )
    add_reread(p)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "never_slower.json"
    doc = {
        "date": _dt.date.today().isoformat(),
        "machine": {
            "device": str(jax.devices()[0].device_kind),
            "jax": jax.__version__,
            "python": platform.python_version(),
        },
        "versions": reproduce_common.versions(),
        "calls": args.calls,
        "workers": args.workers,
        "options": options(args),
        "rows": [],
    }
    if args.resume and path.exists():
        doc["rows"] = json.loads(path.read_text())["rows"]
    done = {r["key"] for r in doc["rows"]}
    t0 = time.perf_counter()
    if args.donate_caches:  # the floors' bandwidth, measured in this run
        from mirage_jax.profile import copy_bandwidth

        args.bandwidth = copy_bandwidth()[0]
        doc["machine"]["copy_bandwidth_bytes_per_s"] = args.bandwidth
    for key, fn, inputs, dtype, model in _cases(args):
        if key in done:
            continue
        if args.stop_after_s is not None and time.perf_counter() - t0 > args.stop_after_s:
            print(f"stopping before {key}: time limit", flush=True)
            break
        try:
            row = measure(key, fn, inputs, dtype, args, model=model)
        except Exception as e:  # one failing program is reported in the table, not fatal
            row = {"key": key, "error": f"{type(e).__name__}: {e}"[:400]}
            print(f"{key}: FAILED {row['error']}", flush=True)
            (out / "never_slower_errors.json").write_text(json.dumps(row, indent=1))
            continue
        doc["rows"].append(row)
        print(
            f"{key:>28} first {row['first_call_s']:7.1f} s  jax.jit {row['jax_jit_us']:9.2f} µs  "
            f"mirage {row['mirage_us']:9.2f} µs  {row['speedup']:.3f}x  kernels {row['kernels']}"
            f"  match {row['matches']}",
            flush=True,
        )
        if "donated" in row:
            g = row["donated"]
            print(
                f"{'donated caches':>28} jax.jit {g['jax_jit_us']:9.2f} µs  mirage "
                f"{g['mirage_us']:9.2f} µs  {g['speedup']:.3f}x  {g['of_floor']:.2f}x floor",
                flush=True,
            )
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False))
        (out / "never_slower.md").write_text(markdown(doc))


if __name__ == "__main__":
    main()
