"""The float checks' float64 reference: numpy's, or XLA's on the GPU for large regions
(`float_check.float_reference`, `lax_ir.evaluate_reference_on_device`), with the same values."""

from __future__ import annotations

import logging

import jax
import numpy as np

import lax_ir
from mirage_jax import float_check
from mirage_jax import select as S


def _causal_attention():
    def f(q, k, v, bias):
        return jax.nn.softmax((q @ k) * 0.125 + bias, axis=-1) @ v

    rng = np.random.default_rng(0)
    shapes = [(2, 64, 32), (2, 32, 128), (2, 128, 32)]
    xs = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    xs.append(np.where(np.tril(np.ones((64, 128))) > 0, 0.0, -np.inf).astype(np.float16))
    return lax_ir.capture(f, *xs), xs


def test_the_device_reference_is_numpys_in_float64():
    p, xs = _causal_attention()
    want = lax_ir.evaluate_reference(p, *xs)
    got = lax_ir.evaluate_reference_on_device(p, *xs)
    assert [g.dtype for g in got] == [np.float64]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-14)
    assert jax.numpy.asarray(1.0).dtype == np.float32  # 64-bit types only for the call


def test_large_regions_on_a_gpu_take_the_device_reference(monkeypatch, caplog):
    p, xs = _causal_attention()
    calls = []
    real = lax_ir.evaluate_reference_on_device
    monkeypatch.setattr(
        lax_ir, "evaluate_reference_on_device", lambda *a: calls.append(1) or real(*a)
    )
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    S.float_reference(p, *xs)
    assert not calls  # 2 x 64 x 128 x 32 x 2 x 2 flops: numpy's
    monkeypatch.setattr(float_check, "REFERENCE_ON_DEVICE_FLOPS", 1e3)
    got = S.float_reference(p, *xs)
    assert calls == [1]
    np.testing.assert_allclose(got[0], lax_ir.evaluate_reference(p, *xs)[0], rtol=1e-12)

    def fails(*a):
        raise MemoryError("RESOURCE_EXHAUSTED: out of memory")

    monkeypatch.setattr(lax_ir, "evaluate_reference_on_device", fails)
    with caplog.at_level(logging.WARNING, logger="mirage_jax"):
        got = S.float_reference(p, *xs)
    assert "float64 reference on the GPU failed (MemoryError" in caplog.text
    np.testing.assert_allclose(got[0], lax_ir.evaluate_reference(p, *xs)[0], rtol=1e-12)


def test_large_outputs_are_compared_as_jax_arrays_with_numpys_errors(monkeypatch):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 32))
    out = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(np.float16)
    want = float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    errors = float_check.FloatErrors([ref])
    assert errors([out]) == [want]  # numpy's, in float64
    monkeypatch.setattr(float_check, "ON_DEVICE_ELEMENTS", 16)
    (got,) = errors([jax.numpy.asarray(out)])  # jax's, in float32
    assert abs(got - want) <= 4e-7  # float32 rounding, relative to the largest magnitude
    bad = out.copy()
    bad[3, 4] = np.nan
    assert np.isnan(errors([jax.numpy.asarray(bad)])[0])  # fails every tolerance
