"""A kernel's loop split over the grid (`TritonConfig.loop_split`): two launches, same values.

The partial launch walks F/S of the loop's steps in S times the blocks and stores its raw
accumulators; the finishing launch sums them and runs the epilogue (`triton_split`). Run in
Triton's interpreter on the CPU.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from mirage_jax.lower import LoweringError, TritonConfig, lower, plan
from mirage_jax.lower import triton as tr
from mirage_jax.lower.kernel_graph import LOOP_SPLIT
from mirage_jax.lower.triton_split import split_refusal
from mirage_jax.mugraph import (
    BlockGraphBuilder,
    MuGraph,
    MuGraphBuilder,
    MuGraphError,
    evaluate_reference,
)
from mirage_jax.mugraph.graph import ONE_LAUNCH
from mirage_jax.mugraph.resize import with_numbers
from mirage_jax.tuning import split_variants, wide_variants
from tests.test_lower import softmax_graph

warnings.filterwarnings("ignore", category=DeprecationWarning)


def norm_gemm_graph(dtype="float16"):
    """r + (x * g) @ w / rms(x), looping over K in 4 steps: a dot's sum, the norm's sum of
    squares and a loop-invariant residual (`accum_keep`); 2 blocks over N."""
    b = BlockGraphBuilder(grid=(2,), forloop_range=4)
    x = b.input((8, 128), dtype, imap=(None,), forloop_dim=1)
    g = b.input((1, 128), dtype, imap=(None,), forloop_dim=1)
    w = b.input((128, 64), dtype, imap=(1,), forloop_dim=0)
    r = b.input((8, 64), dtype, imap=(1,))
    acc = b.op("accum_sum", b.op("matmul", b.op("mul", x, g), w))
    rms = b.op("accum_rms_last", x, eps=1e-6)
    b.output(b.op("add", b.op("div", acc, rms), b.op("accum_keep", r)), (1,))
    mb = MuGraphBuilder()
    ins = [mb.input((8, 128), dtype), mb.input((1, 128), dtype)]
    ins += [mb.input((128, 64), dtype), mb.input((8, 64), dtype)]
    return mb.build(mb.graph_defined(ins, b.build()), name="norm_gemm")


def _inputs(g, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in g.input_avals]


def _rel(out, ref):
    out = np.asarray(out, np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


@pytest.fixture
def launched(monkeypatch):
    """The names of the Triton kernels launched (built) while lowering."""
    names = []
    real = tr.launcher

    def spy(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(tr, "launcher", spy)
    return names


@pytest.mark.parametrize("splits", [2, 4])
def test_a_split_loop_gives_the_values_of_the_whole_loop(splits, launched):
    g = norm_gemm_graph()
    xs = _inputs(g)
    (ref,) = evaluate_reference(g, *xs)
    (whole,) = lower(g, backend="triton", interpret=True)(*xs)
    config = TritonConfig(loop_split=splits)
    (split,) = lower(g, backend="triton", config=config, interpret=True)(*xs)
    assert _rel(whole, ref) < 5e-3 and _rel(split, ref) < 5e-3
    np.testing.assert_allclose(np.asarray(split), np.asarray(whole), rtol=2e-3, atol=2e-3)
    assert [n.rsplit("_", 1)[-1] for n in launched[-2:]] == ["part", "finish"], launched


def test_the_sources_of_a_split_kernel():
    (p,) = plan(norm_gemm_graph()).values()
    part, finish = tr.generate_split_sources(p, TritonConfig(loop_split=2), "k")
    assert "def k_part(in0, in1, in2, in3, part0, part1, part2):" in part
    assert "it = split * 2 + step" in part and "tl.store(part2" in part
    assert "def k_finish(in0, in1, in2, in3, part0, part1, part2, out0):" in finish
    assert "for s in tl.static_range(2):" in finish
    assert "# accum_keep: part 0's" in finish  # a kept value is not summed over the parts
    assert "for it in" not in finish  # the finishing launch has no loop over K


def test_what_cannot_be_split_is_refused_and_lowered_whole(launched):
    (p,) = plan(norm_gemm_graph()).values()
    assert split_refusal(p, 2) is None and split_refusal(p, 4) is None
    assert "does not divide" in split_refusal(p, 3)
    assert "does not divide" in split_refusal(p, 8)
    g = softmax_graph()
    (q,) = plan(g).values()
    assert "running max" in split_refusal(q, 2)
    with pytest.raises(LoweringError, match=r"cannot split its loop: .*running max"):
        tr.build_kernel(q, TritonConfig(loop_split=2), interpret=True, where="softmax")
    # through `lower`, a kernel that cannot be split runs as one launch
    xs = _inputs(g)
    (ref,) = evaluate_reference(g, *xs)
    launched.clear()
    (out,) = lower(g, backend="triton", config=TritonConfig(loop_split=2), interpret=True)(*xs)
    assert _rel(out, ref) < 5e-3 and not any(n.endswith(("_part", "_finish")) for n in launched)


def test_the_meta_split_applies_with_no_config_and_select_offers_it(launched):
    """`select(tune_warps=True)` times the winner with `LOOP_SPLIT` in its meta (2 blocks of 4
    steps: 2 and 4 parts); the lowering reads it when given no config."""
    g = norm_gemm_graph()
    assert split_variants(g, "triton") == [2, 4]
    assert split_variants(g, "pallas") == []  # the backend cannot split
    assert split_variants(softmax_graph(), "triton") == []
    split = MuGraph(g.ops, g.outputs, {**g.meta, LOOP_SPLIT: 4})
    xs = _inputs(g)
    (out,) = lower(split, backend="triton", interpret=True)(*xs)
    (ref,) = evaluate_reference(g, *xs)
    assert _rel(out, ref) < 5e-3
    assert [n.rsplit("_", 1)[-1] for n in launched] == ["part", "finish"]
    with pytest.raises(ValueError, match="loop_split must be >= 1"):
        dataclasses.replace(TritonConfig(), loop_split=0)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 4])
def test_a_split_loop_on_the_gpu(splits):
    """The two launches through jax-triton on a GPU give the values of the whole loop."""
    g = norm_gemm_graph()
    xs = _inputs(g)
    (ref,) = evaluate_reference(g, *xs)
    (whole,) = lower(g, backend="triton")(*xs)
    (split,) = lower(g, backend="triton", config=TritonConfig(loop_split=splits))(*xs)
    assert _rel(whole, ref) < 5e-3 and _rel(split, ref) < 5e-3
    np.testing.assert_allclose(np.asarray(split), np.asarray(whole), rtol=2e-3, atol=2e-3)


def two_norm_gemms(n=64, k=128, grid=2, loop=4, dtype="float16", one_launch=True):
    """Two independent norm + GEMM kernels of the same x (Q and K of a decode step), launched
    as one where `one_launch`."""
    mb = MuGraphBuilder()
    x, gain = mb.input((8, k), dtype), mb.input((1, k), dtype)
    outs = []
    for width in (n, n // 2):
        w = mb.input((k, width), dtype)
        b = BlockGraphBuilder(grid=(grid,), forloop_range=loop)
        bx = b.input((8, k), dtype, imap=(None,), forloop_dim=1)
        bgain = b.input((1, k), dtype, imap=(None,), forloop_dim=1)
        bw = b.input((k, width), dtype, imap=(1,), forloop_dim=0)
        acc = b.op("accum_sum", b.op("matmul", b.op("mul", bx, bgain), bw))
        b.output(b.op("div", acc, b.op("accum_rms_last", bx, eps=1e-6)), (1,))
        outs += mb.graph_defined([x, gain, w], b.build())
    g = mb.build(outs, name="two_norm_gemms")
    return MuGraph(g.ops, g.outputs, {**g.meta, ONE_LAUNCH: one_launch})


def test_a_one_launch_group_splits_its_loops_in_two_launches(launched):
    g = two_norm_gemms()
    assert g.independent_kernels() and g.launch_groups() == (g.independent_kernels(),)
    xs = _inputs(g)
    refs = evaluate_reference(g, *xs)
    launched.clear()
    outs = lower(g, backend="triton", config=TritonConfig(loop_split=2), interpret=True)(*xs)
    assert [n.rsplit("_", 1)[-1] for n in launched] == ["part", "finish"], launched
    assert all(n.startswith("mugraph_group_") for n in launched)
    for out, ref in zip(outs, refs):
        assert _rel(out, ref) < 5e-3
    plans = [p for _, p in sorted(plan(g).items())]
    part = tr.generate_group_source(plans, TritonConfig(loop_split=2), "k", mode="partial")
    assert "k1_split = k1_local % 2" in part and "tl.store(k1_part0" in part
    assert "k0_out0" not in part  # the partial launch writes partials only
    finish = tr.generate_group_source(plans, TritonConfig(loop_split=2), "k", mode="finish")
    assert "k1_part0" in finish and "tl.store(k1_out0" in finish and "for k0_it" not in finish
    # a split no kernel of the group allows: one launch, loops whole
    launched.clear()
    lower(g, backend="triton", config=TritonConfig(loop_split=8), interpret=True)(*xs)
    assert len(launched) == 1 and not launched[0].endswith(("_part", "_finish"))


def test_other_numbers_give_the_same_values_and_bad_ones_are_refused():
    g = norm_gemm_graph()
    ((i, _),) = g.graph_defined()
    xs = _inputs(g)
    (ref,) = evaluate_reference(g, *xs)
    for grid, loop in (((1,), 8), ((4,), 2), ((2,), 1)):
        h = with_numbers(g, {i: (grid, loop)})
        (kernel,) = [op for op in h.ops if op.block_graph is not None]
        assert (kernel.block_graph.grid, kernel.block_graph.forloop_range) == (grid, loop)
        (out,) = evaluate_reference(h, *xs)
        np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-9)
    with pytest.raises(MuGraphError):
        with_numbers(g, {i: ((3,), 4)})  # 64 columns in 3 blocks
    with pytest.raises(ValueError, match="grid"):
        with_numbers(g, {i: ((2, 2), 4)})


def test_wide_variants_read_a_decode_weight_in_wide_tiles():
    """A [8, 1024] × [1024, 2048] fp16 norm + GEMM in 128 blocks of 16 columns (32 B of each
    weight row): its variants read 128 and 64 columns, split until 2 blocks per SM."""
    g = two_norm_gemms(n=2048, k=1024, grid=128, loop=4)
    variants = wide_variants(g, "triton")
    got = {label: h for label, h in variants}
    assert list(got) == [
        "weights read 256 B wide, loop in 8 parts",
        "weights read 128 B wide, loop in 4 parts",
    ]
    h = got["weights read 256 B wide, loop in 8 parts"]
    numbers = [(op.block_graph.grid, op.block_graph.forloop_range) for _, op in h.graph_defined()]
    assert numbers == [((16,), 8), ((8,), 8)]  # 128 columns, 128 rows a step
    assert h.meta[LOOP_SPLIT] == 8 and h.launch_groups() == (h.independent_kernels(),)
    xs = _inputs(g)
    for a, b in zip(evaluate_reference(h, *xs), evaluate_reference(g, *xs)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    # a weight stored transposed (read in place, its rows contiguous along K): already wide
    assert wide_variants(g, "triton", {2: 0, 3: 0}) == []
    # small weights are not re-tiled
    assert wide_variants(two_norm_gemms(), "triton") == []


def test_wide_variants_give_a_weight_stored_n_by_k_fewer_rows_and_wider_steps():
    """A weight read in place as Wᵀ (stored [N, K], equinox's `Linear`): the loop walks its
    stored rows 64 wide (128 B); the 256 B variant takes 128-element steps and 128 rows a block
    (its tile 32 KB) or 4K-element tiles (four times the blocks), the 128 B one is refused
    (already that wide)."""
    g = two_norm_gemms(n=2048, k=1024, grid=8, loop=16)
    variants = dict(wide_variants(g, "triton", {2: 0, 3: 0}))
    wide, narrow = (
        "weights read 256 B wide, loop in 8 parts",
        "weights read 256 B wide (4K-element tiles), loop in 4 parts",
    )
    assert list(variants) == [wide, narrow]
    xs = _inputs(g)
    for label, want in ((wide, [((16,), 8), ((8,), 8)]), (narrow, [((32,), 8), ((64,), 8)])):
        h = variants[label]
        numbers = [
            (op.block_graph.grid, op.block_graph.forloop_range) for _, op in h.graph_defined()
        ]
        assert numbers == want, label
        for a, b in zip(evaluate_reference(h, *xs), evaluate_reference(g, *xs)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
def test_a_split_group_on_the_gpu():
    """A one-launch group split 4 ways through jax-triton gives the values of the whole loops."""
    g = two_norm_gemms()
    xs = _inputs(g)
    whole = lower(g, backend="triton")(*xs)
    split = lower(g, backend="triton", config=TritonConfig(loop_split=4))(*xs)
    for a, b, ref in zip(split, whole, evaluate_reference(g, *xs)):
        assert _rel(a, ref) < 5e-3
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-3)


def test_wide_variants_leave_loops_whole_where_the_backend_cannot_split():
    g = two_norm_gemms(n=2048, k=1024, grid=128, loop=4)
    labels = [label for label, _ in wide_variants(g, "pallas")]
    assert labels == ["weights read 256 B wide", "weights read 128 B wide"]
    assert all(LOOP_SPLIT not in h.meta for _, h in wide_variants(g, "pallas"))
