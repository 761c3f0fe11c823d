"""`experiments.reproduce`: the contenders of a benchmark (ours, the original's, the baselines)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.models.attention import import_tokamax
from experiments.reproduce_common import _err, _region_programs


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
        tk = import_tokamax()
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
