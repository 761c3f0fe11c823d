"""A training step (`experiments.unseen_models.train_step`: an MLP's loss,
`jax.value_and_grad`, an SGD update) reaches the search: the weight gradient `gᵀ h` is a piece
of its own with its transpose at the interface (`pieces.transposed_operand_cuts`), the loss's
1/n is a scalar and its mean over (B, T, D) a sum over rows (`layouts._scalar_operand_rule`,
`_reduce_all_rule`)."""

import tempfile
from pathlib import Path

import jax
import numpy as np

import lax_ir
import mirage_jax
from experiments.unseen_models import train_step
from mirage_jax.search.diagnose import blockers


def test_every_region_of_a_training_step_is_searchable():
    step, args = train_step(d=16)
    regions = lax_ir.partition(lax_ir.capture(step, *args)).regions
    searched = [r for r in regions if not r.is_trivial]
    assert searched and not any(blockers(r.program) for r in searched), [
        blockers(r.program) for r in searched
    ]
    # the weight gradients: a matmul alone, its first operand transposed at the interface
    alone = [r.program for r in searched if r.program.op_counts() == {"matmul": 1}]
    assert any(
        any(op[0] == "transpose" for op in ops)
        for p in alone
        for _, ops in p.meta["interface"]["inputs"]
    )


def test_a_training_step_runs_with_kernels_and_matches_jax_jit():
    step, args = train_step(d=16)
    with tempfile.TemporaryDirectory() as d:
        f = mirage_jax.jit(
            step, backend="pallas-interpret", cache=Path(d) / "c.sqlite", budget_s=10.0
        )
        got = f(*args)
        kernels = sum(x.status == "kernel" for x in f.last.decisions)
    want = jax.jit(step)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
    assert kernels >= 3, f.last.decisions
