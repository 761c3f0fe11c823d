"""A transformer block built from equinox's own layers, under `mirage_jax.filter_jit` against
`equinox.filter_jit`: end to end, with a fresh cache and its own search.

The block is what an equinox user writes from the library (`eqx.nn.LayerNorm`,
`eqx.nn.MultiheadAttention` with a causal mask, `eqx.nn.MLP` with GELU, `eqx.nn.Dropout` in
inference mode), vmapped over the batch. Its modules hold a dropout flag and rate and the MLP's
activation functions as fields, which `jax.jit` (and `mirage_jax.jit`) cannot trace; both
filter jits hold them static. Rows: the first call (capture, search, verification, selection),
the device time of each (`mirage_jax.profile.time_trace`, GPU only), the kernels kept, and
whether the outputs match. Results go to `<out>/equinox_builtins.json` and `.md`.

    python -m experiments.equinox_builtins --out experiments/results/x      # on the GPU
    python -m experiments.equinox_builtins --cpu                            # tiny, interpret
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import mirage_jax
from experiments.library_blocks import first_call, parser, run_rows, write


class Block(eqx.Module):
    """Pre-LN encoder-decoder style block: x + attn(ln(x)), then + mlp(ln(.)), causal."""

    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP
    drop: eqx.nn.Dropout

    def __init__(self, d: int, heads: int, dtype: Any, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.ln1 = eqx.nn.LayerNorm(d, dtype=dtype)
        self.attn = eqx.nn.MultiheadAttention(heads, d, dtype=dtype, key=k1)
        self.ln2 = eqx.nn.LayerNorm(d, dtype=dtype)
        self.mlp = eqx.nn.MLP(d, d, 4 * d, 1, activation=jax.nn.gelu, dtype=dtype, key=k2)
        self.drop = eqx.nn.Dropout(0.1, inference=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x (T, D) -> (T, D)."""
        causal = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        h = jax.vmap(self.ln1)(x)
        x = x + self.drop(self.attn(h, h, h, mask=causal))
        return x + self.drop(jax.vmap(self.mlp)(jax.vmap(self.ln2)(x)))


def forward(block: Block, x: jax.Array) -> jax.Array:
    """The block over a batch, x (B, T, D)."""
    return jax.vmap(block)(x)


def _case(batch: int, tokens: int, d: int, heads: int, dtype: Any) -> tuple[Block, jax.Array]:
    block = Block(d, heads, dtype, jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, tokens, d), jnp.float32)
    return block, x.astype(dtype)


def run_case(
    batch: int, tokens: int, d: int, heads: int, dtype: Any, backend: str, calls: int
) -> dict[str, Any]:
    """One row: mirage_jax.filter_jit (fresh cache) against equinox.filter_jit."""
    block, x = _case(batch, tokens, d, heads, dtype)
    params, static = eqx.partition(block, eqx.is_array)
    ref = eqx.filter_jit(forward)
    want = ref(block, x)
    with first_call(mirage_jax.filter_jit, forward, (block, x), backend, want) as (ours, common):
        row: dict[str, Any] = {
            "batch": batch, "tokens": tokens, "d_model": d, "heads": heads,
            "dtype": jnp.dtype(dtype).name, **common,
        }  # fmt: skip
        if jax.devices()[0].platform == "gpu":
            from mirage_jax.profile import time_trace

            def timed(f: Any) -> float:
                # the modules' arrays are arguments; their flags and functions stay static
                fn = jax.jit(lambda p, x: f(eqx.combine(p, static), x))
                return float(time_trace(fn, (params, x), calls=calls).median_us)

            row["equinox_us"] = round(timed(ref), 2)
            row["mirage_us"] = round(timed(ours), 2)
            row["speedup"] = round(row["equinox_us"] / row["mirage_us"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__, heads=16)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args(argv)
    if args.cpu:
        shape, dtype, backend = (8, 32, 4), jnp.float32, "pallas-interpret"
    else:
        shape, dtype, backend = (args.tokens, args.d_model, args.heads), jnp.float16, "auto"
    rows = run_rows(args.batches, lambda b: run_case(b, *shape, dtype, backend, args.calls))
    write(
        args.out,
        "equinox_builtins",
        "equinox built-in layers: mirage_jax.filter_jit against equinox.filter_jit",
        "first call by wall clock with an empty cache; device time per call by "
        "mirage_jax.profile.time_trace (kernel durations from a profiler trace, median of "
        f"{args.calls} calls), both filter jits in the same process",
        [("batch", "batch"), ("tokens", "tokens"), ("d_model", "d_model"),
         ("first call (s)", "first_call_s"), ("equinox.filter_jit (µs)", "equinox_us"),
         ("mirage_jax.filter_jit (µs)", "mirage_us"), ("speedup", "speedup"),
         ("kernels", "kernels"), ("rel. error", "rel_err")],
        rows,
    )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
