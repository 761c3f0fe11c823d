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
- each at block rows BM, key tile BN, STEPS steps per program, warps, stages.

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
    for it in range(0, STEPS):
        start = base + it * BN
        ktile = tl.load(kt + h * 64 * 4096 + d[:, None] * 4096 + start + cols[None, :])
        vtile = tl.load(v + h * 4096 * 64 + (start + cols[:, None]) * 64 + d[None, :])
        s = tl.dot(qt, ktile)
        if FORM == 0:  # unstable
            p = tl.math.exp2(s)
            l_i = l_i + tl.sum(p, 1)
            acc = tl.dot(p.to(tl.float16), vtile, acc)
        elif FORM == 1:  # stable, rescale every step
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(tl.float16), vtile, acc)
            m_i = m_new
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


FORMS = {"unstable": 0, "stable": 1, "norescale": 2, "lazy": 3}


def call(form: str, bm: int, bn: int, steps: int, warps: int, stages: int):
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
    ref_u = jnp.exp((x[0] @ x[1]).astype(jnp.float32) * 0.125)
    ref_u = (ref_u / ref_u.sum(-1, keepdims=True)) @ x[2].astype(jnp.float32)
    say(f"devices {jax.devices()} jax {jax.__version__} triton {triton.__version__}")
    say("form BM BN steps splits warps stages: µs (kernel alone), max abs err")
    shapes = [(128, 128, 8), (128, 128, 4), (64, 128, 8), (128, 64, 8), (64, 64, 8), (64, 128, 4)]
    for (bm, bn, steps), form, warps, stages in itertools.product(
        shapes, list(FORMS), (4, 8), (3,)
    ):
        try:
            fn, splits = call(form, bm, bn, steps, warps, stages)
            o, sums, m = fn(*x)
            got = combine(o, sums, m, splits, form != "unstable")
            err = float(jnp.max(jnp.abs(got - (ref if form != "unstable" else ref_u))))
            t = time_trace(fn, sets, calls=args.calls)
            say(
                f"{form:9s} {bm:3d} {bn:3d} {steps:2d} {splits:3d} w{warps} s{stages}: "
                f"{t.median_us:7.2f}  err {err:.2g}"
            )
        except Exception as e:  # a probe: record and go on
            say(f"{form:9s} {bm:3d} {bn:3d} {steps:2d} w{warps}: {type(e).__name__} {str(e)[:160]}")


if __name__ == "__main__":
    main()
