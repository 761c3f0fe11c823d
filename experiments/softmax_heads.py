"""Softmax over a matmul's columns, as model code writes it: a classifier head on the first
token (ViT-B/16: 768 → 1000 classes, bias), a mixture-of-experts router (Mixtral: 4096 → 8
experts, logits in bfloat16, the softmax in float32, 256 tokens a sequence), and attention
probabilities returned for inspection (`softmax(q kᵀ/√d)`, 12 heads of 64, 256 tokens).

Each runs under `mirage_jax.jit` (fresh cache, its own search) against `jax.jit`. Rows: the
first call (capture, search, verification, selection), the device time of each
(`mirage_jax.profile.time_trace`, GPU only), the kernels kept, whether the outputs match.
Results go to `<out>/softmax_heads.json` and `.md`.

    python -m experiments.softmax_heads --out experiments/results/x     # on the GPU
    python -m experiments.softmax_heads --cpu                           # tiny, interpret
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax
from experiments.library_blocks import first_call, parser, run_rows, write

BF16 = jnp.bfloat16


def classifier(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """Class probabilities from the first token's features."""
    return jax.nn.softmax(x[:, 0] @ w + b, axis=-1)


def router(x: jax.Array, w: jax.Array) -> jax.Array:
    """Expert probabilities per token: bfloat16 logits, a float32 softmax."""
    return jax.nn.softmax((x @ w).astype(jnp.float32), axis=-1)


def probabilities(q: jax.Array, k: jax.Array) -> jax.Array:
    """Attention probabilities per head, (B, H, T, S)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jax.nn.softmax(s.astype(jnp.float32), axis=-1)


def _inputs(name: str, batch: int, small: bool) -> tuple[Callable[..., Any], tuple]:
    rng = np.random.default_rng(0)

    def n(*shape: int, scale: float = 1.0, dtype: Any = BF16) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape) * scale, dtype)

    if name == "classifier":
        t, d, c = (4, 32, 10) if small else (197, 768, 1000)
        return classifier, (n(batch, t, d), n(d, c, scale=d**-0.5), n(c, scale=0.1))
    if name == "router":
        t, d, e = (8, 64, 8) if small else (256, 4096, 8)
        return router, (n(batch * t, d), n(d, e, scale=d**-0.5))
    t, h, hd = (8, 2, 16) if small else (256, 12, 64)
    return probabilities, (n(batch, t, h, hd), n(batch, t, h, hd))


def run_case(name: str, batch: int, small: bool, backend: str, calls: int) -> dict[str, Any]:
    """One row: mirage_jax.jit (fresh cache) against jax.jit."""
    fn, args = _inputs(name, batch, small)
    want = jax.jit(fn)(*args)
    with first_call(mirage_jax.jit, fn, args, backend, want) as (ours, common):
        row: dict[str, Any] = {"case": name, "batch": batch, **common}
        if jax.devices()[0].platform == "gpu":
            from mirage_jax.profile import time_trace

            row["jax_us"] = round(float(time_trace(jax.jit(fn), args, calls=calls).median_us), 2)
            row["mirage_us"] = round(float(time_trace(ours, args, calls=calls).median_us), 2)
            row["speedup"] = round(row["jax_us"] / row["mirage_us"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__, heads=12)
    p.add_argument("--cases", nargs="*", default=["classifier", "router", "probabilities"])
    args = p.parse_args(argv)
    backend = "pallas-interpret" if args.cpu else "auto"
    todo = [(c, b) for c in args.cases for b in args.batches]
    rows = run_rows(todo, lambda cb: run_case(cb[0], cb[1], args.cpu, backend, args.calls))
    write(
        args.out,
        "softmax_heads",
        "softmax over a matmul's columns: mirage_jax.jit against jax.jit",
        "first call by wall clock with an empty cache; device time per call by "
        "mirage_jax.profile.time_trace (kernel durations from a profiler trace, median of "
        f"{args.calls} calls), both jits in the same process",
        [("case", "case"), ("batch", "batch"), ("first call (s)", "first_call_s"),
         ("jax.jit (µs)", "jax_us"), ("mirage_jax.jit (µs)", "mirage_us"),
         ("speedup", "speedup"), ("kernels", "kernels"), ("rel. error", "rel_err")],
        rows,
    )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
