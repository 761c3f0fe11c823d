"""A model's decode attention as a split µGraph at several numbers of parts, its combine lowered
flat or as a loop, each timed alone against XLA (GPU).

For the question behind `mirage_jax.lower.triton_flat` and `tuning.split_depth_variants`: how
the split kernel and its combining kernel trade as the parts grow. The search's first split
µGraph of the model's attention region (two kernels) is renumbered to S parts of F loop steps
(`mugraph.resize.with_numbers`), its combine one block per (KV head, query row), lowered for
Triton with the given warps, with the combine flat (`triton_flat.FLAT_MIN_STEPS` lowered to S)
and as a loop; each is checked against XLA and timed by `profile.time_trace` (device time,
per kernel). Inputs are the region's own (contiguous): the stored layouts of a model's caches
are not read through views here.

    python -m experiments.split_parts_probe llama_decode_nnx --size llama7b --batch 1 \
        --parts 16 32 64 --out experiments/results
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

import lax_ir
from experiments import models as M
from experiments.region_probe import _numbers, write_probe
from mirage_jax.lower import lower, triton_flat
from mirage_jax.lower.kernel_graph import WARPS
from mirage_jax.mugraph import MuGraph, MuGraphError
from mirage_jax.mugraph.resize import with_numbers
from mirage_jax.search import Budget, search
from mirage_jax.tuning import _combine_grid, _combines


def attention_region(name: str, size: str, batch: int) -> lax_ir.Program:
    """The region of model `name` with a softmax (exp and a shifted max) and two matmuls."""
    m = M.get(name, batch=batch, size=size)
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    for r in part.regions:
        ops = [n.op for n in r.program.nodes]
        if "exp" in ops and "reduce_max" in ops and ops.count("matmul") == 2:
            return r.program
    raise SystemExit(f"{name} at {size}, batch {batch}: no attention region")


def forms(
    g: MuGraph, parts: list[int], steps: list[int], warps: list[tuple[int, int]]
) -> Iterator[tuple[str, MuGraph, bool]]:
    """(label, µGraph, flat) for split µGraph `g` at each (parts, loop steps, warps), its
    combine flat and as a loop; numbers the µGraph cannot take are skipped."""
    ((b, pairs),) = _combines(g).items()
    a, axis = pairs[0]
    split, combine = g.ops[a].block_graph, g.ops[b].block_graph
    keys = split.grid[axis] * split.forloop_range
    per_part = combine.forloop_range // split.grid[axis]
    for S, F, w in itertools.product(parts, steps, warps):
        if keys % (S * F):
            continue
        grid = tuple(S if x == axis else n for x, n in enumerate(split.grid))
        try:
            h = with_numbers(g, {a: (grid, F), b: (_combine_grid(g, b), S * per_part)})
        except (MuGraphError, ValueError):  # numbers the µGraph cannot take
            continue
        h = MuGraph(h.ops, h.outputs, {**h.meta, WARPS: w})
        for flat in (True, False):
            yield f"S={S} F={F} w{w} {'flat' if flat else 'loop'}", h, flat


def lowered(h: MuGraph, flat: bool, interpret: bool = False) -> Any:
    """`h` lowered for Triton with its combine flat or as a loop."""
    keep = triton_flat.FLAT_MIN_STEPS
    triton_flat.FLAT_MIN_STEPS = 2 if flat else triton_flat.FLAT_MAX_STEPS + 1
    try:
        return lower(h, backend="triton", interpret=interpret)
    finally:
        triton_flat.FLAT_MIN_STEPS = keep


def probe(name: str, size: str, batch: int, parts: list[int], calls: int = 30) -> dict:
    """Search `name`'s attention region and time its split µGraph's forms (GPU)."""
    from mirage_jax.profile import time_trace
    from mirage_jax.select import random_inputs

    program = attention_region(name, size, batch)
    res = search(program, budget=Budget(time_s=60, results=64), seed=0)
    g = next(g for g in res.mugraphs if len(g.graph_defined()) == 2 and _combines(g))
    inputs = functools.cache(lambda s: random_inputs(program, s))

    xla = jax.jit(lambda *xs: tuple(lax_ir.evaluate(program, *xs)))
    tx = time_trace(xla, inputs, calls=calls)
    ref = [np.asarray(o, np.float32) for o in xla(*inputs(0))]
    rows = {"xla_us": tx.median_us, "mugraph": _numbers(g), "forms": []}
    print(f"XLA {tx.median_us:.2f} µs; µGraph {_numbers(g)}", flush=True)
    for label, h, flat in forms(g, parts, [1, 2], [(4, 4), (8, 4)]):
        try:
            fn = jax.jit(lowered(h, flat))
            out = fn(*inputs(0))
            err = max(
                float(np.max(np.abs(np.asarray(o, np.float32) - r))) for o, r in zip(out, ref)
            )
            t = time_trace(fn, inputs, calls=calls)
        except Exception as e:  # a form that fails is reported, not fatal
            rows["forms"].append({"form": label, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        kernels = [round(k[1], 2) for k in t.kernels]
        rows["forms"].append({"form": label, "us": t.median_us, "kernels": kernels, "err": err})
        print(f"{label:28s} {t.median_us:6.2f} µs {kernels} err {err:.1e}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--size", default="llama7b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--parts", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)
    result = probe(args.model, args.size, args.batch, args.parts)
    tag = f"{args.model}_{args.size}_b{args.batch}"
    write_probe(Path(args.out) / f"split_parts_probe_{tag}.json", vars(args), result)
    print(json.dumps({"xla_us": result["xla_us"]}))


if __name__ == "__main__":
    main()
