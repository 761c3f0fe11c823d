"""The real-model set (experiments.models) at tiny size on the CPU: each model runs under
jax.jit and matches its float64 reference; each captures with lax_ir and rebuilds to the same
values; the flax nnx and equinox Llama blocks are one function; floors count what they say."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import lax_ir
from experiments import benchmarks as B
from experiments import models as M

BATCH = 2  # > 1, so batch handling (vmaps, broadcasts) is exercised
NAMES = M.names()


@pytest.fixture(scope="module")
def cases():
    """One model, drawn case and jitted output per name (drawn and compiled once)."""
    out = {}
    for name in NAMES:
        m = M.get(name, BATCH, "tiny")
        case = m.make(seed=3)
        got = jax.jit(m.fn)(*case.args)
        out[name] = (m, case, got if isinstance(got, tuple) else (got,))
    return out


def _assert_close(got, want, rtol, atol, what):
    assert len(got) == len(want), what
    for name, g, w in zip(what, got, want):
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def test_registry_lists_every_model_and_leaves_the_paper_set_alone():
    assert NAMES == [
        "llama_decode_nnx",
        "llama_decode_eqx",
        "gemma_decode",
        "gpt2_prefill",
        "sdpa",
        "sdpa_causal",
        "sdpa_decode",
    ]
    assert "llama_decode_nnx" not in B.names()
    assert all(not k.startswith(("llama", "gemma", "gpt2", "sdpa")) for k in B.BENCHMARKS)
    listed = B.models(size="tiny", batches=(1,))
    assert [m.name for m in listed] == NAMES
    with pytest.raises(KeyError, match="names"):
        M.get("llama")
    with pytest.raises(KeyError, match="sizes"):
        M.get("sdpa", size="huge")


@pytest.mark.parametrize("name", NAMES)
def test_jit_matches_float64_reference(cases, name):
    m, case, got = cases[name]
    assert m.dtype == np.float32
    rtol, atol = m.tolerance
    _assert_close(got, m.reference(case), rtol, atol, m.output_names)


@pytest.mark.parametrize("name", NAMES)
def test_capture_partition_rebuild_gives_same_values(cases, name):
    m, case, want = cases[name]
    program = lax_ir.capture(m.fn, *case.args)
    assert program == lax_ir.capture(m.fn, *m.abstract_args())  # abstract args, same program
    part = lax_ir.partition(program)
    got = jax.jit(lax_ir.rebuild(part))(*case.args)
    got = got if isinstance(got, tuple) else (got,)
    _assert_close(got, [np.asarray(w, np.float64) for w in want], 1e-5, 1e-5, m.output_names)


def test_flax_and_equinox_llama_are_one_function():
    nnx_model = M.get("llama_decode_nnx", BATCH, "tiny")
    eqx_model = M.get("llama_decode_eqx", BATCH, "tiny")
    a, b = nnx_model.make(seed=11), eqx_model.make(seed=11)
    for k in a.weights:  # the same checkpoint went into both libraries' modules
        np.testing.assert_array_equal(a.weights[k], b.weights[k])
    got_nnx = jax.jit(nnx_model.fn)(*a.args)
    got_eqx = jax.jit(eqx_model.fn)(*b.args)
    _assert_close(got_eqx, [np.asarray(x, np.float64) for x in got_nnx], 1e-5, 1e-5, "xkv")


def test_mask_hides_the_cache_past_pos(cases):
    """Changing cache slots after pos leaves x unchanged; the written slot is the new token's."""
    m, case, got = cases["llama_decode_nnx"]
    pos = int(case.inputs["pos"])
    k, v = (np.array(case.inputs[n]) for n in ("k_cache", "v_cache"))
    k[:, pos + 1 :] += 5.0
    v[:, pos + 1 :] -= 5.0
    args = (case.args[0], case.args[1], k, v, case.args[4])
    x2, k2, _ = jax.jit(m.fn)(*args)
    np.testing.assert_allclose(np.asarray(x2), np.asarray(got[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(k2)[:, pos], np.asarray(got[1])[:, pos])
    assert not np.allclose(np.asarray(got[1])[:, pos], case.inputs["k_cache"][:, pos])


def test_floor_counts_weights_cache_and_activations_once():
    m = M.get("llama_decode_nnx", 1, "tiny")
    c = m.config
    d, q, kv, f = c.d_model, c.q_heads * c.head_dim, c.kv_heads * c.head_dim, c.ffn
    weights = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f
    cache = c.kv_len * kv  # one cache, batch 1
    x = c.q_len * d
    itemsize = 4
    read = (weights + x + 2 * cache) * itemsize + 4  # + int32 pos
    assert m.floor_bytes() == read + (x + 2 * cache) * itemsize
    assert m.floor_bytes(in_place_cache=True) == read + (x + 2 * c.q_len * kv) * itemsize
    big = M.get("llama_decode_nnx", 8, "llama7b")  # fp16, 8 KV heads of 128, cache 4096
    weights = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 11008 + 2 * 4096  # 177.2M
    caches = 2 * 8 * 4096 * 1024
    assert big.floor_bytes() == 2 * (weights + 2 * caches + 2 * 8 * 4096) + 4
