"""experiments/prologue_probe.py on the CPU: the values a region's matmuls read, and the region
with barriers on them computing what the region computes (the probe's timing needs a GPU).
A tiny Llama block (flax nnx): its norm + projections and its attention have such operands."""

from __future__ import annotations

import jax
import numpy as np

import lax_ir
from experiments import models as M
from experiments.prologue_probe import matmul_operands, with_barriers
from lax_ir.interpret import evaluate
from mirage_jax.search.cuts import cut_candidates
from mirage_jax.select import random_inputs


def test_barriers_on_the_matmul_operands_keep_the_regions_values() -> None:
    m = M.get("llama_decode_nnx", batch=1, size="tiny")
    part = lax_ir.partition(lax_ir.capture(m.fn, *m.abstract_args()))
    checked = 0
    for r in part.regions:
        p = r.program
        operands = matmul_operands(p)
        if not cut_candidates(p):
            assert not operands
            continue
        nodes = p.nodes
        for i in operands:  # what a matmul reads, after the converts between it and the cut
            assert any(n.op == "matmul" and i in n.args for _, n in p.ops())
            assert nodes[i].op not in ("input", "constant")
        xs = [jax.numpy.asarray(x) for x in random_inputs(p, 0)]
        want = evaluate(p, *xs)
        for at in (set(operands), set(cut_candidates(p))):
            got = with_barriers(p, at)(*xs)
            for g, w in zip(got, want):
                # jitted against eager: the same ops, rounded apart by XLA's fusions
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-6)
        checked += 1
    assert checked >= 2  # the norm + projections and the attention, at least
