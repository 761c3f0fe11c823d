"""Why our Pallas lowering of gqa_bs1[25] is slower than our Triton source: variants of kernel 1.

A diagnosis behind docs/perf_log.md (2026-11-21 ~21:25 UTC): the µGraph's first kernel written
by hand in Pallas with the same grid (2×16×4), tiles (64×64) and loop (4 steps of 64 keys), in
2-D or 3-D blocks, with exp or exp2, fp16 or fp32 outputs, against our Pallas and Triton
lowerings of the whole µGraph, by the profiler-trace method. GPU only.

    python -m experiments.pallas_probe PEER_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from mirage_jax import profile
from mirage_jax.lower import lower
from mirage_jax.mugraph.mirage_import import load_mirage_checkpoint

BH, Q, D, S = 2, 256, 64, 4096
SPLITS, BQ, STEP = 16, 64, 64
PER = S // SPLITS
LOG2E = np.float32(np.log2(np.e))


def make(rank3: bool, out_dtype: Any, fast_exp: bool) -> Any:
    """Kernel 1 of gqa_bs1[25] by hand: partial exp-sums and outputs per (head, split, q block)."""

    def kernel(q_ref, k_ref, v_ref, acc_ref, sum_ref):
        q = q_ref[...].reshape(BQ, D) if rank3 else q_ref[...]

        def body(i, carry):
            acc, ssum = carry
            if rank3:
                k = k_ref[:, :, pl.ds(i * STEP, STEP)].reshape(D, STEP)
                v = v_ref[:, pl.ds(i * STEP, STEP), :].reshape(STEP, D)
            else:
                k = k_ref[:, pl.ds(i * STEP, STEP)]
                v = v_ref[pl.ds(i * STEP, STEP), :]
            s = jnp.dot(q, k, preferred_element_type=jnp.float32)
            e = jnp.exp2(s * LOG2E) if fast_exp else jnp.exp(s)
            acc = acc + jnp.dot(e.astype(jnp.float16), v, preferred_element_type=jnp.float32)
            return acc, ssum + e.sum(-1)

        init = (jnp.zeros((BQ, D), jnp.float32), jnp.zeros((BQ,), jnp.float32))
        acc, ssum = jax.lax.fori_loop(0, PER // STEP, body, init)
        acc_ref[...] = acc.astype(out_dtype).reshape(acc_ref.shape)
        sum_ref[...] = ssum.astype(out_dtype)

    lead = 1 if rank3 else None
    call = pl.pallas_call(
        kernel,
        grid=(BH, SPLITS, Q // BQ),
        in_specs=[
            pl.BlockSpec((lead, BQ, D), lambda b, s, i: (b, i, 0)),
            pl.BlockSpec((lead, D, PER), lambda b, s, i: (b, 0, s)),
            pl.BlockSpec((lead, PER, D), lambda b, s, i: (b, s, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, lead, BQ, D), lambda b, s, i: (b, s, i, 0)),
            pl.BlockSpec((None, None, BQ), lambda b, s, i: (b, s, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((BH, SPLITS, Q, D), out_dtype),
            jax.ShapeDtypeStruct((BH, SPLITS, Q), out_dtype),
        ],
        compiler_params=plt.CompilerParams(num_warps=4, num_stages=3),
    )
    return jax.jit(call)


def _inputs(seed: int) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    q = (r.standard_normal((BH, Q, D)) * 0.25).astype(np.float16)
    k = (r.standard_normal((BH, D, S)) * 0.25).astype(np.float16)
    return [q, k, r.standard_normal((BH, S, D)).astype(np.float16)]


def main(peer: str, out: str) -> None:
    sets = [tuple(jax.device_put(x) for x in _inputs(s)) for s in range(8)]
    g = load_mirage_checkpoint(f"{peer}/h100/gqa_bs1.json")[25]
    ours_pallas, ours_triton = lower(g, "pallas"), lower(g, "triton")
    variants = {
        "2-D, fp32 out, exp2": make(False, jnp.float32, True),
        "2-D, fp16 out, exp2": make(False, jnp.float16, True),
        "2-D, fp16 out, exp": make(False, jnp.float16, False),
        "3-D+reshape, fp16 out, exp2": make(True, jnp.float16, True),
        "ours pallas [25]": jax.jit(lambda *x: ours_pallas(*x)),
        "ours triton [25]": jax.jit(lambda *x: ours_triton(*x)),
    }
    rows = []
    for name, fn in variants.items():
        t = profile.time_trace(fn, lambda s: sets[s], calls=50, max_sets=8)
        kernels = [(k, round(us, 2)) for k, us, _ in t.kernels]
        print(f"{name:32} total {t.median_us:6.2f}  {kernels}", flush=True)
        rows.append({"variant": name, "trace_us": t.median_us, "kernels": kernels})
    Path(out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
