"""`mirage_jax.explain`: what `mirage_jax.jit` does with a function, region by region.

The report lists what was captured, the partition (regions and what kept ops out of them),
and per region: where its decision came from (cache, search, none), the chosen µGraph (text
listing; pictures via `Explanation.svgs()` or Jupyter), its verification bound, and its
measured time against XLA where known.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lax_ir.partition import n_ops
from mirage_jax.api import MirageJit, RegionDecision, TraceRecord, device_kind, has_gpu
from mirage_jax.filter_jit import FilterJit
from mirage_jax.log import search_summary
from mirage_jax.lower import backends

PROGRAM_LISTING_MAX_NODES = 60


@dataclass(frozen=True)
class Explanation:
    """The report of `explain`; `str()` is the text form, Jupyter shows it with pictures."""

    record: TraceRecord
    device: str
    cache_path: str
    backend: str
    search: str

    @property
    def decisions(self) -> tuple[RegionDecision, ...]:
        return self.record.decisions

    @property
    def program(self) -> Any:
        return self.record.program

    @property
    def partition(self) -> Any:
        return self.record.partition

    def kernels(self) -> list[RegionDecision]:
        """The regions that run as fused kernels."""
        return [d for d in self.decisions if d.status == "kernel"]

    def svgs(self) -> dict[int, str]:
        """Region index → SVG picture of its chosen µGraph (where one was chosen)."""
        out: dict[int, str] = {}
        for d in self.decisions:
            if d.mugraph is not None:
                try:
                    from mirage_jax.mugraph import to_svg

                    out[d.index] = to_svg(d.mugraph)
                except Exception as e:  # a picture is optional
                    out[d.index] = f"<!-- no picture: {html.escape(str(e))} -->"
        return out

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:  # a notebook's text/plain: one line, not the whole record
        return (
            f"<Explanation of {self.record.name}: {len(self.kernels())} of "
            f"{len(self.decisions)} region(s) as fused kernels; print() it for the report>"
        )

    def text(self, listing: bool | None = None) -> str:
        """The text report; `listing` forces (or suppresses) the captured Program's listing."""
        r = self.record
        lines = [
            f"mirage_jax.explain: {r.name} on {self.device} "
            f"(backend={self.backend}, search={self.search}, cache={self.cache_path})"
        ]
        if r.error or r.program is None:
            lines.append(f"  capture failed ({r.error}); the function runs as plain XLA")
            return "\n".join(lines)
        p = r.program
        counts = ", ".join(f"{k}×{v}" for k, v in sorted(p.op_counts().items()))
        ins = ", ".join(_aval(s, d) for s, d in p.input_avals)
        outs = ", ".join(_aval(s, d) for s, d in p.output_avals)
        lines.append(
            f"captured: ({ins}) -> ({outs}); {n_ops(sum(1 for _ in p.ops()))} ({counts}); "
            f"hash {p.canonical_hash[:12]}"
        )
        if listing or (listing is None and len(p.nodes) <= PROGRAM_LISTING_MAX_NODES):
            lines.extend("  " + ln for ln in str(p).splitlines())
        lines.append("")
        lines.extend(r.partition.explain().splitlines())
        n_kernels = len(self.kernels())
        lines.append("")
        lines.append(
            f"{n_kernels} of {len(self.decisions)} region(s) run as fused kernels; "
            "everything else runs as XLA"
        )
        if r.function_check is not None:
            lines.append(r.function_check.reason)
        for d in self.decisions:
            lines.extend(_region_lines(d))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [f"<pre>{html.escape(self.text())}</pre>"]
        for index, svg in self.svgs().items():
            parts.append(f"<p>region {index}: chosen µGraph</p>{svg}")
        return "\n".join(parts)


def _aval(shape: Sequence[int], dtype: str) -> str:
    from lax_ir.ops import short_dtype

    return f"{short_dtype(dtype)}[{','.join(map(str, shape))}]"


def _region_lines(d: RegionDecision) -> list[str]:
    head = f"region {d.index} [{d.region_hash[:12]}]: "
    if d.status == "kernel":
        head += f"fused kernel ({d.backend}) from {d.source}: {d.reason}"
    else:
        head += f"XLA: {d.reason}"
    lines = ["", head]
    if d.cache_key:
        lines.append(f"  cache key {d.cache_key[:16]}")
    searched = search_summary(d.timings)
    if searched:
        lines.append(f"  {searched}" if d.source == "search" else f"  when stored: {searched}")
    if d.mugraph is not None:
        lines.append("  µGraph:")
        lines.extend("    " + ln for ln in str(d.mugraph).splitlines())
    v = (d.verification or {}).get("verdict") or {}
    if v:
        lines.append(
            f"  verified: {'equal' if v.get('equal') else 'NOT equal'} over {v.get('trials')} "
            f"field trial(s) (p={v.get('p')}, q={v.get('q')}); false-accept bound "
            f"{float(v.get('bound', 1.0)):.1e}"
        )
    check = (d.verification or {}).get("load_check")
    if check:  # set by Cache.lookup (mirage_jax.cache_check)
        lines.append(
            f"  checked on load: a fresh field trial re-derived the output order "
            f"{check['output_order']}; float check: {check['float_check']}"
        )
    t = d.timings or {}
    mine, xla = t.get("mugraph_us"), t.get("xla_us")
    if mine is not None and xla is not None:
        lines.append(
            f"  time: µGraph {float(mine):.2f} µs against XLA {float(xla):.2f} µs "
            f"({float(xla) / max(float(mine), 1e-12):.2f}× faster)"
            + (f", measured on {t['device']}" if t.get("device") else "")
        )
    elif xla is not None:
        lines.append(f"  time: XLA {float(xla):.2f} µs")
    elif t.get("estimated_us") is not None:
        lines.append(
            f"  time: not measured (no GPU); the cost model estimates "
            f"{float(t['estimated_us']):.2f} µs on the target GPU"
        )
    else:
        lines.append("  time: not measured")
    return lines


def explain(
    fn: Callable[..., Any],
    *args: Any,
    search: str | None = None,
    backend: str | None = None,
    cache: Any = None,
    static_argnums: int | Sequence[int] | None = None,
    **kwargs: Any,
) -> Explanation:
    """Explain what `mirage_jax.jit` does with `fn` at these arguments (arrays or specs).

    `fn` may be a plain function, a `mirage_jax.jit` or a `mirage_jax.filter_jit` object
    (its options are used). The search is not run unless `search="auto"` is passed: by
    default only the cache is read.
    `search`, `backend`, `cache` and `static_argnums` are explain's own keywords; other
    keyword arguments go to `fn`.
    """
    if isinstance(fn, FilterJit):  # its MirageJit, on the arrays and the static half
        args, kwargs, fn = fn.jit_args(*args, **kwargs), {}, fn.jit
    if isinstance(fn, MirageJit):
        changes: dict[str, Any] = {"search": search or _no_search(fn.opts.search)}
        if backend is not None:
            changes["backend"] = backend
        if cache is not None:
            changes["cache"] = cache
        f = fn.with_options(**changes)
    else:
        f = MirageJit(
            fn,
            static_argnums=static_argnums,
            backend=backend or "auto",
            search=search or "cached",
            cache=cache,
        )
    f.trace(*args, **kwargs)
    record = f.last
    assert record is not None
    effective = f.opts.backend
    if effective == "auto":  # what auto resolved to here (`backends.resolve`), and why not
        name, why = backends.resolve("auto", has_gpu())
        effective = f"auto → {name}" if name else f"auto → xla ({why})"
    return Explanation(
        record=record,
        device=device_kind(),
        cache_path=str(f.cache.path) if f.cache is not None else "none",
        backend=effective,
        search=f.opts.search,
    )


def _no_search(mode: str) -> str:
    return "cached" if mode == "auto" else mode
