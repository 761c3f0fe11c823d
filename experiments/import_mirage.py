"""Import every Mirage checkpoint µGraph and verify it against its benchmark program.

For each file of the original's checkpoints (`experiments.peer`: a clone of the evaluation branch
of https://github.com/mirage-project/mirage, or `--peer DIR` with {a100,h100}/) it imports every
µGraph (`mirage_jax.mugraph.load_mirage_checkpoint`), maps the file to its benchmark in the
original's own form (`<workload>_mirage` in experiments/benchmarks.py, resized to the µGraph's
input shapes where a file was saved at other shapes), and checks each distinct µGraph (by
canonical hash; the files repeat many) with `fields.verify(mugraph, program)`, plus a float
check: the µGraph evaluated in fp16 with jnp against the float64 reference on random inputs.
Writes experiments/results/import_mirage.{md,json}.

    python experiments/import_mirage.py [--trials 2] [--jobs 2] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

RESULTS = ROOT / "experiments" / "results"
FP16_TOL = 2e-2  # max |out - ref| / max |ref| for fp16 evaluation

# file-name prefix -> workload (longest prefixes first)
PREFIXES = (
    ("qknorm_gqa", "qknorm"),
    ("gqa", "gqa"),
    ("rmsnorm", "rmsnorm"),
    ("single_lora", "lora"),
    ("lora", "lora"),
    ("single_gated_mlp", "gated_mlp"),
    ("gated_mlp", "gated_mlp"),
    ("norm_transformer", "ntrans"),
    ("ntrans", "ntrans"),
)

# workload -> named dims read off the µGraph's input shapes
DIMS = {
    "gqa": lambda s: {"heads": s[0][0], "q_len": s[0][1], "head_dim": s[0][2], "kv_len": s[1][2]},
    "qknorm": lambda s: {
        "heads": s[0][0],
        "q_len": s[0][1],
        "head_dim": s[0][2],
        "kv_len": s[1][2],
    },
    "rmsnorm": lambda s: {"rows": s[0][0], "hidden": s[0][1], "out": s[1][1]},
    "lora": lambda s: {"rows": s[0][0], "hidden": s[0][1], "out": s[1][1], "rank": s[2][1]},
    "gated_mlp": lambda s: {"rows": s[0][0], "hidden": s[0][1], "ffn": s[1][1]},
    "ntrans": lambda s: {"rows": s[0][0], "hidden": s[0][1]},
}


def workload_of(stem: str) -> tuple[str, int]:
    """(workload, batch) of a checkpoint file name such as qknorm_gqa_bs8 or lora."""
    for prefix, workload in PREFIXES:
        if stem.startswith(prefix):
            m = re.search(r"_bs(\d+)", stem)
            return workload, int(m.group(1)) if m else 1
    raise KeyError(f"no benchmark for checkpoint {stem!r}")


def benchmark_for(stem: str, input_shapes):
    """The benchmark (mirage form) for a file, resized to the µGraph's input shapes if needed."""
    from experiments import benchmarks as B

    workload, batch = workload_of(stem)
    bm = B.get(f"{workload}_mirage", batch if batch in B.BATCHES else 1)
    if tuple(tuple(s.shape) for s in bm.inputs) != tuple(input_shapes):
        bm = bm.resized(DIMS[workload](input_shapes))
    return bm


_PROGRAMS: dict = {}
_FILES: dict = {}


MIN_DIM = 16  # shrinking stops at this size


def shrink(g, stem: str):
    """The µGraph and its benchmark at reduced shapes: same grids, loops and maps.

    Each named dim of the workload (largest first) is divided by the largest factor in
    64, 32, ..., 2 that keeps it >= MIN_DIM and keeps the µGraph valid (even splits, shape
    rules) with the benchmark's output shape.
    """
    from mirage_jax.mugraph import MuGraphError
    from mirage_jax.mugraph.resize import with_input_shapes

    shapes = tuple(s for s, _ in g.input_avals)
    bm = benchmark_for(stem, shapes)
    dims = dict(bm.dims)
    for name in sorted(dims, key=lambda k: -dims[k]):
        for f in (64, 32, 16, 8, 4, 2):
            if dims[name] % f or dims[name] // f < MIN_DIM:
                continue
            trial = bm.resized({**dims, name: dims[name] // f})
            try:
                g2 = with_input_shapes(g, [s.shape for s in trial.inputs])
            except MuGraphError:
                continue
            if g2.output_avals[0][0] != tuple(trial.output.shape):
                continue
            g, bm, dims = g2, trial, dict(trial.dims)
            break
    return g, bm


def check(job: tuple[str, int, int, int, str]) -> dict:
    """Verify µGraph `index` of `path` against its program; float-check it; time both.

    `mode` "full" checks the µGraph as saved, "small" at the reduced shapes of `shrink`.
    """
    import numpy as np

    import fields
    import lax_ir
    from lax_ir import FloatAlgebra
    from mirage_jax.mugraph import interpret, load_mirage_checkpoint

    path, index, trials, seed, mode = job
    if path not in _FILES:
        _FILES.clear()  # one file at a time per worker (jobs come grouped by file)
        _FILES[path] = load_mirage_checkpoint(path)
    g = _FILES[path][index]
    stem = Path(path).stem
    if mode == "small":
        g, bm = shrink(g, stem)
    else:
        bm = benchmark_for(stem, tuple(s for s, _ in g.input_avals))
    shapes = tuple(s for s, _ in g.input_avals)
    key = (bm.name, shapes)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = lax_ir.capture(bm.fn, *bm.inputs)
    program = _PROGRAMS[key]
    rec = {"benchmark": bm.key, "dims": dict(bm.dims), "mode": mode}
    t = time.perf_counter()
    try:
        v = fields.verify(g, program, trials=trials, seed=seed)
        rec.update(
            verified=bool(v.equal),
            reason=v.reason,
            trials=v.trials,
            bound=v.bound,
            p=v.p,
            q=v.q,
        )
    except Exception as e:  # an op without field meaning, or a shape mismatch
        rec.update(verified=False, reason=f"{type(e).__name__}: {e}")
    rec["verify_s"] = time.perf_counter() - t
    t = time.perf_counter()
    xs = bm.make_inputs(seed)
    ref = np.asarray(bm.reference(*xs), np.float64)
    # fp16, dtype-faithful (fp32 accumulators): XLA at full size; numpy (no per-op compile) when
    # small.
    alg = FloatAlgebra() if mode == "full" else FloatAlgebra(np)
    out = np.asarray(interpret(g, xs, alg)[0], np.float64)
    rec["fp16_rel_err"] = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    if not rec["verified"]:  # evidence: our float64 semantics of their graph against the reference
        x64 = [np.asarray(x, np.float64) for x in xs]
        alg64 = FloatAlgebra(np, "float64")
        out64 = interpret(g, x64, alg64)[0]
        rec["f64_rel_err"] = float(np.max(np.abs(out64 - ref)) / np.max(np.abs(ref)))
        # A tell-tale of a µGraph that reduces input 0 over its last dim before it meets the
        # others (QKNorm: Q only through the row sums of rms_norm(Q), never Q·K).
        perm = np.random.default_rng(seed).permutation(x64[0].shape[-1])
        permuted = [x64[0][..., perm], *x64[1:]]
        out_p = interpret(g, permuted, alg64)[0]
        ref_p = np.asarray(bm.reference(*permuted), np.float64)
        rec["invariant_to_permuting_input0_last_dim"] = bool(np.allclose(out_p, out64, 1e-9, 1e-12))
        rec["reference_invariant_too"] = bool(np.allclose(ref_p, ref, 1e-9, 1e-12))
    rec["float_s"] = time.perf_counter() - t
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2, help="field trials per µGraph")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="at most N distinct µGraphs per file")
    ap.add_argument(
        "--full",
        choices=("none", "bs1", "first"),
        default="bs1",
        help="full-size checks: none, the first µGraph of each batch-1 file, or of every file",
    )
    ap.add_argument("--peer", type=Path, help="the checkpoints (default: $MIRAGE_PEER_DIR)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json")
    args = ap.parse_args(argv)
    if args.render_only:
        saved = json.loads((args.out / "import_mirage.json").read_text())
        (args.out / "import_mirage.md").write_text(_markdown(saved["summary"], saved["files"]))
        return 0

    from mirage_jax.mugraph import load_mirage_checkpoint

    start = time.perf_counter()
    from experiments import peer

    args.peer = peer.find(args.peer)
    if args.peer is None:
        raise SystemExit(f"import_mirage: {peer.HOW_TO_GET}")
    files = sorted(args.peer.glob("*/*.json"))
    rows, jobs, owners = [], {}, defaultdict(set)
    for path in files:
        rel = str(path.relative_to(args.peer))
        try:
            graphs = load_mirage_checkpoint(path)
        except Exception as e:
            rows.append({"file": rel, "mugraphs": 0, "import_error": str(e), "hashes": []})
            continue
        hashes = [g.canonical_hash for g in graphs]
        shapes = tuple(s for s, _ in graphs[0].input_avals)
        bm = benchmark_for(path.stem, shapes)
        rows.append(
            {"file": rel, "mugraphs": len(graphs), "hashes": hashes, "benchmark": _bm_str(bm)}
        )
        # The file's first µGraph at full size; every distinct µGraph at reduced shapes.
        if args.full == "first" or (args.full == "bs1" and workload_of(path.stem)[1] == 1):
            jobs.setdefault((hashes[0], "full"), (str(path), 0, args.trials, args.seed, "full"))
        new = [i for i, h in enumerate(hashes) if (h, "small") not in jobs]
        for i in dict.fromkeys(new[: args.limit or None]):
            jobs.setdefault((hashes[i], "small"), (str(path), i, args.trials, args.seed, "small"))
        for h in hashes:
            owners[h].add(rel)
    import_s = time.perf_counter() - start
    n_graphs = sum(r["mugraphs"] for r in rows)
    print(
        f"imported {n_graphs} µGraphs from {len(files)} files in {import_s:.1f}s; "
        f"{len(jobs)} checks ({sum(m == 'full' for _, m in jobs)} at full size)",
        flush=True,
    )
    # Full-size checks first (the slowest), then by file, so workers reuse loaded files.
    order = sorted(jobs, key=lambda k: (k[1] != "full", jobs[k][0], jobs[k][1]))
    results: dict[tuple[str, str], dict] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = pool.map(check, [jobs[k] for k in order], chunksize=1)
        for n, (k, rec) in enumerate(zip(order, futures)):
            results[k] = rec
            if (n + 1) % 100 == 0 or k[1] == "full":
                print(
                    f"  {n + 1}/{len(order)} checked, {time.perf_counter() - start:.0f}s",
                    flush=True,
                )
    total_s = time.perf_counter() - start

    table = []
    for r in rows:
        recs = [results[(h, "small")] for h in r["hashes"] if (h, "small") in results]
        fulls = [results[k] for k in {(h, "full") for h in r["hashes"]} if k in results]
        why = _why([x for x in recs + fulls if not x["verified"]])
        table.append(
            {
                "file": r["file"],
                "mugraphs": r["mugraphs"],
                "checked": len(recs),
                "verified": sum(x["verified"] for x in recs),
                "rejected": sum(not x["verified"] for x in recs),
                "full_size": f"{sum(x['verified'] for x in fulls)}/{len(fulls)}",
                "why": why or r.get("import_error", ""),
                "benchmark": r.get("benchmark", ""),
                "max_fp16_rel_err_verified": max(
                    (x["fp16_rel_err"] for x in recs + fulls if x["verified"]), default=None
                ),
            }
        )
    small = [x for (_, m), x in results.items() if m == "small"]
    full = [x for (_, m), x in results.items() if m == "full"]
    disagree = [
        h
        for (h, m) in results
        if m == "full"
        and (h, "small") in results
        and results[(h, "full")]["verified"] != results[(h, "small")]["verified"]
    ]
    summary = {
        "files": len(files),
        "mugraphs": n_graphs,
        "distinct": len({h for h, _ in jobs}),
        "verified_total": sum(t["verified"] for t in table),
        "rejected_total": sum(t["rejected"] for t in table),
        "verified_distinct": sum(x["verified"] for x in small),
        "rejected_distinct": sum(not x["verified"] for x in small),
        "full_size_checked": len(full),
        "full_size_verified": sum(x["verified"] for x in full),
        "full_vs_small_disagreements": disagree,
        "rejected_workloads": sorted(
            {x["benchmark"].rsplit("_b", 1)[0] for x in results.values() if not x["verified"]}
        ),
        "all_rejected_float_wrong": all(
            x.get("f64_rel_err", 0) > 0.1 for x in results.values() if not x["verified"]
        ),
        "max_fp16_rel_err_verified": max(
            (x["fp16_rel_err"] for x in results.values() if x["verified"]), default=None
        ),
        "trials": args.trials,
        "full": args.full,
        "seed": args.seed,
        "jobs": args.jobs,
        "seconds": round(total_s, 1),
        "fp16_tolerance": FP16_TOL,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    per_graph = {f"{h}:{m}": {**rec, "files": sorted(owners[h])} for (h, m), rec in results.items()}
    (args.out / "import_mirage.json").write_text(
        json.dumps({"summary": summary, "files": table, "checks": per_graph}, indent=1)
    )
    (args.out / "import_mirage.md").write_text(_markdown(summary, table))
    print(json.dumps(summary, indent=1))
    return 0


def _bm_str(bm) -> str:
    return f"{bm.name} " + ",".join(f"{k}={v}" for k, v in bm.dims)


def _why(rejected: list[dict]) -> str:
    """Rejections grouped by reason, with the float64 evidence of each group."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for rec in rejected:
        inv = rec.get("invariant_to_permuting_input0_last_dim") and not rec.get(
            "reference_invariant_too"
        )
        groups[(rec.get("reason", ""), rec.get("mode"), bool(inv))].append(rec)
    parts = []
    for (reason, mode, inv), recs in groups.items():
        errs = [r["f64_rel_err"] for r in recs if "f64_rel_err" in r]
        text = f"{len(recs)}× ({mode} size) field: {reason}"
        if errs:
            text += f"; float64 evaluation off by {min(errs):.1f}–{max(errs):.1f} (relative)"
        if inv:
            text += "; output invariant to permuting input 0's last dim (the reference is not)"
        parts.append(text)
    return "; ".join(parts)


FULL_DOC = {"none": "no file", "bs1": "every batch-1 file", "first": "every file"}


def _markdown(summary: dict, table: list[dict]) -> str:
    s = summary
    args_full = s["full"]
    lines = [
        "# Import and verification of the original Mirage's checkpoint µGraphs",
        "",
        "Written by `experiments/import_mirage.py`. Every µGraph is imported with "
        "`mirage_jax.mugraph.load_mirage_checkpoint` (each op's recorded shape checked against "
        "our shape inference) and verified with `fields.verify(mugraph, program)` against the "
        "benchmark in the original's own form (`<workload>_mirage`: rms_norm without eps, "
        "unscaled attention with no max shift, QKNorm on Q and V) at the µGraph's shapes.",
        "",
        "How: identical µGraphs (same canonical hash; the files repeat many) are checked once. "
        "Every distinct µGraph is verified at reduced shapes: the same grids, loop ranges, maps "
        "and ops, with each named dim divided while every split stays even "
        "(`mirage_jax.mugraph.resize.with_input_shapes`), since the field evaluation costs "
        "grow with the element count and the µGraph's correctness class does not. The first "
        f"µGraph of {FULL_DOC[args_full]} is also verified at its full saved shapes (`full size` "
        "column), and evaluated there in fp16 with jnp/XLA; at reduced shapes the fp16 "
        "evaluation uses numpy (dtype-faithful, fp32 accumulators). "
        f"`fp16 err` is max|out − ref| / max|ref| of the µGraph evaluated in fp16 against "
        f"the float64 reference on random inputs (tolerance {FP16_TOL}).",
        "",
        f"**{s['files']} files, {s['mugraphs']} µGraphs ({s['distinct']} distinct): verified "
        f"{s['verified_total']} ({s['verified_distinct']} distinct), rejected "
        f"{s['rejected_total']} ({s['rejected_distinct']} distinct).** Full size: "
        f"{s['full_size_verified']}/{s['full_size_checked']} verified; full/reduced "
        f"disagreements: {len(s['full_vs_small_disagreements'])}. {s['trials']} field trials "
        f"each, seed {s['seed']}; {s['seconds']} s on {s['jobs']} processes.",
        "",
        "| file | µGraphs | verified | rejected | full size | why rejected | benchmark | max fp16 err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        err = t["max_fp16_rel_err_verified"]
        lines.append(
            f"| {t['file']} | {t['mugraphs']} | {t['verified']} | {t['rejected']} "
            f"| {t['full_size']} | {t['why']} | {t['benchmark']} "
            f"| {'' if err is None else f'{err:.1e}'} |"
        )
    if s["rejected_total"]:
        lines += ["", "## Rejections", ""]
        if s["rejected_workloads"] == ["qknorm_mirage"] and s["all_rejected_float_wrong"]:
            lines.append(REJECTIONS.format(v=s["verified_distinct"], r=s["rejected_distinct"]))
        else:
            lines.append("Rejected workloads: " + ", ".join(s["rejected_workloads"]) + ".")
    return "\n".join(lines) + "\n"


REJECTIONS = """\
Every rejected µGraph is rejected by the field test *and* its float64 evaluation disagrees with
the float64 reference (relative errors above 1, column `why`), so the µGraph computes another
function: the error is theirs unless our semantics of some op is wrong. Three observations say
it is theirs. (1) Our semantics of every op these µGraphs use (rms_norm, accum_sum,
accum_sum_last, accum_rms_last, mul, div, exp, matmul) is the same code that verifies, exactly
in the field, the {v} distinct RMSNorm, GQA, GatedMLP, LoRA and nTrans µGraphs (kernel-level
exp and matmul, which only QKNorm uses, run the same op-table entries as the block-level ones
GQA uses), and every op's recorded shape matched our shape inference on import. (2) The rejected µGraphs are exactly the
{r} distinct QKNorm µGraphs (all 190 of each QKNorm file; no other workload has a rejection).
(3) In every one of them the output is unchanged when the head dim of Q (input 0) is permuted,
while attention's output changes: these µGraphs use Q only through row sums (accum_sum_last or
accum_rms_last of rms_norm(Q) over the head dim) and then multiply with rows of K (a `mul`
outer product, or a matmul over the wrong dim), so Q·K is never formed. Such a function cannot
equal softmax(rms_norm(Q)·K)·rms_norm(V) on generic inputs. The original accepted them with a
single deterministic fingerprint test over Z_167 × Z_83 (MIRAGE.md §4), on structured inputs
((input_idx·100003 + idx) mod pq); its issues #166, #236 and #377 report QKNorm searches that
find no µGraph (MIRAGE.md §8).
See tests/test_mugraph_import.py::test_qknorm_checkpoints_are_wrong.
"""


if __name__ == "__main__":
    raise SystemExit(main())
