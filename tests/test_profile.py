"""mirage_jax.profile on the CPU: the chained method runs, keeps every call, labels its results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mirage_jax import profile


def _op(x, w):
    return jnp.tanh(x @ w)


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]


def test_chain_keeps_every_call_in_order():
    prog = profile.chained(_op, 5)
    sets = [tuple(jnp.asarray(x) for x in _inputs(s)) for s in range(2)]
    hlo = prog.lower(sets).compile().as_text()
    assert hlo.count(" dot(") == 5  # none merged or dropped as dead code
    outs = prog(sets)
    assert len(outs) == 5
    np.testing.assert_allclose(outs[2], _op(*sets[0]), rtol=1e-5)  # call i uses set i % 2
    np.testing.assert_allclose(outs[3], _op(*sets[1]), rtol=1e-5)


def test_time_device_on_cpu_is_labelled_not_device_time():
    t = profile.time_device(_op, _inputs, chain=4, repeats=3, warmup=1)
    assert isinstance(t, profile.Timing)
    assert not t.device_time and t.device == "cpu"
    assert "NOT device time" in t.method and "chained" in t.method
    assert t.n == 3 and len(t.samples_us) == 3 and t.chain == 4
    assert t.input_sets == 5  # small inputs: a distinct set per call of the long program
    assert t.p10_us <= t.median_us <= t.p90_us
    assert set(t.as_dict()) >= {"median_us", "p10_us", "p90_us", "method", "device"}
    assert "µs" in str(t)


def test_one_input_set_and_rotation_cap():
    t = profile.time_device(_op, _inputs(0), chain=2, repeats=1, warmup=0)
    assert t.input_sets == 1
    t = profile.time_device(_op, _inputs, chain=8, repeats=1, warmup=0, rotate_bytes=1)
    assert t.input_sets == 1  # one set already exceeds the rotation budget


def test_copy_bandwidth_runs():
    bw, t = profile.copy_bandwidth(1 << 20, chain=2, repeats=2, warmup=1)
    assert np.isfinite(bw) and t.chain == 2  # CPU noise can even make it negative


def test_bad_arguments():
    with pytest.raises(ValueError):
        profile.time_device(_op, _inputs(0), chain=0)


@pytest.mark.gpu
def test_device_time_on_gpu():
    t = profile.time_device(jax.jit(_op), _inputs, chain=16, repeats=5)
    assert t.device_time and t.median_us > 0


_XSPACE = """
planes {
  name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 2000000 }
    events { metadata_id: 1 offset_ps: 50000000 duration_ps: 4000000 }
    events { metadata_id: 2 offset_ps: 55000000 duration_ps: 3000000 }
  }
  lines { id: 2 name: "XLA Modules" timestamp_ns: 1000
    events { metadata_id: 3 offset_ps: 0 duration_ps: 9000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "fusion_1" } }
  event_metadata { key: 2 value { id: 2 name: "mugraph_kernel" } }
  event_metadata { key: 3 value { id: 3 name: "jit_f" } }
}
planes { name: "/host:CPU" lines { id: 1 name: "python" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 99000000 } }
  event_metadata { key: 1 value { id: 1 name: "PjitFunction(f)" } } }
"""


def test_trace_parsing_reads_stream_lines_only_and_splits_calls():
    from jax.profiler import ProfileData

    data = ProfileData.from_serialized_xspace(ProfileData.text_proto_to_serialized_xspace(_XSPACE))
    events = profile.gpu_events(data)
    assert [e.name for e in events] == ["fusion_1", "mugraph_kernel"] * 2  # not "XLA Modules"
    sums, spans = profile.per_call(events, 2)
    assert sums == pytest.approx([7.0, 7.0]) and spans == pytest.approx([8.0, 8.0])
    sums, _ = profile.per_call(events[:3], 2)  # uneven: one group, total / calls
    assert sums == pytest.approx([5.5])


def test_time_trace_needs_a_gpu():
    if jax.devices()[0].platform == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="GPU"):
        profile.time_trace(_op, _inputs(0), calls=2, warmup=1)


@pytest.mark.gpu
def test_trace_time_on_gpu():
    t = profile.time_trace(jax.jit(_op), _inputs, calls=10)
    assert t.device_time and t.median_us > 0 and t.kernels
    assert t.median_us <= t.span_us + 1e-6


def test_time_trace_feeds_each_calls_outputs_to_the_next_on_its_set(monkeypatch):
    """`feed`: a decode loop's donated caches; each input set's chain runs on (trace faked:
    no GPU here); without `feed` every call reuses its set's arguments."""
    seen = []

    def step(state, x):
        seen.append(float(state[0]))
        return state + x, state * 0

    step.lower = None  # run eagerly (time_trace jits what has no `lower`): `seen` fills

    def fake_trace(run, log_dir=None):
        run()
        return []

    monkeypatch.setattr(profile, "trace_events", fake_trace)
    monkeypatch.setattr(profile, "_device_kind", lambda: ("fake", True))
    sets = lambda s: (np.full(1, 10.0 * s, np.float32), np.ones(1, np.float32))  # noqa: E731
    t = profile.time_trace(
        step, sets, calls=3, warmup=1, max_sets=2, feed=lambda a, o: (o[0], a[1])
    )
    assert seen == [0.0, 1.0, 10.0, 2.0]  # warm-up on set 0, then sets 0, 1, 0: each carries on
    assert "fed to the next" in t.method
    seen.clear()
    profile.time_trace(step, sets, calls=3, warmup=1, max_sets=2)
    assert seen == [0.0, 0.0, 10.0, 0.0]


@pytest.mark.gpu
def test_donated_caches_are_timed_as_a_decode_loop_runs_them():
    """Donation with `feed` (the Llama nnx decode step, realistic size): every call gets
    caches it may consume, and the step updates them in place: the copies that the plain
    step makes to return its caches are gone."""
    from experiments import models as M
    from experiments.never_slower import caches_of, decode_loop

    m = M.get("llama_decode_nnx", batch=1, size="realistic")
    ci, _ = caches_of(m)
    fresh, fed = decode_loop(m, lambda s: m.make(0).args)
    donated = profile.time_trace(jax.jit(m.fn, donate_argnums=ci), fresh, calls=5, feed=fed)
    plain = profile.time_trace(jax.jit(m.fn), fresh, calls=5)
    copies = [[n for n, *_ in t.kernels if "memcpy" in n.lower()] for t in (donated, plain)]
    assert copies[0] == [] and copies[1], copies
    assert "fed to the next" in donated.method


def test_kernel_timeline_positions() -> None:
    """`experiments.kernel_timeline.positions`: each kernel position's median over the calls,
    by the first call's names; nothing where the trace does not divide into the calls."""
    from experiments.kernel_timeline import positions
    from mirage_jax.profile import KernelEvent

    durations = [(1000, 5000), (3000, 4000), (2000, 6000)]  # three calls of two kernels, ns
    events = [
        KernelEvent(name, 0, d, "Stream #1")
        for pair in durations
        for name, d in zip(("copy", "gemm"), pair)
    ]
    assert positions(events, 3) == [("copy", 2.0), ("gemm", 5.0)]
    assert positions(events[:-1], 3) == []


_XSPACE_LABELLED = """
planes {
  name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000
      stats { metadata_id: 9 str_value: "jit(f)/mirage_jax.region12/custom_jvp_call/triton" } }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 2000000
      stats { metadata_id: 9 str_value: "jit(f)/mirage_jax.region1/pjit" } }
    events { metadata_id: 3 offset_ps: 9000000 duration_ps: 1000000
      stats { metadata_id: 9 str_value: "jit(f)/add" } }
  }
  event_metadata { key: 1 value { id: 1 name: "mugraph_kernel_a" } }
  event_metadata { key: 2 value { id: 2 name: "mugraph_kernel_b" } }
  event_metadata { key: 3 value { id: 3 name: "loop_add_fusion" } }
  stat_metadata { key: 9 value { id: 9 name: "tf_op" } }
}
"""


def test_kernels_are_told_apart_by_the_region_scope_their_ops_carry():
    """`assemble` traces region k's kernel under `mirage_jax.region{k}`; a trace's events whose
    labels name one region add up to that region's time per call (region 1 is not region 12)."""
    from jax.profiler import ProfileData

    text = ProfileData.text_proto_to_serialized_xspace(_XSPACE_LABELLED)
    events = profile.gpu_events(ProfileData.from_serialized_xspace(text))
    assert events[0].labels == ("jit(f)/mirage_jax.region12/custom_jvp_call/triton",)
    assert profile.region_times(events, calls=2) == ((1, 1.0), (12, 2.5))
    assert profile.region_times(events[2:], calls=1) == ()  # XLA's own kernels: no region
