"""`experiments.reproduce --phase time`: every contender checked and timed on the GPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.errors import max_rel_error
from experiments.models.attention import import_tokamax
from experiments.reproduce_common import (
    FP16_TOL,
    QUICK_OUT,
    SCHEMA,
    _err,
    _now,
    find_peer,
    newest,
    today,
    versions,
)
from experiments.reproduce_contenders import _imported, _ours, baselines


# ---------------------------------------------------------------------------- time phase
def _has_gpu() -> bool:
    import jax

    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def machine_name(device: str) -> str:
    """A short file-name slug of a device kind: "NVIDIA H100 80GB HBM3" → "h100"."""
    m = re.search(r"\b([ABHLGV]\d{2,3}[A-Z]?)\b", device.upper())
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


rel_err = max_rel_error
"""max|out − ref| / max|ref| (`experiments.errors.max_rel_error`)."""


class _Inputs:
    """Input sets per benchmark and per layout, made once on the device (never timed)."""

    def __init__(self, n_sets: Callable[[Any], int]):
        self.n_sets = n_sets
        self._sets: dict[str, list[tuple]] = {}
        self._host: dict[str, list] = {}
        self._layouts: dict[tuple[str, int], list[tuple]] = {}
        self._refs: dict[str, Any] = {}

    def sets(self, bm: Any, layout: Callable | None = None) -> list[tuple]:
        import jax

        if bm.key not in self._sets:
            n = self.n_sets(bm)
            host = [bm.make_inputs(seed) for seed in range(n)]
            self._host[bm.key] = host[0]
            self._sets[bm.key] = [tuple(jax.device_put(x) for x in xs) for xs in host]
        if layout is None:
            return self._sets[bm.key]
        key = (bm.key, id(layout))
        if key not in self._layouts:
            f = jax.jit(layout)
            self._layouts[key] = [tuple(f(*xs)) for xs in self._sets[bm.key]]
        return self._layouts[key]

    def reference(self, bm: Any) -> Any:
        if bm.key not in self._refs:
            self.sets(bm)
            self._refs[bm.key] = bm.reference(*self._host[bm.key])
        return self._refs[bm.key]

    def clear(self) -> None:
        self._sets.clear(), self._host.clear(), self._layouts.clear(), self._refs.clear()


def _run_contender(c: dict, bm: Any, inputs: _Inputs, opts: dict) -> dict[str, Any]:
    """Float-check one contender against the float64 reference, then time it."""
    import jax

    from mirage_jax import profile

    rec: dict[str, Any] = {"label": c["label"], "kind": c.get("kind", "baseline")}
    if "candidates" in c:
        rec["candidates"] = c["candidates"]
    if "fn" not in c:
        rec["status"] = c.get("status", "unsupported")
        return rec
    bench = c.get("bench", bm)
    rec["form"] = bench.name
    if opts["timed"] and time.monotonic() > opts["deadline"]:
        rec["status"] = "skipped: time limit (--deadline-s)"
        return rec
    t0 = time.perf_counter()
    try:
        sets = inputs.sets(bench, c.get("layout"))
        out = jax.block_until_ready(c["fn"](*sets[0]))
        if "unlayout" in c:  # the contender's own output layout, converted untimed
            out = c["unlayout"](out)
        rec["rel_err"] = rel_err(out, inputs.reference(bench))
    except Exception as e:
        rec.update(status=f"failed: {_err(e)}", compile_s=round(time.perf_counter() - t0, 2))
        return rec
    rec["compile_s"] = round(time.perf_counter() - t0, 2)
    rec["valid"] = rec["rel_err"] <= FP16_TOL
    if not rec["valid"] and rec["kind"] not in ("imported", "imported_xla"):
        rec["status"] = f"float check failed (rel err {rec['rel_err']:.2g} > {FP16_TOL})"
        return rec
    if not opts["timed"]:
        rec["status"] = "ok (not timed)"
        return rec
    for i, method in enumerate(opts["methods"]):
        try:
            if method == "trace":
                t = profile.time_trace(
                    c["fn"], lambda s: sets[s], calls=opts["calls"], warmup=opts["warmup"],
                    max_sets=len(sets),
                )  # fmt: skip
            else:
                t = profile.time_device(
                    c["fn"], lambda s: sets[s], chain=opts["chain"], repeats=opts["repeats"],
                    warmup=opts["warmup"], max_sets=len(sets),
                )  # fmt: skip
        except Exception as e:
            rec["status"] = f"timing failed ({method}): {_err(e)}"
            return rec
        skip = ("method", "device", "samples_us")
        rec["time" if i == 0 else f"time_{method}"] = {
            k: v for k, v in t.as_dict().items() if k not in skip
        }
    rec["status"] = "ok" if rec["valid"] else "ok (float check failed: not counted)"
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def _us(c: dict) -> float | None:
    t = c.get("time")
    return t["median_us"] if t and c.get("valid") else None


def summarize(row: dict, bandwidth: float | None) -> dict:
    """Best of ours, best baseline, speedup, fraction of the floor, the original's µGraph."""
    cs = row["contenders"]

    def best(kind: str, backend: str = "") -> dict | None:
        """The fastest valid contender of `kind` (labelled "(backend)" when one is given)."""
        timed = [c for c in cs if c["kind"] == kind and _us(c) is not None]
        timed = [c for c in timed if not backend or c["label"].endswith(f"({backend})")]
        return min(timed, key=_us) if timed else None

    ours, base, imp = best("ours"), best("baseline"), best("imported")
    xla = next((c for c in cs if c["label"] == "XLA"), None)
    row["ours"] = {"label": ours["label"], "us": _us(ours)} if ours else None
    row["best_baseline"] = {"label": base["label"], "us": _us(base)} if base else None
    row["xla_us"] = _us(xla) if xla else None
    row["speedup"] = _us(base) / _us(ours) if ours and base else None
    row["speedup_vs_xla"] = row["xla_us"] / _us(ours) if ours and row["xla_us"] else None
    jit = [u for u in (row["ours"] and row["ours"]["us"], row["xla_us"]) if u]
    row["jit_us"] = min(jit) if jit else None  # what mirage_jax.jit runs: never slower than XLA
    if bandwidth:
        row["floor_us"] = row["floor_bytes"] / bandwidth * 1e6
        row["fraction_of_floor"] = row["floor_us"] / _us(ours) if ours else None
    row["vs_original"] = {}
    for backend in ("pallas", "triton"):  # issue 6: same backend, same run
        o, i = best("ours", backend), best("imported", backend)
        if o and i:
            row["vs_original"][backend] = {
                "ours": o["label"], "ours_us": _us(o), "original": i["label"],
                "original_us": _us(i), "ratio": _us(i) / _us(o),
            }  # fmt: skip
    if imp:
        imp_xla = next((c for c in cs if c["kind"] == "imported_xla" and c.get("time")), None)
        row["imported_best"] = {
            "label": imp["label"],
            "us": _us(imp),
            "speedup": _us(base) / _us(imp) if base else None,
            "speedup_vs_xla_same_form": (
                imp_xla["time"]["median_us"] / _us(imp) if imp_xla else None
            ),
        }
    return row


def _time_benchmark(entry: dict, ctx: dict) -> dict[str, Any]:
    from experiments import benchmarks as B

    bm = B.get(entry["name"], entry["batch"])
    bm = bm.small() if entry.get("small") else bm
    row: dict[str, Any] = {
        k: entry.get(k) for k in ("key", "name", "batch", "dims", "program_hash", "floor_bytes")
    }
    row["search"] = [
        {"region": r["index"], **{k: v for k, v in r["search"].items() if k != "stats"},
         "seconds_by_phase": (r["search"].get("stats") or {}).get("seconds"),
         "verified": (r["search"].get("stats") or {}).get("verified"),
         "accepted": (r["search"].get("stats") or {}).get("accepted"),
         "candidates": len(r["candidates"])}
        for r in entry["regions"]
    ]  # fmt: skip
    row["imported_plan"] = {
        k: v for k, v in (entry.get("imported") or {}).items() if k not in ("candidates", "dropped")
    }
    t0 = time.perf_counter()
    base = baselines(bm, ctx["interpret"], ctx["on_gpu"])
    ours = _ours(entry, bm, ctx["backends"], ctx["interpret"], ctx["triton_candidates"])
    if not ours:
        ours = [{"label": "mirage_jax", "kind": "ours",
                 "status": "no verified candidate (mirage_jax.jit runs XLA)"}]  # fmt: skip
    # The order matters when the time limit cuts a run short: XLA, our first candidate and
    # the baselines first, so that every benchmark that is timed at all has a speedup.
    contenders = [base[0], ours[0], *base[1:], *ours[1:]]
    contenders += _imported(
        entry, ctx["peer"], bool(entry.get("small")), ctx["interpret"], ctx["backends"]
    )
    row["contenders"] = [_run_contender(c, bm, ctx["inputs"], ctx) for c in contenders]
    ctx["inputs"].clear()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return summarize(row, ctx["bandwidth"])


def _load_plan(args: argparse.Namespace) -> tuple[Path, dict]:
    path = Path(args.plan) if args.plan else None
    if path is None:
        path = args.out / "plan.json" if args.quick else newest(args.plan_dir, "plan-*.json")
    if path is None or not path.exists():
        raise SystemExit(f"reproduce: no plan file ({path or args.plan_dir}); run --phase search")
    return path, json.loads(path.read_text())


def phase_time(args: argparse.Namespace) -> Path:
    """Lower, float-check and time every contender of the plan; write results, table, figure."""
    import jax

    from experiments import figures
    from mirage_jax import profile

    plan_path, plan = _load_plan(args)
    dev = jax.devices()[0]
    device = str(getattr(dev, "device_kind", dev.platform))
    on_gpu = dev.platform == "gpu"
    timed = on_gpu and not plan.get("quick")
    backends = ["pallas"]
    triton = "not available: jax_triton is not importable"
    if on_gpu and importlib.util.find_spec("jax_triton") is not None:
        backends.append("triton")
        triton = "ok"
    elif not on_gpu:
        triton = "not run: the jax-triton backend needs a GPU"
    entries = [
        e for e in plan["benchmarks"]
        if (args.names is None or e["name"] in args.names)
        and (args.batches is None or e["batch"] in args.batches)
    ]  # fmt: skip
    t_start = time.monotonic()
    bandwidth, bw_rec = None, None
    if timed:
        bandwidth, bw_timing = profile.copy_bandwidth(repeats=args.repeats)
        bw_rec = {"bytes_per_s": bandwidth, "median_us": bw_timing.median_us}

    def n_sets(bm: Any) -> int:
        if not timed:
            return 1
        per_set = max(1, bm.floor_bytes - math.prod(bm.output.shape) * bm.dtype.itemsize)
        return min(args.chain + 1, max(1, math.ceil(2 * profile.L2_BYTES / per_set)))

    ctx = {
        "on_gpu": on_gpu, "interpret": not on_gpu, "backends": backends, "timed": timed,
        "peer": find_peer(args.peer), "bandwidth": bandwidth, "inputs": _Inputs(n_sets),
        "chain": args.chain, "repeats": args.repeats, "warmup": args.warmup,
        "deadline": t_start + args.deadline_s, "triton_candidates": args.triton_candidates,
        "methods": args.methods, "calls": args.calls,
    }  # fmt: skip
    machine = machine_name(device) if on_gpu else "cpu"
    stem = "quick" if plan.get("quick") else f"{machine}-{today()}"
    out_dir = args.out if args.out_given or not plan.get("quick") else QUICK_OUT
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "kind": "mirage_jax reproduce results",
        "schema": SCHEMA,
        "machine": machine,
        "device": device,
        "date": today(),
        "created": _now(),
        "quick": bool(plan.get("quick")),
        "timed": timed,
        "complete": False,
        "command": " ".join([args.prog, *args.argv]),
        "method": _method(args, timed),
        "timing": {"chain": args.chain, "repeats": args.repeats, "warmup": args.warmup},
        "float_tolerance": FP16_TOL,
        "bandwidth": bw_rec,
        "versions": versions(),
        "plan": {"file": plan_path.name, "created": plan.get("created"),
                 "options": plan.get("options"), "versions": plan.get("versions")},
        "contenders_available": {
            "pallas": "ok" + ("" if on_gpu else " (interpret mode)"), "triton": triton,
            "cudnn": "ok" if on_gpu else "unsupported: no GPU",
            "tokamax": _tokamax_status(on_gpu),
            "original": str(ctx["peer"]) if ctx["peer"] else "no --peer folder",
        },
        "reported": figures.REPORTED,
        "benchmarks": [],
    }  # fmt: skip
    json_path = out_dir / f"{stem}.json"
    for n, entry in enumerate(entries):
        row = _time_benchmark(entry, ctx)
        results["benchmarks"].append(row)
        print(_progress_line(n, len(entries), row), flush=True)
        json_path.write_text(json.dumps(results, indent=1, default=str))
    results["complete"] = time.monotonic() <= ctx["deadline"]
    results["seconds"] = round(time.monotonic() - t_start, 1)
    if args.merge:
        _merge(results, plan, Path(args.merge))
    results["summary"] = figures.summary(results)
    json_path.write_text(json.dumps(results, indent=1, default=str))
    for p in figures.write(results, out_dir, stem):
        print(f"wrote {p}")
    print(f"wrote {json_path} ({results['seconds']}s)")
    return json_path


def _merge(results: dict, plan: dict, path: Path) -> None:
    """Add the rows of an earlier results file (same device) that this run did not time."""
    old = json.loads(path.read_text())
    if old.get("device") != results["device"]:
        raise SystemExit(f"--merge {path}: timed on {old.get('device')}, not {results['device']}")
    done = {r["key"] for r in results["benchmarks"]}
    order = {e["key"]: i for i, e in enumerate(plan["benchmarks"])}
    rows = results["benchmarks"] + [r for r in old["benchmarks"] if r["key"] not in done]
    results["benchmarks"] = sorted(rows, key=lambda r: order.get(r["key"], len(order)))
    # complete when no row kept from either run was cut short by the time limit
    results["complete"] = results["complete"] and not any(
        "skipped: time limit" in c.get("status", "")
        for r in results["benchmarks"]
        for c in r.get("contenders", [])
    )
    results["merged_from"] = {"file": path.name, "created": old.get("created"),
                              "seconds": old.get("seconds"), "bandwidth": old.get("bandwidth")}  # fmt: skip


def _tokamax_status(on_gpu: bool) -> str:
    if not on_gpu:
        return "unsupported: no GPU"
    try:
        tk = import_tokamax()
        return f"ok ({getattr(tk, '__version__', '?')})"
    except Exception as e:
        return f"not available: {_err(e)}"


def _method(args: argparse.Namespace, timed: bool) -> str:
    if not timed:
        return (
            "not timed: --quick or no GPU; every contender is lowered (Pallas interpret mode on "
            "the CPU) and checked against the float64 reference only"
        )
    described = {
        "trace": (
            f"mirage_jax.profile.time_trace (profiler trace): {args.calls} calls, each "
            "dispatched and completed alone with rotating input sets, under jax.profiler.trace; "
            "per call = the sum of the durations of the kernels the GPU ran (no launch gaps); "
            f"{args.warmup} warm-up calls; median and p10/p90 over calls"
        ),
        "chained": (
            f"mirage_jax.profile.time_device (chained): one jitted program calls the contender "
            f"{args.chain + 1} times (calls ordered by lax.optimization_barrier; input sets "
            f"rotate so the chain's working set exceeds 2x the L2), timed against 1 call; per "
            f"call = (t({args.chain + 1}) - t(1)) / {args.chain}; {args.warmup} warm-up runs; "
            f"median and p10/p90 over {args.repeats} repeats (includes launch gaps: it reads "
            "several µs above the trace for small kernels, experiments/results/timing_check_*)"
        ),
    }
    head, *others = args.methods
    return (
        f"Headline: {described[head]}."
        + "".join(f" Also recorded (time_{m}): {described[m]}." for m in others)
        + " Layout changes a baseline needs (cuDNN/tokamax "
        "(B,T,N,H), Pallas decode (B,S,K,D)) are made once outside the timed program, on its "
        "inputs and (for the float check only) its output. Floors use the copy bandwidth "
        "measured in the same run."
    )


def _progress_line(n: int, total: int, row: dict) -> str:
    parts = []
    for c in row["contenders"]:
        t = c.get("time")
        parts.append(
            f"{c['label']}={t['median_us']:.1f}µs" if t else f"{c['label']}: {c['status']}"
        )
    sp = row.get("speedup")
    head = f"[{n + 1}/{total}] {row['key']} ({row['seconds']}s)"
    return head + (f" speedup {sp:.2f}x" if sp else "") + "\n    " + "\n    ".join(parts)
