"""A norm's rounded row materialised once, read by plain projections (`cut_search`).

Equinox's RMSNorm computes in float32 and rounds the normalised row to float16 before its
projections. One kernel per output recomputes the norm in every block; the rival cut stores
the rounded row (the narrowing convert, `cuts.cut_candidates`) and the projections read it as
plain GEMVs, launched together after the norm's kernel. Run in the interpreters on the CPU.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mirage_jax.lower import lower
from tests.conftest import interpret_backends


def gate_up(x, g, w1, w2):
    """Equinox-style: the norm and its gain in float32, rounded once for two projections."""
    import jax
    import jax.numpy as jnp

    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    h = (h * g.astype(jnp.float32)).astype(jnp.float16)
    return jax.nn.silu(h @ w1), h @ w2


def _region():
    import jax
    import jax.numpy as jnp

    import lax_ir

    S = jax.ShapeDtypeStruct
    d, n = 256, 256
    specs = [S((1, d), jnp.float16), S((1, d), jnp.float16)]
    specs += [S((d, n), jnp.float16), S((d, n), jnp.float16)]
    (region,) = lax_ir.partition(lax_ir.capture(gate_up, *specs)).regions
    return region.program


def _lowers_to_the_region(g, program, backends=None, interpret=True):
    """`g` lowered on `backends` (default: both interpreters) computes the region's outputs
    (2e-2, 16-bit floats)."""
    import lax_ir
    from mirage_jax.select import random_inputs

    xs = random_inputs(program, 0)
    want = lax_ir.evaluate_reference(program, *xs)
    for backend in backends or interpret_backends():
        got = lower(g, backend=backend, interpret=interpret)(*xs)
        for o, w in zip(got, want):
            w = np.asarray(w, np.float64)
            err = np.max(np.abs(np.asarray(o, np.float64) - w)) / np.max(np.abs(w))
            assert err < 2e-2, (backend, err)


def test_the_cut_is_the_narrowing_convert():
    from mirage_jax.search.cuts import cut_candidates

    program = _region()
    (cut,) = cut_candidates(program)
    node = program.nodes[cut]
    assert node.op == "convert" and str(node.dtype) == "float16", node


def test_a_small_region_does_not_pay_for_the_rival_cut():
    from mirage_jax.search import Budget, search

    program = _region()  # 256 KB of weights: under `RIVAL_CUT_MIN_BYTES`
    res = search(program, budget=Budget(time_s=60, reread=True), seed=0, workers=1)
    structures = [g.meta["structure"] for g in res.mugraphs]
    assert any("all outputs" in s for s in structures), structures
    assert not [s for s in structures if "own kernels" in s]


def test_the_reread_search_offers_the_cut_beside_one_kernel_per_output(monkeypatch):
    from mirage_jax.search import Budget, cut_search, search

    program = _region()
    monkeypatch.setattr(cut_search, "RIVAL_CUT_MIN_BYTES", 0)  # as a 7B layer's regions
    res = search(program, budget=Budget(time_s=60, reread=True), seed=0, workers=1)
    structures = [g.meta["structure"] for g in res.mugraphs]
    assert any(s.startswith("one kernel per output") or "all outputs" in s for s in structures)
    cut = [g for g in res.mugraphs if "own kernels" in g.meta["structure"]]
    assert cut, structures
    levelled = [g for g in cut if g.meta["structure"].startswith("one launch per level")]
    assert levelled, [g.meta["structure"] for g in cut]
    g = levelled[0]
    assert g.meta["verified"] == "full"
    assert [len(lv) for lv in g.dependency_levels()] == [1, 2]  # the norm, then both GEMVs
    assert all(op.block_graph is not None for op in g.ops if op.op != "input")
    _lowers_to_the_region(g, program)


def test_the_cut_pieces_are_searched_with_the_region_search_workers(monkeypatch):
    """A region's cut pieces use its worker pool, several at once (`PIECES_AT_ONCE`): they
    were searched with one worker, in the search's own process, one after another, which made
    the cuts most of a 7B region's search on the H200."""
    import threading

    from mirage_jax.search import Budget, driver

    seen = []
    real = driver.search

    def spy(program, **kw):
        name = threading.current_thread().name
        seen.append((program.meta.get("name", ""), kw.get("workers"), name))
        return real(program, **kw)

    monkeypatch.setattr(driver, "search", spy)
    real(_region(), budget=Budget(time_s=60, reread=True), seed=0, workers=2)
    pieces = [(w, t) for name, w, t in seen if ".piece%" in name]
    assert len(pieces) >= 2 and all(w == 2 for w, _ in pieces), seen
    assert all(t.startswith("mirage_jax-piece") for _, t in pieces), seen


def prefill_ln(x, g, b, w1, w2):
    """A prefill's LayerNorm (gain and bias) before two projections, as equinox writes it."""
    import jax
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    h = (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b
    return h @ w1, h @ w2


def _prefill_region(fn, dtype, norm_dtype):
    """The one region of `fn(x, g, b, w1, w2)` over 256 rows of 1024 in `dtype`, its norm's
    gain and bias in `norm_dtype`."""
    import jax

    import lax_ir

    S = jax.ShapeDtypeStruct
    rows, d = 256, 1024
    specs = [S((rows, d), dtype), S((d,), norm_dtype), S((d,), norm_dtype)]
    specs += [S((d, d), dtype)] * 2
    (region,) = lax_ir.partition(lax_ir.capture(fn, *specs)).regions
    return region.program


def test_a_starved_prefill_stitch_gets_the_rival_cut():
    """Over many rows, one kernel per output recomputes the norm in every block with K whole in
    its tiles; that stitch is starved (`cost.STARVED` times the memory floor) whatever the
    region's bytes, so the cut that materialises the norm once is searched and ranks first
    (equinox's LayerNorm + Q/K/V over 256 tokens: 15.1 µs on the H200 against XLA's 19.0,
    where the per-output stitch ran 50.5)."""
    import jax.numpy as jnp

    from mirage_jax.search import Budget, cut_search, search

    program = _prefill_region(prefill_ln, jnp.float16, jnp.float16)
    assert cut_search._input_bytes(program) < cut_search.RIVAL_CUT_MIN_BYTES
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    best = res.mugraphs[0]
    assert "own kernels" in best.meta["structure"] and best.meta["cuts"], best.meta
    per_output = [g for g in res.mugraphs if not g.meta.get("cuts")]
    assert per_output and all(g.meta["cost"]["us"] > best.meta["cost"]["us"] for g in per_output)
    _lowers_to_the_region(best, program)


def mixed_ln(x, g, b, w1, w2, dtype=None):
    """flax's mixed precision: LayerNorm with float32 parameters over a 16-bit activation,
    the row rounded to 16 bits for the projections (as `Dense(dtype=bfloat16)` does)."""
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    h = ((x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(dtype or jnp.float16)
    return h @ w1, h @ w2


def test_a_float32_norm_piece_stores_the_row_the_program_rounded():
    """The norm piece computes in float32 (float32 gain and bias) where the program cut at its
    16-bit convert: its kernel stores the row in 16 bits (`BlockOutput.dtype`,
    `cuts.stored_as`) for the projections, where the stitch failed its validation and the
    region had only the per-output stitch (flax linen's LayerNorm + Q/K/V with float32
    parameters: 514 µs on the H200 against XLA's 17). In float16 here: Triton's CPU
    interpreter computes bfloat16 tiles wrongly (the GPU test runs bfloat16)."""
    import jax.numpy as jnp

    from mirage_jax.search import Budget, search

    program = _prefill_region(mixed_ln, jnp.float16, jnp.float32)
    res = search(program, budget=Budget(time_s=60), seed=0, workers=1)
    best = res.mugraphs[0]
    assert "own kernels" in best.meta["structure"] and best.meta["cuts"], best.meta
    norm = best.ops[best.outputs[0][0]].args[0]  # the projections read the norm kernel's row
    assert best.shapes[norm][1] == "float16", best  # the rounded row, as the program cut it
    _lowers_to_the_region(best, program)


@pytest.mark.gpu
def test_both_gpu_backends_lower_the_bfloat16_projections_of_a_float32_norm():
    """The same in bfloat16, as flax writes it, on the GPU in Triton and Pallas."""
    import jax.numpy as jnp

    from mirage_jax.search import Budget, search

    bf16 = functools.partial(mixed_ln, dtype=jnp.bfloat16)
    program = _prefill_region(bf16, jnp.bfloat16, jnp.float32)
    best = search(program, budget=Budget(time_s=60), seed=0).mugraphs[0]
    assert best.meta["cuts"], best.meta
    _lowers_to_the_region(best, program, ("triton", "pallas"), interpret=False)
