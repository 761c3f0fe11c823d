"""A causal prefill block built from flax's own layers, in flax nnx and in flax linen, under
`mirage_jax.jit` against `jax.jit` and the library's jit: end to end, with a fresh cache and
its own search.

The block is what a flax user writes from the library: `LayerNorm`, the library's
multi-head attention (`nnx.MultiHeadAttention(decode=False)`, linen's
`MultiHeadDotProductAttention`) with `make_causal_mask`, and a `Linear`/`Dense` MLP with GELU.
The libraries' attention adds each head's bias to Q, K and V and lays V out for P V by two
transposes; `lax_ir.layouts` and `lax_ir.pieces` make the projections with their biases, the
attention and the output projection one searchable region each. Rows: the first call
(capture, search, verification, selection), the device time of each (`mirage_jax.profile.
time_trace`, GPU only), the kernels kept, and whether the outputs match. Results go to
`<out>/flax_prefill.json` and `.md`.

    python -m experiments.flax_prefill --out experiments/results/x      # on the GPU
    python -m experiments.flax_prefill --cpu                            # tiny, interpret
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

import mirage_jax
from experiments.library_blocks import first_call, parser, run_rows, write
from experiments.nnx_builtins import Block, step


class LinenBlock(nn.Module):
    """The prefill block of `nnx_builtins.Block(decode=False)` in flax linen."""

    heads: int
    dtype: Any
    param_dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x (B, T, D) -> (B, T, D)."""
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype or self.dtype}
        h = nn.LayerNorm(**kw)(x)
        attn = nn.MultiHeadDotProductAttention(num_heads=self.heads, **kw)
        x = x + attn(h, h, mask=nn.make_causal_mask(x[..., 0]))
        h = nn.Dense(4 * x.shape[-1], **kw)(nn.LayerNorm(**kw)(x))
        return x + nn.Dense(x.shape[-1], **kw)(jax.nn.gelu(h))


def _timed(fn: Any, args: tuple, calls: int) -> float:
    from mirage_jax.profile import time_trace

    return round(float(time_trace(fn, args, calls=calls).median_us), 2)


def run_case(
    library: str,
    batch: int,
    tokens: int,
    d: int,
    heads: int,
    dtype: Any,
    backend: str,
    calls: int,
    param_dtype: Any = None,
) -> dict[str, Any]:
    """One row: mirage_jax.jit (fresh cache) against the library's own jit; parameters in
    `param_dtype` where given (mixed precision: the layers convert them to `dtype`)."""
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, tokens, d), jnp.float32).astype(dtype)
    if library == "nnx":
        block = Block(d, heads, dtype, nnx.Rngs(0), decode=False, param_dtype=param_dtype)
        ref, fn, args = nnx.jit(step), step, (block, x)
        graphdef, state = nnx.split(block)
        plain = (jax.jit(lambda s, x: step(nnx.merge(graphdef, s), x)), (state, x))
    else:
        model = LinenBlock(heads, dtype, param_dtype)
        params = model.init(jax.random.PRNGKey(0), x)
        fn = model.apply
        ref, args = jax.jit(fn), (params, x)
        plain = (ref, args)
    want = ref(*args)  # first: where the library's own jit fails, it says so
    with first_call(mirage_jax.jit, fn, args, backend, want) as (ours, common):
        row: dict[str, Any] = {
            "library": library, "batch": batch, "tokens": tokens, "d_model": d,
            "heads": heads, "dtype": jnp.dtype(dtype).name,
            "param_dtype": jnp.dtype(param_dtype or dtype).name, **common,
        }  # fmt: skip
        if jax.devices()[0].platform == "gpu":
            # nnx.jit also returns the module's state: XLA copies every parameter out
            row["library_us"] = _timed(ref, args, calls)
            row["jax_jit_us"] = _timed(*plain, calls)
            row["mirage_us"] = _timed(ours, args, calls)
            row["speedup"] = round(row["jax_jit_us"] / row["mirage_us"], 3)
            row["speedup_library"] = round(row["library_us"] / row["mirage_us"], 3)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__, heads=16)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--libraries", nargs="*", default=["nnx", "linen"], choices=["nnx", "linen"])
    p.add_argument(
        "--dtype",
        default="bfloat16",
        help="on the GPU (bfloat16: flax's float16 attention asks XLA for a dot algorithm, "
        "F16_F16_F32, that the H200 with jax 0.11.2 rejects under jax.jit itself)",
    )
    p.add_argument(
        "--param-dtype",
        default=None,
        help="the parameters' dtype where it differs from --dtype (mixed precision: float32 "
        "parameters, bfloat16 compute)",
    )
    args = p.parse_args(argv)
    if args.cpu:
        shape, dtype, backend = (8, 32, 4), jnp.float32, "pallas-interpret"
    else:
        shape, dtype, backend = (args.tokens, args.d_model, args.heads), args.dtype, "auto"
    cases = [(lib, b) for lib in args.libraries for b in args.batches]
    rows = run_rows(
        cases, lambda c: run_case(*c, *shape, dtype, backend, args.calls, args.param_dtype)
    )
    write(
        args.out,
        "flax_prefill",
        "flax's own layers (nnx and linen), causal prefill: mirage_jax.jit against the "
        "library's jit",
        "first call by wall clock with an empty cache; device time per call by "
        "mirage_jax.profile.time_trace (kernel durations from a profiler trace, median of "
        f"{args.calls} calls), the library's jit (nnx.jit, which also returns the module's "
        "state; jax.jit for linen) and jax.jit of the block as a function of its state, in "
        "the same process",
        [("library", "library"), ("batch", "batch"), ("tokens", "tokens"),
         ("params", "param_dtype"),
         ("d_model", "d_model"), ("first call (s)", "first_call_s"),
         ("library's jit (µs)", "library_us"), ("jax.jit (µs)", "jax_jit_us"),
         ("mirage_jax.jit (µs)", "mirage_us"), ("× jax.jit", "speedup"),
         ("× library's jit", "speedup_library"), ("kernels", "kernels"),
         ("rel. error", "rel_err")],
        rows,
    )  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
