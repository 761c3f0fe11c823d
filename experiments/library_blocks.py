"""What `equinox_builtins` and `nnx_builtins` share: the error measure, and the results files
(JSON with the method, machine and versions; a Markdown table)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
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
