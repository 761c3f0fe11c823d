"""Our own lowering of a one-row GEMV x @ W (1 x K @ K x N, fp16) at chosen tilings: which tiling
does our Triton code run fastest, and what does the cost model say of each?

For issue 16: `gemv_probe` times hand-written Triton; this times the µGraphs the search builds
(its loop form and its split-K form with a combining kernel), instantiated at the tilings given
here rather than the ones the cost model keeps. Device time per call
(`mirage_jax.profile.time_trace`, median of 30, rotating input sets), XLA's `x @ w` in the same
run; each line: grids (blocks per kernel), loop ranges, warps, µs, the cost model's estimate.

    python -m experiments.gemv_tilings 4096 4096 > experiments/results/gemv_tilings_<gpu>_<date>.txt

With `--norm`, the region is an RMSNorm (fp32 statistic, fp16 gain) followed by the GEMV: its
split-K form's combining kernel reads the row again for the rms (`Budget(reread=True)`: off in
`search.Budget` by default, on in `mirage_jax.jit`). `--splits-only` skips the loop forms. Each
line also gives the device time of each kernel (split, combine).
"""

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import lax_ir
from mirage_jax.lower import TritonConfig, lower
from mirage_jax.profile import time_trace
from mirage_jax.search import Budget, driver, search
from mirage_jax.search import cost as cost_model
from mirage_jax.search.structure import Numbers, instantiate


def normed_gemv(x, w, g):
    """RMSNorm of the row (statistic in fp32), times the gain (1, K), then x @ W: a decode
    block's norm + projection."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    return (h.astype(jnp.float16) * g) @ w


def main() -> None:
    seen: list = []  # (problem, structure) of each structure the search numbers
    orig = driver._instances

    def spy(problem, s, target, device, keep, deadline):
        seen.append((problem, s))
        return orig(problem, s, target, device, keep, deadline)

    driver._instances = spy
    K, N = int(sys.argv[1]), int(sys.argv[2])
    norm = "--norm" in sys.argv[3:]
    S = jax.ShapeDtypeStruct
    specs = [S((1, K), jnp.float16), S((K, N), jnp.float16)]
    if norm:
        p = lax_ir.capture(normed_gemv, *specs, S((1, K), jnp.float16))
    else:
        p = lax_ir.capture(lambda x, w: x @ w, *specs)
    pr = lax_ir.partition(p).regions[0].program
    search(
        pr,
        budget=Budget(time_s=60, results=4, cuts=False, max_predefined=0, reread=norm),
        seed=0,
        workers=1,
        progress=False,
    )
    driver._instances = orig
    split_s = [
        s for _, s in seen if len(s.kernels) == 2 and "loop[0" in s.describe(str).split(";")[0]
    ]
    loop_s = [s for _, s in seen if len(s.kernels) == 1 and "loop[0" in s.describe(str)]
    problem = seen[0][0]

    @functools.cache
    def inputs(seed):
        r = np.random.default_rng(seed)
        xs = (
            jnp.asarray(r.normal(0, 0.3, (1, K)), jnp.float16),
            jnp.asarray(r.normal(0, 0.02, (K, N)), jnp.float16),
        )
        return (*xs, jnp.asarray(r.normal(1, 0.1, (1, K)), jnp.float16)) if norm else xs

    xla = time_trace(jax.jit(normed_gemv if norm else lambda x, w: x @ w), inputs, calls=30)
    print(f"K={K} N={N}{' norm' if norm else ''} XLA {xla.median_us:.2f} µs", flush=True)

    def run(s, grids, loops, warps):
        try:
            g = instantiate(s, problem.program.input_avals, problem.sizes, Numbers(grids, loops))
            c = cost_model.estimate(g)
            f = lower(g, backend="triton", config=TritonConfig(num_warps=warps))
            t = time_trace(f, inputs, calls=30)
            each = " + ".join(f"{us:.2f}" for _, us, _ in t.kernels)
            print(
                f"  {grids} {loops} w{warps}: {t.median_us:.2f} µs ({each}) "
                f"(model {c.seconds * 1e6:.1f})",
                flush=True,
            )
        except Exception as e:
            print(f"  {grids} {loops} w{warps}: {type(e).__name__} {str(e)[:120]}", flush=True)

    t0 = time.perf_counter()
    for cols in (16, 32, 64, 128, 256) if "--splits-only" not in sys.argv else ():
        for rows in (64, 256, 512, 1024):
            if loop_s:
                run(loop_s[0], ((N // cols,),), (K // rows,), 4)
    combine = (max(1, N // 32),)
    for cols in (64, 128, 256):
        for split in (2, 8, 16, 32):
            for rows in (64, 256):
                per = K // split
                if per < rows:
                    continue
                if split_s:
                    run(split_s[0], ((N // cols, split), combine), (per // rows, split), 4)
    for w in (2, 8):
        if split_s:
            run(split_s[0], ((N // 256, 16), combine), (4, 16), w)
    print("sweep", round(time.perf_counter() - t0, 1), "s")


if __name__ == "__main__":
    main()
