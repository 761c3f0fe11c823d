"""`experiments.reproduce --phase search`: the plan of candidates per benchmark (CPU)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from experiments.reproduce_common import (
    COMPARABLE,
    SCHEMA,
    _err,
    _now,
    _output_order,
    _region_programs,
    find_peer,
    newest,
    suite,
    today,
    versions,
)


# ---------------------------------------------------------------------------- search phase
def _lowering_check(g: Any, gpu_check: bool) -> str:
    """ "ok" when `g` plans (and, with gpu_check, lowers for CUDA on this machine), else why."""
    import jax

    from mirage_jax.lower import export_for_gpu, lower, plan

    try:
        plan(g)
        if gpu_check:
            fn = lower(g, backend="pallas", interpret=False)
            export_for_gpu(fn, *[jax.ShapeDtypeStruct(s, d) for s, d in g.input_avals])
    except Exception as e:
        return _err(e)
    return "ok"


def _candidate(
    g: Any, program: Any, source: str, rank: int, args: argparse.Namespace
) -> tuple[dict[str, Any] | None, str]:
    """A plan record of candidate `g` for `program`, or (None, why it was dropped)."""
    import fields
    from mirage_jax.mugraph.serialize import to_dict
    from mirage_jax.search import estimate

    lowering = _lowering_check(g, args.gpu_check)
    if lowering != "ok":
        return None, f"lowering: {lowering}"
    meta = dict(g.meta)
    n_out = len(program.outputs)
    if meta.get("verified") == "full" and "bound" in meta and n_out == 1:
        verification = {"verified": "full", "bound": meta["bound"], "trials": meta.get("trials")}
        order = [0]
    else:  # verify here at full size (cache entries, representative-only, multi-output)
        v = fields.verify(g, program, seed=args.seed)
        if not v:
            return None, f"verification: {v.reason}"
        verification = {"verified": "full", "bound": v.bound, "trials": v.trials, "p": v.p}
        order = _output_order(v, n_out)
    cost = meta.get("cost") or estimate(g).to_dict()
    return {
        "rank": rank,
        "source": source,
        "hash": g.canonical_hash,
        "cost": cost,
        "structure": meta.get("structure", ""),
        "verification": verification,
        "output_order": order,
        "lowering": "ok (Pallas→Triton export checked)" if args.gpu_check else "ok (planned)",
        "mugraph": to_dict(g),
    }, ""


def _cache_candidates(region_hash: str, cache_path: str | None) -> list[Any]:
    """µGraphs stored for this region in mirage_jax's kernel cache (any device/backend)."""
    if cache_path is None:
        return []
    try:
        from mirage_jax.cache import Cache, mugraph_from_json

        cache = Cache(cache_path or None)
        if not Path(cache.path).exists():
            return []
        return [
            mugraph_from_json(e.mugraph_json)
            for e in cache.entries()
            if e.region_hash == region_hash and e.mugraph_json
        ]
    except Exception:
        return []


def _search_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "budget_s": args.budget_s,
        "seed": args.seed,
        "candidates": args.candidates,
        "gpu_check": args.gpu_check,
    }


def _structures_first(found: list[tuple[Any, str]]) -> list[tuple[Any, str]]:
    """The cheapest µGraph of each structure first (in cost order), then the rest.

    The cost model orders instances of one structure well (grids, loop ranges) but misjudges
    structures against each other (the H100 timings of 2026-11-21: at gqa b=8 its first pick,
    one kernel recomputing Q·K per V column block, ran 2.4x slower than the split-KV pair it
    ranked below), so the GPU gets one candidate per structure before a second of any.
    """
    first, rest, seen = [], [], set()
    for g, source in found:
        key = g.meta.get("structure") or g.canonical_hash
        (rest if key in seen else first).append((g, source))
        seen.add(key)
    return first + rest


def _search_region(region: Any, args: argparse.Namespace) -> dict[str, Any]:
    from mirage_jax.search import Budget, search

    k = args.candidates
    rec: dict[str, Any] = {
        "index": region.index,
        "hash": region.program.canonical_hash,
        "ops": len(region.nodes),
        "inputs": len(region.inputs),
        "outputs": len(region.outputs),
    }
    t0 = time.perf_counter()
    found: list[tuple[Any, str]] = []
    try:
        budget = Budget(time_s=args.budget_s, results=max(8, 3 * k), confirm=k + 1)
        res = search(
            region.program, budget=budget, seed=args.seed, workers=args.workers, progress=None
        )
        rec["search"] = {
            "stop_reason": res.stop_reason,
            "message": res.message,
            "found": len(res.mugraphs),
            "structures": list(res.structures),
            "stats": res.stats,
        }
        found = [(g, "search") for g in res.mugraphs]
    except Exception as e:
        rec["search"] = {"stop_reason": "error", "message": _err(e, 600), "found": 0}
    rec["search"]["seconds"] = round(time.perf_counter() - t0, 2)
    found = _structures_first(found)
    seen = {g.canonical_hash for g, _ in found}
    for g in _cache_candidates(rec["hash"], args.cache):
        if g.canonical_hash not in seen:
            found.append((g, "cache"))
            seen.add(g.canonical_hash)
    kept, dropped = [], []
    for rank, (g, source) in enumerate(found):
        if len(kept) >= k:
            break
        cand, why = _candidate(g, region.program, source, rank, args)
        if cand is None:
            dropped.append({"rank": rank, "hash": g.canonical_hash, "why": why})
        else:
            kept.append(cand)
    rec["candidates"] = kept
    rec["dropped"] = dropped
    return rec


def _imported_plan(bm: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Rank the original's µGraphs for `bm` by the cost model; keep the best that verify."""
    from experiments import benchmarks as B

    peer = find_peer(args.peer)
    if bm.workload not in COMPARABLE or bm.name in ("gqa_scaled", "gqa_stable"):
        return {"status": "not applicable (see the gqa row)" if "gqa" in bm.name else "none"}
    if bm.workload in ("lora", "gated_mlp") and bm.batch != 1:
        rows = {"lora": 16, "gated_mlp": 8}[bm.workload]
        return {"status": f"not comparable: the original fixes X at {rows} rows at every batch"}
    if peer is None:
        return {"status": "the original's checkpoints were not found (pass --peer)"}
    mbm = B.get(f"{bm.workload}_mirage", bm.batch)
    rel = f"h100/{mbm.checkpoint}"
    if not (peer / rel).exists():
        return {"status": f"no checkpoint {rel}"}
    rec: dict[str, Any] = {"file": rel, "form": mbm.name, "comparable": COMPARABLE[bm.workload]}
    try:
        ranked = _rank_imported(peer / rel)
    except Exception as e:
        return {**rec, "status": f"import failed: {_err(e)}"}
    rec["count"] = len(ranked)
    kept, dropped = [], []
    for cost, index, g in ranked[: 4 * args.imported + 4]:
        if len(kept) >= args.imported:
            break
        cand, why = _imported_candidate(g, Path(rel).stem, index, cost, args)
        (kept if cand else dropped).append(cand or {"index": index, "why": why})
    why = sorted({d["why"].split(":")[0] for d in dropped})
    status = "ok" if kept else f"none of {len(dropped)} examined passed ({', '.join(why)})"
    rec.update(status=status, candidates=kept, dropped=dropped)
    return rec


def _rank_imported(path: Path) -> list[tuple[dict, int, Any]]:
    """(cost, index, µGraph) of each distinct µGraph of a checkpoint, cheapest first."""
    from mirage_jax.mugraph import load_mirage_checkpoint
    from mirage_jax.search import estimate

    ranked, seen = [], set()
    for i, g in enumerate(load_mirage_checkpoint(path)):
        if g.canonical_hash in seen:
            continue
        seen.add(g.canonical_hash)
        try:
            ranked.append((estimate(g).to_dict(), i, g))
        except Exception:
            continue
    ranked.sort(key=lambda x: (x[0]["us"], x[1]))
    return ranked


def _imported_candidate(
    g: Any, stem: str, index: int, cost: dict, args: argparse.Namespace
) -> tuple[dict | None, str]:
    """Lowering check at the µGraph's shapes (reduced in quick mode); verified at reduced shapes.

    Reduced shapes keep the grids, loop ranges and maps (`import_mirage.shrink`); the field
    evaluation cost grows with the element count and the µGraph's correctness does not.
    """
    import fields
    import lax_ir
    from experiments.import_mirage import shrink

    g_small, bm_small = shrink(g, stem)
    lowering = _lowering_check(g_small if args.quick else g, args.gpu_check)
    if lowering != "ok":
        return None, f"lowering: {lowering}"
    program = lax_ir.capture(bm_small.fn, *bm_small.inputs)
    try:
        v = fields.verify(g_small, program, seed=args.seed)
    except Exception as e:
        return None, f"verification: {_err(e)}"
    if not v:
        return None, f"verification: {v.reason}"
    return {
        "index": index,
        "hash": g.canonical_hash,
        "cost": cost,
        "verification": {
            "verified": "reduced shapes (same grids, loops and maps)",
            "bound": v.bound,
            "trials": v.trials,
            "dims": dict(bm_small.dims),
        },
    }, ""


def _previous_entries(args: argparse.Namespace) -> dict[tuple[str, str], dict]:
    """Plan entries to reuse: (program hash, options) -> entry, from --reuse or the newest plan."""
    if not args.reuse:
        return {}
    path = Path(args.reuse) if isinstance(args.reuse, str) else newest(args.plan_dir, "plan-*.json")
    if path is None or not path.exists():
        return {}
    try:
        old = json.loads(path.read_text())
    except Exception:
        return {}
    opts = json.dumps(old.get("options", {}).get("search", {}), sort_keys=True)
    return {(e["program_hash"], opts): e for e in old.get("benchmarks", [])}


def phase_search(args: argparse.Namespace) -> Path:
    """Search (or reuse) each benchmark's candidates; write and return the plan file."""
    benches = suite(args.names, args.batches, args.quick)
    previous = _previous_entries(args)
    opts = _search_options(args)
    opts_key = json.dumps(opts, sort_keys=True)
    plan: dict[str, Any] = {
        "kind": "mirage_jax reproduce plan",
        "schema": SCHEMA,
        "created": _now(),
        "quick": args.quick,
        "versions": versions(),
        "options": {"search": opts, "imported": args.imported, "workers": args.workers},
        "peer": str(find_peer(args.peer) or ""),
        "benchmarks": [],
    }
    path = Path(args.plan) if args.plan else args.plan_dir / f"plan-{today()}.json"
    if args.quick and not args.plan:
        path = args.out / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    for n, bm in enumerate(benches):
        t0 = time.perf_counter()
        program, part, regions = _region_programs(bm)
        old = previous.get((program.canonical_hash, opts_key))
        if old is not None:
            entry = dict(old, reused=True)
        else:
            entry = {
                "key": bm.key,
                "name": bm.name,
                "batch": bm.batch,
                "small": args.quick,
                "dims": dict(bm.dims),
                "program_hash": program.canonical_hash,
                "floor_bytes": bm.floor_bytes,
                "regions": [_search_region(r, args) for r in regions],
                "imported": _imported_plan(bm, args),
            }
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        plan["benchmarks"].append(entry)
        cands = sum(len(r["candidates"]) for r in entry["regions"])
        print(
            f"[{n + 1}/{len(benches)}] {bm.key}: {len(entry['regions'])} region(s), "
            f"{cands} candidate(s), original's: {entry['imported'].get('status')}"
            f"{' (reused)' if entry.get('reused') else ''}, {entry['seconds']:.0f}s",
            flush=True,
        )
        path.write_text(json.dumps(plan, indent=1, default=str))
    plan["seconds"] = round(time.perf_counter() - t_all, 1)
    path.write_text(json.dumps(plan, indent=1, default=str))
    print(f"wrote {path}")
    return path
