"""Hand-written Triton attention (the FlashAttention-2 form) at the set's prefill shapes, with
the Hopper features Triton 3.6 offers through jax-triton, against cuDNN: tile sizes, warps,
stages, `warp_specialize`, persistent (flattened) tiles. Inputs as stored (B, T, heads, D).

For issue 16's prefill criterion: what a Triton kernel reaches at these shapes (our generator
emits the same form). Writes `$OUT/x/ws_probe.txt` (µs per form, device time by
`mirage_jax.profile.time_trace`, median of 30 calls). On a GPU:

    python -m experiments.attention_forms_probe sdpa gpt2 long

Measured on the H100, 2026-11-27: `experiments/results/prefill_probes_h100_2026-11-27c.txt`.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

try:
    import jax_triton as jt
except ImportError:
    jt = None
from mirage_jax.profile import time_trace

OUT = os.environ.get("OUT", "/tmp") + "/x"


def say(*a):
    """Print a line and append it to `$OUT/x/ws_probe.txt`."""
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    os.makedirs(OUT, exist_ok=True)
    with open(f"{OUT}/ws_probe.txt", "a") as log:
        log.write(s + "\n")


@triton.jit
def _tile(
    Q,
    K,
    V,
    Out,
    pid_m,
    bh,
    T: tl.constexpr,
    S: tl.constexpr,
    NQ: tl.constexpr,
    NK: tl.constexpr,
    H: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    CAUSAL: tl.constexpr,
    QL: tl.constexpr,
    WS: tl.constexpr,
):
    b = bh // NQ
    n = bh % NQ
    kh = n // (NQ // NK)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_h = tl.arange(0, H)
    q = tl.load(Q + b * T * NQ * H + offs_m[:, None] * (NQ * H) + n * H + offs_h[None, :])
    q = (q * QL).to(tl.float16)
    kb = K + b * S * NK * H + kh * H
    vb = V + b * S * NK * H + kh * H
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, H), tl.float32)
    if CAUSAL:
        hi = (pid_m + 1) * BM
    else:
        hi = S
    for start in tl.range(0, hi, BN, warp_specialize=WS):
        offs_n = start + tl.arange(0, BN)
        kT = tl.load(kb + offs_n[None, :] * (NK * H) + offs_h[:, None])
        s = tl.dot(q, kT)
        if CAUSAL:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        v = tl.load(vb + offs_n[:, None] * (NK * H) + offs_h[None, :])
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(
        Out + b * T * NQ * H + offs_m[:, None] * (NQ * H) + n * H + offs_h[None, :],
        o.to(tl.float16),
    )


@triton.jit
def fa(
    Q,
    K,
    V,
    Out,
    T: tl.constexpr,
    S: tl.constexpr,
    NQ: tl.constexpr,
    NK: tl.constexpr,
    H: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    CAUSAL: tl.constexpr,
    QL: tl.constexpr,
    WS: tl.constexpr,
    NPROG: tl.constexpr,
    FLAT: tl.constexpr,
    NTILES: tl.constexpr,
):
    MB: tl.constexpr = T // BM
    if NPROG == 0:
        pid_m = tl.program_id(0)
        if CAUSAL:
            pid_m = MB - 1 - pid_m
        _tile(Q, K, V, Out, pid_m, tl.program_id(1), T, S, NQ, NK, H, BM, BN, CAUSAL, QL, WS)
    else:
        for tile in tl.range(tl.program_id(0), NTILES, NPROG, flatten=FLAT):
            pid_m = tile % MB
            if CAUSAL:
                pid_m = MB - 1 - pid_m
            _tile(Q, K, V, Out, pid_m, tile // MB, T, S, NQ, NK, H, BM, BN, CAUSAL, QL, WS)


def fa_call(B, T, NQ, NK, H, BM, BN, warps, stages, causal, ws, nprog, flat):
    scale = 1.0 / np.sqrt(H) * 1.4426950408889634

    def f(q, k, v):
        grid = (T // BM, B * NQ) if nprog == 0 else (nprog,)
        return jt.triton_call(
            q,
            k,
            v,
            kernel=fa,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid=grid,
            num_warps=warps,
            num_stages=stages,
            T=T,
            S=T,
            NQ=NQ,
            NK=NK,
            H=H,
            BM=BM,
            BN=BN,
            CAUSAL=causal,
            QL=float(scale),
            WS=ws,
            NPROG=nprog,
            FLAT=flat,
            NTILES=(T // BM) * B * NQ,
        )

    return jax.jit(f)


def run_shape(tag, B, T, NQ, NK, H, causal, variants):
    def sets(i):
        ks = jax.random.split(jax.random.key(i), 3)
        return (
            jax.random.normal(ks[0], (B, T, NQ, H), jnp.float16),
            jax.random.normal(ks[1], (B, T, NK, H), jnp.float16),
            jax.random.normal(ks[2], (B, T, NK, H), jnp.float16),
        )

    x = sets(0)
    want = np.asarray(
        jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation="xla"
            )
        )(*x),
        np.float32,
    )
    flops = 4 * B * NQ * T * T * H / (2 if causal else 1)
    say(f"== {tag} B{B} T{T} NQ{NQ} NK{NK} H{H} causal={causal}: {flops / 1e9:.2f} Gflop done")
    try:
        cud = jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation="cudnn"
            )
        )
        t = time_trace(cud, sets, calls=30)
        say(f"   cudnn {t.median_us:8.2f}  {flops / t.median_us / 1e6:.0f} Tflop/s")
    except Exception as e:
        say("   cudnn failed", type(e).__name__, str(e)[:100])
    for BM, BN, w, st, ws, nprog, flat in variants:
        name = f"BM{BM:3d} BN{BN:3d} w{w} s{st} ws={ws} nprog={nprog} flat={flat}"
        try:
            fn = fa_call(B, T, NQ, NK, H, BM, BN, w, st, causal, ws, nprog, flat)
            got = np.asarray(fn(*x), np.float32)
            err = float(np.max(np.abs(got - want)))
            t = time_trace(fn, sets, calls=30)
            say(
                f"   {name}: {t.median_us:8.2f} µs {flops / t.median_us / 1e6:.0f} Tflop/s err {err:.3g}"
            )
        except Exception as e:
            say(f"   {name}: {type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
    say("devices", jax.devices(), "jax", jax.__version__, "triton", triton.__version__)
    base = [
        (64, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 3),
        (128, 64, 8, 4),
        (128, 128, 8, 4),
        (128, 64, 4, 3),
    ]
    V = [(*b, False, 0, False) for b in base]
    V += [(128, 64, 8, 3, True, 0, False)]  # warp_specialize: same TTGIR on sm90 without TMA
    V += [
        (128, 64, 8, 3, False, 132, True),
        (128, 64, 8, 3, False, 132, False),
        (64, 64, 4, 3, False, 264, True),
        (128, 128, 8, 3, False, 132, True),
        (128, 64, 8, 3, True, 132, True),
    ]
    which = sys.argv[1:] or ["sdpa", "gpt2", "long"]
    if "sdpa" in which:
        run_shape("sdpa", 8, 512, 8, 2, 128, False, V)
    if "gpt2" in which:
        run_shape("gpt2", 8, 512, 16, 16, 64, True, V)
    if "long" in which:
        run_shape("long", 1, 4096, 32, 8, 128, False, [v for v in V if v[5] == 0 or v[6]])
