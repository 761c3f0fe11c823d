"""One kernel-cache entry: its fields, its key, its JSON-lines form, and the checks of its form.

`read_lines` and `parse_line` turn an import file into entries or reasons for rejecting lines
(over-long lines are skipped unread, non-UTF-8 and malformed ones are named).

`CacheEntry` is one row of the cache (`mirage_jax.cache`). Nothing read from a database row or
an imported line becomes a CacheEntry without `parse_entry`, which checks form only: types,
sizes, hexadecimal hashes, a plausible date, well-formed JSON records and a verification bound
in [0, 1]. With `deep=True` (import) it also parses the µGraph and checks that the key and the
record's hashes match the entry. Whether the µGraph is really equal to its region is checked
later, against the region itself (`mirage_jax.cache_check`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

ORIGINS = ("search", "store", "import", "unknown")
"""Where an entry came from: the search of `mirage_jax.jit` (its kernel passed a float check
when it was selected), `Cache.store`, `Cache.import_`, or unknown (a row written before the
cache recorded origins, schema 1)."""

MAX_LINE_BYTES = 4 * 2**20
"""Longest import line read; a longer one is skipped unread."""
MAX_MUGRAPH_CHARS = 2 * 2**20
MAX_RECORD_CHARS = 64 * 2**10
"""Longest verification record, timings or options JSON."""
MAX_NAME_CHARS = 256
"""Longest device kind or library version."""
FUTURE_SLACK_S = 86_400.0
"""How far in the future a creation date may lie (clock skew between machines)."""

FIELDS = (
    "key",
    "region_hash",
    "device_kind",
    "backend",
    "lib_version",
    "options",
    "mugraph_json",
    "verdict_json",
    "timings_json",
    "created_at",
)
"""The fields an export line must have (`origin` is optional and ignored on import)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
_BACKEND = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class InvalidEntry(ValueError):
    """A row or an import line is malformed (the message names the field and the fault)."""


class StaleEntry(Exception):
    """A well-formed entry failed a check against its key or region (the message says which)."""


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
    """One row. `mugraph_json` is None when the region runs as XLA (no µGraph found, or none
    faster; `timings["reason"]` says which)."""

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
    origin: str = "search"

    @property
    def is_xla(self) -> bool:
        """True for an entry that runs the region as XLA (`timings["reason"]` says why), a
        runner-up's too."""
        return self.mugraph_json is None or self.runner_up

    @property
    def runner_up(self) -> bool:
        """True for an XLA entry that keeps a verified µGraph which came close to XLA on the
        region alone, for the whole-function check (`mirage_jax.runner_up`)."""
        return self.mugraph_json is not None and bool(self.timings.get("runner_up"))

    @property
    def verification(self) -> dict[str, Any]:
        """The verification record: region_hash, mugraph_hash, output_order, verdict (and,
        for an entry returned by `Cache.lookup`, `load_check`: what was checked on load)."""
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
        """Parse one export line, checking its form and hashes (raises InvalidEntry)."""
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise InvalidEntry(f"not JSON ({e})") from None
        return parse_entry(data, deep=True)

    def expected_key(self) -> str:
        """The key this entry's fields give (a stored key that differs is stale)."""
        return make_key(
            self.region_hash, self.device_kind, self.backend, self.lib_version, self.options
        )


def parse_entry(data: Any, *, deep: bool = False) -> CacheEntry:
    """A CacheEntry from an export line's dict (or a row as one), or InvalidEntry saying why.

    `deep` (import) also parses the µGraph and checks the key and the record's hashes.
    """
    if not isinstance(data, dict):
        raise InvalidEntry(f"not a JSON object but a {type(data).__name__}")
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise InvalidEntry(f"missing field(s) {', '.join(missing)}")
    key = _hex64(data, "key")
    region_hash = _hex64(data, "region_hash")
    device_kind = _name(data, "device_kind")
    backend = data["backend"]
    if not isinstance(backend, str) or not _BACKEND.fullmatch(backend):
        raise InvalidEntry(f"backend {_show(backend)} is not a backend name")
    options = data["options"]
    if not isinstance(options, dict):
        raise InvalidEntry(f"options is a {type(options).__name__}, not an object")
    if len(json.dumps(options, default=str)) > MAX_RECORD_CHARS:
        raise InvalidEntry(f"options are longer than {MAX_RECORD_CHARS} characters")
    mugraph_json = _json_text(data, "mugraph_json", MAX_MUGRAPH_CHARS)
    verdict_json = _json_text(data, "verdict_json", MAX_RECORD_CHARS)
    timings_json = _json_text(data, "timings_json", MAX_RECORD_CHARS)
    if verdict_json is not None:
        _check_record(json.loads(verdict_json))
    origin = data.get("origin", "unknown")
    if origin not in ORIGINS:
        raise InvalidEntry(f"origin {_show(origin)} is not one of {', '.join(ORIGINS)}")
    entry = CacheEntry(
        key=key,
        region_hash=region_hash,
        device_kind=device_kind,
        backend=backend,
        lib_version=_name(data, "lib_version"),
        options=options,
        mugraph_json=mugraph_json,
        verdict_json=verdict_json,
        timings_json=timings_json,
        created_at=_date(data["created_at"]),
        origin=origin,
    )
    if deep:
        _check_deep(entry)
    return entry


def read_lines(f: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) per line; None for a line longer than `limit`, which is skipped
    without being held in memory."""
    lineno = 0
    while raw := f.readline(limit + 1):
        lineno += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            while (chunk := f.readline(2**20)) and not chunk.endswith(b"\n"):
                pass
            yield lineno, None
        else:
            yield lineno, raw


def parse_line(raw: bytes | None, max_bound: float) -> tuple[str, CacheEntry | None]:
    """("", entry), ("", None) for a blank line, or (why it is rejected, None)."""
    if raw is None:
        return f"longer than {MAX_LINE_BYTES} bytes; skipped unread", None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})", None
    if not text.strip():
        return "", None
    try:
        entry = CacheEntry.from_json(text)
    except InvalidEntry as e:
        return str(e), None
    if entry.verdict_json is not None:
        bound = float(entry.verification["verdict"]["bound"])
        if not bound <= max_bound:
            return f"verification bound {bound:.1e} exceeds the {max_bound:.0e} trusted", None
    return "", entry


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}... ({len(text)} characters)"


def _hex64(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise InvalidEntry(f"{name} {_show(value)} is not a 64-digit lowercase hex sha256")
    return value


def _name(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise InvalidEntry(f"{name} {_show(value)} is not a string of 1 to {MAX_NAME_CHARS}")
    if not value.isprintable():
        raise InvalidEntry(f"{name} {_show(value)} has control characters")
    return value


def _json_text(data: Mapping[str, Any], name: str, limit: int) -> str | None:
    """A field holding JSON text of an object (or null): its text, checked."""
    value = data[name]
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEntry(f"{name} is a {type(value).__name__}, not a JSON string or null")
    if len(value) > limit:
        raise InvalidEntry(f"{name} is longer than {limit} characters ({len(value)})")
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError) as e:
        raise InvalidEntry(f"{name} is not JSON ({e})") from None
    if not isinstance(parsed, dict):
        raise InvalidEntry(f"{name} holds a {type(parsed).__name__}, not a JSON object")
    return value


def _date(value: Any) -> float:
    """created_at: seconds since the epoch, not in the future (0 = unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidEntry(f"created_at {_show(value)} is not a number of seconds since 1970")
    value = float(value)
    if not math.isfinite(value) or value < 0 or value > time.time() + FUTURE_SLACK_S:
        raise InvalidEntry(f"created_at {value!r} is not a date between 1970 and now")
    return value


def _check_record(record: Mapping[str, Any]) -> None:
    """The form of a verification record (what `fields.Verdict.record` writes)."""
    for name in ("region_hash", "mugraph_hash"):
        if not isinstance(record.get(name), str):
            raise InvalidEntry(f"verdict_json has no {name} string")
    verdict = record.get("verdict")
    if not isinstance(verdict, dict):
        raise InvalidEntry("verdict_json has no verdict object")
    if not isinstance(verdict.get("equal"), bool):
        raise InvalidEntry("verdict_json: verdict.equal is not true or false")
    trials = verdict.get("trials")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise InvalidEntry(f"verdict_json: verdict.trials {_show(trials)} is not a count")
    bound = verdict.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 <= bound <= 1:
        raise InvalidEntry(f"verdict_json: verdict.bound {_show(bound)} is not in [0, 1]")
    order = record.get("output_order")
    if order is not None and (
        not isinstance(order, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in order)
        or sorted(order) != list(range(len(order)))
    ):
        raise InvalidEntry(f"verdict_json: output_order {_show(order)} is not a permutation")


def _check_deep(entry: CacheEntry) -> None:
    """The key and the record's hashes against the entry and its parsed µGraph."""
    if entry.key != entry.expected_key():
        raise InvalidEntry("key does not match the entry's fields (region, device, backend, ...)")
    if entry.mugraph_json is None:
        if entry.verdict_json is not None:
            raise InvalidEntry("an XLA entry (mugraph_json null) carries a verification record")
        return
    if entry.verdict_json is None:
        raise InvalidEntry("a µGraph entry has no verification record (verdict_json null)")
    try:
        mugraph = mugraph_from_json(entry.mugraph_json)
    except Exception as e:
        raise InvalidEntry(f"mugraph_json does not load ({type(e).__name__}: {e})") from None
    record = entry.verification
    if record["region_hash"] != entry.region_hash:
        raise InvalidEntry("verdict_json's region_hash is not the entry's region_hash")
    if record["mugraph_hash"] != mugraph.canonical_hash:
        raise InvalidEntry("verdict_json's mugraph_hash is not the µGraph's canonical hash")
    if not record["verdict"]["equal"] or record["verdict"]["trials"] < 1:
        raise InvalidEntry("verdict_json does not say equal after at least one trial")


def _mugraph_codec(name: str) -> Any:
    """mirage_jax.mugraph's `to_json`/`from_json` (package, serialize module or MuGraph)."""
    import contextlib
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
