"""What the running max costs in gqa_stable's split-KV kernel, and which forms hide it (GPU).

`gqa_stable` at b=8 (16 KV heads x 256 query rows, 4096 keys, head dim 64, scale 0.125) runs
its split kernel slower than `gqa`'s unstable one (issue 16: stable within 10% of unstable).
Hand-written Triton split kernels through jax-triton, each launched alone and timed by
`mirage_jax.profile.time_trace` (device time, median of 30 calls), in one run:

- `unstable`: exp of the raw scores, sums only (gqa's form);
- `stable`: the running max as `mirage_jax.lower` generates it (max per step, rescale);
- `norescale`: the max per step but no rescale of the sums (wrong numbers: the cost split);
- `lazy`: the rescale only when some row's max grew by more than `LAZY_LOG2` (in log2 units)
  since the last rescale; otherwise the old max stays the reference (p <= 2**LAZY_LOG2);
- `unstable_pipe`, `stable_pipe`: the next key tile's scores issued before this tile's softmax
  (its wgmma runs while the exp and the max do), the last tile peeled;
- `spec`: the first key tile's row max is the reference for every later tile (no max per
  step); where some row's sum reaches 2**15 (a float16 term may have overflowed), the block
  redoes its rows in the `stable` form (`spec_nofb`: no fallback, for its cost; `spec_pre`:
  the reference from a dot of the first tile before the loop, no branch in it). Stable forms are also checked at 6x larger scores;
- each at block rows BM, key tile BN, STEPS steps per program, warps, stages, and with
  `tl.range(warp_specialize=True)` where `--ws 1`.

The partial results are combined in jnp and checked against XLA's softmax attention.
Writes `<out>/stable_split_probe.txt`.

    python -m experiments.stable_split_probe --out /tmp/x
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

import jax
import jax.numpy as jnp

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LAZY_LOG2 = 8.0
H, M, D, N = 16, 256, 64, 4096


@triton.jit
def _step(s, vtile, m_i, l_i, acc, STABLE: tl.constexpr):
    """One key tile's online-softmax update: (m, l, acc) after the scores `s` (log2 units)."""
    if STABLE:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), vtile, acc * alpha[:, None])
        m_i = m_new
    else:
        p = tl.math.exp2(s)
        l_i = l_i + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.float16), vtile, acc)
    return m_i, l_i, acc


@triton.jit
def split_attn(
    q,
    kt,
    v,
    po,
    pl,
    pm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    STEPS: tl.constexpr,
    SPLITS: tl.constexpr,
    FORM: tl.constexpr,
    QS: tl.constexpr,
    THRESH: tl.constexpr,
    WS: tl.constexpr,
):
    h = tl.program_id(0)
    mb = tl.program_id(1)
    sp = tl.program_id(2)
    rows = mb * BM + tl.arange(0, BM)
    d = tl.arange(0, 64)
    cols = tl.arange(0, BN)
    qt = tl.load(q + h * 256 * 64 + rows[:, None] * 64 + d[None, :])
    qt = (qt.to(tl.float32) * QS).to(tl.float16)  # scale and log2(e) folded into Q
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, 64), tl.float32)
    base = sp * STEPS * BN
    kbase = kt + h * 64 * 4096 + d[:, None] * 4096 + cols[None, :]
    vbase = v + h * 4096 * 64 + cols[:, None] * 64 + d[None, :]
    if FORM >= 6:  # speculative: the first tile's max is the reference for every tile
        if FORM == 8:  # the reference from a dot of its own before the loop
            m_i = tl.max(tl.dot(qt, tl.load(kbase + base)), 1)
        for it in range(0, STEPS):
            start = base + it * BN
            s = tl.dot(qt, tl.load(kbase + start))
            if FORM != 8:  # noqa: SIM102 (a constexpr branch around a runtime one)
                if it == 0:
                    m_i = tl.max(s, 1)
            p = tl.math.exp2(s - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = tl.dot(p.to(tl.float16), tl.load(vbase + start * 64), acc)
        # every p is below l (all are positive): l < 2**15 means none overflowed in float16;
        # the first tile's max term is 1, so l >= 1 and the terms that matter are normal
        # some row's scores outgrew its reference: redo the block, stable
        if FORM != 7 and tl.max(l_i, 0) >= 32768.0:
            m_i = tl.full((BM,), float("-inf"), tl.float32)
            l_i = tl.zeros((BM,), tl.float32)
            acc = tl.zeros((BM, 64), tl.float32)
            for it in tl.range(0, STEPS, num_stages=1):  # rare: no buffers of its own
                start = base + it * BN
                s = tl.dot(qt, tl.load(kbase + start))
                m_i, l_i, acc = _step(s, tl.load(vbase + start * 64), m_i, l_i, acc, True)
    elif FORM >= 4:  # pipelined: the next tile's scores are issued before this tile's softmax
        s = tl.dot(qt, tl.load(kbase + base))
        for it in tl.range(0, STEPS - 1, warp_specialize=WS):
            start = base + it * BN
            vtile = tl.load(vbase + start * 64)
            s_next = tl.dot(qt, tl.load(kbase + start + BN))
            m_i, l_i, acc = _step(s, vtile, m_i, l_i, acc, FORM == 5)
            s = s_next
        vtile = tl.load(vbase + (base + (STEPS - 1) * BN) * 64)
        m_i, l_i, acc = _step(s, vtile, m_i, l_i, acc, FORM == 5)
    else:
        for it in tl.range(0, STEPS, warp_specialize=WS):
            start = base + it * BN
            ktile = tl.load(kbase + start)
            vtile = tl.load(vbase + start * 64)
            s = tl.dot(qt, ktile)
            if FORM == 0:  # unstable
                m_i, l_i, acc = _step(s, vtile, m_i, l_i, acc, False)
            elif FORM == 1:  # stable, rescale every step
                m_i, l_i, acc = _step(s, vtile, m_i, l_i, acc, True)
            elif FORM == 2:  # max per step, no rescale (timing only)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.math.exp2(s - m_new[:, None])
                l_i = l_i + tl.sum(p, 1)
                acc = tl.dot(p.to(tl.float16), vtile, acc)
                m_i = m_new
            else:  # lazy: rescale only when a row's max grew by more than THRESH
                m_new = tl.maximum(m_i, tl.max(s, 1))
                grow = tl.max(m_new - m_i, 0)
                if grow > THRESH:
                    alpha = tl.math.exp2(m_i - m_new)
                    l_i = l_i * alpha
                    acc = acc * alpha[:, None]
                    m_i = m_new
                p = tl.math.exp2(s - m_i[:, None])
                l_i = l_i + tl.sum(p, 1)
                acc = tl.dot(p.to(tl.float16), vtile, acc)
    out_rows = (h * 256 + rows) * SPLITS + sp
    tl.store(po + out_rows[:, None] * 64 + d[None, :], acc)
    tl.store(pl + out_rows, l_i)
    tl.store(pm + out_rows, m_i)


FORMS = {
    "unstable": 0,
    "stable": 1,
    "norescale": 2,
    "lazy": 3,
    "unstable_pipe": 4,
    "stable_pipe": 5,
    "spec": 6,
    "spec_nofb": 7,
    "spec_pre": 8,
}


def call(form: str, bm: int, bn: int, steps: int, warps: int, stages: int, ws: bool = False):
    """A jitted split kernel of `form` at these numbers: (q, kt, v) -> (o, l, m) partials."""
    import jax_triton as jt

    splits = N // (bn * steps)
    qs = 0.125 * LOG2E

    def f(q, kt, v):
        shapes = [
            jax.ShapeDtypeStruct((H * M * splits, D), jnp.float32),
            jax.ShapeDtypeStruct((H * M * splits,), jnp.float32),
            jax.ShapeDtypeStruct((H * M * splits,), jnp.float32),
        ]
        return jt.triton_call(
            q,
            kt,
            v,
            kernel=split_attn,
            out_shape=shapes,
            grid=(H, M // bm, splits),
            num_warps=warps,
            num_stages=stages,
            BM=bm,
            BN=bn,
            STEPS=steps,
            SPLITS=splits,
            FORM=FORMS[form],
            QS=qs,
            THRESH=0.0 if form != "lazy" else LAZY_LOG2,
            WS=ws,
        )

    return jax.jit(f), splits


def combine(o, sums, m, splits: int, stable: bool):
    """The partials combined in jnp (log2-domain maxima), (H, M, D)."""
    o = o.reshape(H, M, splits, D)
    sums = sums.reshape(H, M, splits)
    if not stable:
        return o.sum(2) / sums.sum(2)[..., None]
    m = m.reshape(H, M, splits)
    mx = m.max(2, keepdims=True)
    w = jnp.exp2(m - mx)
    return (o * w[..., None]).sum(2) / (sums * w).sum(2)[..., None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/x")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    p.add_argument("--shapes", nargs="+", default=None, help="BMxBNxSTEPS, e.g. 64x128x8")
    p.add_argument("--warps", nargs="+", type=int, default=[4, 8])
    p.add_argument("--stages", nargs="+", type=int, default=[3])
    p.add_argument(
        "--ws", nargs="+", type=int, default=[0], help="warp_specialize off (0) / on (1)"
    )
    args = p.parse_args()
    from mirage_jax.profile import time_trace

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def say(s: str) -> None:
        print(s, flush=True)
        with open(out / "stable_split_probe.txt", "a") as log:
            log.write(s + "\n")

    def sets(i):
        ks = jax.random.split(jax.random.key(i), 3)
        return (
            jax.random.normal(ks[0], (H, M, D), jnp.float16),
            jax.random.normal(ks[1], (H, D, N), jnp.float16),
            jax.random.normal(ks[2], (H, N, D), jnp.float16),
        )

    x = sets(0)
    ref = jax.nn.softmax((x[0] @ x[1]).astype(jnp.float32) * 0.125, axis=-1) @ x[2].astype(
        jnp.float32
    )
    ref6 = jax.nn.softmax(((x[0] * 6) @ x[1]).astype(jnp.float32) * 0.125, axis=-1) @ x[2].astype(
        jnp.float32
    )
    ref_u = jnp.exp((x[0] @ x[1]).astype(jnp.float32) * 0.125)
    ref_u = (ref_u / ref_u.sum(-1, keepdims=True)) @ x[2].astype(jnp.float32)
    say(f"devices {jax.devices()} jax {jax.__version__} triton {triton.__version__}")
    say("form BM BN steps splits warps stages: µs (kernel alone), max abs err")
    shapes = [(128, 128, 8), (128, 128, 4), (64, 128, 8), (128, 64, 8), (64, 64, 8), (64, 128, 4)]
    if args.shapes:
        shapes = [tuple(int(n) for n in sh.split("x")) for sh in args.shapes]
    for (bm, bn, steps), form, warps, stages, ws in itertools.product(
        shapes, args.forms, args.warps, args.stages, args.ws
    ):
        tag = f"{form:13s} {bm:3d} {bn:3d} {steps:2d} w{warps} s{stages}{' ws' if ws else '   '}"
        try:
            fn, splits = call(form, bm, bn, steps, warps, stages, bool(ws))
            o, sums, m = fn(*x)
            stable = not form.startswith("unstable")
            got = combine(o, sums, m, splits, stable)
            err = float(jnp.max(jnp.abs(got - (ref if stable else ref_u))))
            if stable:  # scores 6x larger: the speculative form must fall back
                o, sums, m = fn(x[0] * 6, x[1], x[2])
                got = combine(o, sums, m, splits, stable)
                err = max(err, float(jnp.max(jnp.abs(got - ref6))))
            t = time_trace(fn, sets, calls=args.calls)
            say(f"{tag} splits {splits:2d}: {t.median_us:7.2f}  err {err:.2g}")
        except Exception as e:  # a probe: record and go on
            say(f"{tag}: {type(e).__name__} {str(e)[:300]}")


if __name__ == "__main__":
    main()
