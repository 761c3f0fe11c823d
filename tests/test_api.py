"""mirage_jax.jit on the CPU: the XLA path and the kernel-replacement path, grad/vmap/jit."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
import mirage_jax
from experiments import benchmarks
from mirage_jax import api
from mirage_jax.cache import Cache, CacheWarning
from mirage_jax.mugraph import BlockGraphBuilder, MuGraphBuilder

REPO = Path(__file__).resolve().parents[1]
EPS = benchmarks.EPS
TOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 2e-4, "float64": 1e-9}


@pytest.fixture(autouse=True)
def _fresh_warnings():
    api._WARNED.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "no GPU", mirage_jax.MirageWarning)
        yield


def assert_close(got, want, tol=None):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        t = tol or TOL[str(np.dtype(w.dtype))]
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_allclose(g64, w64, rtol=t, atol=t * (np.max(np.abs(w64)) + 1e-30))


# ---------------------------------------------------------------------- hand-built µGraphs
def _attention(b, q, k, v, scale=None, shift=False):
    s = b.op("matmul", q, k)
    if scale is not None:
        s = b.op("mul_scalar", s, scalar=scale)
    if shift:
        s = b.op("sub", s, b.op("reduce_max", s, dim=2))
    e = b.op("exp", s)
    return b.op("matmul", b.op("div", e, b.op("reduce_sum", e, dim=2)), v)


def _rms_over(b, x, dim, n, eps):
    ss = b.op("reduce_sum", b.op("square", x), dim=dim)
    ms = b.op("add_scalar", b.op("mul_scalar", ss, scalar=1.0 / n), scalar=eps)
    return b.op("div", x, b.op("sqrt", ms))


def _lora(b, x, w, a, c):
    return b.op("add", b.op("matmul", x, w), b.op("matmul", b.op("matmul", x, a), c))


def _gated(b, x, w1, w2):
    return b.op("mul", b.op("silu", b.op("matmul", x, w1)), b.op("matmul", x, w2))


def _ntrans(b, h, x, alpha, eps=None):
    inner = b.op("add", b.op("rms_norm", h, eps=eps), x)
    return b.op("rms_norm", b.op("add", x, b.op("mul", alpha, inner)), eps=eps)


# Kernel-level µGraphs equal to each benchmark program (specs → output ref).
MUGRAPHS = {
    "rmsnorm": lambda b, x, w, s: b.op("matmul", b.op("rms_norm", x, eps=EPS), w),
    "rmsnorm_mirage": lambda b, x, w, s: b.op("matmul", b.op("rms_norm", x), w),
    "lora": lambda b, *xs, s: _lora(b, *xs),
    "lora_mirage": lambda b, *xs, s: _lora(b, *xs),
    "gated_mlp": lambda b, *xs, s: _gated(b, *xs),
    "gated_mlp_mirage": lambda b, *xs, s: _gated(b, *xs),
    "gqa": lambda b, q, k, v, s: _attention(b, q, k, v),
    "gqa_mirage": lambda b, q, k, v, s: _attention(b, q, k, v),
    "gqa_scaled": lambda b, q, k, v, s: _attention(b, q, k, v, 0.125),
    "gqa_stable": lambda b, q, k, v, s: _attention(b, q, k, v, 0.125, shift=True),
    "qknorm": lambda b, q, k, v, s: _attention(
        b, b.op("rms_norm", q, eps=EPS), _rms_over(b, k, 1, s[1].shape[1], EPS), v, 0.125
    ),
    "qknorm_mirage": lambda b, q, k, v, s: _attention(
        b, b.op("rms_norm", q), k, b.op("rms_norm", v)
    ),
    "ntrans": lambda b, h, x, a, s: _ntrans(b, h, x, a, EPS),
    "ntrans_mirage": lambda b, h, x, a, s: _ntrans(b, h, x, a),
}


def bench_f32(name: str):
    bench = benchmarks.get(name).small()
    specs = [jax.ShapeDtypeStruct(s.shape, jnp.float32) for s in bench.inputs]
    xs = [jnp.asarray(a) for a in bench.make_inputs(seed=0, dtype=np.float32)]
    return bench, specs, xs


def inject(cache: Cache, region_program, build, specs, backend="reference") -> None:
    """Verify a hand-built µGraph against the region and store it for this device."""
    b = MuGraphBuilder()
    ins = [b.input(s.shape, str(np.dtype(s.dtype))) for s in specs]
    out = build(b, *ins, s=specs)
    graph = b.build(list(out) if isinstance(out, list) else [out])
    cache.store(region_program, graph, device_kind=api.device_kind(), backend=backend)


def rmsnorm_block_graph(b, x, w, s, grid=3, loop=2):
    """rms_norm(X) @ W as one graph-defined kernel: W split over the grid, K over the loop."""
    (m, k), n = s[0].shape, s[1].shape[1]
    dtype = str(np.dtype(s[0].dtype))
    bb = BlockGraphBuilder(grid=(grid,), forloop_range=loop)
    wt = bb.input((k, n), dtype, imap=(1,), forloop_dim=0)
    xt = bb.input((m, k), dtype, imap=(None,), forloop_dim=1)
    acc = bb.op("accum_sum", bb.op("matmul", xt, wt))
    bb.output(bb.op("div", acc, bb.op("accum_rms_last", xt, eps=EPS)), omap=(1,))
    return b.graph_defined([w, x], bb.build())[0]


def gated_block_graph(b, x, w1, w2, s, grid=2, loop=2):
    """silu(X @ W1) * (X @ W2) as a two-output graph-defined kernel and a kernel-level mul."""
    (m, k), n = s[0].shape, s[1].shape[1]
    dtype = str(np.dtype(s[0].dtype))
    bb = BlockGraphBuilder(grid=(grid,), forloop_range=loop)
    xt = bb.input((m, k), dtype, imap=(None,), forloop_dim=1)
    at = bb.input((k, n), dtype, imap=(1,), forloop_dim=0)
    ct = bb.input((k, n), dtype, imap=(1,), forloop_dim=0)
    up = bb.op("accum_sum", bb.op("matmul", xt, at))
    gate = bb.op("accum_sum", bb.op("matmul", xt, ct))
    bb.output(bb.op("silu", up), omap=(1,))
    bb.output(gate, omap=(1,))
    o1, o2 = b.graph_defined([x, w1, w2], bb.build())
    return b.op("mul", o1, o2)


def only_region(fn, *specs):
    part = lax_ir.partition(lax_ir.capture(fn, *specs))
    (region,) = [r for r in part.regions if not r.is_trivial]
    return region


# ---------------------------------------------------------------------- benchmarks
@pytest.mark.parametrize("name", benchmarks.names())
def test_benchmark_xla_path_matches_jax_jit(name, tmp_path):
    bench = benchmarks.get(name).small()
    xs = [jnp.asarray(a) for a in bench.make_inputs(seed=1)]
    f = mirage_jax.jit(bench.fn, cache=tmp_path / "c.sqlite")
    assert_close(f(*xs), jax.jit(bench.fn)(*xs))
    assert f.stats.captures == 1 and f.stats.kernels == 0


def test_the_trace_records_where_its_time_went(tmp_path):
    """`last.phases_s`: seconds per phase of the trace, in order, for the first-call log."""
    bench = benchmarks.get("rmsnorm").small()
    xs = [jnp.asarray(a) for a in bench.make_inputs(seed=1)]
    f = mirage_jax.jit(bench.fn, search="cached", cache=tmp_path / "c.sqlite")
    f(*xs)
    phases = f.last.phases_s
    assert list(phases)[:2] == ["capture", "search_and_select"]
    assert all(v >= 0 for v in phases.values())


KERNEL_CASES = [(n, "reference") for n in benchmarks.names()] + [
    (n, "pallas-interpret") for n in ("rmsnorm", "lora", "gqa_stable", "ntrans")
]


@pytest.mark.parametrize("name, backend", KERNEL_CASES)
def test_benchmark_kernel_path_matches_jax_jit_under_grad_vmap_jit(name, backend, tmp_path):
    bench, specs, xs = bench_f32(name)
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, MUGRAPHS[name], specs, backend)
    f = mirage_jax.jit(bench.fn, backend=backend, search="cached", cache=cache)
    check_kernel_path(f, bench, xs)


@pytest.mark.parametrize(
    "name, build", [("rmsnorm", rmsnorm_block_graph), ("gated_mlp", gated_block_graph)]
)
def test_graph_defined_pallas_kernels_in_interpret_mode(name, build, tmp_path):
    warm_up_pallas_interpret()
    bench, specs, xs = bench_f32(name)
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, build, specs, "pallas-interpret")
    f = mirage_jax.jit(bench.fn, backend="pallas-interpret", search="cached", cache=cache)
    check_kernel_path(f, bench, xs)
    assert "pallas_call" in str(jax.make_jaxpr(f)(*xs))


def warm_up_pallas_interpret():
    """Run one Pallas kernel in interpret mode: jax retraces the first jit in a process that
    executes one (once per process, not per function), which would spoil the trace counts."""
    from jax.experimental import pallas as pl

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    x = jnp.ones(8)
    pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)


def check_kernel_path(f, bench, xs, tol=None):
    ref = jax.jit(bench.fn)
    assert_close(f(*xs), ref(*xs), tol)
    assert (f.stats.kernels, f.stats.cache_hits) == (1, 1)
    ct = jnp.asarray(np.random.default_rng(0).standard_normal(ref(*xs).shape), jnp.float32)
    argnums = tuple(range(len(xs)))
    grad = lambda g: jax.grad(lambda *a: jnp.sum(g(*a) * ct), argnums=argnums)  # noqa: E731
    assert_close(grad(f)(*xs), grad(ref)(*xs), tol)
    batched = jnp.stack([xs[0], 0.5 * xs[0], -xs[0]])
    in_axes = (0,) + (None,) * (len(xs) - 1)
    vm = lambda g: jax.vmap(g, in_axes)(batched, *xs[1:])  # noqa: E731
    assert_close(vm(f), vm(ref), tol)
    outer = jax.jit(lambda *a: 2.0 * f(*a))
    assert_close(outer(*xs), 2.0 * ref(*xs), tol)
    assert f.stats.captures == 1  # grad, vmap and the outer jit reused the one trace


# ---------------------------------------------------------------------- on the GPU
GPU_TOL = 1e-2  # f32 dots run as TF32 in Triton kernels and in XLA, differently


@pytest.mark.gpu
@pytest.mark.parametrize("name", benchmarks.names())
def test_gpu_kernel_level_mugraphs_match_jax_jit(name, tmp_path):
    bench, specs, xs = bench_f32(name)
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, MUGRAPHS[name], specs, "pallas")
    f = mirage_jax.jit(
        bench.fn, backend="pallas", search="cached", cache=cache, function_check=False
    )
    check_kernel_path(f, bench, xs, GPU_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, build", [("rmsnorm", rmsnorm_block_graph), ("gated_mlp", gated_block_graph)]
)
def test_gpu_graph_defined_pallas_kernels_match_jax_jit(name, build, tmp_path):
    bench, specs, xs = bench_f32(name)
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, build, specs, "pallas")
    f = mirage_jax.jit(
        bench.fn, backend="pallas", search="cached", cache=cache, function_check=False
    )
    check_kernel_path(f, bench, xs, GPU_TOL)
    assert "pallas_call" in str(jax.make_jaxpr(f)(*xs))


def test_auto_backend_prefers_triton_where_jax_triton_imports(monkeypatch):
    import importlib.util

    from mirage_jax.lower import backends

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "jax_triton" else real(n, *a)
    )
    monkeypatch.setattr(backends, "jax_triton_problem", lambda: None)  # test_backend_choice
    assert api.gpu_default_backend() == "triton"
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "jax_triton" else real(n, *a)
    )
    assert api.gpu_default_backend() == "pallas"


@pytest.mark.gpu
def test_gpu_auto_backend_runs_triton_kernels(tmp_path):
    pytest.importorskip("jax_triton")
    bench, specs, xs = bench_f32("rmsnorm")
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, rmsnorm_block_graph, specs, "triton")
    f = mirage_jax.jit(bench.fn, search="cached", cache=cache, function_check=False)  # triton
    check_kernel_path(f, bench, xs, GPU_TOL)


@pytest.mark.gpu
def test_gpu_transformer_block_with_a_pallas_kernel(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    params, x, pad, _ = block_with_mlp_kernel(cache, "pallas")
    f = mirage_jax.jit(
        transformer_block, backend="pallas", search="cached", cache=cache, function_check=False
    )
    check_block(f, params, x, pad, GPU_TOL)
    assert (f.stats.kernels, f.stats.captures) == (1, 1)


# ---------------------------------------------------------------------- a model-shaped block
def transformer_block(params, x, pad):
    """rms_norm, causal attention (jnp.where mask), residuals, a lax.scan, a gated MLP."""
    t, d = x.shape
    h = benchmarks.rms_norm(x) * params["g1"]
    q, k, v = h @ params["wq"], h @ params["wk"], h @ params["wv"]
    s = (q @ k.T) * (1.0 / np.sqrt(d))
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    x = x + (jax.nn.softmax(s, axis=-1) @ v) @ params["wo"]

    def mix(carry, xt):
        carry = 0.75 * carry + 0.25 * xt
        return carry, carry

    _, ema = jax.lax.scan(mix, jnp.zeros((d,), x.dtype), x)
    m = benchmarks.rms_norm(ema)
    y = (jax.nn.silu(m @ params["w1"]) * (m @ params["w2"])) @ params["w3"]
    y = jnp.where(pad[:, None], 0.0, y)
    return x + y


def block_inputs(t=8, d=32, f=64, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"g1": (d,), "w1": (d, f), "w2": (d, f), "w3": (f, d)}
    shapes |= {n: (d, d) for n in ("wk", "wo", "wq", "wv")}
    params = {n: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), jnp.float32)
              for n, s in shapes.items()}  # fmt: skip
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    pad = jnp.asarray(np.arange(t) >= t - 2)
    return params, x, pad


def block_with_mlp_kernel(cache: Cache, backend: str = "reference"):
    """`block_inputs()` and the block's partition, with its MLP region's µGraph in `cache`."""
    params, x, pad = block_inputs()
    specs = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x, pad)
    )
    part = lax_ir.partition(lax_ir.capture(transformer_block, *specs))
    (mlp,) = [r for r in part.regions if "logistic" in r.program.op_counts()]
    mlp_specs = [jax.ShapeDtypeStruct(s, d) for s, d in mlp.program.input_avals]
    inject(cache, mlp.program, mlp_mugraph, mlp_specs, backend)
    return params, x, pad, part


def mlp_mugraph(b, w1, w2, w3, ema, s):
    m = b.op("rms_norm", ema, eps=EPS)
    return b.op(
        "matmul", b.op("mul", b.op("silu", b.op("matmul", m, w1)), b.op("matmul", m, w2)), w3
    )


def test_transformer_block_matches_jax_jit(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    params, x, pad, part = block_with_mlp_kernel(cache)
    reasons = part.explain()
    assert "scan" in reasons and "select_n" in reasons

    xla = mirage_jax.jit(transformer_block, search="cached", cache=cache)  # no GPU: XLA
    assert_close(xla(params, x, pad), jax.jit(transformer_block)(params, x, pad))
    f = mirage_jax.jit(transformer_block, backend="reference", search="cached", cache=cache)
    check_block(f, params, x, pad)
    assert (f.stats.kernels, f.stats.captures) == (1, 1)


def check_block(f, params, x, pad, tol=None):
    ref = jax.jit(transformer_block)
    assert_close(f(params, x, pad), ref(params, x, pad), tol)
    loss = lambda g: lambda p, x: jnp.sum(g(p, x, pad) ** 2)  # noqa: E731
    assert_close(jax.grad(loss(f), argnums=(0, 1))(params, x),
                 jax.grad(loss(ref), argnums=(0, 1))(params, x), tol)  # fmt: skip
    xb = jnp.stack([x, x[::-1], 2 * x])
    vm = lambda g: jax.vmap(g, (None, 0, None))(params, xb, pad)  # noqa: E731
    assert_close(vm(f), vm(ref), tol)
    assert_close(jax.jit(lambda p, x: f(p, x, pad) - x)(params, x), ref(params, x, pad) - x, tol)


# ---------------------------------------------------------------------- calling conventions
def test_decorator_forms_pytrees_and_static_args(tmp_path):
    @mirage_jax.jit
    def plain(x):
        return x * 2.0

    @mirage_jax.jit(static_argnums=1, static_argnames="mode", cache=False)
    def tree(inputs, n, *, mode="sum"):
        y = inputs["a"] @ inputs["b"] * n
        return {"y": y, "s": (jnp.sum(y) if mode == "sum" else jnp.max(y), n)}

    assert isinstance(plain, mirage_jax.MirageJit) and plain.__name__ == "plain"
    np.testing.assert_allclose(plain(jnp.ones(3)), 2.0)
    inputs = {"a": jnp.ones((2, 4)), "b": jnp.ones((4, 3))}
    out = tree(inputs, 3, mode="max")
    assert out["s"][1] == 3 and float(out["s"][0]) == 12.0
    assert_close(out["y"], jnp.full((2, 3), 12.0))
    tree(inputs, 3, mode="max")
    assert tree.stats.captures == 1
    tree(inputs, 2, mode="max")
    tree(inputs, 2, mode="sum")
    assert tree.stats.captures == 3  # each static value is its own signature


def test_weak_typed_scalars_keep_jax_promotion(tmp_path):
    f = mirage_jax.jit(lambda x, s: x * s, cache=False)
    x = jnp.ones((4,), jnp.float16)
    assert f(x, 2.0).dtype == jax.jit(lambda x, s: x * s)(x, 2.0).dtype == jnp.float16


def test_donation_passes_through():
    f = mirage_jax.jit(lambda x, y: x + y, donate_argnums=0, cache=False)
    text = f.lower(jnp.ones(8), jnp.ones(8)).as_text()
    assert "buffer_donor" in text or "tf.aliasing_output" in text


def test_search_fills_the_cache_once_per_signature(tmp_path):
    bench, specs, xs = bench_f32("rmsnorm")
    cache = Cache(tmp_path / "c.sqlite")
    f = mirage_jax.jit(bench.fn, backend="reference", search="auto", cache=cache, budget_s=20)
    assert_close(f(*xs), jax.jit(bench.fn)(*xs))
    f(*xs)
    assert (f.stats.captures, f.stats.searches, f.stats.kernels) == (1, 1, 1)
    decision = f.last.decisions[0]
    assert decision.source == "search" and decision.verification["verdict"]["equal"]
    g = mirage_jax.jit(bench.fn, backend="reference", search="auto", cache=cache)
    assert_close(g(*xs), jax.jit(bench.fn)(*xs))
    assert (g.stats.searches, g.stats.cache_hits, g.stats.kernels) == (0, 1, 1)
    x2 = jnp.concatenate([xs[0], -xs[0]])  # a new shape: captured and searched again
    assert_close(f(x2, xs[1]), jax.jit(bench.fn)(x2, xs[1]))
    assert (f.stats.captures, f.stats.searches) == (2, 2)
    assert len(cache.entries()) == 2


def test_no_gpu_warns_once_and_runs_xla(tmp_path):
    if api.has_gpu():
        pytest.skip("this machine has a GPU")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = mirage_jax.jit(lambda x, w: jnp.exp(x @ w), cache=tmp_path / "c.sqlite")
        g = mirage_jax.jit(lambda x: jnp.exp(x) / 3.0, cache=tmp_path / "c.sqlite")
        f(jnp.ones((2, 2)), jnp.ones((2, 2)))
        g(jnp.ones(3))
    msgs = [str(w.message) for w in caught if issubclass(w.category, mirage_jax.MirageWarning)]
    assert len(msgs) == 1 and msgs[0].startswith("no GPU: mirage_jax.jit runs the XLA path")
    assert f.last.decisions[0].status == "xla" and "no GPU" in f.last.decisions[0].reason


def test_kernel_outputs_are_reordered_by_the_verdict_matching(tmp_path):
    def two(x, w):
        y = x @ w
        return y * 2.0, y + x

    specs = [jax.ShapeDtypeStruct((4, 4), jnp.float32)] * 2
    region = only_region(two, *specs)

    def swapped(b, x, w, s):  # outputs in the other order
        y = b.op("matmul", x, w)
        return [b.op("add", y, x), b.op("mul_scalar", y, scalar=2.0)]

    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, region.program, swapped, specs)
    f = mirage_jax.jit(two, backend="reference", search="cached", cache=cache)
    x, w = jnp.arange(16.0).reshape(4, 4) / 10, jnp.eye(4) + 0.5
    assert_close(f(x, w), jax.jit(two)(x, w))
    assert f.stats.kernels == 1


# ---------------------------------------------------------------------- the cache in the loop
def test_cache_written_by_another_process_is_used(tmp_path, monkeypatch):
    """`mirage-jax optimize` in a subprocess searches and fills the cache; this process uses it."""
    path = tmp_path / "shared.sqlite"
    bench, specs, xs = bench_f32("gated_mlp")
    argv = ["-m", "mirage_jax.cli", "optimize", "experiments.benchmarks:gated_mlp", "-q"]
    for s in specs:
        argv += ["--arg", f"f32[{','.join(map(str, s.shape))}]"]
    argv += ["--backend", "reference", "--budget-s", "20"]
    env = dict(os.environ, MIRAGE_JAX_CACHE=str(path), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, timeout=600,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "1 fused kernel(s)" in done.stdout
    monkeypatch.setenv("MIRAGE_JAX_CACHE", str(path))
    f = mirage_jax.jit(bench.fn, backend="reference", search="cached")
    assert f.cache.path == path
    assert_close(f(*xs), jax.jit(bench.fn)(*xs))
    assert (f.stats.cache_hits, f.stats.kernels, f.stats.searches) == (1, 1, 0)


def test_corrupt_cache_file_is_recovered_from(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    bench, specs, xs = bench_f32("lora")
    f = mirage_jax.jit(bench.fn, backend="reference", search="cached", cache=path)
    with pytest.warns(CacheWarning, match="corrupt"):
        out = f(*xs)
    assert_close(out, jax.jit(bench.fn)(*xs))
    inject(Cache(path), only_region(bench.fn, *specs).program, MUGRAPHS["lora"], specs)
    g = mirage_jax.jit(bench.fn, backend="reference", search="cached", cache=path)
    assert_close(g(*xs), jax.jit(bench.fn)(*xs))
    assert g.stats.kernels == 1


def test_tampered_entry_is_not_trusted_by_jit(tmp_path):
    import contextlib
    import sqlite3

    from mirage_jax.mugraph import to_json

    bench, specs, xs = bench_f32("gated_mlp")
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, MUGRAPHS["gated_mlp"], specs)
    b = MuGraphBuilder()
    x, w1, w2 = (b.input(s.shape, "float32") for s in specs)
    wrong = b.build([b.op("mul", b.op("matmul", x, w1), b.op("matmul", x, w2))])
    with contextlib.closing(sqlite3.connect(cache.path)) as conn, conn:
        conn.execute("UPDATE entries SET mugraph_json=?", (to_json(wrong),))
    f = mirage_jax.jit(bench.fn, backend="reference", search="cached", cache=cache)
    with pytest.warns(CacheWarning, match="another µGraph"):
        out = f(*xs)
    assert_close(out, jax.jit(bench.fn)(*xs))
    assert f.stats.kernels == 0 and cache.entries() == []


# ---------------------------------------------------------------------- explain
def test_explain_reports_regions_mugraphs_and_bounds(tmp_path):
    bench, specs, xs = bench_f32("rmsnorm")
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, MUGRAPHS["rmsnorm"], specs)
    f = mirage_jax.jit(bench.fn, backend="reference", cache=cache)
    text = str(mirage_jax.explain(f, *specs))
    assert "1 of 1 region(s) run as fused kernels" in text
    assert "rms_norm" in text and "false-accept bound" in text
    assert repr(mirage_jax.explain(f, *specs)) == (  # a notebook's text/plain (issue 17)
        "<Explanation of rmsnorm: 1 of 1 region(s) as fused kernels; print() it for the report>"
    )
    params, x, pad = block_inputs()
    expl = mirage_jax.explain(transformer_block, params, x, pad, cache=cache)
    text = str(expl)
    assert "primitive `scan` is outside the Lax fragment" in text
    assert "select_n" in text and expl.kernels() == []
    assert "<pre>" in expl._repr_html_()


def test_missing_search_module_warns_once_and_runs_xla(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mirage_jax.search", None)  # as if it were not installed
    monkeypatch.delattr(mirage_jax, "search", raising=False)
    bench, specs, xs = bench_f32("lora")
    f = mirage_jax.jit(bench.fn, backend="reference", cache=tmp_path / "c.sqlite")
    with pytest.warns(mirage_jax.MirageWarning, match="mirage_jax.search is not available"):
        assert_close(f(*xs), jax.jit(bench.fn)(*xs))
    assert f.stats.kernels == 0 and f.stats.searches == 0
    assert f.last.decisions[0].reason.startswith("search unavailable")


def test_a_closed_over_weight_is_a_kernel_argument(tmp_path):
    """A one-argument `block(x)` whose weight is closed over (a constant in the jaxpr) gets a
    kernel: the region takes the array as an input (a µGraph cannot hold it as a literal)."""
    w = jnp.asarray(np.random.default_rng(0).standard_normal((64, 48)) * 0.1, jnp.float32)

    def block(x):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        return h @ w

    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    f = mirage_jax.jit(block, backend="pallas-interpret", cache=tmp_path / "c.sqlite", workers=1)
    got = f(x)
    assert [d.status for d in f.last.decisions] == ["kernel"], f.last.decisions
    np.testing.assert_allclose(np.asarray(got), np.asarray(block(x)), rtol=1e-4, atol=1e-4)


def two_regions(x, w1, w2):
    """A norm + projection, a reshape (layout), a second projection: two searched regions."""
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    y = (h @ w1).reshape(x.shape[0], 2, -1).transpose(1, 0, 2).reshape(x.shape[0] * 2, -1)
    return jnp.tanh(y @ w2)


def two_region_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, 32), (32, 64), (32, 16))]


def test_searches_run_ahead_of_the_selection(tmp_path, monkeypatch):
    """The regions' searches run in a background thread, smallest region first
    (`regions.search_order`; one at a time with one worker), and each region is selected from
    its own search's result (`regions.SearchAhead`)."""
    import threading

    from mirage_jax import regions

    calls: list[tuple[str, str]] = []
    real_search, real_select = regions.search_only, regions.select_searched

    sizes: list[int] = []

    def search_only(search_mod, program, opts):
        calls.append(("search", program.canonical_hash, threading.current_thread().name))
        sizes.append(len(program.nodes))
        return real_search(search_mod, program, opts)

    def select_searched(result, program, *args):
        calls.append(("select", program.canonical_hash, threading.current_thread().name))
        return real_select(result, program, *args)

    monkeypatch.setattr(regions, "search_only", search_only)
    monkeypatch.setattr(regions, "select_searched", select_searched)

    xs = two_region_inputs()
    f = mirage_jax.jit(two_regions, backend="reference", cache=tmp_path / "c.sqlite", workers=1)
    assert_close(f(*xs), jax.jit(two_regions)(*xs))
    searched = [c for c in calls if c[0] == "search"]
    selected = [c for c in calls if c[0] == "select"]
    assert len(searched) == f.stats.searches >= 2, f.last.decisions
    assert all(t.startswith("mirage_jax-search") for *_, t in searched)
    assert all(not t.startswith("mirage_jax-search") for *_, t in selected)
    order = [d.region_hash for d in f.last.decisions if d.source == "search"]
    assert sorted(h for _, h, _ in searched) == sorted(order)
    assert sizes == sorted(sizes) and len(set(sizes)) > 1, sizes  # the smaller region first
    chosen = {h for _, h, _ in selected}
    assert [h for _, h, _ in selected] == [h for _, h, _ in searched if h in chosen]
    assert selected, "no region had a µGraph to select"


@pytest.mark.parametrize(
    ("full_us", "why"), [(10.0, "marginal"), (13.0, "lost"), (10.0, "values differ")]
)
def test_the_whole_function_check_keeps_the_best_subset(tmp_path, monkeypatch, full_us, why):
    """The wiring of `function_check.best_subset` in `jit`: all kernels together win (10 µs
    against jax.jit's 12) but one of them is marginal, or they lose (13 µs), or their values
    differ from jax.jit's (the last kernel's fault); without the last kernel the function
    takes 9 µs, so that kernel is left out, with the reason, and the function still computes
    what jax.jit does. (Checks faked: no GPU here.)"""
    from types import SimpleNamespace

    import mirage_jax.api as api
    from mirage_jax import function_choice
    from mirage_jax.function_check import FunctionCheck

    def two_regions(x, w1, w2):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        y = (h @ w1).reshape(x.shape[0], 2, -1).transpose(1, 0, 2).reshape(x.shape[0] * 2, -1)
        return jnp.tanh(y @ w2)

    asked: list[frozenset[int]] = []

    def fake_check(self, decisions, flat, xla_us=None):
        kernels = frozenset(d.index for d in decisions if d.status == "kernel")
        asked.append(kernels)
        us = full_us if len(asked) == 1 else (9.0 if len(kernels) == 1 else 14.0)
        if why == "values differ" and max(asked[0]) in kernels:  # the last kernel's fault
            return FunctionCheck("xla", us, 12.0, "fake", mismatch="output 0: max error 3")
        return FunctionCheck("kernels" if us < 12.0 else "xla", us, 12.0, "fake")

    monkeypatch.setattr(
        api, "backends", SimpleNamespace(get=lambda n: SimpleNamespace(needs_gpu=True))
    )
    monkeypatch.setattr(function_choice.FunctionChoice, "check", fake_check)
    monkeypatch.setattr(
        function_choice, "marginal", lambda ds: [max(d.index for d in ds if d.status == "kernel")]
    )
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, 32), (32, 64), (32, 16))]
    f = mirage_jax.jit(two_regions, backend="reference", cache=tmp_path / "c.sqlite", workers=1)
    assert_close(f(*xs), jax.jit(two_regions)(*xs))
    kernels = [d for d in f.last.decisions if d.status == "kernel"]
    left = [d for d in f.last.decisions if "left out by the whole-function check" in d.reason]
    assert len(kernels) == 1 and len(left) == 1, f.last.decisions
    assert left[0].index > kernels[0].index  # the last kernel was the one left out
    assert why != "values differ" or "values differ" in left[0].reason
    assert f.last.function_check.kernels_us == 9.0
    assert len(asked[0]) == 2


def test_a_region_is_selected_as_soon_as_its_search_ends(tmp_path, monkeypatch):
    """With two searches at once (`regions.SEARCHES_AT_ONCE`, where there are workers), a
    region whose search ends first is selected first: the first region's search here waits
    until the second region is being selected (in region order it would wait forever)."""
    import dataclasses
    import threading

    from mirage_jax import regions

    second_selected = threading.Event()
    selected: list[str] = []
    real_search, real_select = regions.search_only, regions.select_searched
    first_hash: list[str] = []

    def search_only(search_mod, program, opts):
        if not first_hash:
            first_hash.append(program.canonical_hash)
            assert second_selected.wait(120), "the first region was selected first"
        return real_search(search_mod, program, dataclasses.replace(opts, workers=1))

    def select_searched(result, program, *args):
        selected.append(program.canonical_hash)
        if program.canonical_hash != first_hash[0]:
            second_selected.set()
        return real_select(result, program, *args)

    monkeypatch.setattr(regions, "search_only", search_only)
    monkeypatch.setattr(regions, "select_searched", select_searched)

    xs = two_region_inputs()
    f = mirage_jax.jit(two_regions, backend="reference", cache=tmp_path / "c.sqlite", workers=2)
    assert_close(f(*xs), jax.jit(two_regions)(*xs))
    assert len(selected) >= 2 and selected[-1] == first_hash[0] != selected[0]


def test_searches_at_once_below_one_is_refused_by_name():
    from types import SimpleNamespace

    from mirage_jax import regions

    with pytest.raises(ValueError, match="searches_at_once"):
        regions.SearchAhead([], SimpleNamespace(options={"searches_at_once": 0}, workers=2))
