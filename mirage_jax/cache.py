"""The persistent kernel cache: one SQLite database of the best µGraph found per Lax region.

An entry (`mirage_jax.cache_entry.CacheEntry`) is keyed by the region's canonical hash, the
device kind, the backend, the library version and every option that changes the result
(`make_key`). It stores the chosen µGraph as our JSON (or nothing: "XLA is best here", so the
search is not run again), its verification record, its timings and its origin ("search",
"store", "import", or "unknown" for rows from before origins were kept). The database runs in
WAL mode with a busy timeout, so several processes read and write it at once; a schema-1
database is migrated in place (its rows get origin "unknown").

Nothing read back is trusted:
- a corrupt file is moved aside and recreated; a row that does not parse (wrong types, bad
  JSON, a date that is not one) is deleted with a warning when it is read;
- `lookup` deletes, with a warning naming the reason, an entry whose key does not match its
  fields or whose record is for another region or µGraph, not "equal", or above `max_bound`;
- before its first use in a process an entry passes `mirage_jax.cache_check`: a fresh field
  trial re-derives the output matching (the stored one is never used), and imported,
  stored or unknown-origin entries, and entries whose record disagrees with the fresh trial,
  also pass a float check of their kernel against the region in float64;
- `import_` validates every line (types, sizes, hashes, dates, bound) and imports only the
  valid ones, one transaction each; key prefixes are compared literally.

Load-time cost per region: the first lookup of an entry in a process (later ones hit a
per-process memo), measured with experiments/cache_load_cost.py on the shared 2-core CPU
container (load average 4-6 from other work, so these are upper figures), fp16 inputs at
batch 1, backend "reference", median of 5 (experiments/results/cache_load_cost_cpu.json), s:

    region                                     field trial  float check  first lookup  memoised
    rmsnorm small  X[2,256] W[256,384]               0.006        0.369         0.378     0.003
    rmsnorm full   X[2,4096] W[4096,6144]            0.564        1.578         2.138     0.002
    gqa small      Q[2,16,16] K[2,16,256] V[..]      0.015        0.496         0.514     0.003
    gqa full       Q[2,256,64] K[2,64,4096] V[..]    0.726        0.759         1.534     0.003

The field trial is paid by every entry (the code before paid it on every lookup, not once per
process); the float check only by entries that did not come from this machine's search. XLA
compiling the jitted evaluation is 0.3-0.6 s of it (measured separately); on a GPU the check
compiles the pallas or triton kernel instead, which was not measured here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mirage_jax.cache_check import FLOAT_CHECK_MODES, check_against_region
from mirage_jax.cache_entry import MAX_LINE_BYTES as MAX_LINE_BYTES
from mirage_jax.cache_entry import ORIGINS as ORIGINS
from mirage_jax.cache_entry import CacheEntry as CacheEntry
from mirage_jax.cache_entry import InvalidEntry as InvalidEntry
from mirage_jax.cache_entry import StaleEntry as StaleEntry
from mirage_jax.cache_entry import make_key as make_key
from mirage_jax.cache_entry import mugraph_from_json as mugraph_from_json
from mirage_jax.cache_entry import mugraph_to_json as mugraph_to_json
from mirage_jax.cache_entry import parse_entry, parse_line, read_lines

SCHEMA_VERSION = 2
"""1: no origin column; 2: origin (schema-1 databases are migrated, rows get "unknown")."""
MAX_BOUND = 1e-9
"""Largest false-accept bound a cached µGraph's verification record may carry."""
ENV_VAR = "MIRAGE_JAX_CACHE"
BUSY_TIMEOUT_MS = 30_000
_HEX = frozenset("0123456789abcdef")

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
    "origin",
)
_TABLE = (
    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, region_hash TEXT, "
    "device_kind TEXT, backend TEXT, lib_version TEXT, options_json TEXT, mugraph_json TEXT, "
    "verdict_json TEXT, timings_json TEXT, created_at REAL, "
    "origin TEXT NOT NULL DEFAULT 'unknown')"
)


class CacheWarning(UserWarning):
    """A cache file or entry was not trusted (corrupt, stale or failing verification)."""


class CacheUnavailable(RuntimeError):
    """The cache database cannot be opened or written (the message names the path and why)."""


@dataclass
class ImportReport:
    """What `Cache.import_` did: entries imported, and (line number, reason) per rejected line."""

    imported: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)


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


class Cache:
    """The SQLite kernel cache at `path` (default `default_path()`).

    Arguments:
        path: the database file; its directory is created.
        max_bound: largest verification bound trusted on read (and on import).
        float_check: "auto" (default): float-check entries that were not found by this
            machine's search, and entries whose record disagrees with the fresh field trial;
            "always": every entry, once per process (`mirage_jax.cache_check`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_bound: float = MAX_BOUND,
        float_check: str = "auto",
    ):
        if float_check not in FLOAT_CHECK_MODES:
            raise ValueError(f"float_check must be one of {FLOAT_CHECK_MODES}, got {float_check!r}")
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.max_bound = max_bound
        self.float_check = float_check
        self.failed_writes: list[Exception] = []
        """The errors of `put`s that failed, oldest first (`mirage_jax.jit` only warns)."""
        self._ready = False

    def __repr__(self) -> str:
        return f"Cache({str(self.path)!r})"

    # ------------------------------------------------------------------ connection
    def _unavailable(self, what: str, error: BaseException) -> CacheUnavailable:
        reason = getattr(error, "strerror", None) or str(error)
        return CacheUnavailable(
            f"cannot {what} the cache database {self.path}: {reason}; point the cache at a "
            f"file in a writable directory (--cache PATH, cache=PATH or ${ENV_VAR})"
        )

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
        """Create, migrate or check the database; a corrupt file is moved aside and recreated."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._init_schema()
            except sqlite3.DatabaseError as e:
                if not _is_corruption(e):
                    raise
                self._move_aside(e)
                self._init_schema()
        except (OSError, sqlite3.Error) as e:
            raise self._unavailable("open", e) from e
        self._ready = True

    def _init_schema(self) -> None:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            if not _schema_is_current(conn):
                conn.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait
                try:
                    self._migrate(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            status = conn.execute("PRAGMA quick_check").fetchone()
            if status is None or status[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {status}")
        finally:
            conn.close()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the schema to SCHEMA_VERSION inside the caller's write transaction."""
        conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT)")
        conn.execute(_TABLE)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
        if "origin" not in columns:  # schema 1: its rows' origin is unknown
            conn.execute("ALTER TABLE entries ADD COLUMN origin TEXT NOT NULL DEFAULT 'unknown'")
        row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        if row[0] not in ("1", str(SCHEMA_VERSION)):
            _warn(
                f"mirage_jax cache {self.path} has schema {row[0]}, this library "
                f"writes {SCHEMA_VERSION}; dropping its entries"
            )
            conn.execute("DELETE FROM entries")
        conn.execute("UPDATE meta SET value=? WHERE name='schema_version'", (str(SCHEMA_VERSION),))

    def _run(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Execute one statement; a database found corrupt is moved aside and recreated."""
        try:
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
        except sqlite3.OperationalError as e:  # read-only, locked past the timeout, I/O
            raise self._unavailable("use", e) from e

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

    def check_writable(self) -> None:
        """Raise CacheUnavailable unless an entry could be written now (nothing is kept)."""
        with self._connect():
            pass
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)
            try:
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('write_probe', '')")
                conn.rollback()
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise self._unavailable("write", e) from e

    # ------------------------------------------------------------------ rows
    def _read(self, where: str = "", params: tuple = (), order: str = "") -> list[CacheEntry]:
        """The rows selected by `where`; malformed ones are deleted, with a warning."""
        rows = self._run(
            f"SELECT rowid, {', '.join(_COLUMNS)} FROM entries {where} {order}", params
        )
        good = []
        for rowid, *row in rows:
            try:
                good.append(_row_entry(row))
            except InvalidEntry as e:
                key = row[0] if isinstance(row[0], str) and len(row[0]) <= 64 else "?"
                _warn(
                    f"mirage_jax cache {self.path}: deleted a malformed row (key {key[:16]}): {e}"
                )
                self._run("DELETE FROM entries WHERE rowid=? AND key IS ?", (rowid, row[0]))
        return good

    def put(self, entry: CacheEntry) -> None:
        """Insert or replace `entry`; its key must match its fields and its form must parse.
        A failure is raised and also kept in `failed_writes`."""
        try:
            if entry.key != entry.expected_key():
                raise ValueError("entry key does not match its fields; build it with Cache.entry")
            entry = replace(entry, created_at=entry.created_at or time.time())
            parse_entry(asdict(entry))  # raises InvalidEntry (a ValueError) naming the field
            self._write(entry)
        except Exception as e:
            self.failed_writes.append(e)
            raise

    def _write(self, entry: CacheEntry) -> None:
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
                entry.created_at,
                entry.origin,
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
        origin: str = "search",
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
            origin=origin,
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
        equal within `max_bound`. The entry's origin is "store": its kernel has not been
        float-checked, so its first lookup in a process does that.
        """
        if mugraph is None:
            entry = self.entry(
                program.canonical_hash, device_kind, backend, timings=timings,
                options=options, origin="store",
            )  # fmt: skip
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
            origin="store",
        )
        self.put(entry)
        return entry

    def get_raw(self, key: str) -> CacheEntry | None:
        """The row with this key, or with this unique hexadecimal key prefix (compared
        literally); not checked against its region. KeyError if the prefix is ambiguous."""
        if not isinstance(key, str) or not key:
            return None
        rows = self._read("WHERE key=?", (key,))
        prefix = key.lower()
        if not rows and len(prefix) < 64 and set(prefix) <= _HEX:
            rows = self.entries(prefix=prefix)
            if len(rows) > 1:
                raise KeyError(f"key prefix {key!r} matches {len(rows)} entries")
        return rows[0] if rows else None

    def delete(self, key: str) -> None:
        self._run("DELETE FROM entries WHERE key=?", (key,))

    def entries(self, prefix: str | None = None) -> list[CacheEntry]:
        """Every well-formed row (or those whose key starts with `prefix`, literally), newest
        first, not checked against their regions."""
        if prefix is None:
            return self._read(order="ORDER BY created_at DESC")
        return self._read(
            "WHERE substr(key, 1, ?) = ?", (len(prefix), prefix), "ORDER BY created_at DESC"
        )

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
        program: Any,
        version: str | None = None,
    ) -> tuple[CacheEntry, Any] | None:
        """The checked entry for a region and its parsed µGraph (None for an XLA entry).

        Returns None on a miss. An entry that fails a check is deleted, with a warning naming
        the reason. `program` is the region's lax_ir Program: the entry is checked against it
        (`check`), and the returned entry's verification record carries the re-derived
        `output_order` and `load_check` (what was checked, `mirage_jax.cache_check`).
        """
        key = make_key(region_hash, device_kind, backend, version or lib_version(), options)
        rows = self._read("WHERE key=?", (key,))
        if not rows:
            return None
        try:
            return self.check(rows[0], program=program)
        except StaleEntry as e:
            _warn(
                f"mirage_jax cache: ignoring entry {key[:12]} for region {region_hash[:12]}: "
                f"{e}; it was deleted and will be rebuilt"
            )
            self.delete(key)
            return None

    def check(self, entry: CacheEntry, *, program: Any) -> tuple[CacheEntry, Any]:
        """Check one entry against its region; returns (the entry as checked, its µGraph or
        None for XLA), or raises StaleEntry saying which check failed."""
        if entry.key != entry.expected_key():
            raise StaleEntry("its key does not match its fields")
        if program.canonical_hash != entry.region_hash:
            raise StaleEntry("it is for another region")
        if entry.mugraph_json is None:  # XLA; a runner-up's µGraph is checked like a kernel's
            return entry, None
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
        if tuple(mugraph.input_avals) != tuple(program.input_avals):
            raise StaleEntry("its µGraph's inputs do not match the region's")
        content = [entry.key, entry.mugraph_json, entry.verdict_json, entry.origin, entry.backend]
        load, new = check_against_region(
            mugraph, program, record=rec, origin=entry.origin, backend=entry.backend,
            float_check=self.float_check, memo_key=json.dumps(content),
        )  # fmt: skip
        if new and load.order_disagreed:
            _warn(
                f"mirage_jax cache: entry {entry.key[:12]} for region {entry.region_hash[:12]}: "
                f"{load.mismatches[0]}; it runs with the re-derived order (float check: "
                f"{load.float_check})"
            )
        checked = rec | {"output_order": list(load.output_order), "load_check": load.as_record()}
        return replace(entry, verdict_json=json.dumps(checked, sort_keys=True)), mugraph

    # ------------------------------------------------------------------ sharing
    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every entry as JSON lines (through a temporary file, so a failed export
        leaves no partial file); returns the count. OSError if `path` cannot be written."""
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        entries = self.entries()
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for e in entries:
                    f.write(e.to_json() + "\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return len(entries)

    def import_(self, path: str | os.PathLike[str]) -> ImportReport:
        """Import the JSON lines of `path` (written by `export`) with origin "import".

        Every line is validated (`cache_entry.parse_entry`, deep: types, sizes, hashes, date,
        bound, the µGraph parses) and its bound must be within `max_bound`; each valid line is
        stored in its own transaction, each invalid one is reported as (line number, reason)
        and skipped. Imported entries are float-checked on their first use in a process.
        OSError if `path` cannot be read.
        """
        report = ImportReport()
        with open(path, "rb") as f:
            for lineno, raw in read_lines(f, MAX_LINE_BYTES):
                reason, entry = parse_line(raw, self.max_bound)
                if reason:
                    report.rejected.append((lineno, reason))
                elif entry is not None:
                    self.put(replace(entry, origin="import"))
                    report.imported += 1
        return report


def _row_entry(row: list[Any]) -> CacheEntry:
    """A database row as a CacheEntry (InvalidEntry if it is malformed)."""
    data = dict(zip(_COLUMNS, row))
    options = data.pop("options_json")
    try:
        data["options"] = json.loads(options) if isinstance(options, str) else options
    except ValueError as e:
        raise InvalidEntry(f"options_json is not JSON ({e})") from None
    return parse_entry(data)


def _schema_is_current(conn: sqlite3.Connection) -> bool:
    try:
        row = conn.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
        columns = {r[1] for r in conn.execute("PRAGMA table_info(entries)")}
    except sqlite3.OperationalError:  # no meta table yet
        return False
    return row is not None and row[0] == str(SCHEMA_VERSION) and "origin" in columns


def _is_corruption(e: sqlite3.DatabaseError) -> bool:
    msg = str(e).lower()
    return any(w in msg for w in ("not a database", "malformed", "corrupt", "encrypted"))
