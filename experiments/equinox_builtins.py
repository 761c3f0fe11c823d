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

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import mirage_jax
from experiments.reproduce_common import versions


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


def _rel_err(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def run_case(
    batch: int, tokens: int, d: int, heads: int, dtype: Any, backend: str, calls: int
) -> dict[str, Any]:
    """One row: mirage_jax.filter_jit (fresh cache) against equinox.filter_jit."""
    block, x = _case(batch, tokens, d, heads, dtype)
    params, static = eqx.partition(block, eqx.is_array)
    ref = eqx.filter_jit(forward)
    want = ref(block, x)
    with tempfile.TemporaryDirectory() as tmp:
        ours = mirage_jax.filter_jit(forward, backend=backend, cache=Path(tmp) / "c.sqlite")
        t0 = time.perf_counter()
        got = jax.block_until_ready(ours(block, x))
        first = time.perf_counter() - t0
        decisions = ours.last.decisions
        row: dict[str, Any] = {
            "batch": batch, "tokens": tokens, "d_model": d, "heads": heads,
            "dtype": jnp.dtype(dtype).name, "first_call_s": round(first, 2),
            "kernels": sum(d.status == "kernel" for d in decisions),
            "regions": [(d.index, d.status, d.reason[:160]) for d in decisions],
            "rel_err": _rel_err(got, want),
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


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# equinox built-in layers: mirage_jax.filter_jit against equinox.filter_jit",
        "",
        f"Method: {meta['method']}. Machine: {meta['device']}. Versions: {meta['versions']}.",
        "",
        "| batch | tokens | d_model | first call (s) | equinox.filter_jit (µs) "
        "| mirage_jax.filter_jit (µs) | speedup | kernels | rel. error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['tokens']} | {r['d_model']} | {r['first_call_s']} "
            f"| {r.get('equinox_us', '–')} | {r.get('mirage_us', '–')} "
            f"| {r.get('speedup', '–')} | {r['kernels']} | {r['rel_err']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="tiny sizes, Pallas interpret mode")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.cpu:
        shape, dtype, backend = (8, 32, 4), jnp.float32, "pallas-interpret"
    else:
        shape, dtype, backend = (args.tokens, args.d_model, args.heads), jnp.float16, "auto"
    rows = []
    for b in args.batches:
        row = run_case(b, *shape, dtype, backend, args.calls)
        print({k: v for k, v in row.items() if k != "regions"}, flush=True)
        rows.append(row)
    meta = {
        "method": "first call by wall clock with an empty cache; device time per call by "
        "mirage_jax.profile.time_trace (kernel durations from a profiler trace, median of "
        f"{args.calls} calls), both filter jits in the same process",
        "device": jax.devices()[0].device_kind,
        "date": time.strftime("%Y-%m-%d"),
        "versions": versions(),
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "equinox_builtins.json").write_text(
            json.dumps({"meta": meta, "rows": rows}, indent=1)
        )
        (args.out / "equinox_builtins.md").write_text(_markdown(rows, meta))
    return rows


if __name__ == "__main__":
    main()
