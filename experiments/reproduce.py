"""Reproduce the paper's figure: search on the CPU, time every contender on the GPU, draw it.

Three phases, each run where its dependencies are (the GPU machine has jax, numpy and
matplotlib, but no galois, egglog or network):

- ``--phase search`` (CPU): per benchmark of the suite, capture and partition it and search
  each Lax region, or reuse a previous plan's entry for the same program hash and options;
  µGraphs of mirage_jax's kernel cache for the region join as candidates. The best
  ``--candidates`` K by the cost model that plan, lower for CUDA (`export_for_gpu`) and are
  verified at full size are kept. The original's µGraphs for the benchmark (``--peer``) are
  ranked the same way and the kept ones verified; only their file, index and hash go into the
  plan, never the µGraphs. Writes ``plan-<date>.json``.
- ``--phase time`` (GPU): reads the plan, lowers the candidates (Pallas; jax-triton where
  importable), builds the baselines (XLA, cuDNN attention, the Pallas reference ops, tokamax
  where importable) and imports the original's µGraphs from ``--peer``; checks every contender
  against the float64 reference; times them all with `mirage_jax.profile.time_device`; writes
  ``<machine>-<date>.json`` and ``.md``, and ``.png``/``.svg`` where matplotlib imports.
- ``--phase figure``: redraws the table and the figure from a results file.
- ``--phase real`` (GPU): the real-model set (`experiments/models`) against jax.jit, a fresh
  mirage_jax.jit, cuDNN, Pallas decode and tokamax attention (`experiments.real_baselines`).

``--quick`` runs search and time on the CPU at reduced shapes (`Benchmark.small`) with a small
budget, Pallas in interpret mode and no timing: every path runs (CI), nothing is measured.

    python -m experiments.reproduce --quick --out /tmp/q           # CI: the whole path, CPU
    python -m experiments.reproduce --phase search                 # here: writes the plan
    python -m experiments.reproduce --phase time --peer build/peer --out $OUT   # on the GPU
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from experiments.errors import max_rel_error  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
QUICK_OUT = ROOT / "build" / "reproduce-quick"
FP16_TOL = 2e-2
"""Largest max|out − ref| / max|ref| accepted for an fp16 contender against float64."""
SCHEMA = 1
COMPARABLE = {
    "gqa": "same program and shapes",
    "qknorm": "the original's form (Q and V normalised, unscaled, no eps), same shapes",
    "rmsnorm": "the original's form (no eps), same shapes",
    "ntrans": "the original's form (no eps), same shapes",
    "lora": "same program; shapes agree at b=1 only",
    "gated_mlp": "same program; shapes agree at b=1 only",
}
"""How the original's µGraph for a benchmark compares with our program (rows it is shown in)."""


# ---------------------------------------------------------------------------- helpers
def today() -> str:
    return _dt.date.today().isoformat()


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _err(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def versions() -> dict[str, Any]:
    """Versions of everything that changes a result (and the git commit where there is one)."""
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("jax", "jaxlib", "numpy", "mirage-jax", "triton", "jax-triton", "tokamax"):
        out[name] = _dist_version(name)
    for name in ("galois", "egglog", "matplotlib"):
        out[name] = _dist_version(name)
    try:
        import mirage_jax

        out["mirage_jax"] = mirage_jax.__version__
    except Exception:
        pass
    try:  # on the GPU machine: the driver and cuDNN
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        if smi.returncode == 0:
            out["nvidia_smi"] = smi.stdout.strip()
            from jax._src.lib import cuda_versions  # private, version reporting only

            out["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            out["git_dirty"] = bool(dirty.stdout.strip())
    except Exception:
        pass
    return out


def find_peer(peer: str | Path | None) -> Path | None:
    """The folder holding `h100/*.json` (`experiments.peer.find`), or None."""
    from experiments import peer as peer_mod

    return peer_mod.find(peer)


def newest(directory: Path, pattern: str) -> Path | None:
    files = sorted(directory.glob(pattern), key=lambda p: (p.stat().st_mtime, p.name))
    return files[-1] if files else None


def suite(names: Sequence[str], batches: Sequence[int], quick: bool) -> list[Any]:
    """The benchmarks to run, batch-major (so a run cut short still covers whole batches)."""
    from experiments import benchmarks as B

    out = []
    for b in batches:
        for n in names:
            bm = B.get(n, b)
            out.append(bm.small() if quick else bm)
    return out


def _region_programs(bm: Any) -> tuple[Any, Any, list[Any]]:
    import lax_ir

    program = lax_ir.capture(bm.fn, *bm.inputs)
    part = lax_ir.partition(program)
    return program, part, [r for r in part.regions if not r.is_trivial]


def _output_order(verdict: Any, n_outputs: int) -> list[int]:
    """order[j] = the µGraph output equal to region output j."""
    matching = getattr(verdict, "matching", None)
    if not matching:
        return list(range(n_outputs))
    order = [0] * len(matching)
    for i, j in enumerate(matching):
        order[j] = i
    return order


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


# ---------------------------------------------------------------------------- contenders
def _attention_spec(name: str) -> tuple[float, bool] | None:
    """(softmax scale, rms-normalise Q and K first) for the attention benchmarks."""
    from experiments.benchmarks import ATTN_SCALE

    return {
        "gqa": (1.0, False),
        "gqa_scaled": (ATTN_SCALE, False),
        "gqa_stable": (ATTN_SCALE, False),
        "qknorm": (ATTN_SCALE, True),
    }.get(name)


def _bthd(q, k, v):
    """(heads, T, D), (heads, D, S), (heads, S, D) → (B=heads, T, N=1, D) and (B, S, 1, D)."""
    return q[:, :, None, :], k.transpose(0, 2, 1)[:, :, None, :], v[:, :, None, :]


def _bthd_heads(q, k, v):
    """(heads, T, D), (heads, D, S), (heads, S, D) → (B=1, T, N=heads, D) and (1, S, heads, D)."""
    return q.transpose(1, 0, 2)[None], k.transpose(2, 0, 1)[None], v.transpose(1, 0, 2)[None]


def _from_bthd_heads(o):
    """(1, T, heads, D) → (heads, T, D), for the float check only (not timed)."""
    return o[0].transpose(1, 0, 2)


def _decode(q, k, v):
    """→ Pallas decode layout: q (B, Hq, D), k and v (B, S, 1, D)."""
    return q, k.transpose(0, 2, 1)[:, :, None, :], v[:, :, None, :]


def _import_tokamax() -> Any:
    """tokamax, or raise ImportError; its benchmarking module's xprof import is stubbed."""
    if importlib.util.find_spec("tokamax") is None:
        raise ImportError("tokamax is not installed")
    if importlib.util.find_spec("xprof") is None:  # used only by tokamax.benchmarking
        from importlib.machinery import ModuleSpec

        for name in ("xprof", "xprof.cli", "xprof.cli.tools"):
            if name not in sys.modules:
                spec = ModuleSpec(name, None, is_package=name != "xprof.cli.tools")
                sys.modules[name] = importlib.util.module_from_spec(spec)
        sys.modules["xprof.cli.tools"].get_kernel_stats_tool = None  # type: ignore[attr-defined]
    import tokamax

    try:  # its autotuning cache misses are logged as warnings, one per shape: not news here
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    return tokamax


def _pallas_op(name: str) -> Any:
    """A module of jax.experimental.pallas.ops.gpu (deprecated upstream: warning silenced)."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}")


def baselines(bm: Any, interpret: bool, on_gpu: bool) -> list[dict[str, Any]]:
    """The baselines of `bm`: label, fn, input layout (untimed), or why not applicable."""
    import jax
    import jax.numpy as jnp

    from experiments.benchmarks import EPS, rms_norm

    out: list[dict[str, Any]] = [{"label": "XLA", "fn": jax.jit(bm.fn)}]
    att = _attention_spec(bm.name)

    def norm_qk(q, k):
        return rms_norm(q), rms_norm(k)

    if att is not None:
        scale, norm = att

        def cudnn(q, k, v):
            if norm:
                q, k = norm_qk(q, k)
            o = jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")
            return o.reshape(o.shape[0], o.shape[1], o.shape[3])

        def cudnn_heads(q, k, v):  # (1, T, heads, D), (1, S, heads, D)
            if norm:
                q, k = norm_qk(q, k)
            return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")

        if on_gpu:  # both layouts of the heads: cuDNN's speed depends on it
            out.append({"label": "cuDNN attention (B=heads)", "fn": jax.jit(cudnn),
                        "layout": _bthd})  # fmt: skip
            out.append({"label": "cuDNN attention (N=heads)", "fn": jax.jit(cudnn_heads),
                        "layout": _bthd_heads, "unlayout": _from_bthd_heads})  # fmt: skip
        else:
            out.append({"label": "cuDNN attention", "status": "unsupported: no GPU"})

        def pallas_gqa(q, k, v):
            decode_attention = _pallas_op("decode_attention")
            if norm:
                q, k = norm_qk(q, k)
            s = k.shape[1]
            block_k = min(128, s)
            return decode_attention.gqa(
                q, k, v, sm_scale=scale, block_k=block_k,
                k_splits=max(1, min(16, s // block_k)), interpret=interpret,
            )  # fmt: skip

        out.append({"label": "Pallas decode_attention.gqa", "fn": jax.jit(pallas_gqa),
                    "layout": _decode})  # fmt: skip
    if bm.workload in ("rmsnorm", "ntrans"):

        def prms(x):
            prn = _pallas_op("rms_norm")
            n = x.shape[-1]
            w, b = jnp.ones((n,), x.dtype), jnp.zeros((n,), x.dtype)
            return prn.rms_norm(x[None], w, b, None, 3, EPS, "triton", interpret)[0]

        if bm.workload == "rmsnorm":
            fn = lambda x, w: prms(x) @ w  # noqa: E731
        else:
            fn = lambda h, x, a: prms(x + a * (prms(h) + x))  # noqa: E731
        out.append({"label": "Pallas rms_norm + XLA", "fn": jax.jit(fn)})
    out.extend(_tokamax_baselines(bm, att, on_gpu))
    return out


def _tokamax_baselines(bm: Any, att: tuple[float, bool] | None, on_gpu: bool) -> list[dict]:
    import jax

    from experiments.benchmarks import EPS, rms_norm

    applicable = att is not None or bm.workload in ("rmsnorm", "ntrans", "gated_mlp")
    if not applicable:
        return []
    if not on_gpu:
        return [{"label": "tokamax", "status": "unsupported: no GPU"}]
    try:
        tk = _import_tokamax()
    except Exception as e:
        return [{"label": "tokamax", "status": f"not available: {_err(e)}"}]
    out = []
    if att is not None:
        scale, norm = att
        for impl in ("mosaic", "triton"):

            def f(q, k, v, impl=impl):
                if norm:
                    q, k = rms_norm(q), rms_norm(k)
                o = tk.dot_product_attention(q, k, v, scale=scale, implementation=impl)
                return o.reshape(o.shape[0], o.shape[1], o.shape[3])

            out.append({"label": f"tokamax attention ({impl})", "fn": jax.jit(f), "layout": _bthd})
    elif bm.workload in ("rmsnorm", "ntrans"):

        def trms(x):
            return tk.layer_norm(
                x, None, None, epsilon=EPS, subtract_mean=False, implementation="triton"
            )

        if bm.workload == "rmsnorm":
            fn = lambda x, w: trms(x) @ w  # noqa: E731
        else:
            fn = lambda h, x, a: trms(x + a * (trms(h) + x))  # noqa: E731
        out.append({"label": "tokamax layer_norm (triton) + XLA", "fn": jax.jit(fn)})
    else:
        for impl in ("triton", "mosaic"):

            def glu(x, w1, w2, impl=impl):
                return tk.gated_linear_unit(
                    x, (w1, w2), activation=jax.nn.silu, implementation=impl
                )

            out.append({"label": f"tokamax gated_linear_unit ({impl})", "fn": jax.jit(glu)})
    return out


def _ours(
    entry: dict, bm: Any, backends: Sequence[str], interpret: bool, triton_candidates: int = 1
) -> list[dict]:
    """One contender per candidate rank and backend: the program with its regions replaced.

    Pallas gets every kept candidate; jax-triton the first `triton_candidates` (compile time).
    """
    import jax

    import lax_ir
    from mirage_jax.lower import lower
    from mirage_jax.mugraph.serialize import from_dict

    program, part, regions = _region_programs(bm)
    if program.canonical_hash != entry["program_hash"]:
        return [{"label": "mirage_jax", "kind": "ours", "status": "stale plan: program changed"}]
    planned = {r["index"]: r for r in entry["regions"]}
    depth = max((len(r["candidates"]) for r in entry["regions"]), default=0)
    out = []
    for backend in backends:
        for rank in range(depth if backend == "pallas" else min(depth, triton_candidates)):
            label = f"mirage_jax #{rank + 1} ({backend})"
            try:
                replacements, cands = {}, []
                for region in regions:
                    cs = planned[region.index]["candidates"]
                    if not cs:
                        continue
                    c = cs[min(rank, len(cs) - 1)]
                    impl = lower(from_dict(c["mugraph"]), backend=backend, interpret=interpret)
                    order = c.get("output_order") or [0]
                    replacements[region.index] = lambda *xs, impl=impl, order=order: [
                        impl(*xs)[i] for i in order
                    ]
                    cands.append({k: c[k] for k in ("hash", "cost", "verification", "source")})
                fn = jax.jit(lax_ir.rebuild(part, replacements))
                out.append({"label": label, "kind": "ours", "fn": fn, "candidates": cands})
            except Exception as e:
                out.append(
                    {"label": label, "kind": "ours", "status": f"lowering failed: {_err(e)}"}
                )
    return out


def _imported(
    entry: dict,
    peer: Path | None,
    quick: bool,
    interpret: bool,
    backends: Sequence[str] = ("pallas",),
) -> list[dict]:
    """The original's kept µGraphs (from --peer), each with its own form's inputs, per backend."""
    imp = entry.get("imported") or {}
    if imp.get("status") != "ok":
        return []
    if peer is None:
        return [{"label": "original's µGraph", "kind": "imported", "status": "no --peer folder"}]
    import jax

    from experiments.import_mirage import benchmark_for, shrink
    from mirage_jax.lower import lower
    from mirage_jax.mugraph import load_mirage_checkpoint

    path = peer / imp["file"]
    try:
        graphs = load_mirage_checkpoint(path)
    except Exception as e:
        return [{"label": "original's µGraph", "kind": "imported", "status": _err(e)}]
    out = []
    for c, backend in [(c, b) for c in imp["candidates"] for b in backends]:
        label = f"original's µGraph [{c['index']}] ({backend})"
        g = graphs[c["index"]] if c["index"] < len(graphs) else None
        if g is None or g.canonical_hash != c["hash"]:
            out.append(
                {"label": label, "kind": "imported", "status": "hash mismatch: peer changed"}
            )
            continue
        g, mbm = shrink(g, path.stem) if quick else (g, benchmark_for(path.stem, _shapes(g)))
        try:
            impl = lower(g, backend=backend, interpret=interpret)
            fn = jax.jit(lambda *xs, impl=impl: impl(*xs)[0])
        except Exception as e:
            out.append(
                {"label": label, "kind": "imported", "status": f"lowering failed: {_err(e)}"}
            )
            continue
        out.append({"label": label, "kind": "imported", "fn": fn, "bench": mbm,
                    "candidates": [c]})  # fmt: skip
    if out and any("fn" in c for c in out):
        mbm = next(c["bench"] for c in out if "fn" in c)
        out.append({"label": "XLA (original's form)", "kind": "imported_xla",
                    "fn": jax.jit(mbm.fn), "bench": mbm})  # fmt: skip
    return out


def _shapes(g: Any) -> tuple:
    return tuple(s for s, _ in g.input_avals)


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
        tk = _import_tokamax()
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


# ---------------------------------------------------------------------------- figure phase
def phase_figure(args: argparse.Namespace) -> list[Path]:
    """Redraw the table and the figure of a results file (default: the newest)."""
    from experiments import figures

    path = Path(args.results) if args.results else figures.newest_results(args.out)
    if path is None:
        raise SystemExit(f"reproduce: no results file in {args.out}")
    results = json.loads(path.read_text())
    results["summary"] = figures.summary(results)
    written = figures.write(results, Path(args.out) if args.out_given else path.parent, path.stem)
    for p in written:
        print(f"wrote {p}")
    return written


# ---------------------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `python -m experiments.reproduce` / `mirage-jax reproduce`."""
    p.add_argument("--phase", choices=("search", "time", "figure", "real", "all"), default="all",
                   help="search (CPU: writes the plan), time (GPU: reads the plan, writes the "
                   "results), figure (redraws from a results file), real (GPU: the real-model "
                   "baselines, experiments.real_baselines), all (search then time; the default)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="CPU smoke run: reduced shapes, small budget, Pallas interpret mode, "
                   "float checks only, no timing (CI)")  # fmt: skip
    p.add_argument(
        "--names",
        nargs="+",
        metavar="NAME",
        help="benchmark names (default: experiments.benchmarks.PAPER_NAMES)",
    )
    p.add_argument(
        "--batches",
        nargs="+",
        type=int,
        metavar="B",
        help="batch sizes (default: 1 8 16; --quick: 1)",
    )
    p.add_argument(
        "--plan",
        metavar="PATH",
        help="the plan file (search writes, time reads; "
        "default: experiments/results/plan-<date>.json / the newest plan-*.json)",
    )
    p.add_argument("--results", metavar="PATH", help="figure phase: the results JSON")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where results, table and figure go "
        "(default experiments/results/; --quick: build/reproduce-quick/)",
    )
    p.add_argument(
        "--peer",
        metavar="DIR",
        help="the original's µGraph checkpoints: a clone of the evaluation branch of "
        "github.com/mirage-project/mirage, or a folder with h100/*.json (default: "
        "$MIRAGE_PEER_DIR, else build/peer)",
    )
    p.add_argument(
        "--budget-s", type=float, help="search budget per region, s (default 120; --quick: 10)"
    )
    p.add_argument(
        "--candidates", type=int, help="our µGraphs kept per region (default 3; --quick: 2)"
    )
    p.add_argument(
        "--imported", type=int, help="original's µGraphs kept per benchmark (default 2; --quick: 1)"
    )
    p.add_argument(
        "--workers", type=int, default=1, help="search worker processes (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="search and verification seed (default: %(default)s)"
    )
    p.add_argument(
        "--reuse",
        nargs="?",
        const=True,
        default=True,
        metavar="PLAN",
        help="reuse entries of PLAN (default: the newest plan) whose program hash "
        "and search options match",
    )
    p.add_argument("--no-reuse", dest="reuse", action="store_false", help="search everything")
    p.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also take µGraphs from mirage_jax's kernel cache (default path if no PATH)",
    )
    p.add_argument(
        "--gpu-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lower each kept candidate for CUDA here (jax.export) before planning it "
        "(default: on)",
    )
    p.add_argument(
        "--triton-candidates",
        type=int,
        default=9,
        help="time phase: candidates also lowered through jax-triton (default 9: all)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=("trace", "chained"),
        default=["trace", "chained"],
        help="time phase: timing methods, the first is the headline (default: trace chained)",
    )
    p.add_argument(
        "--calls", type=int, default=30, help="calls per profiler trace (default: %(default)s)"
    )
    p.add_argument(
        "--chain",
        type=int,
        default=32,
        help="calls per chained timing program (default: %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=25,
        help="timing repeats (median, p10/p90) (default: %(default)s)",
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed runs before timing (default: %(default)s)"
    )
    p.add_argument(
        "--merge",
        metavar="RESULTS",
        help="time phase: also keep the rows of this earlier results file (same "
        "device) that this run does not time, e.g. after a run split by --batches",
    )
    p.add_argument("--deadline-s", type=float, default=500.0,
                   help="time phase: stop timing after this many seconds and write what was "
                   "timed (default: %(default)s s; keep it below any time limit the run is under, "
                   "so that its results are saved)")  # fmt: skip
    return p


def _defaults(
    args: argparse.Namespace, argv: Sequence[str] | None, prog: str
) -> argparse.Namespace:
    from experiments.benchmarks import PAPER_NAMES

    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.argv[:1] == ["reproduce"]:  # called as `mirage-jax reproduce ...`
        args.argv = args.argv[1:]
    args.prog = prog
    args.out_given = args.out is not None
    args.out = Path(args.out) if args.out else (QUICK_OUT if args.quick else RESULTS)
    args.plan_dir = RESULTS
    if args.phase in ("search", "all"):
        args.names = args.names or list(PAPER_NAMES)
        args.batches = args.batches or ([1] if args.quick else [1, 8, 16])
    args.budget_s = args.budget_s or (10.0 if args.quick else 120.0)
    args.candidates = args.candidates or (2 if args.quick else 3)
    args.imported = args.imported if args.imported is not None else (1 if args.quick else 2)
    if args.quick:
        args.reuse = False if args.reuse is True else args.reuse
    return args


def run(
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
    prog: str = "python -m experiments.reproduce",
) -> int:
    """Run the phases `args.phase` names (`args` from a parser given `add_arguments`)."""
    args = _defaults(args, argv, prog)
    if args.phase in ("time", "all") and not args.quick and not _has_gpu():
        plan_quick = args.phase == "time" and _load_plan(args)[1].get("quick")
        if not plan_quick:
            raise SystemExit(
                f"{prog}: --phase {args.phase} times on a GPU and this machine has none: run "
                "--phase search here and --phase time on the GPU, or --quick (CPU, untimed)"
            )
    if args.phase == "figure":
        phase_figure(args)
        return 0
    if args.phase == "real":  # resumes, so a run cut by --deadline-s is continued by the next
        from experiments import real_baselines

        argv = ["--out", str(args.out), "--calls", str(args.calls), "--resume"]
        return real_baselines.main([*argv, "--stop-after-s", str(args.deadline_s)])
    if args.phase in ("search", "all"):
        args.plan = str(phase_search(args))
    if args.phase in ("time", "all"):
        phase_time(args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="python -m experiments.reproduce",
            description=(__doc__ or "").split("\n\n")[0],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return run(parser.parse_args(argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
