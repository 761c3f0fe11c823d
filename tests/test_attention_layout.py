"""Attention written with einsums (any layout of scores and probabilities) becomes one region in
the ``[batch..., rows, keys]`` layout, with the same values (`lax_ir.attention_layout`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lax_ir
from lax_ir.attention_layout import canonical_attention

B, T, S, K, G, H = 2, 3, 8, 2, 2, 4


def _softmax(x: jax.Array, axis: int) -> jax.Array:
    return jax.nn.softmax(x, axis=axis)


def gqa_rows(q, k, v):
    """Gemma-style: scores BKGTS, softmax over S, back to BTKGH."""
    s = jnp.einsum("btkgh,bskh->bkgts", q, k) * 0.5
    return jnp.einsum("bkgts,bskh->btkgh", _softmax(s, -1), v)


def gqa_columns(q, k, v):
    """Scores with the keys before the queries (BKSGT), softmax over S (not the last axis)."""
    s = jnp.einsum("bskh,btkgh->bksgt", k, q)
    return jnp.einsum("bksgt,bskh->btkgh", _softmax(s, 2), v)


def heads_last(q, k, v):
    """Scores laid out with the heads last (BTSKG), softmax over S."""
    s = jnp.einsum("btkgh,bskh->btskg", q, k)
    return jnp.einsum("btskg,bskh->bkgth", _softmax(s, 2), v)


def masked(q, k, v, m):
    """An additive mask in the query-major layout, before the softmax."""
    s = jnp.einsum("btkgh,bskh->btkgs", q, k) + m
    return jnp.einsum("btkgs,bskh->btkgh", _softmax(s, -1), v)


def _args(fn):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, T, K, G, H), np.float32)
    k = rng.standard_normal((B, S, K, H), np.float32)
    v = rng.standard_normal((B, S, K, H), np.float32)
    if fn is masked:
        return q, k, v, rng.standard_normal((B, T, K, G, S), np.float32)
    return q, k, v


def repeat_kv(q, k, v):
    """Llama-style: KV heads widened by `jnp.repeat`, scores BHTS, softmax, back to BTHD."""
    q = q.reshape(B, T, K * G, H)
    keys, values = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, keys) * 0.5
    return jnp.einsum("bhts,bshd->bthd", _softmax(s, -1), values)


@pytest.mark.parametrize("fn", [gqa_rows, gqa_columns, heads_last, masked, repeat_kv])
def test_einsum_attention_is_one_region_with_the_same_values(fn) -> None:
    args = _args(fn)
    program = lax_ir.capture(fn, *args)
    part = lax_ir.partition(program)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    region = part.region_of(exp)
    assert region is not None
    assert sum(program.nodes[i].op == "matmul" for i in region.nodes) == 2
    inner = region.program  # layout steps moved to its interface: none left inside
    assert not [n.op for _, n in inner.ops() if n.op == "transpose"], inner.pretty()
    got = jax.jit(lax_ir.rebuild(part))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-5, atol=1e-5)


def test_repeated_kv_heads_are_read_once_as_stored() -> None:
    """`jnp.repeat` of the KV heads becomes grouped query rows: the region reads K and V as
    the caller stores them (B, S, K, H), not widened to the query heads."""
    args = _args(repeat_kv)
    program = lax_ir.capture(repeat_kv, *args)
    part = lax_ir.partition(program)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    region = part.region_of(exp)
    assert not [n.op for _, n in region.program.ops() if n.op == "broadcast_in_dim"]
    shapes = sorted(program.nodes[i].shape for i in region.inputs)
    assert shapes.count((B, S, K, H)) == 2, shapes


def test_keys_and_values_split_from_one_projection_are_read_in_place() -> None:
    """GPT-2's form (`einsum("bqhd,bkhd->bhqk") * c` on (B, T, heads, D) arrays): K and V reach
    the region as transposes of the stored arrays, which a kernel reads in place
    (`lax_ir.views.input_view`, from the interface's recorded input shapes); Q carries its
    scale at the interface."""
    from lax_ir.views import input_view

    def fn(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.125
        return jnp.einsum("bhqk,bkhd->bqhd", _softmax(s, -1), v)

    rng = np.random.default_rng(3)
    args = [rng.standard_normal((1, 16, 4, 8), np.float32) for _ in range(3)]
    program = lax_ir.capture(fn, *args)
    part = lax_ir.partition(program)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    iface = part.region_of(exp).program.meta["interface"]
    assert iface["shapes"] == ((1, 16, 4, 8),) * 3
    ops_of = dict(iface["inputs"])  # region input position (q, k, v) -> its steps
    views = {pos: input_view(iface["shapes"][pos], ops) for pos, ops in ops_of.items()}
    assert views[1] is not None and views[2] is not None, iface
    assert views[0] is None and ops_of[0][-1] == ("scale", 0.125), iface
    got = jax.jit(lax_ir.rebuild(part))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-5, atol=1e-5)


def test_softmax_over_a_query_axis_is_left_alone() -> None:
    """A softmax over the query tokens is not an attention core: the program is unchanged."""

    def fn(q, k, v):
        s = jnp.einsum("btkgh,bskh->bkgts", q, k)
        return jnp.einsum("bkgts,bskh->btkgh", _softmax(s, 3), v)

    args = _args(fn)
    program = lax_ir.capture(fn, *args)
    assert canonical_attention(program) == program
    got = lax_ir.evaluate(program, *args)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-5, atol=1e-5)


def test_the_rewrite_keeps_the_result_in_the_traced_jaxpr() -> None:
    """The relaid PV result takes the original's place (`origins`), so a kernel can be put
    there; the layout steps the rewrite made have none."""
    args = _args(gqa_rows)
    program = lax_ir.capture(gqa_rows, *args)
    origins = program.meta["origins"]
    (out,) = program.outputs
    assert origins[out]
    made = [i for i, n in program.ops() if n.op == "transpose" and not origins[i]]
    assert made, "the rewrite's own layout steps have no place in the jaxpr"


def test_column_form_attention_gets_a_verified_mugraph() -> None:
    """The keys-before-queries scores, once relaid, are searched like any attention."""
    from mirage_jax.search import Budget, search

    args = _args(gqa_columns)
    program = lax_ir.capture(gqa_columns, *args)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    region = lax_ir.partition(program).region_of(exp)
    res = search(region.program, budget=Budget(time_s=60), seed=0, workers=1)
    assert res.best is not None, (res.stop_reason, res.message)


@pytest.mark.gpu
def test_gpu_causal_attention_reads_and_writes_its_arrays_in_place(tmp_path) -> None:
    """GPT-2's attention through `mirage_jax.jit` on Triton: K and V read from the (B, T,
    heads, D) arrays in place, the output written (T, heads, D) for the (B, T, heads * D)
    the program wants, the causal bias a constant; the result is jax.jit's."""
    pytest.importorskip("jax_triton")
    import mirage_jax
    from lax_ir.views import layout_after
    from mirage_jax.regions import stored_views

    b, t, h, d = 1, 256, 4, 64

    def fn(qkv):
        q, k, v = (a.reshape(b, t, h, d) for a in jnp.split(qkv, 3, axis=-1))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.125
        s = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool))[None, None], s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", _softmax(s, -1), v).reshape(b, t, h * d)

    x = jnp.asarray(np.random.default_rng(4).standard_normal((b, t, 3 * h * d)), jnp.float16)
    f = mirage_jax.jit(fn, backend="triton", cache=tmp_path / "c.sqlite", function_check=False)
    got = np.asarray(f(x), np.float64)
    want = np.asarray(jax.jit(fn)(x), np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert f.stats.kernels == 1
    program = lax_ir.capture(fn, x)
    part = lax_ir.partition(program)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    region = part.region_of(exp)
    after = [layout_after(part.program, o) for o in region.outputs]
    st = stored_views(region.program, "triton", after)
    assert len(st.views) >= 2 and st.outputs, (st, region.program.meta["interface"])


def test_a_mask_widened_over_grouped_heads_reaches_the_region_unwidened() -> None:
    """Llama nnx's form: KV heads widened by `jnp.repeat`, scores masked by `jnp.where` with a
    (T, S) mask. The bias is made at the mask's shape and widened over the query heads, which
    the region groups by KV head: the region reads the S values, not a widened copy XLA
    writes on every call (`lax_ir.layouts._grouped_broadcast_rule`), with the same values."""

    def fn(q, k, v, pos):
        keys, values = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
        s = jnp.einsum("bthd,bshd->bhts", q, keys) * 0.5
        mask = jnp.arange(S)[None, :] <= pos[:, None]
        s = jnp.where(mask[None, None], s, jnp.finfo(s.dtype).min)
        return jnp.einsum("bhts,bshd->bthd", _softmax(s, -1), values)

    rng = np.random.default_rng(0)
    args = (
        rng.standard_normal((1, 1, K * G, H), np.float32),
        rng.standard_normal((1, S, K, H), np.float32),
        rng.standard_normal((1, S, K, H), np.float32),
        np.array([5], np.int32),
    )
    program = lax_ir.capture(fn, *args)
    part = lax_ir.partition(program)
    (exp,) = [i for i, n in program.ops() if n.op == "exp"]
    region = part.region_of(exp)
    steps = [ops for _, ops in region.program.meta["interface"]["inputs"]]
    assert not any(op == "broadcast" for ops in steps for op, _ in ops), steps
    sizes = sorted(int(np.prod(region.program.nodes[i].shape)) for i in region.program.inputs)
    assert sizes[0] == S, sizes  # the bias, unwidened
    got = jax.jit(lax_ir.rebuild(part))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(*args)), rtol=1e-5, atol=1e-5)


@st.composite
def _grouped_broadcasts(draw):
    """(source shape, widened shape, reshape target): a [1, ..., S] bias widened over some
    axes, the widened axes then split or merged among themselves (or not: mixed groups too)."""
    s = draw(st.sampled_from([2, 4, 8]))
    wide_axes = draw(st.lists(st.sampled_from([2, 3, 4, 6]), min_size=1, max_size=2))
    src = (1,) * len(wide_axes) + (1, s)
    wide = (*wide_axes, 1, s)
    n = int(np.prod(wide_axes))
    splits = [d for d in (2, 3, 4, 6) if n % d == 0 and d < n]
    if splits and draw(st.booleans()):
        a = draw(st.sampled_from(splits))
        dst = (a, n // a, s)
    elif draw(st.booleans()):
        dst = (n, s)
    else:
        dst = (n * s,)  # a widened axis merged with the bias's own: left to the interface
    return src, wide, dst


@settings(max_examples=25, deadline=None)
@given(_grouped_broadcasts())
def test_grouped_broadcast_rule_keeps_the_values(shapes):
    """`_grouped_broadcast_rule` (through `hoist_layouts`): the region with its interface
    computes what the traced program does, and where the reshape splits or merges widened
    axes only among themselves, no broadcast is left at the interface."""
    from lax_ir.interface import adapt
    from lax_ir.layouts import hoist_layouts

    src, wide, dst = shapes

    def fn(x, y):
        return jnp.exp(jnp.broadcast_to(x, wide).reshape(dst) * 0.5 + y)

    rng = np.random.default_rng(0)
    args = (rng.standard_normal(src, np.float32), rng.standard_normal(dst, np.float32))
    program = lax_ir.capture(fn, *args)
    hoisted = hoist_layouts(program)
    got = adapt(lambda *xs: lax_ir.evaluate(hoisted, *xs), hoisted)(*args)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(fn(*args)), rtol=1e-6)
    steps = [ops for _, ops in hoisted.meta["interface"]["inputs"]]
    widened_apart = len(dst) > 1
    assert widened_apart == (not any(op == "broadcast" for ops in steps for op, _ in ops)), steps
