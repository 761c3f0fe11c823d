"""Reconcile the two device-time methods, and hold the lowered gqa µGraphs to the split-KV yardstick.

GPU only. Two parts, one JSON + Markdown report:

1. methods: for each contender, the chained method (`profile.time_device`), the profiler-trace
   method (`profile.time_trace`: sum of kernel durations per call, each call alone) and the
   chained program under the profiler (kernel sum and first-start-to-last-end span per call
   inside the chain). If the chained figure is near the span inside the chain and far above the
   kernel sum, the chain is bound by kernel launches, not by the kernels.
2. gqa (the original's form, b=1 and b=8): XLA, the hand-written split-KV kernel
   (`experiments.reference_kernels.split_kv_gqa`, 4/8/16 splits), the original's µGraphs
   (cheapest by the cost model) and our searched ones (from a reproduce plan), lowered with
   a sweep of Pallas configs (num_warps × num_stages), all by both methods.

    python -m experiments.timing_check --peer build/peer --plan PLAN.json [PLAN2.json] --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import jax

from experiments import benchmarks as B
from experiments.errors import max_rel_error as rel_err
from experiments.reproduce_common import versions
from mirage_jax import profile

CONFIGS = [(w, s) for w in (4, 8) for s in (1, 2, 3)]
"""(num_warps, num_stages) of the Pallas config sweep."""


def _sets(bm: Any, n: int) -> list[tuple]:
    return [tuple(jax.device_put(x) for x in bm.make_inputs(s)) for s in range(n)]


def measure(label: str, fn: Any, bm: Any, sets: list[tuple], ref: Any, opts: dict) -> dict:
    """Float-check `fn`, then time it by both methods and trace its chain."""
    rec: dict[str, Any] = {"label": label, "benchmark": bm.key}
    t0 = time.perf_counter()
    try:
        out = jax.block_until_ready(fn(*sets[0]))
        rec["rel_err"] = rel_err(out[0] if isinstance(out, (list, tuple)) else out, ref)
        chained = profile.time_device(
            fn, lambda s: sets[s], chain=opts["chain"], repeats=opts["repeats"], max_sets=len(sets)
        )
        rec["chained_us"] = chained.median_us
        rec["chained_p10_p90"] = [chained.p10_us, chained.p90_us]
        traced = profile.time_trace(fn, lambda s: sets[s], calls=opts["calls"], max_sets=len(sets))
        rec["trace_us"] = traced.median_us
        rec["trace_p10_p90"] = [traced.p10_us, traced.p90_us]
        rec["trace_span_us"] = traced.span_us
        rec["kernels"] = [list(k) for k in traced.kernels]
        n = opts["chain"] + 1
        prog = profile.chained(fn, n)
        arg = [sets[i % len(sets)] for i in range(n)]
        jax.block_until_ready(prog(arg))
        events = profile.trace_events(lambda: jax.block_until_ready(prog(arg)))
        if events:
            end = max(e.start_ns + e.duration_ns for e in events)
            rec["in_chain_sum_us"] = sum(e.duration_ns for e in events) / n / 1e3
            rec["in_chain_span_us"] = (end - events[0].start_ns) / n / 1e3
        rec["status"] = "ok"
    except Exception as e:
        rec["status"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc()
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    print(_line(rec), flush=True)
    return rec


def _line(r: dict) -> str:
    def f(k):
        v = r.get(k)
        return "–" if v is None else f"{v:.1f}"

    return (
        f"{r['benchmark']:>14} {r['label'][:58]:<58} chained {f('chained_us'):>6} trace "
        f"{f('trace_us'):>6} in-chain sum {f('in_chain_sum_us'):>6} span "
        f"{f('in_chain_span_us'):>6} err {r.get('rel_err', float('nan')):.1e} {r['status'][:60]}"
    )


def _plan_mugraphs(plan: dict, name: str, batch: int, top: int) -> list[tuple[str, Any]]:
    from mirage_jax.mugraph.serialize import from_dict

    out = []
    for e in plan.get("benchmarks", []):
        if e["name"] != name or e["batch"] != batch or len(e["regions"]) != 1:
            continue
        for c in e["regions"][0]["candidates"][:top]:
            out.append((f"ours #{c['rank'] + 1}", from_dict(c["mugraph"])))
        return out
    return out


def _imported(peer: Path, bm: Any, top: int) -> list[tuple[str, Any]]:
    from experiments.reproduce_search import _rank_imported

    path = peer / "h100" / bm.checkpoint
    ranked = _rank_imported(path)
    shapes = [tuple(x.shape) for x in bm.inputs]
    keep = [(i, g) for _, i, g in ranked if [s for s, _ in g.input_avals] == shapes]
    return [(f"original's [{i}]", g) for i, g in keep[:top]]


def _lowered(g: Any, backend: str = "pallas", config: Any = None) -> Any:
    from mirage_jax.lower import lower

    impl = lower(g, backend=backend, config=config)
    return jax.jit(lambda *xs: impl(*xs)[0])


def run(args: argparse.Namespace) -> dict:
    from experiments.reference_kernels import split_kv_gqa
    from mirage_jax.lower.pallas import PallasConfig

    opts = {"chain": args.chain, "repeats": args.repeats, "calls": args.calls}
    plan: dict[str, Any] = {"benchmarks": []}
    for path in args.plan:  # earlier files first; a later file's entry for a benchmark wins
        plan["benchmarks"] = [
            *json.loads(Path(path).read_text())["benchmarks"],
            *plan["benchmarks"],
        ]
    peer = Path(args.peer) if args.peer else None
    rows: list[dict] = []
    deadline = time.monotonic() + args.deadline_s

    def go(label, make, bm, sets, ref):
        if time.monotonic() > deadline:
            rows.append({"label": label, "benchmark": bm.key, "status": "skipped: deadline"})
            return
        try:
            fn = make()
        except Exception as e:
            rows.append({"label": label, "benchmark": bm.key, "status": f"lowering failed: {e}"})
            print(f"{bm.key} {label}: lowering failed: {e}", flush=True)
            return
        rows.append(measure(label, fn, bm, sets, ref, opts))

    # ---- part 2 first (it is what issue 5 asks): gqa against the yardstick
    for b in args.gqa_batches:
        bm = B.get("gqa_mirage", b)
        sets = _sets(bm, args.sets)
        ref = bm.reference(*bm.make_inputs(0))
        go("XLA", lambda bm=bm: jax.jit(bm.fn), bm, sets, ref)
        for splits in (4, 8, 16):
            go(
                f"hand-written split-KV ({splits} splits)",
                lambda s=splits: jax.jit(lambda q, k, v: split_kv_gqa(q, k, v, splits=s)),
                bm,
                sets,
                ref,
            )
        graphs = (_imported(peer, bm, args.top) if peer else []) + _plan_mugraphs(
            plan, "gqa", b, args.top
        )
        for label, g in graphs:
            go(f"{label} pallas default", lambda g=g: _lowered(g), bm, sets, ref)
            for w, s in CONFIGS:
                cfg = PallasConfig(num_warps=w, num_stages=s)
                go(f"{label} pallas w{w} s{s}", lambda g=g, c=cfg: _lowered(g, config=c), bm,
                   sets, ref)  # fmt: skip
            go(f"{label} triton default", lambda g=g: _lowered(g, "triton"), bm, sets, ref)

    # ---- part 1: the methods side by side on the other benchmarks
    for name in args.names:
        bm = B.get(name, 1)
        sets = _sets(bm, args.sets)
        ref = bm.reference(*bm.make_inputs(0))
        go("XLA", lambda bm=bm: jax.jit(bm.fn), bm, sets, ref)
        for label, g in _plan_mugraphs(plan, name, 1, 1):
            go(f"{label} pallas", lambda g=g: _lowered(g), bm, sets, ref)
        mname = f"{bm.workload}_mirage"
        if peer and mname in B.BENCHMARKS and bm.workload != "qknorm":
            mbm = B.get(mname, 1)
            msets = _sets(mbm, args.sets)
            mref = mbm.reference(*mbm.make_inputs(0))
            for label, g in _imported(peer, mbm, 1):
                go(f"{label} pallas", lambda g=g: _lowered(g), mbm, msets, mref)
    bw, _ = profile.copy_bandwidth(chain=8, repeats=5)
    return {
        "kind": "mirage_jax timing check",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": jax.devices()[0].device_kind,
        "versions": versions(),
        "options": vars(args),
        "copy_bandwidth_bytes_per_s": bw,
        "methods": {
            "chained": "profile.time_device: (t(N+1) - t(1)) / N of a jitted chain, median",
            "trace": "profile.time_trace: per call (each alone), sum of GPU kernel durations",
            "in_chain": "the chained program of N+1 calls under the profiler: kernel-duration "
            "sum and first-start-to-last-end span, per call",
        },
        "rows": rows,
    }


def markdown(res: dict) -> str:
    lines = [
        f"# Timing check: {res['device']}, {res['created']}",
        "",
        "Written by `python -m experiments.timing_check`. Columns (µs per call): **chained** "
        "(the method of every other results file), **trace** (sum of kernel durations per call, "
        "profiler), **in-chain sum / span** (the chained program under the profiler: kernel "
        "time and wall span per call). Copy bandwidth "
        f"{res['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s.",
        "",
        "| benchmark | contender | chained | trace | in-chain sum | in-chain span | rel err | "
        "top kernels (µs/call) | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v):
        return "–" if v is None else f"{v:.1f}"

    for r in res["rows"]:
        ks = "; ".join(f"{n[:28]} {us:.1f}" for n, us, _ in (r.get("kernels") or [])[:3])
        err = r.get("rel_err")
        lines.append(
            f"| {r['benchmark']} | {r['label']} | {f(r.get('chained_us'))} | "
            f"{f(r.get('trace_us'))} | {f(r.get('in_chain_sum_us'))} | "
            f"{f(r.get('in_chain_span_us'))} | {'–' if err is None else f'{err:.1e}'} | {ks} | "
            f"{r['status'][:80]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", help="folder holding h100/<checkpoint>.json (the original's)")
    p.add_argument("--plan", nargs="*", default=[], help="reproduce plans (our µGraphs)")
    p.add_argument("--out", default="experiments/results")
    p.add_argument("--gqa-batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--names", nargs="*", default=["ntrans", "lora", "rmsnorm", "gated_mlp"])
    p.add_argument("--top", type=int, default=1, help="µGraphs per source for gqa")
    p.add_argument("--chain", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--sets", type=int, default=8, help="rotating input sets")
    p.add_argument("--deadline-s", type=float, default=420)
    args = p.parse_args(argv)
    if jax.devices()[0].platform != "gpu":
        p.error("timing_check needs a GPU (both methods time device kernels)")
    res = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"timing_check_{time.strftime('%Y-%m-%d')}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(res))
    print(f"wrote {out / stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
