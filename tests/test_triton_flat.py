"""Combining loops lowered flat (`mirage_jax.lower.triton_flat`), in Triton's interpreter.

A split attention's combining kernel walks its partials in a loop of small steps; flat, the
partials of every step are loaded at once along a new axis, reduced over it, and the rescaled
sums are taken against the final max. The results must match the µGraph's own semantics and
the loop form's.
"""

from __future__ import annotations

import numpy as np
import pytest

from mirage_jax.lower import lower, plan, source_of, triton_flat
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder, evaluate_reference

pytest.importorskip("triton")


def combine_graph(steps: int, dtype: str = "float16"):
    """The combine of a split softmax: per (head, row), S partial maxima, sums and outputs."""
    b = BlockGraphBuilder(grid=(2, 4), forloop_range=steps)
    m = b.input((2, 4, steps), dtype, imap=(0, 1), forloop_dim=2)
    o = b.input((2, 4, steps * 16), dtype, imap=(0, 1), forloop_dim=2)
    s = b.input((2, 4, steps), dtype, imap=(0, 1), forloop_dim=2)
    big = b.op("accum_max", m)
    num = b.op("accum_rescale_sum", o, m, big)
    den = b.op("accum_rescale_sum", s, m, big)
    total = b.op("accum_sum", s)
    b.output(b.op("div", num, den), (0, 1))
    b.output(total, (0, 1))
    mb = MuGraphBuilder()
    shapes = [(2, 4, steps), (2, 4, steps * 16), (2, 4, steps)]
    ins = [mb.input(sh, dtype) for sh in shapes]
    return mb.build(mb.graph_defined(ins, b.build()), name=f"combine{steps}")


def _inputs(steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    m = (rng.standard_normal((2, 4, steps)) * 4).astype(np.float16)
    o = rng.standard_normal((2, 4, steps * 16)).astype(np.float16)
    s = (rng.random((2, 4, steps)) + 0.5).astype(np.float16)
    return [m, o, s]


def _rel(out, ref) -> float:
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("steps", [2, 8, 32, 64])
def test_flat_combine_matches_the_mugraph_and_the_loop(steps, monkeypatch):
    monkeypatch.setattr(triton_flat, "FLAT_MIN_STEPS", 2)  # short loops flat too, for the check
    g = combine_graph(steps)
    (p,) = plan(g).values()
    assert triton_flat.flat_loop(p, steps, 4)
    assert "steps flat" in source_of(p)
    xs = _inputs(steps)
    ref = evaluate_reference(g, *xs)
    flat = lower(g, backend="triton", interpret=True)(*xs)
    for o, r in zip(flat, ref):
        assert _rel(o, r) < 5e-3
    monkeypatch.setattr(triton_flat, "FLAT_MAX_STEPS", 0)
    assert "steps flat" not in source_of(p)
    looped = lower(g, backend="triton", interpret=True)(*xs)
    for a, b in zip(flat, looped):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-3, atol=2e-3
        )


def test_loops_with_a_dot_or_too_many_steps_stay_loops():
    from tests.test_lower import softmax_graph

    (p,) = plan(softmax_graph()).values()
    assert not triton_flat.flat_loop(p, p.forloop_range, 4)
    assert "steps flat" not in source_of(p)
    (q,) = plan(combine_graph(128)).values()
    assert not triton_flat.flat_loop(q, 128, 4)  # past FLAT_MAX_STEPS
    (r,) = plan(combine_graph(16)).values()
    assert not triton_flat.flat_loop(r, 16, 4)  # under FLAT_MIN_STEPS: the loop was faster


def test_flat_source_compiles_for_sm90():
    from mirage_jax.lower import TritonConfig, triton_runtime
    from mirage_jax.lower import triton as tr

    (p,) = plan(combine_graph(32)).values()
    name, src = tr.kernel_source(p, TritonConfig())
    assert "steps flat" in src and "for it in" not in src
    fn = triton_runtime.load_kernel(name, src)
    compiled = tr.compile_for(fn, ["float16"] * 5)
    assert "ptx" in compiled.asm


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [32, 64])
def test_flat_combine_on_gpu(steps):
    """The flat combine compiled by Triton on the GPU (jax-triton) matches the µGraph."""
    pytest.importorskip("jax_triton")
    g = combine_graph(steps)
    xs = _inputs(steps, seed=1)
    ref = evaluate_reference(g, *xs)
    for o, r in zip(lower(g, backend="triton")(*xs), ref):
        assert _rel(o, r) < 5e-3


def test_split_parts_probe_forms_compute_the_region(monkeypatch, once_per_run):
    """`experiments.split_parts_probe`: each form (parts, steps, warps; combine flat or looped)
    of a searched split attention lowers and computes what the region does (the gqa_stable
    search `test_search` runs, read back where another process of the run made it)."""
    import jax

    import lax_ir
    from experiments.split_parts_probe import forms, lowered
    from mirage_jax.lower import triton_body
    from mirage_jax.select import random_inputs
    from tests import test_search
    from tests.test_search import kernels, searched

    flat_kernels = []

    def counted(*args, **kwargs):
        flat_kernels.append(args[1])
        return triton_flat.emit_flat(*args, **kwargs)

    monkeypatch.setattr(triton_body, "emit_flat", counted)
    monkeypatch.setitem(test_search._ONCE, "fn", once_per_run)
    p, r = searched("gqa_stable")
    g = next(g for g in r.mugraphs if len(kernels(g)) == 2 and "split" in g.meta["structure"])
    xs = [np.asarray(x) for x in random_inputs(p, 0)]
    ref = [np.asarray(o, np.float32) for o in lax_ir.evaluate(p, *xs)]
    got = list(forms(g, [2], [1], [(4, 4)]))
    assert [label.split()[-1] for label, _, _ in got] == ["flat", "loop"]
    for label, h, flat in got:
        flat_kernels.clear()
        outs = jax.jit(lowered(h, flat, interpret=True))(*xs)
        assert bool(flat_kernels) == flat, label  # the combine flat only where asked
        for o, want in zip(outs, ref):
            np.testing.assert_allclose(np.asarray(o, np.float32), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("tail", [0, 2])
def test_fused_combine_probe_one_launch_on_cpu(tail):
    """`experiments.fused_combine_probe`: the one-launch form (the last block of each KV head
    combines) computes the attention, and resets its counters where asked."""
    from experiments.fused_combine_probe import inputs, one_launch_on_cpu, reference

    want = reference(*inputs(0))
    for reset in (False, True):
        out, cnt = one_launch_on_cpu(4, tail, reset)
        assert np.abs(out.astype(np.float64) - want).max() < 0.05
        assert (cnt == 0).all() if reset else (cnt == 4).all()
