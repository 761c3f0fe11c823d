"""What the library-block experiments (`equinox_builtins`, `nnx_builtins`, `flax_prefill`,
`softmax_heads`) share: the first call with an empty cache, the error measure, and the results
files (JSON with the method, machine and versions; a Markdown table)."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments.reproduce_common import versions


def parser(doc: str, heads: int) -> argparse.ArgumentParser:
    """The options both experiments take (`--cpu`, `--batches`, `--d-model`, `--heads`,
    `--calls`, `--out`); each adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="tiny sizes, Pallas interpret mode")
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    return p


@contextlib.contextmanager
def first_call(
    jit: Callable[..., Any], fn: Callable[..., Any], args: tuple, backend: str, want: Any
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """`jit(fn)` (`mirage_jax.jit` or `filter_jit`) with an empty cache in a temporary
    directory, its first call made on `args`: yields the jit (alive until the block ends, for
    timing) and the row's common entries (the first call's seconds, the kernels kept, each
    region's decision, the error against `want`)."""
    with tempfile.TemporaryDirectory() as tmp:
        ours = jit(fn, backend=backend, cache=Path(tmp) / "c.sqlite")
        t0 = time.perf_counter()
        got = jax.block_until_ready(ours(*args))
        first = time.perf_counter() - t0
        decisions = ours.last.decisions
        yield (
            ours,
            {
                "first_call_s": round(first, 2),
                "kernels": sum(d.status == "kernel" for d in decisions),
                "regions": [(d.index, d.status, d.reason[:160]) for d in decisions],
                "rel_err": rel_err(got, want),
            },
        )


def rel_err(a: Any, b: Any) -> float:
    """The largest difference relative to the reference's largest magnitude."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def run_rows(cases: Sequence[Any], run: Any) -> list[dict[str, Any]]:
    """`run(case)` for each case, each row printed as it finishes (without its regions)."""
    rows = []
    for case in cases:
        row = run(case)
        print({k: v for k, v in row.items() if k != "regions"}, flush=True)
        rows.append(row)
    return rows


def write(
    out: Path | None,
    stem: str,
    title: str,
    method: str,
    columns: Sequence[tuple[str, str]],
    rows: list[dict[str, Any]],
) -> None:
    """`<out>/<stem>.json` and `.md`: the rows with the method, machine, date and versions;
    `columns` are (header, row key) pairs of the table (a missing value shows as –)."""
    if out is None:
        return
    meta = {
        "method": method,
        "device": jax.devices()[0].device_kind,
        "date": time.strftime("%Y-%m-%d"),
        "versions": versions(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"# {title}",
        "",
        f"Method: {method}. Machine: {meta['device']}. Versions: {meta['versions']}.",
        "",
        "| " + " | ".join(h for h, _ in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        cells = [_cell(r.get(k)) for _, k in columns]
        lines.append("| " + " | ".join(cells) + " |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and 0 < abs(v) < 0.1:
        return f"{v:.1e}"
    return str(v)
