"""Split views: a canonical axis made of stored axes that are not next to each other (Gemma's
(heads, D, head_dim) weights read as (D, heads * head_dim)) is read in place, its address per
element from the index's digits (`lax_ir.interface.SplitView`, `lax_ir.views.split_view`,
the Triton generator's `triton_access.tile_access`)."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import lax_ir
from lax_ir.interface import (
    SplitView,
    apply_ops,
    contiguous_axis,
    read_view,
    view_stored_shape,
    view_strides,
)
from lax_ir.views import input_view, split_view
from mirage_jax.lower import lower
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder, evaluate_reference
from tests.test_views import _chains

GEMMA_Q = (("transpose", (1, 0, 2)), ("reshape", (64, 128)))
GEMMA_KV = (("transpose", (0, 1, 3, 2)), ("reshape", (64, 64)), ("transpose", (1, 0)))


def _addresses(shape, view) -> np.ndarray:
    """Each canonical element's offset in the stored array, from `view_strides`' digits."""
    parts = view_strides(shape, view)
    out = np.zeros(shape, dtype=np.int64)
    for index in itertools.product(*(range(n) for n in shape)):
        at = 0
        for i, axis in zip(index, parts):
            inner = int(np.prod([n for n, _ in axis])) if axis else 1
            for n, stride in axis:
                inner //= n
                at += (i // inner) % n * stride
        out[index] = at
    return out


def test_gemma_weights_are_split_views_read_in_place():
    """The query weight (heads, D, head_dim) and the stacked KV weight (2, kv heads, D,
    head_dim) read as (D, heads * head_dim): their head_dim stays the tile's contiguous axis."""
    steps, v = input_view((8, 64, 16), GEMMA_Q)
    assert steps == (("reshape", (8, 64, 16)),)
    assert v == SplitView((1, 0, 2), ((64,), (8, 16))) and contiguous_axis(v) == 1
    steps, v = input_view((2, 2, 64, 16), GEMMA_KV)
    assert steps == (("reshape", (4, 64, 16)),)
    assert v == SplitView((1, 0, 2), ((64,), (4, 16)))
    for shape, ops in (((8, 64, 16), GEMMA_Q), ((2, 2, 64, 16), GEMMA_KV)):
        x = np.arange(int(np.prod(shape))).reshape(shape)
        steps, v = input_view(shape, ops)
        stored = apply_ops(x, steps)
        np.testing.assert_array_equal(read_view(stored, v), apply_ops(x, ops))
        np.testing.assert_array_equal(_addresses(apply_ops(x, ops).shape, v), apply_ops(x, ops))


def test_a_split_view_whose_contiguous_axis_is_not_innermost_is_refused():
    """(N, D, H) read as (D, H * N): the contiguous H is not the inner part of its axis, so
    neighbouring lanes would be D * H elements apart; (N, H, D) read as (H * N, D) is read in
    place (D contiguous and whole)."""
    assert input_view((8, 64, 16), (("transpose", (1, 2, 0)), ("reshape", (64, 128)))) is None
    _, v = input_view((8, 16, 64), (("transpose", (1, 0, 2)), ("reshape", (128, 64))))
    assert v == SplitView((1, 0, 2), ((16, 8), (64,))) and contiguous_axis(v) == 1


@settings(max_examples=400, deadline=None)
@given(_chains(widen=True))
def test_every_split_view_found_reads_the_same_array_at_the_same_addresses(chain):
    """Through transposes, reshapes and broadcasts: widened parts are read with stride 0, so
    the stored array holds each value once."""
    shape, ops = chain
    got = split_view(shape, ops)
    if got is None:
        return
    stored, v = got
    x = np.arange(int(np.prod(shape))).reshape(shape)
    want = apply_ops(x, ops)
    assert view_stored_shape(want.shape, v) == stored and math.prod(stored) == x.size
    np.testing.assert_array_equal(read_view(x.reshape(stored), v), want)
    np.testing.assert_array_equal(_addresses(want.shape, v), want)


def test_a_causal_bias_widened_over_query_groups_is_read_with_stride_zero():
    """sdpa's causal bias (B, kv heads, T, S) widened over the 4 query heads of each group and
    merged with T: the kernel reads the bias itself, XLA writes no copy 4 times its size."""
    ops = (
        ("broadcast", (4, 2, 3, 8, 8)),
        ("transpose", (1, 2, 3, 0, 4)),
        ("reshape", (2, 3, 32, 8)),
    )
    steps, v = input_view((1, 2, 3, 8, 8), ops)
    assert steps == (("reshape", (2, 3, 8, 8)),)
    assert v == SplitView((0, 1, 2, -1, 3), ((2,), (3,), (8, 4), (8,)))
    x = np.arange(2 * 3 * 64).reshape(1, 2, 3, 8, 8)
    np.testing.assert_array_equal(read_view(apply_ops(x, steps), v), apply_ops(x, ops))


def _projection(dtype="float32"):
    """x (4, 64) @ W (64, 128): the output columns over 4 blocks of 32, K over 4 steps of 16."""
    b = BlockGraphBuilder(grid=(4,), forloop_range=4)
    x = b.input((4, 64), dtype, imap=(None,), forloop_dim=1)
    w = b.input((64, 128), dtype, imap=(1,), forloop_dim=0)
    b.output(b.op("accum_sum", b.op("matmul", x, w)), (1,))
    mb = MuGraphBuilder()
    ins = [mb.input((4, 64), dtype), mb.input((64, 128), dtype)]
    return mb.build(mb.graph_defined(ins, b.build()), name="projection")


SPLITS = {
    # N = (8 heads, 16): a block's 32 columns span two heads (Gemma's query weight)
    "columns_over_heads": SplitView((1, 0, 2), ((64,), (8, 16))),
    # N = (2, 64): a block's 32 columns lie within one part
    "columns_within_a_part": SplitView((1, 0, 2), ((64,), (2, 64))),
    # K = (4, 16) apart, the loop's dim: each step one part
    "loop_one_part_a_step": SplitView((0, 2, 1), ((4, 16), (128,))),
    # K = (8, 8) apart: each step spans two parts
    "loop_two_parts_a_step": SplitView((0, 2, 1), ((8, 8), (128,))),
    # both axes split
    "both": SplitView((2, 0, 3, 1), ((4, 16), (8, 16))),
    # N = (8 widened, 16): the weight stored (64, 16), broadcast over 8 (stride 0)
    "columns_widened": SplitView((0, -1, 1), ((64,), (8, 16))),
    # K = (4 widened, 16) and N = (2, 64) apart
    "loop_widened": SplitView((-1, 1, 0, 2), ((4, 16), (2, 64))),
}


def _projection_case(case: str, seed: int):
    """(µGraph, x, view, the stored weight, the reference output) of `SPLITS[case]`."""
    g = _projection()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    view = SPLITS[case]
    stored = rng.standard_normal(view_stored_shape((64, 128), view)).astype(np.float32)
    w = np.ascontiguousarray(read_view(stored, view))
    assert w.shape == (64, 128)
    (want,) = evaluate_reference(g, x, w)
    return g, x, view, stored, want


@pytest.mark.parametrize("backend", ["triton", "pallas-interpret"])
@pytest.mark.parametrize("case", sorted(SPLITS))
def test_a_weight_read_through_a_split_view_gives_the_plain_outputs(backend, case):
    """Triton reads the stored weight in place, per element (interpreted here); Pallas gets it
    laid out by XLA (`read_view`). Both give the µGraph's reference outputs."""
    if backend == "triton":
        pytest.importorskip("triton")
    g, x, view, stored, want = _projection_case(case, seed=3)
    (got,) = lower(g, backend=backend, interpret=True, views={1: view})(x, stored)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    if backend == "triton":
        from mirage_jax.lower import triton as T
        from mirage_jax.lower.kernel_graph import plan

        (p,) = plan(g).values()
        _, src = T.kernel_source(p, T.default_config(), views={1: view})
        assert "is stored as the array it is a view of: SplitView" in src
        assert " % " in src  # addressed by the index's digits


def test_an_einsum_over_a_heads_first_weight_reaches_its_region_as_a_split_view():
    """Gemma's `einsum("BTD,NDH->BTNH")`: the region reads the weight as (D, heads *
    head_dim), which the Triton kernel reads in place (no XLA transpose on every call)."""
    from mirage_jax.regions import stored_views

    args = (
        jax.ShapeDtypeStruct((1, 1, 64), jnp.float32),
        jax.ShapeDtypeStruct((8, 64, 16), jnp.float32),
        jax.ShapeDtypeStruct((64,), jnp.float32),
    )
    part = lax_ir.partition(lax_ir.capture(_gemma_q, *args))
    (region,) = [r for r in part.regions if "matmul" in {n.op for n in r.program.nodes}]
    st = stored_views(region.program, "triton")
    iface = region.program.meta["interface"]
    (k,) = [k for k, (pos, _) in enumerate(iface["inputs"]) if iface["shapes"][pos] == (8, 64, 16)]
    assert st.views[k] == SplitView((1, 0, 2), ((64,), (8, 16)))
    assert st.steps[k] == (("reshape", (8, 64, 16)),)


def _gemma_q(x, w, g):
    """Gemma's norm with its `1 + scale` gain, then the query projection in its own layout."""
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1 + g)
    return jnp.einsum("BTD,NDH->BTNH", y, w)


def test_a_region_kernel_reads_gemmas_weight_in_place_with_xlas_derivatives():
    """The region as `mirage_jax.jit` assembles it (`region_kernel`, Triton interpreted): the
    weight arrives as stored, the outputs match the program's, and forward and reverse
    derivatives through the split view are XLA's."""
    from types import SimpleNamespace

    from mirage_jax.regions import region_kernel, stored_views
    from mirage_jax.search import Budget, search

    pytest.importorskip("triton")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 1, 64)).astype(np.float32)
    w = (rng.standard_normal((8, 64, 16)) * 0.1).astype(np.float32)
    g = (rng.standard_normal((64,)) * 0.1).astype(np.float32)
    part = lax_ir.partition(lax_ir.capture(_gemma_q, x, w, g))
    (region,) = [r for r in part.regions if any(n.op == "matmul" for n in r.program.nodes)]
    assert any(
        isinstance(v, SplitView) for v in stored_views(region.program, "triton").views.values()
    )
    res = search(region.program, budget=Budget(time_s=60, max_candidates=4), seed=0, workers=1)
    decision = SimpleNamespace(mugraph=res.mugraphs[0], verification=None, cache_key="t")
    fn = region_kernel(decision, region, "triton", None, strict=True)
    assert callable(fn), fn
    args = [(x, w, g)[part.program.inputs.index(i)] for i in region.inputs]
    at = {id(a): k for k, a in enumerate(args)}
    k_w = at[id(w)]

    def with_w(fun):
        return lambda ww: fun(*[ww if k == k_w else a for k, a in enumerate(args)])[0]

    want = jax.jit(_gemma_q)(x, w, g).reshape(-1)
    np.testing.assert_allclose(np.asarray(with_w(fn)(w)).reshape(-1), want, rtol=1e-4, atol=1e-4)
    loss = lambda fun: lambda ww: jnp.sum(fun(ww) ** 2)  # noqa: E731
    ref = lambda ww: _gemma_q(x, ww, g)  # noqa: E731
    np.testing.assert_allclose(
        np.asarray(jax.grad(loss(with_w(fn)))(w)), np.asarray(jax.grad(loss(ref))(w)), 1e-4, 1e-4
    )


def _gqa(q, k, v):
    """`jax.nn.dot_product_attention` with 4 query heads over 2 KV heads, as users call it."""
    return jax.nn.dot_product_attention(q, k, v, implementation="xla")


class AttentionRegion:
    """A GQA attention call (`fn(q, k, v)`, 4 query heads over 2 KV heads, T tokens) cut into
    regions: its attention region, the steps the program applies after it, and the function
    of q that runs a kernel for the region inside the program."""

    def __init__(self, fn, T: int, seed: int):
        from lax_ir.views import layout_after

        rng = np.random.default_rng(seed)
        self.fn = fn
        self.q = rng.standard_normal((2, T, 4, 16)).astype(np.float32)
        self.k = rng.standard_normal((2, T, 2, 16)).astype(np.float32)
        self.v = rng.standard_normal((2, T, 2, 16)).astype(np.float32)
        self.part = lax_ir.partition(lax_ir.capture(fn, self.q, self.k, self.v))
        (self.region,) = [r for r in self.part.regions if "exp" in r.program.op_counts()]
        inside = {i for r in self.part.regions for i in r.nodes}
        xla = set(range(len(self.part.program.nodes))) - inside
        self.after = [layout_after(self.part.program, o, xla) for o in self.region.outputs]

    def _value(self, i: int, q):
        """The region's input i: a program input, a constant, a value XLA computes from
        constants, or a reshape of one."""
        nodes, ins = self.part.program.nodes, self.part.program.inputs
        if i in ins:
            return (q, self.k, self.v)[ins.index(i)]
        if nodes[i].op == "constant":
            return np.asarray(nodes[i].param("value").array)
        if nodes[i].op != "reshape":  # XLA computes it from constants (a causal bias)
            from mirage_jax.known_inputs import computed

            value = computed(self.part.program, i)
            assert value is not None, nodes[i]
            return np.asarray(jax.jit(value.fn)())
        return self._value(nodes[i].args[0], q).reshape(nodes[i].shape)

    def with_q(self, kernel):
        """q -> the program's output with `kernel` computing the region."""
        return lambda q: apply_ops(
            kernel(*[self._value(i, q) for i in self.region.inputs])[0], self.after[0]
        )

    def check(self, kernel) -> None:
        """The kernel's values and gradient (in q) are the program's."""
        run = self.with_q(kernel)
        want = np.asarray(jax.jit(self.fn)(self.q, self.k, self.v))
        np.testing.assert_allclose(np.asarray(run(self.q)), want, rtol=1e-4, atol=1e-4)
        loss = lambda f: lambda q: jnp.sum(jnp.sin(f(q)))  # noqa: E731
        np.testing.assert_allclose(
            np.asarray(jax.grad(loss(run))(self.q)),
            np.asarray(jax.grad(loss(lambda q: self.fn(q, self.k, self.v)))(self.q)),
            1e-4,
            1e-4,
        )


def test_a_region_kernel_writes_grouped_attention_in_the_programs_layout():
    """The attention region of a GQA call (`region_kernel`, Triton interpreted, with the steps
    the program applies after it): its (B, kv heads, T * groups, D) output is written through a
    split view as the (B, T, heads, D) array the program returns; values and the gradient
    through the written view are the program's."""
    from types import SimpleNamespace

    from mirage_jax.regions import region_kernel, stored_views
    from mirage_jax.search import Budget, search

    pytest.importorskip("triton")
    case = AttentionRegion(_gqa, T=16, seed=7)
    region = case.region
    st = stored_views(region.program, "triton", case.after)
    assert isinstance(st.outputs[0][0], SplitView), st.outputs
    res = search(region.program, budget=Budget(time_s=60, max_candidates=4), seed=0, workers=1)
    decision = SimpleNamespace(mugraph=res.mugraphs[0], verification=None, cache_key="t")
    fn = region_kernel(decision, region, "triton", None, strict=True, after=case.after)
    assert callable(fn), fn
    case.check(fn)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(SPLITS))
def test_gpu_triton_reads_a_split_view_in_place(case):
    """The same, compiled by Triton and launched through jax-triton on the GPU."""
    pytest.importorskip("jax_triton")
    g, x, view, stored, want = _projection_case(case, seed=4)
    (got,) = lower(g, backend="triton", interpret=False, views={1: view})(x, stored)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=5e-2)
