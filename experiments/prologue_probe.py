"""Does XLA run a projection faster when its prologue (a norm) is not fused into the GEMM?

For issue 16 at Llama-7B size, b=1: in the decode blocks' `jax.jit` profiles the norm +
projection fusions run well above the GEMVs alone (equinox's norm + gate/up 52.4 µs where the
GEMV alone takes 42.6). This probe times each region of a real block that has a matmul
reading a computed value, as XLA runs it, and again with `lax.optimization_barrier` on the
value the matmul reads (so XLA cannot fuse what computes it into the GEMM), in one run:

    python -m experiments.prologue_probe --out experiments/results

Device time per call (`mirage_jax.profile.time_trace`, median), random inputs
(`select.random_inputs`).
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import jax

import lax_ir
from experiments import models as M
from experiments.region_probe import write_probe
from lax_ir.interpret import FloatAlgebra, interpret
from mirage_jax.profile import time_trace
from mirage_jax.search.cuts import computed_matmul_args, cut_candidates
from mirage_jax.select import random_inputs


def matmul_operands(program: lax_ir.Program) -> list[int]:
    """The values the region's matmuls read that the region computes (after the converts and
    broadcasts between a cut candidate and the matmul: what the GEMM itself reads)."""
    return sorted({arg for arg, _ in computed_matmul_args(program)})


def with_barriers(program: lax_ir.Program, at: set[int]):
    """The region as XLA runs it, with an optimization barrier on the values `at`."""

    def hook(i, node, value):
        return jax.lax.optimization_barrier(value) if i in at else value

    def fn(*xs):
        return tuple(interpret(program, xs, FloatAlgebra(), hook=hook))

    return jax.jit(fn)


def probe(name: str, batch: int, size: str, calls: int) -> list[dict]:
    m = M.get(name, batch=batch, size=size)
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    rows = []
    for r in part.regions:
        p = r.program
        cands, operands = cut_candidates(p), matmul_operands(p)
        if not cands:
            continue
        drawn = functools.cache(lambda s, p=p: [jax.device_put(x) for x in random_inputs(p, s)])
        row = {"region": r.index, "ops": sorted({n.op for _, n in p.ops()})}
        for label, at in (("xla", set()), ("barrier_at_cut", set(cands)),
                          ("barrier_at_matmul", set(operands))):  # fmt: skip
            t = time_trace(with_barriers(p, at), drawn, calls=calls)
            row[label + "_us"] = round(t.median_us, 3)
            row[label + "_kernels"] = [[k[:60], round(us, 3)] for k, us, _ in t.kernels[:6]]
        rows.append(row)
        print(name, batch, row["region"], row["xla_us"], row["barrier_at_cut_us"],
              row["barrier_at_matmul_us"], flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+",
                    default=["llama_decode_nnx", "llama_decode_eqx", "gemma_decode"])  # fmt: skip
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--size", default="llama7b")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("experiments/results"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = {
        f"{n}_b{b}": probe(n, b, args.size, args.calls) for n in args.models for b in args.batches
    }
    name = f"prologue_probe_{jax.devices()[0].device_kind.split()[-1].lower()}_{time.strftime('%Y-%m-%d')}.json"
    write_probe(args.out / name, vars(args) | {"out": str(args.out)}, result,
                seconds=f"{time.perf_counter() - t0:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
