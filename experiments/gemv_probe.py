"""How fast can a skinny GEMM (decode: 1 or 8 rows) run on this GPU? Hand-written Triton
kernels over a grid of tilings, against XLA's `jnp.dot`, timed in one run.

For issue 16: the decode blocks' projections are weight-bandwidth bound, and the generated
kernels reach about half of the bandwidth. This probe measures the ceiling a tiling reaches
(column tile `bn`, reduction tile `bk`, split-K `split` with fp32 atomics, warps, stages), so
the search's space and the lowering can be judged against it. Device time per call
(`mirage_jax.profile.time_trace`, median):

    python -m experiments.gemv_probe --out experiments/results
    python -m experiments.gemv_probe --nk --shapes down_7b_b1   # the weight stored (N, K)
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments.region_probe import write_probe
from mirage_jax.profile import time_trace

SHAPES = {  # name: (rows, K, N), the realistic Llama decode block's projections
    "gate_up_b1": (1, 1024, 5632),
    "gate_up_b8": (8, 1024, 5632),
    "down_b1": (1, 2816, 1024),
    "down_b8": (8, 2816, 1024),
    "qkv_b8": (8, 1024, 1536),
    "o_b1": (1, 1024, 1024),
    "qkv_7b_b1": (1, 4096, 6144),
    "gate_up_7b_b1": (1, 4096, 22016),
    "down_7b_b1": (1, 11008, 4096),
}

SPLITS = (1, 2, 4, 8, 16, 43, 86)
"""Split-K factors: powers of two, and 43 and 86 for the 7B down projection's K = 11008 = 43 · 256."""

try:  # the kernel needs triton (installed with jax's GPU wheels); the module imports without
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - a CPU machine without triton
    triton = None


def _kernel():
    """The skinny-GEMM kernel: a column tile per program, split-K over grid axis 1."""
    if triton is None:
        raise RuntimeError("gemv_probe needs triton")
    return _gemv


if triton is not None:

    @triton.jit
    def _gemv(
        x,
        w,
        out,
        M: tl.constexpr,
        K: tl.constexpr,
        N: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        SPLIT: tl.constexpr,
        MODE: tl.constexpr,
        NK: tl.constexpr,
    ):
        pn = tl.program_id(0)
        ps = tl.program_id(1)
        rn = pn * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        ks = K // SPLIT
        for k in range(0, ks, BK):
            rk = ps * ks + k + tl.arange(0, BK)
            xt = tl.load(x + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
            if NK:  # the weight stored (N, K), rows along K, as equinox's Linear keeps it
                wt = tl.load(w + rn[None, :] * K + rk[:, None])
            else:
                wt = tl.load(w + rk[:, None] * N + rn[None, :])
            if MODE == 1:
                acc += tl.dot(xt, wt)
            elif MODE == 2:  # swapped: W^T x^T, the weight tile as the dot's wide M side
                acc += tl.trans(tl.dot(tl.trans(wt), tl.trans(xt)))
            else:
                acc += tl.sum(xt.to(tl.float32)[:, :, None] * wt.to(tl.float32)[None, :, :], axis=1)
        ptrs = out + rm[:, None] * N + rn[None, :]
        if SPLIT == 1:
            tl.store(ptrs, acc, mask=rm[:, None] < M)
        else:
            tl.atomic_add(ptrs, acc, mask=rm[:, None] < M)


def _call(gemv, m, k, n, bn, bk, split, warps, stages, dot, nk=False):
    import jax_triton as jt

    bm = max(16, m) if dot else m  # dot: 0 multiply-sum on CUDA cores, 1 tl.dot, 2 swapped

    def f(x, w):
        return jt.triton_call(
            x,
            w,
            kernel=gemv,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            grid=(n // bn, split),
            num_warps=warps,
            num_stages=stages,
            zeroed_outputs=(0,) if split > 1 else (),
            M=m,
            K=k,
            N=n,
            BM=bm,
            BN=bn,
            BK=bk,
            SPLIT=split,
            MODE=dot,
            NK=nk,
        )[0]

    return f


def probe(shapes: list[str], calls: int, per_shape_s: float, nk: bool = False) -> dict:
    gemv = _kernel()
    rows = {}
    for name in shapes:
        m, k, n = SHAPES[name]
        key = jax.random.PRNGKey(0)
        x = jax.random.normal(key, (m, k), jnp.float16)
        w = (jax.random.normal(jax.random.fold_in(key, 1), (k, n), jnp.float16) * 0.03).astype(
            jnp.float16
        )
        if nk:  # the same values stored transposed; XLA computes x @ wᵀ
            w = jnp.asarray(w.T)
        ref = jnp.dot(x, w.T if nk else w, preferred_element_type=jnp.float32)
        xla = (lambda a, b: jnp.dot(a, b.T)) if nk else (lambda a, b: jnp.dot(a, b))
        res = {"xla_us": time_trace(xla, [x, w], calls=calls).median_us}
        res["bytes"] = 2 * (k * n + m * k + m * n)
        tried = []
        deadline = time.monotonic() + per_shape_s
        for bn, bk, split, dot in itertools.product(
            (32, 64, 128, 256, 512), (64, 128, 256, 512), SPLITS, (0, 1, 2)
        ):
            if n % bn or k % (split * bk) or (dot and m == 1) or (dot == 2 and bn < 64):
                continue
            if time.monotonic() > deadline:
                break
            if not dot and bn * bk * max(m, 1) > 64 * 256 * 2:  # registers: skip huge tiles
                continue
            cfg = dict(bn=bn, bk=bk, split=split, warps=4, stages=3, dot=dot)
            try:
                f = jax.jit(_call(gemv, m, k, n, bn, bk, split, 4, 3, dot, nk))
                err = float(jnp.max(jnp.abs(f(x, w) - ref)))
                us = time_trace(f, [x, w], calls=calls).median_us
                tried.append({**cfg, "us": us, "err": err})
            except Exception as e:  # a tiling that does not compile is data
                tried.append({**cfg, "error": str(e)[:160]})
        tol = 1e-2 * float(jnp.max(jnp.abs(ref)))  # a wrong tiling is reported, never ranked
        ok = sorted((t for t in tried if "us" in t and t["err"] <= tol), key=lambda t: t["us"])
        res["wrong"] = [t for t in tried if "us" in t and t["err"] > tol][:4]
        for t in ok[:3]:  # the best three under other warps and pipelining depths
            for warps, stages in ((8, 3), (4, 1), (4, 2), (4, 4), (8, 4), (2, 3)):
                f = jax.jit(
                    _call(gemv, m, k, n, t["bn"], t["bk"], t["split"], warps, stages, t["dot"], nk)
                )
                us = time_trace(f, [x, w], calls=calls).median_us
                tried.append({**t, "warps": warps, "stages": stages, "us": us})
        ok = sorted((t for t in tried if "us" in t and t["err"] <= tol), key=lambda t: t["us"])
        res["best"] = ok[:8]
        res["tried"] = len(tried)
        res["errors"] = sum("error" in t for t in tried)
        res["best_tb_s"] = res["bytes"] / ok[0]["us"] / 1e6
        res["xla_tb_s"] = res["bytes"] / res["xla_us"] / 1e6
        res["no_split_best"] = next((t for t in ok if t["split"] == 1), None)
        res["best_per_mode"] = {d: next((t for t in ok if t["dot"] == d), None) for d in (0, 1, 2)}
        rows[name] = res
        print(name, json.dumps({k2: v for k2, v in res.items() if k2 != "best"}), flush=True)
        for t in ok[:8]:
            print("   ", t, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--nk", action="store_true", help="the weight stored (N, K), as equinox has it")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--per-shape-s", type=float, default=60.0, help="stop new tilings after")
    p.add_argument("--out", type=Path, default=None, help="a folder for the JSON")
    a = p.parse_args(argv)
    rows = probe(a.shapes, a.calls, a.per_shape_s, a.nk)
    if a.out:
        dev = jax.devices()[0].device_kind.split()[1].lower()
        args = {**vars(a), "out": str(a.out)}
        tag = "_nk" if a.nk else ""
        path = a.out / f"gemv_probe_{dev}_{time.strftime('%Y-%m-%d')}{tag}.json"
        write_probe(path, args, rows)


if __name__ == "__main__":
    main()
