"""Loop steps a constant mask hides whole are skipped (`lower.masked_steps`): a causal prefill's
kernel walks, per block, only the key steps its queries may see, from a table of bounds the
generator reads (`triton.build_kernel(steps=)`), with the same outputs and derivatives."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from mirage_jax.known_inputs import canonical_constants, constant_inputs
from mirage_jax.lower import kernel_graph
from mirage_jax.lower.computed import Computed
from mirage_jax.lower.kernel_graph import plan
from mirage_jax.lower.masked_steps import MASKED, skippable, step_bounds
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder
from mirage_jax.regions import region_kernel
from tests.test_split_views import AttentionRegion


def _causal(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def _attention_graph(T=64, S=64, H=16, tq=16, ts=16, extra_sum=False):
    """softmax(q kᵀ + bias) v over a loop of S / ts key steps, q tiles of tq rows."""
    f32 = "float32"
    b = MuGraphBuilder()
    q, kt, v = b.input((T, H), f32), b.input((H, S), f32), b.input((S, H), f32)
    bias = b.input((T, S), f32)
    bb = BlockGraphBuilder(grid=(T // tq,), forloop_range=S // ts)
    tq_ = bb.input((T, H), f32, imap=(0,))
    tk = bb.input((H, S), f32, imap=(None,), forloop_dim=1)
    tv = bb.input((S, H), f32, imap=(None,), forloop_dim=0)
    tb = bb.input((T, S), f32, imap=(0,), forloop_dim=1)
    s = bb.op("add", bb.op("matmul", tq_, tk), tb)
    m = bb.op("reduce_max", s, dim=1)
    e = bb.op("exp", bb.op("sub", s, m))
    big = bb.op("accum_max", m)
    num = bb.op("accum_rescale_sum", bb.op("matmul", e, tv), m, big)
    den = bb.op("accum_rescale_sum_last", e, m, big)
    out = bb.op("div", num, den)
    bb.output(out, omap=(0,))
    if extra_sum:  # the exps summed as they are, not rescaled
        bb.output(bb.op("accum_sum", e), omap=(0,))
    outs = b.graph_defined([q, kt, v, bias], bb.build())
    return b.build(list(outs))


def _bias_arg(g, i) -> int:
    """The kernel op i's argument that is the µGraph's input 3 (the bias)."""
    return next(k for k, a in enumerate(g.ops[i].args) if g.ops[a[0]].param("index") == 3)


def _causal_bias(T, S, value=-np.inf):
    return np.where(np.tril(np.ones((T, S), bool)), 0.0, value).astype(np.float32)


@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min) * 0.7])
def test_a_causal_mask_bounds_each_blocks_steps_at_its_diagonal(fill):
    g = _attention_graph()
    ((i, p),) = plan(g).items()
    k = _bias_arg(g, i)
    assert skippable(p, k) and not any(skippable(p, j) for j in range(4) if j != k)
    got = step_bounds(p, k, _causal_bias(64, 64, fill))
    # q tile j (rows 16 j .. 16 j + 15) sees key steps 0 .. j, steps 0 .. j - 1 whole (the
    # mask is 0 there: not read); the longest first
    assert got.mask == k
    np.testing.assert_array_equal(got.rows, [[j, 0, j, j + 1] for j in (3, 2, 1, 0)])


def test_nothing_is_skipped_where_it_would_not_be_exact():
    g = _attention_graph()
    ((i, p),) = plan(g).items()
    k = _bias_arg(g, i)
    bias = _causal_bias(64, 64)
    assert step_bounds(p, k, bias) is not None
    assert step_bounds(p, k, np.zeros((64, 64), np.float32)) is None  # no step masked whole
    whole = bias.copy()
    whole[5] = MASKED * 2  # a row that masks every key: its softmax is over masked scores
    assert step_bounds(p, k, whole) is None
    # another accumulator beside the softmax's: not every accumulator drops a masked step
    g2 = _attention_graph(extra_sum=True)
    ((i2, p2),) = plan(g2).items()
    assert not skippable(p2, _bias_arg(g2, i2))


def _unfolded(monkeypatch) -> None:
    """Captures from here on fold no mask: jax's causal bias stays XLA's, computed from
    constants on every call (as at 2048 tokens and more)."""
    import sys

    monkeypatch.setattr(sys.modules["lax_ir.capture"], "MASK_FOLD_MAX_ELEMENTS", 16)


@pytest.mark.parametrize("folded", [True, False])
def test_a_causal_region_kernel_skips_masked_steps_with_the_same_values_and_gradient(
    monkeypatch, folded
):
    """`jax.nn.dot_product_attention(is_causal=True)`'s region, Triton interpreted: its mask,
    folded into a constant or computed by XLA from constants (`known_inputs.Computed`), is
    known, the kernel walks bounded steps, and values and the gradient are XLA's."""
    from mirage_jax.search import Budget, search

    pytest.importorskip("triton")
    if not folded:
        _unfolded(monkeypatch)
    tables = []
    original = kernel_graph._step_bounds

    def spy(*args):
        got = original(*args)
        tables.append(got)
        return got

    monkeypatch.setattr(kernel_graph, "_step_bounds", spy)
    case = AttentionRegion(_causal, T=64, seed=3)
    region = case.region
    known = constant_inputs(case.part.program, region)
    (value,) = canonical_constants(region.program, known).values()
    assert isinstance(value, Computed) != folded
    res = search(region.program, budget=Budget(time_s=60, max_candidates=16), seed=0, workers=1)
    g = next(g for g in res.mugraphs if len(plan(g)) == 1)  # one kernel: its loop sees all keys
    decision = SimpleNamespace(mugraph=g, verification=None, cache_key="t")
    fn = region_kernel(decision, region, "triton", None, True, case.after, known)
    assert callable(fn), fn
    walked = [t.rows for t in tables if t is not None]  # some blocks skip, some skip reads
    assert any((r[:, 3] - r[:, 1]).min() < r[:, 3].max() for r in walked)
    assert any((r[:, 2] > r[:, 1]).any() for r in walked)
    case.check(fn)


def _qkv(seed: int):
    """q (64, 16), kᵀ (16, 64), v (64, 16) for `_attention_graph`."""
    rng = np.random.default_rng(seed)
    shapes = ((64, 16), (16, 64), (64, 16))
    return tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


def _lowered_with_and_without_the_mask_known(interpret: bool):
    from mirage_jax.lower import lower

    g = _attention_graph()
    q, kt, v = _qkv(4)
    bias = _causal_bias(64, 64)
    plain = lower(g, backend="triton", interpret=interpret)
    known = lower(g, backend="triton", interpret=interpret, known={3: bias})
    return plain(q, kt, v, bias)[0], known(q, kt, v, bias)[0]


def test_a_kernel_told_its_mask_gives_the_same_outputs():
    pytest.importorskip("triton")
    want, got = _lowered_with_and_without_the_mask_known(interpret=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.gpu
def test_gpu_a_kernel_told_its_mask_gives_the_same_outputs():
    """The same, compiled by Triton (a loop over runtime bounds) on the GPU."""
    pytest.importorskip("jax_triton")
    want, got = _lowered_with_and_without_the_mask_known(interpret=False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_a_kernel_told_its_mask_walks_only_the_steps_the_table_names():
    """Called with another mask than the one it was told (which a program never does), the
    kernel shows what it reads: nothing in the steps whose tile was 0 (their values make no
    difference), and nothing past the last step the told mask leaves."""
    from mirage_jax.lower import lower

    pytest.importorskip("triton")
    g = _attention_graph()
    q, kt, v = _qkv(5)
    causal = _causal_bias(64, 64)
    told = lower(g, backend="triton", interpret=True, known={3: causal})
    plain = lower(g, backend="triton", interpret=True)
    below = np.zeros((64, 64), np.float32)
    for j in range(4):  # the 16 x 16 tiles left of each block's diagonal tile
        below[16 * j : 16 * j + 16, : 16 * j] = 3.0
    want = np.asarray(told(q, kt, v, causal)[0])
    np.testing.assert_array_equal(np.asarray(told(q, kt, v, causal + below)[0]), want)
    assert not np.allclose(np.asarray(plain(q, kt, v, causal + below)[0]), want)
    # no mask at all: each block attends to the keys up to its diagonal tile's end, unmasked
    no_mask = np.zeros((64, 64), np.float32)
    seen = np.empty_like(q)
    for r in range(64):
        s = q[r] @ kt[:, : 16 * (r // 16 + 1)]
        p = np.exp(s - s.max())
        seen[r] = p @ v[: len(s)] / p.sum()
    np.testing.assert_allclose(np.asarray(told(q, kt, v, no_mask)[0]), seen, rtol=1e-4, atol=1e-4)


def test_only_masking_constants_within_the_size_cap_reach_the_lowering(monkeypatch):
    """`known_inputs.canonical_constants`: the folded causal mask of a region, as the µGraph
    reads it; none where the constant masks nothing or is larger than the cap."""
    from mirage_jax import known_inputs

    case = AttentionRegion(_causal, T=16, seed=1)
    program = case.region.program
    known = constant_inputs(case.part.program, case.region)
    ((k, value),) = canonical_constants(program, known).items()
    assert value.shape == program.input_avals[k][0] and (value <= MASKED).any()
    assert canonical_constants(program, {p: np.zeros_like(v) for p, v in known.items()}) == {}
    monkeypatch.setattr(known_inputs, "MAX_CONSTANT_ELEMENTS", value.size - 1)
    assert canonical_constants(program, known) == {}


def test_a_computed_mask_bounds_the_steps_as_its_value_does():
    """`step_bounds` of a `Computed` value (reduced on the device) is that of its value."""
    import jax.numpy as jnp

    g = _attention_graph()
    ((i, p),) = plan(g).items()
    k = _bias_arg(g, i)
    bias = _causal_bias(64, 64)
    lazy = Computed(lambda: jnp.asarray(bias), bias.shape, "float32")
    want, got = step_bounds(p, k, bias), step_bounds(p, k, lazy)
    assert got.mask == want.mask
    np.testing.assert_array_equal(got.rows, want.rows)
    whole = bias.copy()
    whole[5] = -np.inf
    assert step_bounds(p, k, Computed(lambda: jnp.asarray(whole), whole.shape, "float32")) is None


def test_a_mask_xla_computes_from_constants_is_known_and_inputs_are_not(monkeypatch):
    """`known_inputs.constant_inputs`: jax's causal bias, left to XLA, is a `Computed` whose
    value is XLA's; q, k and v are not known."""
    _unfolded(monkeypatch)
    case = AttentionRegion(_causal, T=32, seed=1)
    program, region = case.part.program, case.region
    known = constant_inputs(program, region)
    ((pos, value),) = known.items()
    assert isinstance(value, Computed) and program.nodes[region.inputs[pos]].op == "opaque"
    bias = np.asarray(jax.jit(value.fn)())
    causal = np.tril(np.ones((32, 32), bool))
    assert bias.shape == value.shape and (bias[..., causal] == 0).all()
    assert (bias[..., ~causal] <= MASKED).all()
    # asked again (the region's kernel after its selection), the same value: equal, so what
    # the device reduces of it (`masked_steps._device_maps`) is reduced once
    assert constant_inputs(program, region) == known
    again = canonical_constants(region.program, constant_inputs(program, region))
    assert again and again == canonical_constants(region.program, known)
    assert len(
        {hash(v) for v in again.values()}
        | {hash(v) for v in canonical_constants(region.program, known).values()}
    ) == len(again)


def test_a_computed_mask_is_inspected_while_jax_traces():
    """The lowering runs while jax traces the user's function: the device reduction of a
    `Computed` mask still runs eagerly, not staged into that trace."""
    import jax.numpy as jnp

    g = _attention_graph()
    ((i, p),) = plan(g).items()
    k = _bias_arg(g, i)
    bias = _causal_bias(64, 64)
    lazy = Computed(lambda: jnp.asarray(bias), bias.shape, "float32")
    got = []
    jax.jit(lambda x: got.append(step_bounds(p, k, lazy)) or x)(1.0)
    np.testing.assert_array_equal(got[0].rows, step_bounds(p, k, bias).rows)


def test_candidates_are_timed_and_checked_with_the_mask_they_will_run_with(monkeypatch):
    """In context, `select` lowers each candidate knowing the region's mask (so it times the
    bounded loops that will run) and feeds it the mask's own value beside random q, k, v: the
    float check passes; fed a random mask instead, the bounded kernels would be wrong."""
    from mirage_jax.known_inputs import with_values
    from mirage_jax.regions import in_context, region_avals
    from mirage_jax.search import Budget, search
    from mirage_jax.select import select

    pytest.importorskip("triton")
    tables = []
    original = kernel_graph._step_bounds
    monkeypatch.setattr(
        kernel_graph, "_step_bounds", lambda *a: tables.append(original(*a)) or tables[-1]
    )
    case = AttentionRegion(_causal, T=64, seed=3)
    program, region = case.region.program, case.region
    known = constant_inputs(case.part.program, region)
    avals = region_avals(case.part, region)
    res = search(program, budget=Budget(time_s=60, max_candidates=16), seed=0, workers=1)
    one = tuple(g for g in res.mugraphs if len(plan(g)) == 1)[:1]  # its loop sees all keys
    res = dataclasses.replace(res, mugraphs=one)
    opts = SimpleNamespace(seed=0, lower_config=None)
    fed = []

    def timer(fn, inputs):
        fed.append(inputs(0))
        return 1.0

    context = in_context(program, opts, "triton", avals, known)
    xla = (10.0, "given")
    sel = select(res, program, backend="triton", top=1, timer=timer, context=context, xla=xla)
    assert sel.best is not None and all(c.error == "" for c in sel.contenders[1:]), sel.contenders
    assert any(t is not None for t in tables)  # the timed kernel walks bounded steps
    ((pos, mask),) = known.items()
    assert all(np.array_equal(np.asarray(xs[pos]), mask) for xs in fed)
    blind = dataclasses.replace(context, inputs=with_values(context.inputs, {pos: -mask}))
    bad = select(res, program, backend="triton", top=1, timer=timer, context=blind, xla=xla)
    assert bad.best is None and bad.contenders[1].error.startswith("wrong result")


def test_with_values_replaces_the_known_positions_of_every_draw():
    import jax.numpy as jnp

    from mirage_jax.known_inputs import with_values

    draw = lambda seed: [np.full(2, seed), np.full(3, seed), np.full(2, seed)]  # noqa: E731
    lazy = Computed(lambda: jnp.arange(2.0), (2,), "float32")
    got = with_values(draw, {1: np.ones(3), 2: lazy})
    for seed in (0, 5):
        a, b, c = got(seed)
        assert (a == seed).all() and (b == 1).all() and np.array_equal(np.asarray(c), [0.0, 1.0])


def test_a_computed_mask_is_reduced_once_for_many_lowerings():
    """`select` lowers many candidates of one region knowing the same `Computed` mask: its value
    is made and reduced on the device once per tiling, not once per lowering."""
    import jax.numpy as jnp

    g = _attention_graph()
    ((i, p),) = plan(g).items()
    k = _bias_arg(g, i)
    bias = _causal_bias(64, 64)
    made = []
    lazy = Computed(lambda: made.append(1) or jnp.asarray(bias), bias.shape, "float32")
    first, again = step_bounds(p, k, lazy), step_bounds(p, k, lazy)
    np.testing.assert_array_equal(first.rows, again.rows)
    assert len(made) == 1


def test_a_computed_mask_is_reduced_once_for_every_tiling():
    """Kernels of other tilings (tiles of 16 and 32 rows, steps of 16 and 32 keys) read their
    maps from one reduction of the value on the device, the same maps as each tiling's own."""
    import jax.numpy as jnp

    from mirage_jax.lower import masked_steps

    bias = _causal_bias(64, 64)
    bias[40:48, :] = 0.0  # rows that see every key (a tile of 32 half masked)
    made = []
    lazy = Computed(lambda: made.append(1) or jnp.asarray(bias), bias.shape, "float32")
    for tq, ts in ((16, 16), (32, 16), (16, 32), (32, 32)):
        ((i, p),) = plan(_attention_graph(tq=tq, ts=ts)).items()
        k = _bias_arg(_attention_graph(tq=tq, ts=ts), i)
        got, want = step_bounds(p, k, lazy), step_bounds(p, k, bias)
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_array_equal(got.rows, want.rows)
    assert len(made) == 1
    assert masked_steps._base_tiles((8, 8, 4096, 24)) == (1, 1, 16, 8)
