"""A split decode attention with its combine in the same launch, against two launches (GPU).

Llama-7B b=1 decode attention (8 KV heads of 4 query rows, 4096 keys, head dim 128), hand-written
Triton kernels through jax-triton, each timed alone by `profile.time_trace` (device time) with
XLA's einsum attention in the same run:

- `two_3d`, `two_row2d`, `two_rowstatic`, `two_rowloop`: a split kernel over S parts, then a
  combining kernel (one block per KV head over a (S, 4, 128) tile; or one per (head, row):
  the S partials as one (S, 128) tile, a static unrolled loop, a `range` loop);
- `memset_t0..2`: one launch, the last block of each KV head (an atomic counter per head)
  combining its S partials, the counters zeroed by jax-triton (`zeroed_outputs`: a memset);
- `keep_t0..2`: the same with the counters in a constant buffer the last block resets, so no
  memset runs (t0: a (S, 4, 128) tile, t1: per row, t2: a static loop over the parts).

On the H100 (2026-11-27) the one-launch forms saved at most 0.4 µs (S=16) and lost at S=32:
the last block's combine is a dependent chain as long as a combining kernel's
(`experiments/results/fused_combine_probe_h100_2026-11-27.txt`, `docs/decisions.md`).

    python -m experiments.fused_combine_probe --out experiments/results
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from mirage_jax.lower.triton_runtime import interpret_kernel, load_kernel

SRC = """
import triton
import triton.language as tl


@triton.jit
def attn(q, kt, mask, v, cnt, po, pl, pm, out, S: tl.constexpr, N: tl.constexpr,
         FUSE: tl.constexpr, RESET: tl.constexpr, TAIL: tl.constexpr):
    h = tl.program_id(0)
    s = tl.program_id(1)
    BLK: tl.constexpr = N // S
    rows = tl.arange(0, 16)
    rmask = rows[:, None] < 4
    d = tl.arange(0, 128)
    k = tl.arange(0, BLK)
    qt = tl.load(q + h * 512 + rows[:, None] * 128 + d[None, :], mask=rmask, other=0.0)
    ktile = tl.load(kt + h * 128 * N + d[:, None] * N + s * BLK + k[None, :])
    mt = tl.load(mask + h * 4 * N + rows[:, None] * N + s * BLK + k[None, :], mask=rmask, other=0.0)
    vt = tl.load(v + h * N * 128 + (s * BLK + k[:, None]) * 128 + d[None, :])
    sc = tl.dot(qt, ktile) + mt.to(tl.float32)
    m = tl.max(sc, axis=1)
    p = tl.exp2((sc - m[:, None]) * 1.4426950408889634)
    l = tl.sum(p, axis=1)
    o = tl.dot(p.to(tl.float16), vt)
    tl.store(po + ((h * S + s) * 4 + rows[:, None]) * 128 + d[None, :], o.to(tl.float16), mask=rmask)
    tl.store(pl + (h * S + s) * 4 + rows, l.to(tl.float16), mask=rows < 4)
    tl.store(pm + (h * S + s) * 4 + rows, m.to(tl.float16), mask=rows < 4)
    if FUSE:
        tl.debug_barrier()
        c = tl.atomic_add(cnt + h, 1, sem="acq_rel")
        if c == S - 1:
            if TAIL == 0:
                ss = tl.arange(0, S)
                r4 = tl.arange(0, 4)
                at = (h * S + ss[:, None]) * 4 + r4[None, :]
                M = tl.load(pm + at, cache_modifier=".cg").to(tl.float32)
                L = tl.load(pl + at, cache_modifier=".cg").to(tl.float32)
                O = tl.load(po + at[:, :, None] * 128 + d[None, None, :], cache_modifier=".cg").to(tl.float32)
                Mx = tl.max(M, axis=0)
                w = tl.exp2((M - Mx[None, :]) * 1.4426950408889634)
                Lt = tl.sum(w * L, axis=0)
                Ot = tl.sum(O * w[:, :, None], axis=0)
                tl.store(out + h * 512 + r4[:, None] * 128 + d[None, :], (Ot / Lt[:, None]).to(tl.float16))
            elif TAIL == 1:
                ss = tl.arange(0, S)
                for r in tl.static_range(4):
                    at = (h * S + ss) * 4 + r
                    M = tl.load(pm + at, cache_modifier=".cg").to(tl.float32)
                    L = tl.load(pl + at, cache_modifier=".cg").to(tl.float32)
                    O = tl.load(po + at[:, None] * 128 + d[None, :], cache_modifier=".cg").to(tl.float32)
                    Mx = tl.max(M, axis=0)
                    w = tl.exp2((M - Mx) * 1.4426950408889634)
                    Lt = tl.sum(w * L, axis=0)
                    Ot = tl.sum(O * w[:, None], axis=0)
                    tl.store(out + h * 512 + r * 128 + d, (Ot / Lt).to(tl.float16))
            else:
                r4 = tl.arange(0, 4)
                am = tl.full((4,), float("-inf"), tl.float32)
                al = tl.zeros((4,), tl.float32)
                ao = tl.zeros((4, 128), tl.float32)
                for j in tl.static_range(S):
                    at = (h * S + j) * 4 + r4
                    M = tl.load(pm + at, cache_modifier=".cg").to(tl.float32)
                    L = tl.load(pl + at, cache_modifier=".cg").to(tl.float32)
                    O = tl.load(po + at[:, None] * 128 + d[None, :], cache_modifier=".cg").to(tl.float32)
                    nm = tl.maximum(am, M)
                    a = tl.exp2((am - nm) * 1.4426950408889634)
                    b = tl.exp2((M - nm) * 1.4426950408889634)
                    al = al * a + L * b
                    ao = ao * a[:, None] + O * b[:, None]
                    am = nm
                tl.store(out + h * 512 + r4[:, None] * 128 + d[None, :], (ao / al[:, None]).to(tl.float16))
            if RESET:
                tl.atomic_xchg(cnt + h, 0)


@triton.jit
def combine_row(po, pl, pm, out, S: tl.constexpr, STATIC: tl.constexpr):
    h = tl.program_id(0)
    r = tl.program_id(1)
    d = tl.arange(0, 128)
    if STATIC == 2:
        ss = tl.arange(0, S)
        at = (h * S + ss) * 4 + r
        M = tl.load(pm + at).to(tl.float32)
        L = tl.load(pl + at).to(tl.float32)
        O = tl.load(po + at[:, None] * 128 + d[None, :]).to(tl.float32)
        Mx = tl.max(M, axis=0)
        w = tl.exp2((M - Mx) * 1.4426950408889634)
        Lt = tl.sum(w * L, axis=0)
        Ot = tl.sum(O * w[:, None], axis=0)
        tl.store(out + h * 512 + r * 128 + d, (Ot / Lt).to(tl.float16))
    else:
        am = float("-inf")
        al = 0.0
        ao = tl.zeros((128,), tl.float32)
        if STATIC == 1:
            for j in tl.static_range(S):
                at = (h * S + j) * 4 + r
                M = tl.load(pm + at).to(tl.float32)
                L = tl.load(pl + at).to(tl.float32)
                O = tl.load(po + at * 128 + d).to(tl.float32)
                nm = tl.maximum(am, M)
                a = tl.exp2((am - nm) * 1.4426950408889634)
                b = tl.exp2((M - nm) * 1.4426950408889634)
                al = al * a + L * b
                ao = ao * a + O * b
                am = nm
        else:
            am = tl.full((1,), float("-inf"), tl.float32)
            al = tl.zeros((1,), tl.float32)
            ao = tl.zeros((1, 128), tl.float32)
            for j in range(S):
                at = (h * S + j) * 4 + r + tl.arange(0, 1)
                M = tl.load(pm + at).to(tl.float32)
                L = tl.load(pl + at).to(tl.float32)
                O = tl.load(po + at[:, None] * 128 + d[None, :]).to(tl.float32)
                nm = tl.maximum(am, M)
                a = tl.exp2((am - nm) * 1.4426950408889634)
                b = tl.exp2((M - nm) * 1.4426950408889634)
                al = al * a + L * b
                ao = ao * a[:, None] + O * b[:, None]
                am = nm
            ao = tl.reshape(ao / al[:, None], (128,))
            tl.store(out + h * 512 + r * 128 + d, ao.to(tl.float16))
            return
        tl.store(out + h * 512 + r * 128 + d, (ao / al).to(tl.float16))


@triton.jit
def combine(po, pl, pm, out, S: tl.constexpr):
    h = tl.program_id(0)
    ss = tl.arange(0, S)
    r4 = tl.arange(0, 4)
    d = tl.arange(0, 128)
    at = (h * S + ss[:, None]) * 4 + r4[None, :]
    M = tl.load(pm + at).to(tl.float32)
    L = tl.load(pl + at).to(tl.float32)
    O = tl.load(po + at[:, :, None] * 128 + d[None, None, :]).to(tl.float32)
    Mx = tl.max(M, axis=0)
    w = tl.exp2((M - Mx[None, :]) * 1.4426950408889634)
    Lt = tl.sum(w * L, axis=0)
    Ot = tl.sum(O * w[:, :, None], axis=0)
    tl.store(out + h * 512 + r4[:, None] * 128 + d[None, :], (Ot / Lt[:, None]).to(tl.float16))
"""


H, R, D, N = 8, 4, 128, 4096


def _shapes(S: int) -> dict[str, jax.ShapeDtypeStruct]:
    f16 = jnp.float16
    return dict(
        po=jax.ShapeDtypeStruct((H * S * R, D), f16),
        pl=jax.ShapeDtypeStruct((H * S * R,), f16),
        pm=jax.ShapeDtypeStruct((H * S * R,), f16),
        out=jax.ShapeDtypeStruct((H, R, D), f16),
        cnt=jax.ShapeDtypeStruct((H,), jnp.int32),
    )


def forms(S: int, warps: int) -> dict:
    """The forms at S parts (split kernel with `warps` warps): name -> fn(q, kt, mask, v)."""
    import jax_triton as jt

    attn, comb, row = (load_kernel(k, SRC) for k in ("attn", "combine", "combine_row"))
    sh = _shapes(S)
    F = dict(S=S, N=N)

    def split(q, kt, mask, v):
        cnt = jnp.zeros((H,), jnp.int32)
        outs = [sh["po"], sh["pl"], sh["pm"], sh["out"]]
        return jt.triton_call(q, kt, mask, v, cnt, kernel=attn, out_shape=outs, grid=(H, S),
                              num_warps=warps, num_stages=1, FUSE=False, RESET=False, TAIL=0,
                              **F)[:3]  # fmt: skip

    out = {
        "two_3d": lambda *a: jt.triton_call(
            *split(*a), kernel=comb, out_shape=[sh["out"]], grid=(H,), num_warps=4, S=S
        )[0]
    }
    for st, name, stages in ((2, "two_row2d", 1), (1, "two_rowstatic", 1), (0, "two_rowloop", 3)):
        out[name] = lambda *a, st=st, stages=stages: jt.triton_call(
            *split(*a), kernel=row, out_shape=[sh["out"]], grid=(H, 4), num_warps=4,
            num_stages=stages, S=S, STATIC=st,
        )[0]  # fmt: skip
    zeroed = [sh["cnt"], sh["po"], sh["pl"], sh["pm"], sh["out"]]
    salt = np.zeros((H + 1,), np.int32)
    salt[-1] = 1000 + S * 10 + warps  # not a splat: one constant buffer, not a broadcast
    for tail in (0, 1, 2):
        out[f"memset_t{tail}"] = lambda q, kt, mask, v, tail=tail: jt.triton_call(
            q, kt, mask, v, kernel=attn, out_shape=zeroed, zeroed_outputs=(0,), grid=(H, S),
            num_warps=warps, num_stages=1, FUSE=True, RESET=False, TAIL=tail, **F,
        )[4]  # fmt: skip
        out[f"keep_t{tail}"] = lambda q, kt, mask, v, tail=tail: jt.triton_call(
            q, kt, mask, v, salt, kernel=attn, out_shape=zeroed[1:], grid=(H, S),
            num_warps=warps, num_stages=1, FUSE=True, RESET=True, TAIL=tail, **F,
        )[3]  # fmt: skip
    return out


def reference(q, kt, mask, v) -> np.ndarray:
    """The attention in float64: softmax(q·Kᵀ + mask)·V per KV head."""
    sc = np.einsum("hrd,hdn->hrn", q.astype(np.float64), kt.astype(np.float64)) + mask
    p = np.exp(sc - sc.max(-1, keepdims=True))
    return np.einsum("hrn,hnd->hrd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def inputs(seed: int) -> tuple[np.ndarray, ...]:
    """(q, Kᵀ, mask, V) in float16, a tenth of the keys masked."""
    r = np.random.default_rng(seed)
    return (
        r.standard_normal((H, R, D)).astype(np.float16),
        r.standard_normal((H, D, N)).astype(np.float16),
        np.where(r.random((H, R, N)) < 0.1, -1e4, 0).astype(np.float16),
        r.standard_normal((H, N, D)).astype(np.float16),
    )


def one_launch_on_cpu(S: int, tail: int, reset: bool) -> tuple[np.ndarray, np.ndarray]:
    """The one-launch form in Triton's interpreter: (its output, the counters after it)."""
    q, kt, mask, v = inputs(0)
    cnt = np.zeros((H,), np.int32)
    po = np.zeros((H * S * R, D), np.float16)
    pl, pm = np.zeros(H * S * R, np.float16), np.zeros(H * S * R, np.float16)
    out = np.full((H, R, D), np.nan, np.float16)
    attn = load_kernel("attn", SRC)
    interpret_kernel(attn, (H, S), q, kt, mask, v, cnt, po, pl, pm, out, S=S, N=N, FUSE=True,
                     RESET=reset, TAIL=tail)  # fmt: skip
    return out, cnt


def main(argv: list[str] | None = None) -> None:
    from mirage_jax.profile import time_trace

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", type=int, nargs="+", default=[16, 32])
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    sets: dict[int, tuple] = {}

    def ins(i: int) -> tuple:  # (kt, v, mask, q) on the device
        if i not in sets:
            q, kt, mask, v = inputs(i)
            sets[i] = tuple(jnp.asarray(x) for x in (kt, v, mask, q))
        return sets[i]

    def xla(kt, v, mask, q):
        sc = jnp.einsum("hrd,hdn->hrn", q, kt) + mask
        pr = jax.nn.softmax(sc.astype(jnp.float32), axis=-1).astype(jnp.float16)
        return (jnp.einsum("hrn,hnd->hrd", pr, v),)

    tx = time_trace(jax.jit(xla), ins, calls=30)
    rows = {"xla_us": tx.median_us, "forms": {}}
    print(f"XLA {tx.median_us:.2f}", flush=True)
    for S, warps in itertools.product(args.parts, (4, 8)):
        for name, f in forms(S, warps).items():
            fn = jax.jit(lambda kt, v, mask, q, f=f: (f(q, kt, mask, v),))
            kt, v, mask, q = ins(1)
            want = reference(*(np.asarray(x) for x in (q, kt, mask, v)))
            try:
                err = float(np.abs(np.asarray(fn(*ins(1))[0], np.float64) - want).max())
                t = time_trace(fn, ins, calls=30)
            except Exception as e:  # a form that fails is reported, not fatal
                print(f"S={S} w{warps} {name}: {type(e).__name__} {str(e)[:200]}", flush=True)
                continue
            ks = ", ".join(f"{k[0][:18]} {k[1]:.2f}" for k in t.kernels)
            print(
                f"S={S:2d} w{warps} {name:13s} {t.median_us:6.2f} [{ks}] err {err:.1e}", flush=True
            )
            rows["forms"][f"{name} S{S} w{warps}"] = {"us": t.median_us, "err": err}
    doc = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "result": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fused_combine_probe.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
