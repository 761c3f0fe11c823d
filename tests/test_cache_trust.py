"""What a cache entry must pass before it is used (issue 14): the output matching is re-derived,
the field verification is repeated, and imported or mismatching entries pass a float check."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lax_ir
import mirage_jax
from experiments import benchmarks
from mirage_jax import api, cache_check
from mirage_jax.cache import Cache, CacheWarning
from mirage_jax.cache_check import forget_checks
from mirage_jax.mugraph import MuGraphBuilder, to_json

F32 = "float32"
SHAPE = (4, 8)
HALF_ALIAS = 1.6065314e-08
"""A float32 the field trial cannot tell from 0.5 (both are 2^-1 modulo p = 2^31 - 69)."""
EPS_ALIAS = 2786.603515625
"""A float32 the field trial cannot tell from benchmarks.EPS = 1e-6 modulo p = 2^31 - 69."""


@pytest.fixture(autouse=True)
def _fresh_warnings():
    api._WARNED.clear()
    forget_checks()  # entries of other tests with the same content passed in this process
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "no GPU", mirage_jax.MirageWarning)
        yield


def two_outputs(x, y):
    """A region with two outputs that share work: h and 0.5·h + x, h = x·y."""
    h = x * y
    return h, h * 0.5 + x


def two_output_region(scalar: float = 0.5):
    """The region of `two_outputs` and a µGraph for it that returns its outputs swapped."""
    specs = [jax.ShapeDtypeStruct(SHAPE, F32)] * 2
    (region,) = lax_ir.partition(lax_ir.capture(two_outputs, *specs)).regions
    b = MuGraphBuilder()
    x, y = (b.input(SHAPE, F32) for _ in range(2))
    h = b.op("mul", x, y)
    graph = b.build([b.op("add", b.op("mul_scalar", h, scalar=scalar), x), h])
    return region.program, graph


def rmsnorm_region(eps: float):
    """The region of the `rmsnorm` benchmark (small, f32) and rms_norm(X, eps) @ W."""
    bench = benchmarks.get("rmsnorm").small()
    specs = [jax.ShapeDtypeStruct(s.shape, F32) for s in bench.inputs]
    (region,) = lax_ir.partition(lax_ir.capture(bench.fn, *specs)).regions
    b = MuGraphBuilder()
    x, w = (b.input(s.shape, F32) for s in specs)
    return bench, region.program, b.build([b.op("matmul", b.op("rms_norm", x, eps=eps), w)])


def store(cache: Cache, program, graph) -> None:
    cache.store(program, graph, device_kind=api.device_kind(), backend="reference")


def forge(cache: Cache, tampered) -> None:
    """Replace the stored µGraph with `tampered`, its record's hash recomputed to match."""
    (entry,) = cache.entries()
    record = entry.verification | {"mugraph_hash": tampered.canonical_hash}
    set_columns(cache, mugraph_json=to_json(tampered), verdict_json=json.dumps(record))


def set_columns(cache: Cache, **columns) -> None:
    with contextlib.closing(sqlite3.connect(cache.path)) as conn, conn:
        for column, value in columns.items():
            conn.execute(f"UPDATE entries SET {column}=?", (value,))


def swap_stored_order(cache: Cache) -> None:
    (entry,) = cache.entries()
    record = entry.verification
    record["output_order"] = record["output_order"][::-1]
    set_columns(cache, verdict_json=json.dumps(record))


def through_import(cache: Cache, tmp_path) -> Cache:
    """The same entries, exported and imported into a fresh cache."""
    cache.export(tmp_path / "team.jsonl")
    other = Cache(tmp_path / "imported.sqlite")
    report = other.import_(tmp_path / "team.jsonl")
    assert report.imported == len(cache.entries()) and not report.rejected
    return other


def run_cached(fn, cache: Cache, *xs):
    f = mirage_jax.jit(fn, backend="reference", search="cached", cache=cache)
    return f, f(*xs)


def inputs(n: int, shape=SHAPE, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(F32) for _ in range(n)]


def max_error(got, want) -> float:
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in zip(got, want))


# ---------------------------------------------------------------------- the output order
@pytest.mark.parametrize("imported", [False, True], ids=["database", "import"])
def test_a_stored_output_order_is_never_trusted(tmp_path, imported):
    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    swap_stored_order(cache)
    if imported:
        cache = through_import(cache, tmp_path)
    xs = inputs(2)
    with pytest.warns(CacheWarning, match="output order"):
        f, got = run_cached(two_outputs, cache, *xs)
    assert f.stats.kernels == 1
    assert max_error(got, two_outputs(*xs)) < 1e-5
    assert f.last.decisions[0].verification["output_order"] == [1, 0]


def test_lookup_returns_the_rederived_order_and_what_was_checked(tmp_path):
    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    entry, mugraph = cache.lookup(
        program.canonical_hash, api.device_kind(), "reference", program=program
    )
    assert mugraph == graph and entry.verification["output_order"] == [1, 0]
    check = entry.verification["load_check"]
    assert check["field_trials"] == 1 and check["output_order"] == [1, 0]
    assert "reference" in check["float_check"]  # stored by Cache.store: not float-checked yet


# ---------------------------------------------------------------------- the float check
def test_an_imported_constant_that_aliases_in_the_field_is_rejected(tmp_path):
    program, graph = two_output_region()
    _, tampered = two_output_region(scalar=HALF_ALIAS)
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    forge(cache, tampered)
    cache = through_import(cache, tmp_path)
    xs = inputs(2)
    with pytest.warns(CacheWarning, match="float check|re-verification"):
        f, got = run_cached(two_outputs, cache, *xs)
    assert f.stats.kernels == 0 and cache.entries() == []
    assert max_error(got, two_outputs(*xs)) < 1e-5


def test_an_imported_eps_that_aliases_in_the_field_is_rejected(tmp_path):
    bench, program, graph = rmsnorm_region(benchmarks.EPS)
    _, _, tampered = rmsnorm_region(EPS_ALIAS)
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    forge(cache, tampered)
    cache = through_import(cache, tmp_path)
    xs = [np.asarray(a, F32) for a in bench.make_inputs(seed=1, dtype=np.float32)]
    with pytest.warns(CacheWarning, match="float check|re-verification"):
        f, _ = run_cached(bench.fn, cache, *xs)
    assert f.stats.kernels == 0 and cache.entries() == []


def cancelling_region():
    """X @ W in float32, and a µGraph equal to it in exact arithmetic only:
    (X + c) @ W - (0·X + c) @ W with c = 1e8, where float32 rounds X + c to c."""
    specs = [jax.ShapeDtypeStruct(SHAPE, F32), jax.ShapeDtypeStruct(SHAPE[::-1], F32)]
    (region,) = lax_ir.partition(lax_ir.capture(lambda x, w: x @ w, *specs)).regions
    b = MuGraphBuilder()
    x, w = (b.input(s.shape, F32) for s in specs)
    shifted = b.op("add_scalar", x, scalar=1e8)
    shift = b.op("add_scalar", b.op("mul_scalar", x, scalar=0.0), scalar=1e8)
    out = b.op("sub", b.op("matmul", shifted, w), b.op("matmul", shift, w))
    return region.program, b.build([out])


def test_an_imported_entry_that_is_wrong_only_in_floats_is_rejected(tmp_path):
    program, cancelling = cancelling_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, cancelling)  # the field trial accepts it: exact arithmetic
    cache = through_import(cache, tmp_path)
    with pytest.warns(CacheWarning, match="float check") as caught:
        hit = cache.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)
    assert hit is None and cache.entries() == []
    assert "relative error" in str(caught[0].message)


def test_entries_from_the_search_skip_the_float_check_unless_asked(tmp_path):
    program, cancelling = cancelling_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, cancelling)
    set_columns(cache, origin="search")
    entry, _ = cache.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)
    assert entry.verification["load_check"]["float_check"] == "not run (origin: search)"
    strict = Cache(cache.path, float_check="always")
    with pytest.warns(CacheWarning, match="float check"):
        assert (
            strict.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)
            is None
        )


def test_the_float_check_says_which_evaluator_ran_when_the_backend_cannot(tmp_path):
    if api.has_gpu():
        pytest.skip("the pallas backend runs here")
    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, graph, device_kind=api.device_kind(), backend="pallas")
    entry, _ = cache.lookup(program.canonical_hash, api.device_kind(), "pallas", program=program)
    how = entry.verification["load_check"]["float_check"]
    assert "µGraph's reference evaluation" in how and "no GPU" in how


def test_entries_are_checked_once_per_process(tmp_path, monkeypatch):
    import fields

    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    calls = []
    real = fields.verify
    monkeypatch.setattr(fields, "verify", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(3):
        assert Cache(cache.path).lookup(
            program.canonical_hash, api.device_kind(), "reference", program=program
        )
    assert len(calls) == 1
    (entry,) = cache.entries()  # a changed row is checked again
    set_columns(cache, verdict_json=json.dumps(entry.verification, indent=1))
    assert cache.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)
    assert len(calls) == 2


# ---------------------------------------------------------------------- origin and migration
def test_origin_is_recorded(tmp_path):
    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    cache.put(Cache.entry(program.canonical_hash, "cpu", "pallas"))
    assert sorted(e.origin for e in cache.entries()) == ["search", "store"]
    imported = through_import(cache, tmp_path)
    assert {e.origin for e in imported.entries()} == {"import"}


def test_a_schema_1_database_is_migrated_and_its_entries_float_checked(tmp_path):
    program, graph = two_output_region()
    cache = Cache(tmp_path / "new.sqlite")
    store(cache, program, graph)
    (entry,) = cache.entries()
    old = tmp_path / "old.sqlite"
    with contextlib.closing(sqlite3.connect(old)) as conn, conn:
        conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute(
            "CREATE TABLE entries (key TEXT PRIMARY KEY, region_hash TEXT, device_kind TEXT, "
            "backend TEXT, lib_version TEXT, options_json TEXT, mugraph_json TEXT, "
            "verdict_json TEXT, timings_json TEXT, created_at REAL)"
        )
        conn.execute(
            "INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?,?)",
            (entry.key, entry.region_hash, entry.device_kind, entry.backend, entry.lib_version,
             "{}", entry.mugraph_json, entry.verdict_json, None, entry.created_at),
        )  # fmt: skip
    migrated = Cache(old)
    (row,) = migrated.entries()
    assert row.key == entry.key and row.origin == "unknown"
    hit, _ = migrated.lookup(
        program.canonical_hash, api.device_kind(), "reference", program=program
    )
    assert "max relative error" in hit.verification["load_check"]["float_check"]


def test_explain_says_what_was_checked_on_load(tmp_path):
    program, graph = two_output_region()
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    specs = [jax.ShapeDtypeStruct(SHAPE, F32)] * 2
    text = mirage_jax.explain(two_outputs, *specs, backend="reference", cache=cache).text()
    assert "checked on load: a fresh field trial re-derived the output order [1, 0]" in text
    assert "float check: backend 'reference': the µGraph's reference evaluation" in text


@pytest.mark.parametrize("what", ["scalar", "eps"])
def test_a_local_entry_whose_constant_aliases_is_rejected_by_the_field_trial(tmp_path, what):
    # An entry edited in the local database (origin "search": no float check by default) with
    # a constant that aliases modulo the old fixed prime: the field trial on load now draws its
    # own field, so the edit is caught without a float check.
    if what == "scalar":
        fn, (program, graph) = two_outputs, two_output_region()
        _, tampered = two_output_region(scalar=HALF_ALIAS)
        xs = inputs(2)
    else:
        bench, program, graph = rmsnorm_region(benchmarks.EPS)
        _, _, tampered = rmsnorm_region(EPS_ALIAS)
        fn = bench.fn
        xs = [np.asarray(a, F32) for a in bench.make_inputs(seed=1, dtype=np.float32)]
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, program, graph)
    forge(cache, tampered)
    set_columns(cache, origin="search")
    with pytest.warns(CacheWarning, match="re-verification"):
        f, _ = run_cached(fn, cache, *xs)
    assert f.stats.kernels == 0 and cache.entries() == []


# ---------------------------------------------------------------------- output dtypes
def widened(x, y):
    """A region whose output is rounded to float16: a µGraph may keep it in float32."""
    return (x * y).astype(jnp.float16)


def test_an_entry_whose_mugraph_keeps_a_wider_float_output_loads_and_runs_rounded(tmp_path):
    """The search's online-softmax µGraphs end in float32 where the region rounds to a
    narrower float; the kernel stores the region's dtype, so the cache takes such an entry
    (sdpa_causal at Llama-7B size was searched again in every process before)."""
    specs = [jax.ShapeDtypeStruct(SHAPE, F32)] * 2
    (region,) = lax_ir.partition(lax_ir.capture(widened, *specs)).regions
    b = MuGraphBuilder()
    x, y = (b.input(SHAPE, F32) for _ in range(2))
    graph = b.build([b.op("mul", x, y)])
    assert graph.output_avals[0][1] == "float32"
    assert region.program.output_avals[0][1] == "float16"
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, region.program, graph)
    xs = inputs(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # not "ignoring entry ..."
        f, (got,) = run_cached(lambda x, y: (widened(x, y),), cache, *xs)
    assert f.stats.kernels == 1 and f.stats.cache_hits == 1
    assert got.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(got), np.asarray(widened(*xs)))


def upcast(x, y):
    """A region of float16 inputs that computes and returns float32."""
    return x.astype(jnp.float32) * y.astype(jnp.float32)


def test_an_entry_whose_mugraph_keeps_its_inputs_float16_loads_and_runs_widened(tmp_path):
    """The search's µGraph keeps its float16 inputs' dtype where the region upcasts and
    returns float32; the lowered µGraph returns the region's dtype (kernels store it so), so
    the cache takes such an entry (before, it was deleted and the region ran as XLA)."""
    specs = [jax.ShapeDtypeStruct(SHAPE, jnp.float16)] * 2
    (region,) = lax_ir.partition(lax_ir.capture(upcast, *specs)).regions
    b = MuGraphBuilder()
    x, y = (b.input(SHAPE, "float16") for _ in range(2))
    graph = b.build([b.op("mul", x, y)])
    assert cache_check._outputs_fit(graph, region.program, (0,))
    cache = Cache(tmp_path / "c.sqlite")
    store(cache, region.program, graph)
    xs = [a.astype(np.float16) for a in inputs(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # not "ignoring entry ..."
        f, (got,) = run_cached(lambda x, y: (upcast(x, y),), cache, *xs)
    assert f.stats.kernels == 1 and f.stats.cache_hits == 1
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(upcast(*xs)), rtol=1e-3)


def test_an_output_of_another_kind_than_the_regions_does_not_fit():
    """Only a float output may come back in another float dtype than the µGraph's."""
    specs = [jax.ShapeDtypeStruct(SHAPE, jnp.float16)] * 2
    (region,) = lax_ir.partition(lax_ir.capture(upcast, *specs)).regions
    b = MuGraphBuilder()
    x, y = (b.input(SHAPE, "int32") for _ in range(2))
    graph = b.build([b.op("mul", x, y)])
    assert not cache_check._outputs_fit(graph, region.program, (0,))
