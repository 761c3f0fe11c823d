"""What a decode GEMV over a weight stored [N, K] (equinox's `Linear`, Gemma's transposed
gating weight) costs with what the norm + gate/up region adds to it: the norm's gain applied
to the activation, the norm's sum of squares, the product rounded to float16, both weights in
one block. One hand-written Triton kernel with each of these as a switch, timed at Llama-7B
size (x [1, 4096], gate and up [11008, 4096] float16) against XLA, device time
(`mirage_jax.profile.time_trace`, median of 20 calls). Needs a GPU:

    python -m experiments.gateup_gain_probe experiments/results/nk_gateup_probe_<machine>_<date>.json
"""

import itertools
import json
import platform
import sys
import time

import jax
import jax.numpy as jnp

from mirage_jax.profile import time_trace

try:  # the kernel needs triton (with jax's GPU wheels); the module imports without
    import jax_triton as jt
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - a CPU machine
    triton = None

CASES = (  # (rows a block, K a step, gain, both weights in a block, norm's sum, rounded to f16)
    (32, 512, 0, 0, 0, 0),
    (32, 512, 1, 0, 0, 0),
    (32, 512, 1, 0, 1, 0),
    (32, 512, 1, 0, 0, 1),
    (16, 512, 0, 1, 0, 0),
    (16, 512, 1, 1, 0, 0),
    (16, 512, 1, 1, 1, 0),
    (16, 512, 1, 1, 1, 1),
    (32, 256, 1, 1, 1, 0),
    (8, 1024, 1, 1, 1, 0),
    (32, 512, 1, 1, 1, 0),
    (16, 256, 1, 1, 1, 0),
)
CONFIGS = ((4, 3), (8, 3), (4, 4))  # (warps, pipelining stages)

if triton is not None:

    @triton.jit
    def _kernel(x, g, w1, w2, o1, o2, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GAIN: tl.constexpr, TWO: tl.constexpr, RMS: tl.constexpr, PRE: tl.constexpr):  # fmt: skip
        pn = tl.program_id(0)
        rn = pn * BN + tl.arange(0, BN)
        acc1 = tl.zeros((1, BN), dtype=tl.float32)
        acc2 = tl.zeros((1, BN), dtype=tl.float32)
        ss = tl.zeros((1, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            xr = tl.load(x + rk[None, :])
            xt = xr.to(tl.float32)
            if GAIN:
                xt = xt * tl.load(g + rk[None, :]).to(tl.float32)
            if PRE:
                xt = xt.to(tl.float16).to(tl.float32)
            if RMS:
                ss += xr.to(tl.float32) * xr.to(tl.float32)
            wt = tl.load(w1 + rn[None, :] * K + rk[:, None])  # [BK, BN], stored (N, K)
            acc1 += tl.sum(xt[:, :, None] * wt.to(tl.float32)[None, :, :], axis=1)
            if TWO:
                wt2 = tl.load(w2 + rn[None, :] * K + rk[:, None])
                acc2 += tl.sum(xt[:, :, None] * wt2.to(tl.float32)[None, :, :], axis=1)
        if RMS:
            r = tl.sqrt(tl.sum(ss, axis=1, keep_dims=True) / K + 1e-6)
            acc1 = acc1 / r
            acc2 = acc2 / r
        if TWO:
            acc1 = acc1 * tl.sigmoid(acc1) * acc2
        tl.store(o1 + rn[None, :], acc1.to(tl.float16))


def _call(k, n, bn, bk, gain, two, rms, pre, warps, stages):
    """The kernel over gate and up (both in each block where `two`, else as one weight of 2n
    rows, as `gemv_probe --nk` reads it)."""
    rows = n if two else 2 * n

    def f(x, g, w1, w2):
        out = [jax.ShapeDtypeStruct((1, rows), jnp.float16), jax.ShapeDtypeStruct((1, 1), jnp.float16)]  # fmt: skip
        return jt.triton_call(
            x, g, w1, w2, kernel=_kernel, out_shape=out, grid=(rows // bn,), num_warps=warps,
            num_stages=stages, K=k, BN=bn, BK=bk, GAIN=gain, TWO=two, RMS=rms, PRE=pre,
        )[0]  # fmt: skip

    return jax.jit(f)


def main(argv: list[str] | None = None) -> None:
    if triton is None:
        raise SystemExit("gateup_gain_probe needs a GPU with triton and jax-triton")
    (path,) = argv if argv is not None else sys.argv[1:]
    k, n = 4096, 11008
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (1, k), jnp.float16)
    g = jax.random.normal(jax.random.fold_in(key, 2), (1, k), jnp.float16)
    w = (jax.random.normal(jax.random.fold_in(key, 1), (2 * n, k), jnp.float16) * 0.03).astype(
        jnp.float16
    )
    w1, w2 = w[:n], w[n:]
    xla = jax.jit(lambda x, g, w1, w2: jax.nn.silu(x * g @ w1.T) * (x * g @ w2.T))
    rows = [{"xla_us": time_trace(xla, [x, g, w1, w2], calls=20).median_us}]
    print(rows[0], flush=True)
    for (bn, bk, gain, two, rms, pre), (warps, stages) in itertools.product(CASES, CONFIGS):
        try:
            f = _call(k, n, bn, bk, gain, two, rms, pre, warps, stages)
            us = time_trace(f, [x, g, w1, w2], calls=20).median_us
        except Exception as e:  # a tiling that does not compile is data
            us = str(e)[:120]
        row = dict(bn=bn, bk=bk, gain=gain, two=two, rms=rms, pre=pre, warps=warps, stages=stages)
        rows.append({**row, "us": us})
        print(rows[-1], flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "method": "device time, mirage_jax.profile.time_trace, median of 20 calls",
    }
    with open(path, "w") as fh:
        json.dump({**meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
