"""A decode step built from flax nnx's own layers, its KV cache held in the module, under
`mirage_jax.jit` against `nnx.jit`: end to end, with a fresh cache and its own search.

The block is what an nnx user writes from the library: `nnx.LayerNorm`,
`nnx.MultiHeadAttention(decode=True)` (its key/value cache and index are `nnx.Cache`
Variables it writes on every call), an `nnx.Linear` MLP with GELU. Each call changes the
module's state, which `jax.jit` would drop; `mirage_jax.jit` writes it back as `nnx.jit` does
(`mirage_jax.nnx_state`). Rows: the first call (capture, search, verification, selection),
the outputs and cache indices of a few steps against `nnx.jit`'s, and on a GPU the device time
of one step of each (`mirage_jax.profile.time_trace`: both as functions of the module's state,
the graph definition held fixed). Results go to `<out>/nnx_builtins.json` and `.md`.

    python -m experiments.nnx_builtins --out experiments/results/x      # on the GPU
    python -m experiments.nnx_builtins --cpu                            # tiny, interpret
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import mirage_jax
from experiments.library_blocks import parser, rel_err, run_rows, write


class Block(nnx.Module):
    """Pre-LN block: x + attn(ln(x)), then + mlp(ln(.)). With `decode` it decodes one token
    and writes the attention's cache at its index; without, it runs a causal prefill
    (`experiments.flax_prefill`)."""

    def __init__(
        self,
        d: int,
        heads: int,
        dtype: Any,
        rngs: nnx.Rngs,
        decode: bool = True,
        param_dtype: Any = None,
    ):
        kw = {"dtype": dtype, "param_dtype": param_dtype or dtype, "rngs": rngs}
        self.ln1 = nnx.LayerNorm(d, **kw)
        self.attn = nnx.MultiHeadAttention(heads, d, decode=decode, **kw)
        self.ln2 = nnx.LayerNorm(d, **kw)
        self.up = nnx.Linear(d, 4 * d, **kw)
        self.down = nnx.Linear(4 * d, d, **kw)
        self.decode = decode

    def __call__(self, x: jax.Array) -> jax.Array:
        """x (B, T, D) -> (B, T, D); T = 1 where it decodes."""
        mask = None if self.decode else nnx.make_causal_mask(x[..., 0])
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


def step(block: Block, x: jax.Array) -> jax.Array:
    """One call of the block (a decode step, or a prefill)."""
    return block(x)


def _block(batch: int, cache: int, d: int, heads: int, dtype: Any) -> Block:
    block = Block(d, heads, dtype, nnx.Rngs(0))
    block.attn.init_cache((batch, cache, d), dtype=dtype)
    return block


def _stateful(fn: Any) -> Any:
    """`fn(graphdef, state)` of one step: the outputs and the state the step leaves."""

    def run(graphdef: Any, state: Any) -> Any:
        (block, x), _ = nnx.merge(graphdef, state)
        return fn(block, x), nnx.state((block, x))

    return run


def run_case(
    batch: int, cache: int, d: int, heads: int, dtype: Any, backend: str, steps: int, calls: int
) -> dict[str, Any]:
    """One row: mirage_jax.jit (fresh cache) against nnx.jit, `steps` decode steps each."""
    ours_block, ref_block = (_block(batch, cache, d, heads, dtype) for _ in range(2))
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal((batch, 1, d)), dtype) for _ in range(steps)]
    ref = nnx.jit(step)
    want = [ref(ref_block, x) for x in xs]  # first: where nnx.jit itself fails, it says so
    with tempfile.TemporaryDirectory() as tmp:
        ours = mirage_jax.jit(step, backend=backend, cache=Path(tmp) / "c.sqlite")
        t0 = time.perf_counter()
        first = jax.block_until_ready(ours(ours_block, xs[0]))
        first_s = time.perf_counter() - t0
        errs = [rel_err(first, want[0])]
        for x, w in zip(xs[1:], want[1:]):
            errs.append(rel_err(ours(ours_block, x), w))
        index = (
            int(ours_block.attn.cache_index.get_value()),
            int(ref_block.attn.cache_index.get_value()),
        )
        decisions = ours.last.decisions
        row: dict[str, Any] = {
            "batch": batch, "cache": cache, "d_model": d, "heads": heads,
            "dtype": jnp.dtype(dtype).name, "first_call_s": round(first_s, 2),
            "kernels": sum(d.status == "kernel" for d in decisions),
            "regions": [(d.index, d.status, d.reason[:160]) for d in decisions],
            "rel_err": max(errs), "cache_index": index, "carried_state": ours._stateful is not None,
        }  # fmt: skip
        if jax.devices()[0].platform == "gpu" and ours._stateful is not None:
            from mirage_jax.profile import time_trace

            graphdef, state = nnx.split(((ours_block, xs[0]), {}))  # as (args, kwargs)
            inner = ours._stateful.inner  # mirage_jax.jit's function of (graphdef, state)
            plain = _stateful(step)
            mine = jax.jit(lambda s: inner(graphdef, s))
            theirs = jax.jit(lambda s: plain(graphdef, s))
            row["nnx_jit_us"] = round(float(time_trace(theirs, (state,), calls=calls).median_us), 2)
            row["mirage_us"] = round(float(time_trace(mine, (state,), calls=calls).median_us), 2)
            row["speedup"] = round(row["nnx_jit_us"] / row["mirage_us"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__, heads=8)
    p.add_argument("--cache", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--dtype",
        default="bfloat16",
        help="on the GPU (bfloat16: flax's float16 attention asks XLA for a dot algorithm, "
        "F16_F16_F32, that the H200 with jax 0.11.2 rejects under nnx.jit itself)",
    )
    args = p.parse_args(argv)
    if args.cpu:
        shape, dtype, backend = (8, 32, 4), jnp.float32, "pallas-interpret"
    else:
        shape, dtype, backend = (args.cache, args.d_model, args.heads), args.dtype, "auto"
    rows = run_rows(
        args.batches, lambda b: run_case(b, *shape, dtype, backend, args.steps, args.calls)
    )
    write(
        args.out,
        "nnx_builtins",
        "flax nnx built-in layers, decoding with the cache in the module: mirage_jax.jit "
        "against nnx.jit",
        "first call by wall clock with an empty cache; outputs of each decode step against "
        "nnx.jit's; device time per step by mirage_jax.profile.time_trace (kernel durations "
        f"from a profiler trace, median of {args.calls} calls), both as jax.jit functions of "
        "the module's state in the same process",
        [("batch", "batch"), ("cache", "cache"), ("d_model", "d_model"),
         ("first call (s)", "first_call_s"), ("nnx.jit (µs)", "nnx_jit_us"),
         ("mirage_jax.jit (µs)", "mirage_us"), ("speedup", "speedup"), ("kernels", "kernels"),
         ("rel. error", "rel_err"), ("cache index (ours, nnx.jit)", "cache_index")],
        rows,
    )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
