"""The persistent kernel cache: one SQLite database of the best µGraph found per Lax region.

An entry is keyed by the region's canonical hash, the device kind, the backend, the library
version and every option that changes the result (`make_key`). It stores the chosen µGraph as
our JSON (or nothing: "XLA is best here", so the search is not run again), its verification
record and its timings. The database runs in WAL mode with a busy timeout, so several
processes read and write it at once.

Nothing read back is trusted blindly: a corrupt file is moved aside and recreated, and an
entry whose key does not match its fields, whose µGraph does not parse, or whose verification
record does not check out (wrong region, wrong µGraph, not "equal", bound above the
threshold, and optionally a fresh one-trial field test) is deleted with a warning and
treated as a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sqlite3
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MAX_BOUND = 1e-9
"""Largest false-accept bound a cached µGraph's verification record may carry."""
ENV_VAR = "MIRAGE_JAX_CACHE"
BUSY_TIMEOUT_MS = 30_000

_COLUMNS = (
    "key",
    "region_hash",
    "device_kind",
    "backend",
    "lib_version",
    "options_json",
    "mugraph_json",
    "verdict_json",
    "timings_json",
    "created_at",
)


class CacheWarning(UserWarning):
    """A cache file or entry was not trusted (corrupt, stale or failing verification)."""


def _warn(message: str) -> None:
    """A CacheWarning pointing at the first frame outside jax, lax_ir and mirage_jax."""
    import functools

    import jax

    import lax_ir

    dirs = (jax.__file__, lax_ir.__file__, os.path.dirname(__file__), functools.__file__)
    skip = tuple(os.path.dirname(os.path.abspath(d)) if d.endswith(".py") else d for d in dirs)
    warnings.warn(message, CacheWarning, stacklevel=2, skip_file_prefixes=skip)


def default_path() -> Path:
    """`$MIRAGE_JAX_CACHE`, else `$XDG_CACHE_HOME/mirage_jax/cache.sqlite` (~/.cache by default)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mirage_jax" / "cache.sqlite"


def lib_version() -> str:
    """The library versions a cached kernel depends on (mirage_jax and jax)."""
    import jax

    from mirage_jax._version import __version__

    return f"mirage_jax {__version__}; jax {jax.__version__}"


def make_key(
    region_hash: str,
    device_kind: str,
    backend: str,
    lib_version: str,
    options: Mapping[str, Any] | None = None,
) -> str:
    """sha256 over the region hash, device kind, backend, library version and sorted options."""
    blob = json.dumps(
        [region_hash, device_kind, backend, lib_version, dict(options or {})],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One row. `mugraph_json` is None when XLA was found best (nothing beat it)."""

    key: str
    region_hash: str
    device_kind: str
    backend: str
    lib_version: str
    options: dict[str, Any] = field(default_factory=dict)
    mugraph_json: str | None = None
    verdict_json: str | None = None
    timings_json: str | None = None
    created_at: float = 0.0

    @property
    def is_xla(self) -> bool:
        """True for a "no µGraph beats XLA" entry."""
        return self.mugraph_json is None

    @property
    def verification(self) -> dict[str, Any]:
        """The verification record: region_hash, mugraph_hash, output_order, verdict."""
        return json.loads(self.verdict_json) if self.verdict_json else {}

    @property
    def timings(self) -> dict[str, Any]:
        """Measured times (µs) and how they were taken, e.g. {"mugraph_us", "xla_us"}."""
        return json.loads(self.timings_json) if self.timings_json else {}

    def to_json(self) -> str:
        """One JSON line (the export format)."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> CacheEntry:
        data = json.loads(line)
        return CacheEntry(**{k: data[k] for k in CacheEntry.__dataclass_fields__ if k in data})

    def expected_key(self) -> str:
        return make_key(
            self.region_hash, self.device_kind, self.backend, self.lib_version, self.options
        )


class Cache:
    """The SQLite kernel cache at `path` (default `default_path()`).

    Arguments:
        path: the database file; its directory is created.
        max_bound: largest verification bound trusted on read.
        reverify: on read, re-run a one-trial field test of the µGraph against the region
            (when `fields` is importable and the region Program is given).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_bound: float = MAX_BOUND,
        reverify: bool = True,
    ):
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.max_bound = max_bound
        self.reverify = reverify
        self._ready = False

    def __repr__(self) -> str:
        return f"Cache({str(self.path)!r})"

    # ------------------------------------------------------------------ connection
    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self._open()
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            with conn:
                yield conn
        finally:
            conn.close()

    def _open(self) -> None:
        """Create or check the database; a corrupt file is moved aside and recreated."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._init_schema()
        except sqlite3.DatabaseError as e:
            if not _is_corruption(e):
                raise
            self._move_aside(e)
            self._init_schema()
        self._ready = True

    def _init_schema(self) -> None:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            with conn:
                conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, region_hash TEXT, "
                    "device_kind TEXT, backend TEXT, lib_version TEXT, options_json TEXT, "
                    "mugraph_json TEXT, verdict_json TEXT, timings_json TEXT, created_at REAL)"
                )
                row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                elif row[0] != str(SCHEMA_VERSION):
                    _warn(
                        f"mirage_jax cache {self.path} has schema {row[0]}, this library "
                        f"writes {SCHEMA_VERSION}; dropping its entries"
                    )
                    conn.execute("DELETE FROM entries")
                    conn.execute(
                        "UPDATE meta SET value=? WHERE name='schema_version'",
                        (str(SCHEMA_VERSION),),
                    )
            status = conn.execute("PRAGMA quick_check").fetchone()
            if status is None or status[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {status}")
        finally:
            conn.close()

    def _run(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Execute one statement; a database found corrupt is moved aside and recreated."""
        try:
            with self._connect() as conn:
                return conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            if not _is_corruption(e):
                raise
            self._ready = False
            self._move_aside(e)
            with self._connect() as conn:
                return conn.execute(sql, params).fetchall()

    def _move_aside(self, error: Exception) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
        _warn(
            f"mirage_jax cache {self.path} is corrupt ({error}); moved it to {aside.name} and "
            "started an empty cache (kernels will be searched again)"
        )
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, aside)
        for suffix in ("-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(str(self.path) + suffix)

    # ------------------------------------------------------------------ rows
    @staticmethod
    def _entry(row: tuple) -> CacheEntry:
        d = dict(zip(_COLUMNS, row))
        return CacheEntry(
            key=d["key"],
            region_hash=d["region_hash"],
            device_kind=d["device_kind"],
            backend=d["backend"],
            lib_version=d["lib_version"],
            options=json.loads(d["options_json"] or "{}"),
            mugraph_json=d["mugraph_json"],
            verdict_json=d["verdict_json"],
            timings_json=d["timings_json"],
            created_at=float(d["created_at"] or 0.0),
        )

    def put(self, entry: CacheEntry) -> None:
        """Insert or replace `entry` (its key must match its fields)."""
        if entry.key != entry.expected_key():
            raise ValueError("entry key does not match its fields; build it with Cache.entry")
        self._run(
            f"INSERT OR REPLACE INTO entries ({', '.join(_COLUMNS)}) VALUES "
            f"({', '.join('?' * len(_COLUMNS))})",
            (
                entry.key,
                entry.region_hash,
                entry.device_kind,
                entry.backend,
                entry.lib_version,
                json.dumps(entry.options, sort_keys=True, default=str),
                entry.mugraph_json,
                entry.verdict_json,
                entry.timings_json,
                entry.created_at or time.time(),
            ),
        )

    @staticmethod
    def entry(
        region_hash: str,
        device_kind: str,
        backend: str,
        *,
        mugraph_json: str | None = None,
        verdict_json: str | None = None,
        timings: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        version: str | None = None,
    ) -> CacheEntry:
        """A well-keyed CacheEntry (the library version defaults to this library's)."""
        version = version or lib_version()
        opts = json.loads(json.dumps(dict(options or {}), sort_keys=True, default=str))
        return CacheEntry(
            key=make_key(region_hash, device_kind, backend, version, opts),
            region_hash=region_hash,
            device_kind=device_kind,
            backend=backend,
            lib_version=version,
            options=opts,
            mugraph_json=mugraph_json,
            verdict_json=verdict_json,
            timings_json=json.dumps(dict(timings), sort_keys=True) if timings else None,
            created_at=time.time(),
        )

    def store(
        self,
        program: Any,
        mugraph: Any,
        *,
        device_kind: str,
        backend: str,
        verdict: Any = None,
        timings: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        trials: int = 3,
        seed: int = 0,
    ) -> CacheEntry:
        """Verify `mugraph` against the region `program` (unless a verdict is given) and store it.

        `mugraph=None` stores "XLA is best". Raises ValueError if the µGraph is not proven
        equal within `max_bound`.
        """
        if mugraph is None:
            entry = self.entry(
                program.canonical_hash, device_kind, backend, timings=timings, options=options
            )
            self.put(entry)
            return entry
        if verdict is None:
            import fields

            verdict = fields.verify(mugraph, program, trials=trials, seed=seed)
        record = verdict.record(program.canonical_hash, mugraph.canonical_hash)
        v = json.loads(record)["verdict"]
        if not v.get("equal") or not float(v.get("bound", 1.0)) <= self.max_bound:
            raise ValueError(
                f"µGraph {mugraph.canonical_hash[:12]} is not proven equal to region "
                f"{program.canonical_hash[:12]} (bound {v.get('bound')}, {v.get('reason', '')!r})"
            )
        entry = self.entry(
            program.canonical_hash,
            device_kind,
            backend,
            mugraph_json=mugraph_to_json(mugraph),
            verdict_json=record,
            timings=timings,
            options=options,
        )
        self.put(entry)
        return entry

    def get_raw(self, key: str) -> CacheEntry | None:
        """The row with this key (or a unique key prefix), unchecked."""
        rows = self._run(f"SELECT {', '.join(_COLUMNS)} FROM entries WHERE key=?", (key,))
        if not rows and key and len(key) < 64:
            rows = self._run(
                f"SELECT {', '.join(_COLUMNS)} FROM entries WHERE key LIKE ?", (key + "%",)
            )
            if len(rows) > 1:
                raise KeyError(f"key prefix {key!r} matches {len(rows)} entries")
        return self._entry(rows[0]) if rows else None

    def delete(self, key: str) -> None:
        self._run("DELETE FROM entries WHERE key=?", (key,))

    def entries(self) -> list[CacheEntry]:
        """Every row, newest first (unchecked)."""
        rows = self._run(f"SELECT {', '.join(_COLUMNS)} FROM entries ORDER BY created_at DESC")
        return [self._entry(r) for r in rows]

    def clear(self) -> int:
        """Delete every entry; returns how many there were."""
        n = self._run("SELECT COUNT(*) FROM entries")[0][0]
        self._run("DELETE FROM entries")
        return int(n)

    # ------------------------------------------------------------------ checked lookup
    def lookup(
        self,
        region_hash: str,
        device_kind: str,
        backend: str,
        options: Mapping[str, Any] | None = None,
        *,
        program: Any = None,
        version: str | None = None,
    ) -> tuple[CacheEntry, Any] | None:
        """The checked entry for a region and its parsed µGraph (None for an XLA entry).

        Returns None on a miss. An entry that fails a check is deleted, with a warning.
        `program` (the region's lax_ir Program) enables the aval check and re-verification.
        """
        key = make_key(region_hash, device_kind, backend, version or lib_version(), options)
        entry = self.get_raw(key) if key else None
        if entry is None or entry.key != key:
            return None
        try:
            mugraph = self.check(entry, program=program)
        except StaleEntry as e:
            _warn(
                f"mirage_jax cache: ignoring entry {key[:12]} for region {region_hash[:12]}: "
                f"{e}; it was deleted and will be rebuilt"
            )
            self.delete(key)
            return None
        return entry, mugraph

    def check(self, entry: CacheEntry, *, program: Any = None) -> Any:
        """Check one entry; returns its µGraph (None for XLA) or raises StaleEntry."""
        if entry.key != entry.expected_key():
            raise StaleEntry("its key does not match its fields")
        if program is not None and program.canonical_hash != entry.region_hash:
            raise StaleEntry("it is for another region")
        if entry.is_xla:
            return None
        try:
            mugraph = mugraph_from_json(entry.mugraph_json or "")
        except Exception as e:
            raise StaleEntry(f"its µGraph does not load ({type(e).__name__}: {e})") from e
        rec = entry.verification
        verdict = rec.get("verdict") or {}
        if rec.get("region_hash") != entry.region_hash:
            raise StaleEntry("its verification record is for another region")
        if rec.get("mugraph_hash") != mugraph.canonical_hash:
            raise StaleEntry("its verification record is for another µGraph")
        if not verdict.get("equal") or int(verdict.get("trials", 0)) < 1:
            raise StaleEntry("its verification record does not say equal")
        bound = float(verdict.get("bound", 1.0))
        if not bound <= self.max_bound:
            raise StaleEntry(f"its verification bound {bound:.1e} exceeds {self.max_bound:.0e}")
        if program is not None:
            if tuple(mugraph.input_avals) != tuple(program.input_avals):
                raise StaleEntry("its µGraph's inputs do not match the region's")
            order = rec.get("output_order") or list(range(len(program.outputs)))
            outs = mugraph.output_avals
            if sorted(order) != list(range(len(outs))) or [outs[i] for i in order] != list(
                program.output_avals
            ):
                raise StaleEntry("its µGraph's outputs do not match the region's")
            if self.reverify:
                _reverify(mugraph, program)
        return mugraph

    # ------------------------------------------------------------------ sharing
    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every entry as JSON lines; returns the count."""
        entries = self.entries()
        with open(path, "w", encoding="utf-8") as f:
            for e in entries:
                f.write(e.to_json() + "\n")
        return len(entries)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Read JSON lines written by `export`; entries with a wrong key are skipped (warned).

        Imported entries are checked again when they are read, like any other.
        """
        n = 0
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entry = CacheEntry.from_json(line)
                    if entry.key != entry.expected_key():
                        raise ValueError("key does not match the entry's fields")
                except Exception as e:
                    _warn(f"{path}:{lineno}: skipped ({type(e).__name__}: {e})")
                    continue
                self.put(entry)
                n += 1
        return n


def _is_corruption(e: sqlite3.DatabaseError) -> bool:
    msg = str(e).lower()
    return any(w in msg for w in ("not a database", "malformed", "corrupt", "encrypted"))


class StaleEntry(Exception):
    """A cache entry failed a check (the message says which)."""


def _mugraph_codec(name: str) -> Any:
    """mirage_jax.mugraph's `to_json`/`from_json` (package, serialize module or MuGraph)."""
    import importlib

    from mirage_jax import mugraph as mg

    owners = [mg, getattr(mg, "MuGraph", None)]
    with contextlib.suppress(ImportError):
        owners.append(importlib.import_module("mirage_jax.mugraph.serialize"))
    for owner in owners:
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn
    raise NotImplementedError(f"mirage_jax.mugraph has no JSON {name} yet")


def mugraph_from_json(text: str) -> Any:
    """Parse our versioned µGraph JSON (raises on an unknown format or version)."""
    return _mugraph_codec("from_json")(text)


def mugraph_to_json(g: Any) -> str:
    """Our versioned µGraph JSON."""
    return _mugraph_codec("to_json")(g)


def _reverify(mugraph: Any, program: Any) -> None:
    """One fresh field trial of the µGraph against the region (skipped without `fields`)."""
    try:
        import fields
    except ImportError:
        return
    seed = random.SystemRandom().randrange(2**31)
    try:
        verdict = fields.verify(mugraph, program, trials=1, seed=seed)
    except Exception as e:
        raise StaleEntry(f"re-verification failed to run ({type(e).__name__}: {e})") from e
    if not verdict.equal:
        raise StaleEntry(f"re-verification rejected it ({verdict.reason})")
