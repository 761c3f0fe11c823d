"""The SQLite kernel cache: keys, checked reads, corruption recovery, sharing, several processes."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import lax_ir
from experiments import benchmarks
from mirage_jax.cache import Cache, CacheEntry, CacheWarning, default_path, make_key
from mirage_jax.mugraph import MuGraphBuilder

REPO = Path(__file__).resolve().parents[1]


def rmsnorm_region(dtype: str = "float16"):
    """The region of `rmsnorm_mirage` (small shapes) and a µGraph equal to it."""
    bench = benchmarks.get("rmsnorm_mirage").small()
    specs = [jax.ShapeDtypeStruct(s.shape, dtype) for s in bench.inputs]
    program = lax_ir.partition(lax_ir.capture(bench.fn, *specs)).regions[0].program
    b = MuGraphBuilder()
    x, w = (b.input(s.shape, dtype) for s in specs)
    good = b.build([b.op("matmul", b.op("rms_norm", x), w)])
    b = MuGraphBuilder()
    x, w = (b.input(s.shape, dtype) for s in specs)
    wrong = b.build([b.op("matmul", x, w)])
    return program, good, wrong


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_JAX_CACHE", str(tmp_path / "x.sqlite"))
    assert default_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("MIRAGE_JAX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "mirage_jax" / "cache.sqlite"


def test_key_covers_every_field():
    base = make_key("r", "cpu", "pallas", "v1", {"a": 1})
    assert base == make_key("r", "cpu", "pallas", "v1", {"a": 1})
    for other in (
        make_key("r2", "cpu", "pallas", "v1", {"a": 1}),
        make_key("r", "gpu", "pallas", "v1", {"a": 1}),
        make_key("r", "cpu", "triton", "v1", {"a": 1}),
        make_key("r", "cpu", "pallas", "v2", {"a": 1}),
        make_key("r", "cpu", "pallas", "v1", {"a": 2}),
    ):
        assert other != base


def test_store_and_lookup_roundtrip(tmp_path):
    program, good, _ = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, good, device_kind="cpu", backend="reference", timings={"xla_us": 2.0})
    hit = cache.lookup(program.canonical_hash, "cpu", "reference", program=program)
    assert hit is not None
    entry, mugraph = hit
    assert mugraph == good
    assert entry.verification["verdict"]["equal"]
    assert entry.timings == {"xla_us": 2.0}
    assert cache.lookup(program.canonical_hash, "cpu", "pallas", program=program) is None
    with contextlib.closing(sqlite3.connect(cache.path)) as conn, conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_refuses_an_unequal_mugraph(tmp_path):
    program, _, wrong = rmsnorm_region()
    with pytest.raises(ValueError, match="not proven equal"):
        Cache(tmp_path / "c.sqlite").store(program, wrong, device_kind="cpu", backend="pallas")


def test_xla_entries_are_cached(tmp_path):
    program, _, _ = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, None, device_kind="cpu", backend="pallas", timings={"xla_us": 5.0})
    entry, mugraph = cache.lookup(program.canonical_hash, "cpu", "pallas", program=program)
    assert mugraph is None and entry.is_xla and entry.timings["xla_us"] == 5.0


def _tamper(cache: Cache, **columns) -> None:
    with contextlib.closing(sqlite3.connect(cache.path)) as conn, conn:
        for col, value in columns.items():
            conn.execute(f"UPDATE entries SET {col}=?", (value,))


def test_tampered_mugraph_is_rejected_and_deleted(tmp_path):
    from mirage_jax.mugraph import to_json

    program, good, wrong = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, good, device_kind="cpu", backend="reference")
    _tamper(cache, mugraph_json=to_json(wrong))
    with pytest.warns(CacheWarning, match="another µGraph"):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None
    assert cache.entries() == []


def test_forged_record_is_caught_by_reverification(tmp_path):
    from mirage_jax.mugraph import to_json

    program, good, wrong = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    entry = cache.store(program, good, device_kind="cpu", backend="reference")
    record = entry.verification
    record["mugraph_hash"] = wrong.canonical_hash  # a record forged to match the wrong graph
    _tamper(cache, mugraph_json=to_json(wrong), verdict_json=json.dumps(record))
    with pytest.warns(CacheWarning, match="re-verification rejected"):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"equal": False}, "does not say equal"),
        ({"bound": 1e-3}, "exceeds"),
        ({"trials": 0}, "does not say equal"),
    ],
)
def test_weak_verification_records_are_rejected(tmp_path, change, message):
    program, good, _ = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    entry = cache.store(program, good, device_kind="cpu", backend="reference")
    record = entry.verification
    record["verdict"].update(change)
    _tamper(cache, verdict_json=json.dumps(record))
    with pytest.warns(CacheWarning, match=message):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None


def test_unreadable_or_misfiled_entries_are_rejected(tmp_path):
    program, good, _ = rmsnorm_region()
    cache = Cache(tmp_path / "c.sqlite")
    cache.store(program, good, device_kind="cpu", backend="reference")
    _tamper(cache, mugraph_json='{"format": "mirage_jax.mugraph", "version": 999}')
    with pytest.warns(CacheWarning, match="does not load"):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None
    cache.store(program, good, device_kind="cpu", backend="reference")
    _tamper(cache, backend="pallas")  # the row no longer matches its key
    with pytest.warns(CacheWarning, match="key does not match"):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None


def test_corrupt_database_is_moved_aside_and_recreated(tmp_path):
    path = tmp_path / "c.sqlite"
    program, good, _ = rmsnorm_region()
    Cache(path).store(program, good, device_kind="cpu", backend="reference")
    path.write_bytes(os.urandom(4096))
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    cache = Cache(path)
    with pytest.warns(CacheWarning, match="corrupt"):
        assert cache.lookup(program.canonical_hash, "cpu", "reference", program=program) is None
    assert list(tmp_path.glob("c.sqlite.corrupt-*"))
    cache.store(program, good, device_kind="cpu", backend="reference")
    assert len(Cache(path).entries()) == 1


def test_export_import_roundtrip(tmp_path):
    program, good, _ = rmsnorm_region()
    a = Cache(tmp_path / "a.sqlite")
    a.store(program, good, device_kind="cpu", backend="reference")
    a.store(program, None, device_kind="cpu", backend="pallas")
    assert a.export(tmp_path / "team.jsonl") == 2
    lines = (tmp_path / "team.jsonl").read_text().splitlines()
    bad = CacheEntry.from_json(lines[0]).__dict__ | {"backend": "forged"}
    lines.append(json.dumps(bad))
    (tmp_path / "team.jsonl").write_text("\n".join(lines) + "\n")
    b = Cache(tmp_path / "b.sqlite")
    report = b.import_(tmp_path / "team.jsonl")
    assert report.imported == 2
    assert [n for n, _ in report.rejected] == [3] and "key does not match" in report.rejected[0][1]
    assert b.lookup(program.canonical_hash, "cpu", "reference", program=program)[1] == good


def test_several_processes_write_at_once(tmp_path):
    path = tmp_path / "c.sqlite"
    script = textwrap.dedent(
        """
        import hashlib, sys
        from mirage_jax.cache import Cache
        cache = Cache(sys.argv[1])
        for i in range(50):
            region = hashlib.sha256(f"{sys.argv[2]}-{i}".encode()).hexdigest()
            cache.put(cache.entry(region, "cpu", "pallas", timings={"i": i}))
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(path), f"w{k}"], cwd=REPO, env=env)
        for k in range(2)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    entries = Cache(path).entries()
    assert len(entries) == 100
    assert np.all([e.key == e.expected_key() for e in entries])
