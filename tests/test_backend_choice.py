"""backend="auto" on a GPU: jax-triton only where it fits the installed triton, else Pallas."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from mirage_jax.lower import backends


def _fake_jax_triton(monkeypatch: pytest.MonkeyPatch, cuda_module: str) -> None:
    """A jax_triton whose triton_lib holds a CUDABackend defined in `cuda_module`."""
    cuda = type("CUDABackend", (), {"__module__": cuda_module})
    lib = types.ModuleType("jax_triton.triton_lib")
    lib.cb = types.SimpleNamespace(CUDABackend=cuda)
    pkg = types.ModuleType("jax_triton")
    pkg.__path__ = []  # a package, so the submodule import resolves from sys.modules
    pkg.triton_lib = lib
    monkeypatch.setitem(sys.modules, "jax_triton", pkg)
    monkeypatch.setitem(sys.modules, "jax_triton.triton_lib", lib)
    monkeypatch.setattr(backends.Backend, "missing", lambda self: ())
    backends.jax_triton_problem.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_probe():
    backends.jax_triton_problem.cache_clear()
    yield
    backends.jax_triton_problem.cache_clear()


def test_a_jax_triton_that_stubs_triton_s_backend_is_refused_with_the_reason(monkeypatch):
    _fake_jax_triton(monkeypatch, "jax_triton.triton_lib")  # the stub jax-triton 0.4 installs
    problem = backends.jax_triton_problem()
    assert problem and "cannot load triton" in problem and "0.3.1" in problem
    with pytest.warns(UserWarning, match="backend='auto' uses Pallas"):
        assert backends.gpu_default() == "pallas"
    ok, why = backends.get("triton").available(has_gpu=True)
    assert not ok and "cannot load triton" in why


def test_a_fitting_jax_triton_is_the_gpu_default(monkeypatch):
    _fake_jax_triton(monkeypatch, "triton.backends.nvidia.compiler")
    assert backends.jax_triton_problem() is None
    assert backends.gpu_default() == "triton"
    assert backends.get("triton").available(has_gpu=True) == (True, "")


def test_explain_names_what_auto_resolved_to(monkeypatch, tmp_path):
    """`explain`'s header says the backend auto chose here (it said pallas on every GPU)."""
    import importlib

    import jax.numpy as jnp

    import mirage_jax

    explain_mod = importlib.import_module("mirage_jax.explain")  # the module, not the function

    monkeypatch.setattr(explain_mod, "has_gpu", lambda: True)
    triton = explain_mod.backends.BACKENDS["triton"]  # as if jax-triton were installed and fit
    fits = dataclasses.replace(triton, requires=(), problem=None)
    monkeypatch.setitem(explain_mod.backends.BACKENDS, "triton", fits)
    x = jnp.ones((2, 8), jnp.float32)
    e = mirage_jax.explain(lambda x: x * 2.0, x, cache=tmp_path / "c.sqlite", search="off")
    assert e.backend == "auto → triton"
    monkeypatch.setattr(explain_mod, "has_gpu", lambda: False)
    e = mirage_jax.explain(lambda x: x * 2.0, x, cache=tmp_path / "c.sqlite", search="off")
    assert e.backend.startswith("auto → xla (no GPU")
