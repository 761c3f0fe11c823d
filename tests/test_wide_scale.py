"""A float32 scale on 16-bit scores (`mul_scalar`'s `cdtype`).

`q @ k.T / np.sqrt(d)` with bfloat16 q and k promotes the scores to float32 (a numpy scalar is
not weakly typed), and 1/√d for d = 32 or 128 is not a bfloat16 number. A µGraph's constant
was rounded to its tile's dtype, so neither the bfloat16 factor nor the bfloat16 product could
carry the program's scale, and the attention had no µGraph. Such scalars now keep float32
(`Facts.wide_scalars`). Run in the interpreters on the CPU.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
import mirage_jax
from mirage_jax.lower import lower
from mirage_jax.search import Budget, search
from mirage_jax.select import random_inputs

B, T, H, D = 2, 16, 4, 32


def attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)  # float32 scores
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(v.dtype), v)


def _args():
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.bfloat16) for _ in range(3)]


def test_the_scores_are_float32_and_the_scale_is_no_bfloat16():
    program = lax_ir.capture(attention, *_args())
    scales = [n for n in program.nodes if n.op == "constant" and not n.shape]
    assert any(
        str(n.dtype) == "float32"
        and float(np.asarray(n.param("value").array).astype(jnp.bfloat16))
        != float(np.asarray(n.param("value").array))
        for n in scales
    ), program


def test_a_bfloat16_attention_scaled_in_float32_runs_as_a_kernel(tmp_path: Path):
    """Under `mirage_jax.jit` (Pallas's interpreter: Triton's CPU interpreter returns garbage
    for bfloat16 attention µGraphs with tiles of a few rows, with or without a scale, where
    Triton on the GPU matches: experiments/results/wide_scale_lowering_h200_2026-11-29_s38.txt),
    the kernel scales by the float32 constant and matches jax.jit."""
    # no wall-clock stop (the search ends exhausted): under CI's load the default budget's
    # one-piece share (30 s) ran out before the µGraph was reached
    f = mirage_jax.jit(
        attention, cache=tmp_path / "c.sqlite", backend="pallas-interpret", budget_s=math.inf
    )
    args = _args()
    got = np.asarray(f(*args), np.float32)
    want = np.asarray(jax.jit(attention)(*args), np.float32)
    (decision,) = f.last.decisions
    assert decision.status == "kernel", decision.reason
    ops = [op for _, k in decision.mugraph.graph_defined() for op in k.block_graph.ops]
    assert any(op.op == "mul_scalar" and op.param("cdtype") == "float32" for op in ops)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 3e-2


@pytest.mark.gpu
def test_both_gpu_backends_lower_the_float32_scale():
    """On the GPU, Triton as well as Pallas (the probe behind this test:
    experiments/results/wide_scale_lowering_h200_2026-11-29_s38.txt, 1.5e-3 in both)."""
    (region,) = lax_ir.partition(lax_ir.capture(attention, *_args())).regions
    program = region.program
    res = search(program, budget=Budget(time_s=60, cuts=False), seed=0)
    xs = random_inputs(program, 0)
    (want,) = lax_ir.evaluate_reference(program, *xs)
    w = np.asarray(want, np.float64)
    for backend in ("triton", "pallas"):
        (got,) = lower(res.best, backend=backend)(*xs)
        err = np.max(np.abs(np.asarray(got, np.float64) - w)) / np.max(np.abs(w))
        assert err < 3e-2, (backend, err)
