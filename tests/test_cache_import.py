"""`Cache.import_` validates every line, and rows that do not parse are deleted on read (issue 14)."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import pytest

from mirage_jax import api
from mirage_jax.cache import Cache, CacheWarning
from tests.test_cache import rmsnorm_region


@pytest.fixture
def exported(tmp_path):
    """A cache with a µGraph entry and an XLA entry, and their export lines as dicts."""
    program, good, _ = rmsnorm_region()
    cache = Cache(tmp_path / "a.sqlite")
    cache.store(program, good, device_kind=api.device_kind(), backend="reference")
    cache.store(program, None, device_kind=api.device_kind(), backend="pallas")
    cache.export(tmp_path / "a.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    return program, sorted(lines, key=lambda line: line["mugraph_json"] is None)  # µGraph first


def write_lines(path, lines) -> None:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))


def import_lines(tmp_path, lines):
    """Import `lines` (dicts, strings or bytes) into a fresh cache; returns it and the report."""
    path = tmp_path / "in.jsonl"
    write_lines(path, [x if isinstance(x, (str, bytes)) else json.dumps(x) for x in lines])
    cache = Cache(tmp_path / "b.sqlite")
    return cache, cache.import_(path)


def with_verdict(line: dict, **change) -> dict:
    record = json.loads(line["verdict_json"])
    record["verdict"].update(change)
    return line | {"verdict_json": json.dumps(record)}


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda mu: mu | {"mugraph_json": {"format": "mirage_jax.mugraph"}}, "mugraph_json"),
        (lambda mu: mu | {"created_at": "yesterday"}, "created_at"),
        (lambda mu: mu | {"created_at": float("nan")}, "created_at"),
        (lambda mu: mu | {"region_hash": "a" * 1000}, "region_hash"),
        (lambda mu: with_verdict(mu, bound=-1), "bound"),
        (lambda mu: with_verdict(mu, bound=2.0), "bound"),
        (lambda mu: mu | {"verdict_json": "{"}, "verdict_json"),
        (lambda mu: mu | {"options": ["not", "a", "dict"]}, "options"),
        (lambda mu: mu | {"key": "0" * 64}, "key"),
        (lambda mu: {k: v for k, v in mu.items() if k != "backend"}, "backend"),
        (lambda mu: ["not an object"], "object"),
    ],
    ids=[
        "mugraph-not-a-string", "date-a-word", "date-nan", "long-region-hash", "bound-negative",
        "bound-above-1", "record-not-json", "options-a-list", "key-mismatch", "field-missing",
        "not-an-object",
    ],
)  # fmt: skip
def test_each_bad_line_is_reported_and_the_others_imported(tmp_path, exported, bad, reason):
    program, (mu, xla) = exported
    cache, report = import_lines(tmp_path, [xla, bad(mu), mu])
    assert report.imported == 2
    ((lineno, why),) = report.rejected
    assert lineno == 2 and reason in why
    assert {e.key for e in cache.entries()} == {mu["key"], xla["key"]}
    assert cache.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)


def test_a_non_utf8_line_is_reported_and_the_others_imported(tmp_path, exported):
    _, (mu, xla) = exported
    cache, report = import_lines(tmp_path, [json.dumps(mu), b'{"key": "\xff\xfe"}', xla])
    assert report.imported == 2 and report.rejected[0][0] == 2
    assert "UTF-8" in report.rejected[0][1]


def test_a_line_over_the_size_limit_is_rejected_without_reading_it_whole(tmp_path, exported):
    from mirage_jax.cache_entry import MAX_LINE_BYTES

    _, (mu, xla) = exported
    huge = json.dumps(mu | {"region_hash": "a" * 20_000_000})
    assert len(huge) > MAX_LINE_BYTES
    cache, report = import_lines(tmp_path, [huge, xla])
    assert report.imported == 1 and report.rejected[0][0] == 1
    assert "longer than" in report.rejected[0][1]


def corrupt_row(cache: Cache, **columns) -> None:
    with contextlib.closing(sqlite3.connect(cache.path)) as conn, conn:
        for column, value in columns.items():
            conn.execute(f"UPDATE entries SET {column}=?", (value,))


@pytest.mark.parametrize(
    "columns",
    [
        {"created_at": "yesterday"},
        {"options_json": "{"},
        {"verdict_json": "not json"},
        {"timings_json": "[1, 2]"},
        {"mugraph_json": 42},
    ],
    ids=["date", "options", "record", "timings", "mugraph"],
)
def test_malformed_rows_are_deleted_when_read(tmp_path, exported, columns):
    program, (mu, xla) = exported
    cache, _ = import_lines(tmp_path, [mu, xla])
    corrupt_row(cache, **columns)
    with pytest.warns(CacheWarning, match="malformed"):
        assert cache.entries() == []
    assert cache.import_(tmp_path / "in.jsonl").imported == 2  # usable again at once
    corrupt_row(cache, **columns)
    with pytest.warns(CacheWarning, match="malformed"):
        hit = cache.lookup(program.canonical_hash, api.device_kind(), "reference", program=program)
    assert hit is None


def test_key_prefixes_are_literal(tmp_path, exported):
    _, (mu, xla) = exported
    cache, _ = import_lines(tmp_path, [mu, xla])
    for pattern in ("%", "_", "%%", mu["key"][:4] + "%"):
        assert cache.get_raw(pattern) is None
    assert cache.get_raw(mu["key"][:12]).key == mu["key"]
    assert [e.key for e in cache.entries(prefix=mu["key"][:12])] == [mu["key"]]
    assert cache.entries(prefix="%") == []
