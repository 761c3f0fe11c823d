"""µGraph IR: shapes, validation errors, hashing, JSON, evaluation against lax_ir, rendering."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fields
import lax_ir
from lax_ir import FloatAlgebra
from mirage_jax.mugraph import (
    BlockGraphBuilder,
    MuGraph,
    MuGraphBuilder,
    MuGraphError,
    Target,
    block_info,
    evaluate,
    evaluate_reference,
    from_json,
    render,
    to_dot,
    to_json,
    to_svg,
    to_text,
    validate,
)
from mirage_jax.mugraph.resize import with_input_shapes

F16 = "float16"
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- builders
def rmsnorm_graph(m=2, k=64, n=48, grid=(4,), rows_axis=None, cols_axis=0, F=4, swap=False):
    """rms_norm(X) @ W as one graph-defined kernel (the original's RMSNorm µGraph)."""
    kb = MuGraphBuilder()
    X, W = kb.input((m, k)), kb.input((k, n))
    b = BlockGraphBuilder(grid, F)
    imap_x = tuple(0 if a == rows_axis else None for a in range(len(grid)))
    imap_w = tuple(1 if a == cols_axis else None for a in range(len(grid)))
    if swap:
        w = b.input((k, n), F16, imap_w, 0)
        x = b.input((m, k), F16, imap_x, 1)
        mm = b.op("matmul", x, w)
        r = b.op("accum_rms_last", x)
    else:
        x = b.input((m, k), F16, imap_x, 1)
        w = b.input((k, n), F16, imap_w, 0)
        r = b.op("accum_rms_last", x)
        mm = b.op("matmul", x, w)
    a = b.op("accum_sum", mm)
    d = b.op("div", a, r)
    omap = tuple(
        0 if ax == rows_axis else 1 if ax == cols_axis else None for ax in range(len(grid))
    )
    b.output(d, omap)
    args = [W, X] if swap else [X, W]
    (o,) = kb.graph_defined(args, b.build())
    return kb.build([o], name="rmsnorm")


def rms_norm_noeps(x):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True))


@functools.cache
def captured(name: str, shapes: tuple) -> lax_ir.Program:
    fns = {
        "rmsnorm": lambda x, w: rms_norm_noeps(x) @ w,
        "gated_mlp": lambda x, w1, w2: jax.nn.silu(x @ w1) * (x @ w2),
        "softmax": lambda q, k, v: jax.nn.softmax((q @ k) * 0.125, axis=-1) @ v,
        "lora": lambda x, w, a, b: x @ w + (x @ a) @ b,
        "residual_gemm": lambda x, w, r: r + x @ w,
    }
    return lax_ir.capture(fns[name], *[jax.ShapeDtypeStruct(s, jnp.float16) for s in shapes])


def randn(shapes, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float16) for s in shapes]


def ref64(program, xs):
    return lax_ir.evaluate_reference(program, *xs)


# ---------------------------------------------------------------------------- shapes
def test_shape_inference_rmsnorm():
    g = rmsnorm_graph()
    assert g.input_avals == (((2, 64), F16), ((64, 48), F16))
    assert g.output_avals == (((2, 48), F16),)
    info = block_info(g.graph_defined()[0][1].block_graph)
    assert info.output_shapes == ((2, 48),)
    assert sorted(set(info.tiles)) == sorted({(2, 16), (16, 12), (2, 1), (2, 12)})


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def rmsnorm_cases(draw):
    """Random legal grids, maps and loop ranges over the fixed rmsnorm structure."""
    m = draw(st.sampled_from([2, 4, 6]))
    k = draw(st.sampled_from([8, 16, 24, 32]))
    n = draw(st.sampled_from([8, 12, 16]))
    naxes = draw(st.integers(1, 3))
    roles = draw(st.permutations(["rows", "cols", None]))[:naxes]
    grid = []
    for role in roles:
        grid.append(
            draw(
                st.sampled_from(
                    divisors(m) if role == "rows" else divisors(n) if role == "cols" else [1]
                )
            )
        )
    rows_axis = roles.index("rows") if "rows" in roles else None
    cols_axis = roles.index("cols") if "cols" in roles else None
    F = draw(st.sampled_from(divisors(k)))
    swap = draw(st.booleans())
    return dict(
        m=m, k=k, n=n, grid=tuple(grid), rows_axis=rows_axis, cols_axis=cols_axis, F=F, swap=swap
    )


@SETTINGS
@given(rmsnorm_cases())
def test_random_block_graphs_shapes(case):
    g = rmsnorm_graph(**case)
    assert g.output_avals == (((case["m"], case["n"]), F16),)
    bg = g.graph_defined()[0][1].block_graph
    info = block_info(bg)
    g0 = case["grid"]
    tm = case["m"] // (g0[case["rows_axis"]] if case["rows_axis"] is not None else 1)
    tn = case["n"] // (g0[case["cols_axis"]] if case["cols_axis"] is not None else 1)
    assert (tm, case["k"] // case["F"]) in info.tiles
    assert (tm, tn) in info.tiles


@SETTINGS
@given(rmsnorm_cases(), st.integers(0, 2**31))
def test_random_block_graphs_equal_lax_program(case, seed):
    g = rmsnorm_graph(**case)
    shapes = tuple(s for s, _ in g.input_avals)
    program = captured("rmsnorm", shapes)
    xs = randn(shapes, seed)
    np.testing.assert_allclose(
        evaluate_reference(g, *xs)[0], ref64(program, xs)[0], rtol=1e-9, atol=1e-9
    )
    assert fields.verify(g, program, trials=1, seed=seed % 1000).equal


@pytest.mark.parametrize("F", [1, 2])
def test_tile_norm_is_right_only_without_a_loop(F):
    """rms_norm of each loop chunk, accumulated after the matmul, is rmsnorm only when F = 1."""
    kb = MuGraphBuilder()
    X, W = kb.input((2, 16)), kb.input((16, 8))
    b = BlockGraphBuilder((2,), F)
    x = b.input((2, 16), F16, (None,), 1)
    w = b.input((16, 8), F16, (1,), 0)
    b.output(b.op("accum_sum", b.op("matmul", b.op("rms_norm", x), w)), (1,))
    (o,) = kb.graph_defined([X, W], b.build())
    g = kb.build([o])
    assert bool(fields.verify(g, captured("rmsnorm", ((2, 16), (16, 8))), trials=1)) == (F == 1)


# ---------------------------------------------------------------------------- validation
def _single(grid, F, inputs, ops, outputs):
    kb = MuGraphBuilder()
    refs = [kb.input(s) for s, _, _ in inputs]
    b = BlockGraphBuilder(grid, F)
    for s, imap, fdim in inputs:
        b.input(s, F16, imap, fdim)
    ids = list(range(len(inputs)))
    for name, args, params in ops:
        ids.append(b.op(name, *args, **params))
    for t, omap in outputs:
        b.output(t, omap)
    outs = kb.graph_defined(refs, b.build())
    return kb.build(outs)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (
            lambda: _single(
                (3,), 1, [((8, 4), (0,), None)], [("accum_sum", (0,), {})], [(1, (0,))]
            ),
            "uneven split: dim 0 of size 8 by grid axis x = 3",
        ),
        (
            lambda: _single(
                (1,), 3, [((8, 4), (None,), 0)], [("accum_sum", (0,), {})], [(1, (None,))]
            ),
            "uneven split: dim 0 .* by forloop_range 3",
        ),
        (
            lambda: _single(
                (2, 2), 1, [((8, 4), (0, 0), None)], [("accum_sum", (0,), {})], [(1, (0, 1))]
            ),
            "grid axis mapped twice: imap maps grid axes x and y",
        ),
        (
            lambda: _single(
                (2, 2), 1, [((8, 4), (0, 1), None)], [("accum_sum", (0,), {})], [(1, (1, 1))]
            ),
            "grid axis mapped twice: omap",
        ),
        (
            lambda: _single(
                (1,), 1, [((8, 4), (None,), None)], [("exp", (0,), {})], [(1, (None,))]
            ),
            "output not accumulated",
        ),
        (
            lambda: _single(
                (2,), 1, [((8, 4), (None,), None)], [("accum_sum", (0,), {})], [(1, (None,))]
            ),
            "replicated along grid axis x .* it must split",
        ),
        (
            lambda: _single(
                (1,),
                1,
                [((8, 4), (None,), None)],
                [("accum_sum", (0,), {}), ("add", (0, 1), {})],
                [(2, (None,))],
            ),
            "mixes loop tensors with accumulated tensors",
        ),
        (
            lambda: _single(
                (1,),
                1,
                [((8, 4), (None,), None)],
                [("accum_sum", (0,), {}), ("accum_sum", (1,), {})],
                [(2, (None,))],
            ),
            "argument 0 is an accumulated tensor",
        ),
        (
            lambda: _single(
                (1,), 1, [((8, 4), (None,), None)], [("frobnicate", (0,), {})], [(1, (None,))]
            ),
            "unknown block-level op 'frobnicate'",
        ),
        (
            lambda: _single(
                (1,),
                1,
                [((8, 4), (None,), None), ((8, 4), (None,), None)],
                [("matmul", (0, 1), {})],
                [(2, (None,))],
            ),
            r"block op 0 \(matmul\): matmul contraction mismatch",
        ),
        (
            lambda: _single(
                (1,), 1, [((8, 4), (None, None), None)], [("accum_sum", (0,), {})], [(1, (None,))]
            ),
            "imap has 2 entries for a grid of 1 axes",
        ),
        (
            lambda: _single(
                (1,), 1, [((8, 4), (None,), 2)], [("accum_sum", (0,), {})], [(1, (None,))]
            ),
            "forloop_dim 2 out of range",
        ),
        (
            lambda: _single(
                (1,),
                1,
                [((8, 4), (None,), None)],
                [("accum_sum_todimx", (0,), {"dimx": 3})],
                [(1, (None,))],
            ),
            "uneven split: last dim 4 is not a multiple of dimx=3",
        ),
    ],
)
def test_validation_errors_name_op_and_rule(build, match):
    with pytest.raises(MuGraphError, match=match):
        build().shapes  # noqa: B018


def test_rescale_needs_the_max_of_its_shift():
    ins = [((8, 4), (None,), 0)]
    ops = [
        ("accum_max", (0,), {}),
        ("exp", (0,), {}),
        ("accum_max", (2,), {}),
        ("accum_rescale_sum", (0, 0, 3), {}),
    ]
    with pytest.raises(MuGraphError, match=r"\(accum_rescale_sum\): the final shift"):
        _single((1,), 2, ins, ops, [(4, (None,))]).shapes  # noqa: B018
    ok = _single(
        (1,),
        2,
        ins,
        [("accum_max", (0,), {}), ("accum_rescale_sum", (0, 0, 1), {})],
        [(2, (None,))],
    )
    assert ok.output_avals == (((4, 4), F16),)


def test_resource_limits():
    g = rmsnorm_graph(grid=(8,), F=1)
    validate(g, "h100")
    with pytest.raises(MuGraphError, match=r"too many blocks: grid \(8,\) has 8 > 4"):
        validate(g, Target("tiny", 1 << 20, max_blocks=4))
    with pytest.raises(MuGraphError, match=r"tile too large for shared memory: .* > 100"):
        validate(g, Target("tiny", 100))


def test_a_block_matmul_over_a_batch_of_tiles_is_refused_for_a_target():
    """Both backends' dots are 2-D: a µGraph leaving heads unsplit ([3, 4, 4] tiles) is no
    candidate (GPT-2 XL's 25 heads gave only such µGraphs, none of which lowered)."""
    ins = [((3, 4, 4), (None,), None), ((3, 4, 4), (None,), None)]
    ops = [("matmul", (0, 1), {}), ("accum_sum", (2,), {})]
    g = _single((1,), 1, ins, ops, [(3, (None,))])
    validate(g)  # well formed
    with pytest.raises(MuGraphError, match=r"block op 0 \(matmul\) multiplies a batch of tiles"):
        validate(g, "h100")
    split = _single((3,), 1, [((3, 4, 4), (0,), None)] * 2, ops, [(3, (0,))])
    validate(split, "h100")


def test_kernel_level_errors():
    kb = MuGraphBuilder()
    a, b = kb.input((4, 8)), kb.input((4, 8))
    with pytest.raises(MuGraphError, match=r"kernel op 2 \(matmul\): matmul contraction mismatch"):
        kb.build([kb.op("matmul", a, b)]).shapes  # noqa: B018
    kb2 = MuGraphBuilder()
    a = kb2.input((4, 8))
    with pytest.raises(MuGraphError, match="unknown kernel-level op 'accum_sum'"):
        kb2.build([kb2.op("accum_sum", a)]).shapes  # noqa: B018


# ---------------------------------------------------------------------------- identity, JSON
@SETTINGS
@given(rmsnorm_cases())
def test_hash_is_independent_of_construction_order(case):
    g1 = rmsnorm_graph(**{**case, "swap": False})
    g2 = rmsnorm_graph(**{**case, "swap": True})
    assert g1 == g2 and g1.canonical_hash == g2.canonical_hash
    assert g1.ops == g2.ops
    other = rmsnorm_graph(**{**case, "F": 1 if case["F"] != 1 else 2, "k": 16})
    assert other != g1


def test_build_merges_duplicates_and_drops_dead_ops():
    kb = MuGraphBuilder()
    x = kb.input((4, 4))
    e1, e2 = kb.op("exp", x), kb.op("exp", x)
    kb.op("sqrt", x)  # dead
    g = kb.build([kb.op("add", e1, e2)])
    assert [op.op for op in g.ops] == ["input", "exp", "add"]
    assert g.ops[2].args == ((1, 0), (1, 0))


@SETTINGS
@given(rmsnorm_cases())
def test_json_round_trip(case):
    g = rmsnorm_graph(**case)
    text = to_json(g)
    g2 = from_json(text)
    assert g2 == g and g2.ops == g.ops and g2.outputs == g.outputs
    assert to_json(g2) == text
    assert g2.meta["name"] == "rmsnorm"


def test_json_rejects_other_formats():
    with pytest.raises(MuGraphError, match="not a µGraph JSON"):
        from_json('{"format": "x", "version": 1}')
    with pytest.raises(MuGraphError, match="version 9 is not supported"):
        from_json('{"format": "mirage_jax.mugraph", "version": 9}')


# ---------------------------------------------------------------------------- semantics
def test_float16_evaluation_matches_reference():
    g = rmsnorm_graph(m=4, k=256, n=64, grid=(2, 4), rows_axis=0, cols_axis=1, F=8)
    xs = randn([(4, 256), (256, 64)])
    out = np.asarray(jax.jit(lambda *a: evaluate(g, *a))(*xs)[0], np.float64)
    ref = ref64(captured("rmsnorm", ((4, 256), (256, 64))), xs)[0]
    assert out.dtype == np.float64 and np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 1e-2


def gated_mlp_graph(m=4, k=32, n=16, grid=4, F=4):
    kb = MuGraphBuilder()
    X, W1, W2 = kb.input((m, k)), kb.input((k, n)), kb.input((k, n))
    b = BlockGraphBuilder((grid,), F)
    x = b.input((m, k), F16, (None,), 1)
    w1 = b.input((k, n), F16, (1,), 0)
    w2 = b.input((k, n), F16, (1,), 0)
    a1 = b.op("accum_sum", b.op("matmul", x, w1))
    a2 = b.op("accum_sum", b.op("matmul", x, w2))
    b.output(b.op("mul", b.op("silu", a1), a2), (1,))
    (o,) = kb.graph_defined([X, W1, W2], b.build())
    return kb.build([o])


def test_gated_mlp_verifies():
    g = gated_mlp_graph()
    program = captured("gated_mlp", tuple(s for s, _ in g.input_avals))
    assert fields.verify(g, program, trials=2).equal


def flash_attention_graph(h=2, lq=8, d=16, kv=32, tq=4, F=4):
    """Online softmax in one kernel: per-iteration shift m, accum_max, rescaled sums."""
    kb = MuGraphBuilder()
    Q, K, V = kb.input((h, lq, d)), kb.input((h, d, kv)), kb.input((h, kv, d))
    b = BlockGraphBuilder((h, lq // tq), F)
    q = b.input((h, lq, d), F16, (0, 1), None)
    k = b.input((h, d, kv), F16, (0, None), 2)
    v = b.input((h, kv, d), F16, (0, None), 1)
    s = b.op("mul_scalar", b.op("matmul", q, k), scalar=0.125)
    m = b.op("reduce_max", s, dim=2)
    e = b.op("exp", b.op("sub", s, m))
    pv = b.op("matmul", e, v)
    big_m = b.op("accum_max", m)
    o = b.op("accum_rescale_sum", pv, m, big_m)
    l_ = b.op("accum_rescale_sum_last", e, m, big_m)
    b.output(b.op("div", o, l_), (0, 1))
    (out,) = kb.graph_defined([Q, K, V], b.build())
    return kb.build([out])


def test_online_softmax_accumulators():
    g = flash_attention_graph()
    shapes = tuple(s for s, _ in g.input_avals)
    program = captured("softmax", shapes)
    xs = randn(shapes, 1, scale=2.0)
    np.testing.assert_allclose(
        evaluate_reference(g, *xs)[0], ref64(program, xs)[0], rtol=1e-9, atol=1e-12
    )
    assert fields.verify(g, program, trials=2).equal


def test_online_softmax_without_rescale_is_rejected():
    """Summing exp(s - m_i) with per-iteration shifts m_i (no rescale) is not softmax."""
    kb = MuGraphBuilder()
    Q, K, V = kb.input((2, 8, 16)), kb.input((2, 16, 32)), kb.input((2, 32, 16))
    b = BlockGraphBuilder((2, 2), 4)
    q = b.input((2, 8, 16), F16, (0, 1), None)
    k = b.input((2, 16, 32), F16, (0, None), 2)
    v = b.input((2, 32, 16), F16, (0, None), 1)
    s = b.op("mul_scalar", b.op("matmul", q, k), scalar=0.125)
    e = b.op("exp", b.op("sub", s, b.op("reduce_max", s, dim=2)))
    o = b.op("accum_sum", b.op("matmul", e, v))
    b.output(b.op("div", o, b.op("accum_sum_last", e)), (0, 1))
    (out,) = kb.graph_defined([Q, K, V], b.build())
    g = kb.build([out])
    assert not fields.verify(
        g, captured("softmax", ((2, 8, 16), (2, 16, 32), (2, 32, 16))), trials=1
    )


def test_concat_matmul_lora():
    kb = MuGraphBuilder()
    X, W, A, B = kb.input((16, 32)), kb.input((32, 64)), kb.input((32, 8)), kb.input((8, 64))
    b = BlockGraphBuilder((4,), 1)
    x = b.input((16, 32), F16, (None,), None)
    w = b.input((32, 64), F16, (1,), None)
    a = b.input((32, 8), F16, (None,), None)
    bb = b.input((8, 64), F16, (1,), None)
    xa = b.op("matmul", x, a)
    b.output(b.op("accum_sum", b.op("concat_matmul", x, xa, w, bb)), (1,))
    (o,) = kb.graph_defined([X, W, A, B], b.build())
    g = kb.build([o])
    program = captured("lora", ((16, 32), (32, 64), (32, 8), (8, 64)))
    assert fields.verify(g, program, trials=2).equal


def test_accumulators_against_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256))
    kb = MuGraphBuilder()
    X = kb.input((4, 256))
    b = BlockGraphBuilder((2,), 2)
    t = b.input((4, 256), F16, (0,), 1)
    outs = [
        b.output(b.op("accum_mean_last", t), (0,)),
        b.output(b.op("accum_rms_last", t), (0,)),
        b.output(b.op("accum_sum_todimx", t, dimx=64), (0,)),
        b.output(b.op("accum_sum_last", t), (0,)),
    ]
    refs = kb.graph_defined([X], b.build())
    g = kb.build(refs)
    assert len(outs) == 4
    mean, rms, todimx, total = evaluate_reference(g, x)
    np.testing.assert_allclose(mean[:, 0], x.mean(-1))
    np.testing.assert_allclose(rms[:, 0], np.sqrt((x * x).mean(-1)))
    np.testing.assert_allclose(todimx, x.reshape(4, 4, 64).sum(1))
    np.testing.assert_allclose(total[:, 0], x.sum(-1))


def residual_gemm_graph(keep_input_loops: bool = False) -> MuGraph:
    """r + x @ w in one kernel that loops over K: the residual is read after the loop."""
    kb = MuGraphBuilder()
    X, W, R = kb.input((4, 64)), kb.input((64, 32)), kb.input((4, 32))
    b = BlockGraphBuilder((2,), 4)
    x = b.input((4, 64), F16, (None,), 1)
    w = b.input((64, 32), F16, (1,), 0)
    r = b.input((4, 32), F16, (1,), 1 if keep_input_loops else None)
    acc = b.op("accum_sum", b.op("matmul", x, w))
    b.output(b.op("add", b.op("accum_keep", r), acc), (1,))
    (o,) = kb.graph_defined([X, W, R], b.build())
    return kb.build([o])


def test_accum_keep_reads_a_loop_invariant_input_after_the_loop():
    """accum_keep carries the residual past a K loop as it is (not summed F times): the
    reference and the finite-field verifier agree with r + x @ w."""
    g = residual_gemm_graph()
    shapes = ((4, 64), (64, 32), (4, 32))
    program = captured("residual_gemm", shapes)
    xs = randn(shapes, 2)
    np.testing.assert_allclose(
        evaluate_reference(g, *xs)[0], ref64(program, xs)[0], rtol=1e-9, atol=1e-9
    )
    assert fields.verify(g, program, trials=2).equal


def test_accum_keep_of_a_tile_the_loop_walks_is_refused():
    with pytest.raises(MuGraphError, match="accum_keep carries a loop-invariant tile"):
        validate(residual_gemm_graph(keep_input_loops=True))


def test_kernel_level_ops_and_numpy_dtype_faithful_algebra():
    kb = MuGraphBuilder()
    x = kb.input((4, 8))
    y = kb.op("gelu", kb.op("rms_norm", x))
    g = kb.build([kb.op("reduce_sum", y, dim=1)])
    assert g.output_avals == (((4, 1), F16),)
    xs = randn([(4, 8)])
    prog = lax_ir.capture(
        lambda a: jnp.sum(jax.nn.gelu(rms_norm_noeps(a), approximate=False), 1, keepdims=True),
        jax.ShapeDtypeStruct((4, 8), jnp.float16),
    )
    assert fields.verify(g, prog, trials=2).equal
    out16 = g.interpret(xs, FloatAlgebra(np))[0]
    assert out16.dtype == np.float16
    np.testing.assert_allclose(out16, ref64(prog, xs)[0], rtol=2e-2, atol=2e-2)


def test_with_input_shapes_keeps_structure():
    g = rmsnorm_graph(m=2, k=64, n=48, grid=(4,), F=4)
    small = with_input_shapes(g, [(2, 16), (16, 8)])
    assert small.output_avals == (((2, 8), F16),)
    with pytest.raises(MuGraphError, match="uneven split"):
        with_input_shapes(g, [(2, 16), (16, 6)])


# ---------------------------------------------------------------------------- rendering
def test_text_dot_and_pictures(tmp_path):
    g = flash_attention_graph()
    text = to_text(g)
    assert "grid (x=2, y=2)  forloop_range 4" in text and "accum_rescale_sum(" in text
    assert "imap {x:0, y:φ}" in text and "omap {x:0, y:1}" in text
    assert str(g) == text
    assert to_dot(g).startswith("digraph")
    for name in ("g.svg", "g.png"):
        path = render(g, tmp_path / name)
        assert path.stat().st_size > 1000
    assert "<svg" in g._repr_svg_()
    with pytest.raises(ValueError, match="render writes"):
        render(g, tmp_path / "g.txt")


def three_kernel_graph(m=4, k=64, n=48, r=16):
    """rms_norm(X) @ W as a graph-defined kernel, then silu and mul (reading it again, one
    column later) and a matmul with an input read late: arrows that skip a column of boxes."""
    kb = MuGraphBuilder()
    X, W, V = kb.input((m, k)), kb.input((k, n)), kb.input((n, r))
    b = BlockGraphBuilder((4,), 4)
    x = b.input((m, k), F16, (None,), 1)
    w = b.input((k, n), F16, (1,), 0)
    rms = b.op("accum_rms_last", x)
    b.output(b.op("div", b.op("accum_sum", b.op("matmul", x, w)), rms), (1,))
    (y,) = kb.graph_defined([X, W], b.build())
    o = kb.op("mul", kb.op("silu", y), y)
    return kb.build([o, kb.op("matmul", o, V), y], name="three_kernels")


def _crosses(p, q, box, eps=0.5):
    """Whether the segment p-q enters box (x, y, w, h), less `eps` at each side."""
    x, y, w, h = box
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    for step, room in ((-dx, p[0] - x - eps), (dx, x + w - eps - p[0]),
                       (-dy, p[1] - y - eps), (dy, y + h - eps - p[1])):  # fmt: skip
        if step == 0:
            if room < 0:
                return False
        elif step < 0:
            t0 = max(t0, room / step)
        else:
            t1 = min(t1, room / step)
    return t0 <= t1


def test_matplotlib_picture_routes_arrows_around_boxes(tmp_path):
    from mirage_jax.mugraph.render import layout

    g = three_kernel_graph()
    lay = layout(g)
    assert len(lay.edges) == sum(len(op.args) for op in g.ops) + len(g.outputs)
    straight = [(e[0], e[-1]) for e in lay.edges]
    assert any(_crosses(p, q, b) for p, q in straight for b in lay.boxes.values())  # the need
    for points in lay.edges:
        for p, q in itertools.pairwise(points):
            for i, box in lay.boxes.items():
                assert not _crosses(p, q, box), (points, i)
    assert [text for _, _, text in lay.outputs] == ["out 0", "out 1", "out 2"]
    for name in ("g.svg", "g.png"):
        assert render(g, tmp_path / name, engine="matplotlib").stat().st_size > 1000
    assert "matplotlib" in to_svg(g, engine="matplotlib").lower()


def _bezier_points(coords):
    """Points along a Graphviz spline (control points p0, then three per cubic piece)."""
    pts = list(zip(coords[::2], coords[1::2], strict=True))
    for a, b, c, d in zip(pts[:-1:3], pts[1::3], pts[2::3], pts[3::3], strict=True):
        for t in np.linspace(0, 1, 21):
            u = 1 - t
            yield tuple(u**3 * a[j] + 3 * u * u * t * b[j] + 3 * u * t * t * c[j] + t**3 * d[j]
                        for j in range(2))  # fmt: skip


def test_graphviz_picture_routes_arrows_around_boxes(tmp_path):
    from mirage_jax.mugraph import render_dot
    from mirage_jax.mugraph.render import picture_dot

    if not render_dot.available():
        pytest.skip("Graphviz's dot program (or the graphviz package) is not installed")
    g = three_kernel_graph()
    boxes, edges = {}, []
    for line in render_dot.pipe(picture_dot(g), "plain").decode().splitlines():
        f = line.split()
        if f[0] == "node":
            x, y, w, h = map(float, f[2:6])
            boxes[f[1]] = (x - w / 2, y - h / 2, w, h)
        elif f[0] == "edge":
            edges.append((f[1], f[2], list(map(float, f[4 : 4 + 2 * int(f[3])]))))
    assert len(edges) == sum(len(op.args) for op in g.ops) + len(g.outputs)
    for tail, head, coords in edges:
        for x, y in _bezier_points(coords):
            for name, box in boxes.items():
                if name not in (tail, head):
                    assert not _crosses((x, y), (x, y), box, eps=0.02), (tail, head, name)
    svg = to_svg(g, engine="graphviz")
    assert "graphviz" in svg and "graph_defined" in svg and "accum_rms_last" in svg
    for name in ("g.svg", "g.png", "g.pdf"):
        assert render(g, tmp_path / name, engine="graphviz").stat().st_size > 1000


def test_picture_engines(monkeypatch):
    from mirage_jax.mugraph import render_dot

    g = three_kernel_graph()
    with pytest.raises(ValueError, match="engine must be one of"):
        to_svg(g, engine="cairo")
    monkeypatch.setattr(render_dot.shutil, "which", lambda name: None)
    assert not render_dot.available()
    with pytest.raises(RuntimeError, match="dot program"):
        to_svg(g, engine="graphviz")
    assert "matplotlib" in to_svg(g).lower()  # auto: matplotlib where Graphviz is missing


def test_mugraph_equality_ignores_meta():
    a = rmsnorm_graph()
    b = MuGraph.build(a.ops, a.outputs, {"name": "other"})
    assert a == b and hash(a) == hash(b)


def test_thread_level_epilogues():
    from mirage_jax.mugraph.thread import epilogues

    g = flash_attention_graph()
    bg = g.graph_defined()[0][1].block_graph
    chains = epilogues(bg)
    names = {bg.ops[t - 3].op: [bg.ops[c - 3].op for c in ch] for t, ch in chains.items()}
    assert names == {"matmul": ["mul_scalar"], "sub": ["exp"]}
    g2 = gated_mlp_graph()
    bg2 = g2.graph_defined()[0][1].block_graph
    assert [bg2.ops[c - 3].op for ch in epilogues(bg2).values() for c in ch] == ["silu"]


def test_a_gemm_of_an_fp32_value_and_16_bit_weights_rounds_the_value_first():
    """A stitched piece leaves its cut value in fp32 (its accumulator); the next piece's
    pre-defined GEMM reads it with bfloat16 weights. The GEMM rounds it to bfloat16 first, as
    the program did where it cut, and its result is bfloat16; other mixed ops stay errors."""
    import jax.numpy as jnp

    from mirage_jax.mugraph.evaluate import evaluate

    kb = MuGraphBuilder()
    x, w = kb.input((4, 8), "float32"), kb.input((8, 16), "bfloat16")
    g = kb.build([kb.op("matmul", x, w)])
    assert g.output_avals == (((4, 16), "bfloat16"),)
    rng = np.random.default_rng(0)
    xv = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    wv = jnp.asarray(rng.standard_normal((8, 16)), jnp.bfloat16)
    (got,) = evaluate(g, xv, wv)
    want = jnp.matmul(xv.astype(jnp.bfloat16), wv, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want.astype(jnp.bfloat16), np.float32)
    )
    kb = MuGraphBuilder()
    a, b = kb.input((4, 8), "float32"), kb.input((4, 8), "bfloat16")
    with pytest.raises(MuGraphError, match="operand dtypes differ"):
        kb.build([kb.op("add", a, b)]).shapes  # noqa: B018


def test_a_block_output_stored_narrower():
    """`BlockOutput.dtype`: the kernel's float32 result stored in 16 bits (a cut norm piece's
    rounded row): its shape rule, its float meaning (rounded once), its JSON and hash; a graph
    without it hashes and serialises as before the field existed."""
    import dataclasses

    kb = MuGraphBuilder()
    X, W = kb.input((2, 64), "float32"), kb.input((64, 48), "float32")
    b = BlockGraphBuilder((4,), 4)
    x = b.input((2, 64), "float32", (None,), 1)
    w = b.input((64, 48), "float32", (1,), 0)
    b.output(b.op("accum_sum", b.op("matmul", x, w)), (1,))
    (o,) = kb.graph_defined([X, W], b.build())
    wide = kb.build([o])
    bg = wide.ops[2].block_graph
    out = dataclasses.replace(bg.outputs[0], dtype=F16)
    op = dataclasses.replace(wide.ops[2], block_graph=dataclasses.replace(bg, outputs=(out,)))
    narrow = MuGraph((*wide.ops[:2], op), wide.outputs)
    assert narrow.shapes[(2, 0)] == ((2, 48), F16) and wide.shapes[(2, 0)][1] == "float32"
    for bad in ("int8", "float64"):  # only a narrower float
        out = dataclasses.replace(bg.outputs[0], dtype=bad)
        op = dataclasses.replace(wide.ops[2], block_graph=dataclasses.replace(bg, outputs=(out,)))
        with pytest.raises(MuGraphError, match=f"stored as {bad}"):
            MuGraph((*wide.ops[:2], op), wide.outputs).shapes  # noqa: B018 (validates)
    assert narrow.canonical_hash != wide.canonical_hash
    assert '"dtype": "float16"' in to_json(narrow) and "stored float16" in to_text(narrow)
    assert from_json(to_json(narrow)).canonical_hash == narrow.canonical_hash
    from mirage_jax.mugraph.serialize import block_graph_to_dict

    assert block_graph_to_dict(bg)["outputs"] == [{"arg": bg.outputs[0].arg, "omap": [1]}]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 64)).astype(np.float32), rng.standard_normal((64, 48))]
    (got,) = evaluate(narrow, xs[0], xs[1].astype(np.float32))
    (want,) = evaluate(wide, xs[0], xs[1].astype(np.float32))
    assert str(got.dtype) == F16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(np.float16))
