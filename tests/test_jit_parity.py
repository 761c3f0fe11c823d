"""mirage_jax.jit behaves exactly like jax.jit: same HLO when nothing is replaced, autodiff of
any order and mode through replaced regions, effects never dropped, no __main__ guard needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mirage_jax
from experiments import benchmarks
from mirage_jax import resolve
from mirage_jax.cache import Cache
from tests.test_api import (
    assert_close,
    bench_f32,
    inject,
    only_region,
    rmsnorm_block_graph,
    warm_up_pallas_interpret,
)

REPO = Path(__file__).resolve().parents[1]


def _hlo(f, *xs) -> str:
    text = f.lower(*xs).compile().as_text().split("\nFileNames")[0]  # the source-line table
    return re.sub(r"metadata=\{[^}]*\}", "", text)  # source lines differ, the program may not


def block(params, x, pad):
    """A small decoder-ish block: residual ops (where, iota) around Lax regions."""
    h = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    s = (h @ params["q"]) @ (h @ params["k"]).T
    s = jnp.where(jnp.arange(x.shape[0])[:, None] >= jnp.arange(x.shape[0]) + pad, -1e9, s)
    y = jax.nn.softmax(s, axis=-1) @ (h @ params["v"])
    return x + jax.nn.silu(y @ params["up"]) @ params["down"]


def _block_inputs():
    rng = np.random.default_rng(0)
    p = {k: jnp.asarray(rng.standard_normal((16, 16)) * 0.2, jnp.float32) for k in "qkv"}
    p["up"] = jnp.asarray(rng.standard_normal((16, 32)) * 0.2, jnp.float32)
    p["down"] = jnp.asarray(rng.standard_normal((32, 16)) * 0.2, jnp.float32)
    return p, jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)


@pytest.mark.parametrize("how", ["search_off", "empty_cache", "backend_xla"])
def test_nothing_replaced_compiles_to_the_same_hlo_as_jax_jit(how, tmp_path):
    params, x = _block_inputs()
    opts = {
        "search_off": {"search": "off"},
        "empty_cache": {"search": "cached", "cache": tmp_path / "c.sqlite"},
        "backend_xla": {"backend": "xla", "cache": False},
    }[how]
    f = mirage_jax.jit(block, static_argnums=2, **opts)
    g = jax.jit(block, static_argnums=2)
    assert _hlo(f, params, x, 0) == _hlo(g, params, x, 0)
    assert_close(f(params, x, 0), g(params, x, 0))


@pytest.fixture(params=["reference", "pallas-interpret"])
def replaced(request, tmp_path):
    """rmsnorm with its region replaced by a graph-defined kernel (and jax.jit of it)."""
    backend = request.param
    if backend == "pallas-interpret":
        warm_up_pallas_interpret()
    bench, specs, xs = bench_f32("rmsnorm")
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, rmsnorm_block_graph, specs, backend)
    f = mirage_jax.jit(bench.fn, backend=backend, search="cached", cache=cache)
    return f, jax.jit(bench.fn), xs


def test_forward_mode_and_higher_orders_through_a_replaced_region(replaced):
    f, g, (x, w) = replaced
    scalar = lambda h: lambda x: jnp.sum(jnp.tanh(h(x, w)))  # noqa: E731
    assert_close(jax.jacfwd(lambda x: f(x, w))(x), jax.jacfwd(lambda x: g(x, w))(x))
    x1 = x[:1, :16]  # the hessian of a small slice keeps the test fast
    embed = lambda h: lambda a: h(x.at[:1, :16].set(a), w)  # noqa: E731
    assert_close(
        jax.hessian(lambda a: jnp.sum(embed(f)(a) ** 2))(x1),
        jax.hessian(lambda a: jnp.sum(embed(g)(a) ** 2))(x1),
        tol=1e-3,
    )
    assert_close(
        jax.grad(lambda x: jnp.sum(jax.grad(scalar(f))(x) ** 2))(x),
        jax.grad(lambda x: jnp.sum(jax.grad(scalar(g))(x) ** 2))(x),
        tol=1e-3,
    )
    batched = jnp.stack([x, 0.5 * x])
    assert_close(jax.vmap(jax.grad(scalar(f)))(batched), jax.vmap(jax.grad(scalar(g)))(batched))
    assert f.stats.kernels == 1


def test_debug_callbacks_run_as_often_as_under_jax_jit(tmp_path):
    bench, specs, (x, w) = bench_f32("rmsnorm")
    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, rmsnorm_block_graph, specs)
    calls = {"mirage": 0, "jax": 0}

    def fn(tag):
        def f(x, w):
            jax.debug.callback(lambda s: calls.__setitem__(tag, calls[tag] + 1), jnp.sum(x))
            return benchmarks.rmsnorm(x, w)

        return f

    f = mirage_jax.jit(fn("mirage"), backend="reference", search="cached", cache=cache)
    g = jax.jit(fn("jax"))
    for _ in range(3):
        jax.block_until_ready(f(x, w))
        jax.block_until_ready(g(x, w))
    assert f.stats.kernels == 1
    assert calls == {"mirage": 3, "jax": 3}


def test_io_callback_with_an_unused_result_still_runs(tmp_path):
    from jax.experimental import io_callback

    seen = []

    def f(x):
        io_callback(
            lambda v: seen.append(float(v)) or np.float32(0),
            jax.ShapeDtypeStruct((), jnp.float32),
            x.sum(),
        )
        return jnp.exp(x) / jnp.sum(jnp.exp(x))

    x = jnp.arange(4.0)
    g = mirage_jax.jit(f, backend="reference", cache=tmp_path / "c.sqlite", budget_s=20)
    jax.block_until_ready(g(x))
    assert seen == [6.0]


def test_lower_trace_and_eval_shape_pass_through(tmp_path):
    params, x = _block_inputs()
    f = mirage_jax.jit(block, static_argnums=2, search="off")
    g = jax.jit(block, static_argnums=2)
    assert f.trace(params, x, 0).jaxpr.out_avals == g.trace(params, x, 0).jaxpr.out_avals
    assert f.eval_shape(params, x, 0) == jax.eval_shape(g, params, x, 0)
    h = mirage_jax.jit(lambda p, x: block(p, x, 0), search="off")
    assert jax.eval_shape(h, params, x) == jax.eval_shape(g, params, x, 0)
    assert "HloModule" in f.lower(params, x, 0).as_text(dialect="hlo")


def test_strict_mode_raises_on_a_fallback(tmp_path, monkeypatch):
    bench, specs, xs = bench_f32("rmsnorm")

    def broken(*a, **k):
        raise RuntimeError("search exploded")

    monkeypatch.setattr(resolve, "search_region", broken)
    f = mirage_jax.jit(bench.fn, backend="reference", cache=False, strict=True)
    with pytest.raises(mirage_jax.FallbackError, match="search exploded"):
        f(*xs)
    monkeypatch.setenv("MIRAGE_JAX_STRICT", "1")
    with pytest.raises(mirage_jax.FallbackError):
        mirage_jax.jit(bench.fn, backend="reference", cache=False)(*xs)
    monkeypatch.delenv("MIRAGE_JAX_STRICT")
    with pytest.warns(mirage_jax.MirageWarning, match="search exploded"):
        mirage_jax.jit(bench.fn, backend="reference", cache=False)(*xs)


def run_script(script: Path, text: str) -> subprocess.CompletedProcess:
    """Write `text` (dedented) to `script` and run it in a fresh CPU process from the repo."""
    script.write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=script.parent,
        env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return run


@pytest.mark.slow
def test_a_script_without_a_main_guard_searches_with_two_workers(tmp_path):
    run = run_script(
        tmp_path / "user_script.py",
        """
            import numpy as np, jax.numpy as jnp
            import mirage_jax
            print("body", flush=True)
            def f(x, w):
                return (x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) @ w
            x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
            w = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
            g = mirage_jax.jit(f, backend="reference", cache=False, workers=2, budget_s=60,
                               strict=True)
            out = g(x, w)
            print("kernels", g.stats.kernels, float(np.max(np.abs(out - f(x, w)))), flush=True)
            """,
    )
    assert run.stdout.count("body") == 1, run.stdout  # no worker re-ran the script
    kernels, err = run.stdout.split("kernels")[1].split()
    assert kernels == "1" and float(err) < 1e-3, run.stdout


def test_a_second_call_in_a_fresh_process_neither_traces_nor_compiles_again(tmp_path):
    """Lowering a Pallas kernel imports modules that register JAX trace-context states; in a
    fresh process that happened inside the first call, so `jax.jit`'s cache missed on the
    second call, which captured, resolved and compiled the function again (4.5 s for a tiny
    GPT-2 block). `settle_trace_context` imports them before the first dispatch."""
    run = run_script(
        tmp_path / "twice.py",
        """
            import numpy as np, jax.numpy as jnp
            import mirage_jax
            def f(x, w):
                return (x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) @ w
            if __name__ == "__main__":
                x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
                w = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
                g = mirage_jax.jit(f, backend="pallas-interpret", cache=False, workers=1,
                                   max_candidates=1, strict=True)
                for _ in range(3):
                    out = g(x, w)
                print("traces", g.stats.traces, "kernels", g.stats.kernels,
                      float(np.max(np.abs(out - f(x, w)))), flush=True)
            """,
    )
    _, traces, _, kernels, err = run.stdout.split()
    assert (traces, kernels) == ("1", "1") and float(err) < 1e-3, run.stdout


@pytest.mark.gpu
def test_gpu_whole_function_check_keeps_jax_jit_when_the_kernels_are_slower(tmp_path):
    # one block of one row at a time: a µGraph far slower than XLA's fused rmsnorm GEMM
    bench, specs, xs = bench_f32("rmsnorm")

    def slow(b, x, w, s):
        return rmsnorm_block_graph(b, x, w, s, grid=1, loop=8)

    cache = Cache(tmp_path / "c.sqlite")
    inject(cache, only_region(bench.fn, *specs).program, slow, specs, "pallas")
    f = mirage_jax.jit(bench.fn, backend="pallas", search="cached", cache=cache)
    assert_close(f(*xs), jax.jit(bench.fn)(*xs), tol=1e-2)
    check = f.last.function_check
    assert check is not None and check.choice == "xla", check
    assert check.kernels_us > check.xla_us and f.stats.kernels == 0
    assert "whole function with kernels" in mirage_jax.explain(f, *xs).text()
    g = mirage_jax.jit(bench.fn, backend="pallas", search="cached", cache=cache)
    g(*xs)  # a second process would read the decision from the cache: no timing again
    assert g.last.function_check.source == "cache"
