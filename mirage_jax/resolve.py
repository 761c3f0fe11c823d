"""Resolving one region: the in-process memo, the cache, the search (when allowed), the store.

`Resolver` answers, per Lax region of a trace, what it runs as (`RegionDecision`): a cached
or searched verified µGraph, or XLA with the reason. Used by `mirage_jax.api.MirageJit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mirage_jax._env import device_kind, fallback, warn_once
from mirage_jax.cache import Cache, CacheEntry, lib_version, make_key
from mirage_jax.regions import SearchUnavailable, search_region


@dataclass(frozen=True)
class RegionDecision:
    """What one region runs as, and why.

    Arguments:
        index: the region's index in the partition.
        region_hash: the canonical hash of the region's Program.
        status: "kernel" (a µGraph replaces it) or "xla".
        reason: why (a cache hit, a search result, no GPU, a failure, ...).
        source: "cache", "search", "memo" or "none".
        mugraph: the chosen µGraph (None for XLA).
        verification: the verification record (region, µGraph, output order, verdict).
        timings: measured times in µs where known (e.g. mugraph_us, xla_us).
        cache_key: the cache key the decision is stored under ("" if none).
        backend: the backend a kernel is lowered for ("" for XLA).
        runner_up: for an XLA region, a verified µGraph that came close to XLA on the region
            alone (`verification` is its record): the whole-function check tries it
            (`mirage_jax.runner_up`).
    """

    index: int
    region_hash: str
    status: str
    reason: str
    source: str = "none"
    mugraph: Any = None
    verification: Mapping[str, Any] | None = None
    timings: Mapping[str, Any] | None = None
    cache_key: str = ""
    backend: str = ""
    runner_up: Any = None


class Resolver:
    """Resolves one region: memo → cache → search (when allowed) → store."""

    def __init__(self, owner: Any, backend: str):  # owner: the `MirageJit`
        self.owner = owner
        self.backend = backend
        self.device = device_kind()
        self.version = lib_version()

    def key_options(self) -> dict[str, Any]:
        opts = dict(self.owner.opts.options)
        if self.owner.opts.lower_config is not None:
            opts["lower_config"] = repr(self.owner.opts.lower_config)
        return opts

    def key(self, region: Any) -> str:
        return make_key(
            region.program.canonical_hash,
            self.device,
            self.backend,
            self.version,
            self.key_options(),
        )

    def lookup(self, region: Any) -> RegionDecision | None:
        """The memo, then the cache; None on a miss."""
        owner = self.owner
        key = self.key(region)
        if key in owner._memo:
            owner.stats.memo_hits += 1
            return dataclasses.replace(owner._memo[key], index=region.index, source="memo")
        decision = self._from_cache(region, key)
        if decision is not None:
            owner._memo[key] = decision
        return decision

    def search(
        self,
        region: Any,
        avals: Sequence[tuple] | None = None,
        searched: Any = None,
        known: Mapping[int, Any] | None = None,
    ) -> RegionDecision:
        """Search the region and store the result (an XLA decision if it cannot run); with the
        region's own input `avals`, candidates are timed as the function calls the region;
        `searched`: its search already started (`regions.SearchAhead`); `known`: its inputs
        whose values depend on no input (`known_inputs.constant_inputs`)."""
        key = self.key(region)
        decision = self._search(region, key, avals, searched, known)
        self.owner._memo[key] = decision
        return decision

    def _from_cache(self, region: Any, key: str) -> RegionDecision | None:
        cache, stats = self.owner.cache, self.owner.stats
        if cache is None:
            return None
        try:
            hit = cache.lookup(
                region.program.canonical_hash,
                self.device,
                self.backend,
                self.key_options(),
                program=region.program,
                version=self.version,
            )
        except Exception as e:  # an unusable cache is never fatal (strict: raised)
            fallback(
                f"cache:{cache.path}",
                f"mirage_jax cache {cache.path} is unusable ({type(e).__name__}: {e}); "
                "running without it",
                e,
                self.owner.opts.strict,
            )
            return None
        if hit is None:
            stats.cache_misses += 1
            return None
        stats.cache_hits += 1
        entry, mugraph = hit
        # An XLA entry says why it was stored (no µGraph found, or none faster when timed);
        # entries from before the reason was kept say only that XLA was chosen.
        why_xla = entry.timings.get("reason") or "XLA was chosen when it was stored"
        return self._decision(
            region, entry, mugraph, "cache", "cached verified µGraph", f"cached: {why_xla}"
        )

    def _search(
        self,
        region: Any,
        key: str,
        avals: Sequence[tuple] | None,
        searched: Any = None,
        known: Mapping[int, Any] | None = None,
    ) -> RegionDecision:
        owner = self.owner
        try:
            found = search_region(region.program, owner.opts, self.backend, avals, searched, known)
        except SearchUnavailable as e:
            fallback(
                "search-unavailable",
                f"mirage_jax.jit(search='auto'): {e}; regions not in the cache run as XLA",
                e,
                owner.opts.strict,
            )
            return xla_decision(region, f"search unavailable: {e}")
        except Exception as e:  # a bug in the search: reported (strict: raised)
            fallback(
                f"search-failed:{key}",
                f"mirage_jax search failed on region {region.index} "
                f"({type(e).__name__}: {e}); it runs as XLA",
                e,
                owner.opts.strict,
            )
            return xla_decision(region, f"search failed ({type(e).__name__}: {e})")
        owner.stats.searches += 1
        entry = self.entry(region, found)
        if owner.cache is not None and found.cacheable:
            try:
                owner.cache.put(entry)
            except Exception as e:
                warn_once(
                    f"cache-write:{owner.cache.path}",
                    f"mirage_jax cache {owner.cache.path}: could not store a search result "
                    f"({type(e).__name__}: {e})",
                )
        return self._decision(
            region, entry, found.mugraph, "search", found.reason, f"search: {found.reason}"
        )

    def entry(self, region: Any, found: Any) -> CacheEntry:
        """The cache entry a region's `SearchOutcome` is stored as (`mirage_jax.zoo` writes
        the same entries)."""
        return Cache.entry(
            region.program.canonical_hash,
            self.device,
            self.backend,
            mugraph_json=found.mugraph_json,
            verdict_json=found.verdict_json,
            timings={
                **found.timings,
                "reason": found.reason,
                "from": provenance(region.program),
                **({"runner_up": True} if found.runner_up else {}),
            },
            options=self.key_options(),
            version=self.version,
        )

    def decision(self, region: Any, entry: CacheEntry, found: Any) -> RegionDecision:
        """The decision a just-searched region's stored `entry` stands for."""
        return self._decision(
            region, entry, found.mugraph, "search", found.reason, f"search: {found.reason}"
        )

    def _decision(
        self, region: Any, entry: CacheEntry, mugraph: Any, source: str, why: str, why_xla: str
    ) -> RegionDecision:
        """The decision a cache entry (read or just written) stands for."""
        if mugraph is None:
            return xla_decision(region, why_xla, source=source, entry=entry)
        if entry.runner_up:
            d = xla_decision(region, why_xla, source=source, entry=entry)
            return dataclasses.replace(
                d, runner_up=mugraph, verification=entry.verification, backend=self.backend
            )
        return RegionDecision(
            region.index, entry.region_hash, "kernel", why, source, mugraph, entry.verification,
            entry.timings, entry.key, self.backend,
        )  # fmt: skip


def provenance(program: Any) -> str:
    """Where a region came from, for `cache ls`: its function's name and region index, and
    its input shapes, e.g. `block.region0(f16[1,1024], f16[1024,256])`."""
    from lax_ir import ops as lax_ops

    shapes = ", ".join(
        f"{lax_ops.short_dtype(d)}[{','.join(map(str, s))}]" for s, d in program.input_avals
    )
    return f"{program.meta.get('name', 'region')}({shapes})"


def xla_decision(
    region: Any,
    reason: str,
    base: RegionDecision | None = None,
    *,
    source: str = "none",
    entry: CacheEntry | None = None,
) -> RegionDecision:
    if base is not None:
        return dataclasses.replace(base, status="xla", reason=reason, backend="", runner_up=None)
    return RegionDecision(
        index=region.index,
        region_hash=region.program.canonical_hash,
        status="xla",
        reason=reason,
        source=source,
        timings=entry.timings if entry is not None else None,
        cache_key=entry.key if entry is not None else "",
    )
