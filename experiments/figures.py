"""The paper's figure and table from a results file of `experiments/reproduce.py`.

`figure(results)` draws the speedup of our best µGraph over the best baseline per benchmark,
one panel per batch size (log scale, a line at 1.0, our time written on each bar), with the
original's µGraph lowered through our backend beside it; `markdown(results)` writes the table
with every contender's time, and the original's own reported figures as context. Only numpy
and matplotlib are needed (matplotlib is imported when drawing).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

REPORTED: list[dict[str, str]] = [
    {"claim": "up to 3.3x over the best baseline (v3); 3.5x in v1", "source": "arXiv abstracts"},
    {"claim": "end-to-end 0.9-1.9x", "source": "alphaXiv summary of v3"},
    {
        "claim": "RMSNorm about 2.1x (bs1) and 1.9x (bs8); nTrans about 10x vs PyTorch "
        "(figure reading)",
        "source": "mirage issue #166",
    },
    {"claim": "RMSNorm+Linear 1.5-1.7x; LoRA 1.6x vs torch on A100", "source": "its tutorials"},
    {"claim": "GQA (v1): 2x FlashDecoding, 1.5x FlashInfer", "source": "README at 351e4402"},
    {
        "claim": "caveat: the H100 checkpoints give wrong outputs and fresh searches run at 0.9x "
        "PyTorch",
        "source": "mirage issue #658",
    },
]
"""The original's headline figures as reported (each with its source), not measured."""

OURS_COLOR = "#1a73e8"
IMPORTED_COLOR = "#9aa0a6"


def newest_results(directory: str | Path | None = None) -> Path | None:
    """The newest results file (`<machine>-<date>.json`, not a plan) in `directory`."""
    d = Path(directory) if directory else RESULTS
    files = [
        p
        for p in d.glob("*.json")
        if not p.name.startswith("plan") and p.name != "import_mirage.json"
    ]
    good = []
    for p in files:
        try:
            if json.loads(p.read_text()).get("kind") == "mirage_jax reproduce results":
                good.append(p)
        except (OSError, ValueError):
            continue
    return max(good, key=lambda p: (p.stat().st_mtime, p.name)) if good else None


def _created(path: Path) -> str:
    """A results file's creation time as written in it ("" when unreadable): file names of
    one day (`h100-<date>.json`, `h100-<date>-final.json`) do not sort by time."""
    try:
        return str(json.loads(path.read_text()).get("created") or "")
    except (OSError, ValueError):
        return ""


def load_results(path: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """A results file and its path: `path`, else the newest H100 run (by its `created`
    time), else the newest file."""
    if path is None:
        h100 = [(_created(p), p) for p in RESULTS.glob("h100-*.json")]
        path = max(h100)[1] if h100 else newest_results(RESULTS)
    if path is None:
        raise FileNotFoundError(f"no results file in {RESULTS}; run experiments/reproduce.py")
    path = Path(path)
    return json.loads(path.read_text()), path


def _gmean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers: per batch the geometric-mean speedup, the best, and wins."""
    rows = results.get("benchmarks", [])
    out: dict[str, Any] = {"timed": bool(results.get("timed")), "by_batch": {}}
    for b in sorted({r["batch"] for r in rows}):
        rs = [r for r in rows if r["batch"] == b and r.get("speedup")]
        best = max(rs, key=lambda r: r["speedup"]) if rs else None
        out["by_batch"][str(b)] = {
            "benchmarks": sum(r["batch"] == b for r in rows),
            "timed": len(rs),
            "geomean_speedup": _gmean([r["speedup"] for r in rs]),
            "max_speedup": best["speedup"] if best else None,
            "max_at": best["name"] if best else None,
            "faster_than_best_baseline": sum(r["speedup"] > 1.0 for r in rs),
        }
    sp = [r["speedup"] for r in rows if r.get("speedup")]
    best = max((r for r in rows if r.get("speedup")), key=lambda r: r["speedup"], default=None)
    out["geomean_speedup"] = _gmean(sp)
    out["max_speedup"] = best["speedup"] if best else None
    out["max_at"] = best["key"] if best else None
    out["faster_than_best_baseline"] = sum(x > 1.0 for x in sp)
    out["timed_benchmarks"] = len(sp)
    return out


# ---------------------------------------------------------------------------- figure
def figure(results: dict[str, Any]):
    """A matplotlib Figure: speedup over the best baseline, one panel per batch size."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter

    rows = results.get("benchmarks", [])
    names = list(dict.fromkeys(r["name"] for r in rows))
    batches = sorted({r["batch"] for r in rows}) or [1]
    fig = Figure(figsize=(max(6.0, 1.0 + 1.45 * len(names)), 2.9 * len(batches)), dpi=110)
    axes = fig.subplots(len(batches), 1, squeeze=False)[:, 0]
    vals = [
        v
        for r in rows
        for v in (r.get("speedup"), (r.get("imported_best") or {}).get("speedup"))
        if v
    ]
    lo = min([0.4, *(v / 2.5 for v in vals)])
    hi = max([2.5, *(v * 2.5 for v in vals)])
    width = 0.38
    for ax, b in zip(axes, batches):
        by_name = {r["name"]: r for r in rows if r["batch"] == b}
        for i, name in enumerate(names):
            r = by_name.get(name)
            if r is None:
                continue
            imp = r.get("imported_best") or {}
            bars = [(i - width / 2, r.get("speedup"), (r.get("ours") or {}).get("us"), True),
                    (i + width / 2, imp.get("speedup"), imp.get("us"), False)]  # fmt: skip
            for x, sp, us, ours in bars:
                if not sp:
                    if ours:
                        ax.text(x, 1.0, _why_missing(r), ha="center", va="bottom", fontsize=6,
                                rotation=90, color="#5f6368")  # fmt: skip
                    continue
                ax.bar(x, sp - 1.0, width, bottom=1.0, color=OURS_COLOR if ours else IMPORTED_COLOR,
                       hatch=None if ours else "//", edgecolor="white")  # fmt: skip
                up = sp >= 1.0
                ax.text(x, sp * (1.04 if up else 0.96), f"{sp:.2f}x  {us:.1f}µs", ha="center",
                        va="bottom" if up else "top", fontsize=6.5, rotation=90)  # fmt: skip
        ax.axhline(1.0, color="#202124", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(FixedLocator([2.0**k for k in range(-6, 7)]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylabel(f"b = {b}\nspeedup over best baseline", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", which="major", lw=0.3, alpha=0.6)
    fig.legend(
        handles=[
            Patch(color=OURS_COLOR, label="mirage_jax (our search, our lowering)"),
            Patch(facecolor=IMPORTED_COLOR, hatch="//", edgecolor="white",
                  label="original Mirage's µGraph, our lowering (its own form)"),
        ],
        fontsize=7,
        loc="lower center",
        ncols=2,
        frameon=False,
    )  # fmt: skip
    if results.get("timed"):
        title = f"mirage_jax on {results.get('device', '?')} ({results.get('date', '')})"
    else:
        title = f"mirage_jax --quick on {results.get('device', '?')}: not timed, nothing to plot"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _why_missing(r: dict) -> str:
    ours = [c for c in r.get("contenders", []) if c.get("kind") == "ours"]
    if not ours:
        return "no µGraph"
    if any(c.get("status") == "ok (not timed)" for c in ours):
        return "not timed"
    return "no µGraph" if any("no verified" in c.get("status", "") for c in ours) else "n/a"


# ---------------------------------------------------------------------------- table
def _fmt(x: float | None, spec: str = ".1f", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _time(c: dict, key: str = "time") -> str:
    t = c.get(key)
    if not t:
        return "–"
    return f"{t['median_us']:.1f} [{t['p10_us']:.1f}–{t['p90_us']:.1f}]"


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown: headline, main table, every contender, the original's claims."""
    rows = results.get("benchmarks", [])
    s = results.get("summary") or summary(results)
    bw = (results.get("bandwidth") or {}).get("bytes_per_s")
    lines = [
        f"# mirage_jax reproduction: {results.get('device', '?')}, {results.get('date', '')}",
        "",
        f"Written by `experiments/reproduce.py` (`{results.get('command', '')}`); plan "
        f"`{(results.get('plan') or {}).get('file', '')}`. Method: {results.get('method', '')}",
        "",
    ]
    if not results.get("complete", True):
        lines += ["**Incomplete run:** the time limit cut it short (see each row).", ""]
    if results.get("timed"):
        lines.append(
            f"**Headline:** our best µGraph against the best baseline of each benchmark: "
            f"geometric mean {_fmt(s.get('geomean_speedup'), '.2f')}x over "
            f"{s.get('timed_benchmarks')} benchmarks, up to {_fmt(s.get('max_speedup'), '.2f')}x "
            f"({s.get('max_at')}); faster than every baseline on "
            f"{s.get('faster_than_best_baseline')}. Copy bandwidth measured: "
            f"{_fmt(bw and bw / 1e12, '.2f')} TB/s."
        )
        for b, v in s.get("by_batch", {}).items():
            lines.append(
                f"- b={b}: geomean {_fmt(v['geomean_speedup'], '.2f')}x, max "
                f"{_fmt(v['max_speedup'], '.2f')}x ({v['max_at']}), "
                f"{v['faster_than_best_baseline']}/{v['timed']} faster than the best baseline"
            )
    else:
        lines.append("**Not timed** (`--quick` or no GPU): correctness of every path only.")
    legend = (
        "Speedup = best baseline time / our best µGraph's time; floor = bytes read once and "
        "written once at the measured bandwidth. `mirage_jax.jit` runs XLA where no µGraph "
        "beats it (`jit µs`). Times are medians in µs [p10–p90]."
        if results.get("timed")
        else "Nothing was timed or measured here, so the time, speedup and floor columns are "
        "empty; each contender's status says whether it lowered and matched the float64 "
        "reference."
    )
    lines += [
        "",
        legend,
        "",
        "| benchmark | b | ours µs | best baseline | XLA µs | speedup | jit µs | floor µs "
        "| floor/ours | original's µGraph µs (speedup) | bound | search |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = next(
            (c for c in r["contenders"] if c.get("kind") == "ours"
             and r.get("ours") and c["label"] == r["ours"]["label"]), None,
        )  # fmt: skip
        base = r.get("best_baseline")
        bound = None
        if ours and ours.get("candidates"):
            bound = max(c["verification"].get("bound", 0) for c in ours["candidates"])
        srch = "; ".join(
            f"{x.get('stop_reason')} {x.get('seconds')}s, {x.get('candidates')} kept"
            for x in r.get("search", [])
        )
        lines.append(
            f"| {r['name']} | {r['batch']} | {_time(ours) + _short(ours) if ours else _ours_status(r)} "
            f"| {base['label'] + ' ' + _fmt(base['us']) if base else '–'} "
            f"| {_fmt(r.get('xla_us'))} | {_fmt(r.get('speedup'), '.2f')} "
            f"| {_fmt(r.get('jit_us'))} | {_fmt(r.get('floor_us'), '.2f')} "
            f"| {_fmt(r.get('fraction_of_floor'), '.2f')} "
            f"| {_imported_cell(r)} "
            f"| {_fmt(bound, '.1e')} | {srch} |"
        )
    versus = [(r, b, v) for r in rows for b, v in (r.get("vs_original") or {}).items()]
    if versus:
        lines += [
            "",
            "## Searched against the original's µGraphs, per backend",
            "",
            "Our best searched µGraph and the original's best imported µGraph, lowered with the "
            "same backend and timed in the same run (ratio > 1: ours is faster).",
            "",
            "| benchmark | b | backend | ours µs | original's µs | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r, b, v in versus:
            lines.append(
                f"| {r['name']} | {r['batch']} | {b} | {_fmt(v['ours_us'])} ({v['ours']}) "
                f"| {_fmt(v['original_us'])} ({v['original']}) | {_fmt(v['ratio'], '.2f')} |"
            )
    other = next(
        (k for r in rows for c in r["contenders"] for k in c if k.startswith("time_")), None
    )
    lines += [
        "",
        "## Every contender",
        "",
        "| benchmark | b | contender | form | µs [p10–p90] | "
        + (f"{other.removeprefix('time_')} µs | " if other else "")
        + "rel err | status |",
        "|---|---|---|---|---|---|---|" + ("---|" if other else ""),
    ]
    for r in rows:
        for c in r["contenders"]:
            extra = f"{_time(c, other)} | " if other else ""
            lines.append(
                f"| {r['name']} | {r['batch']} | {c['label']} | {c.get('form', '')} "
                f"| {_time(c)} | {extra}{_fmt(c.get('rel_err'), '.1e')} | {c.get('status', '')} |"
            )
    lines += [
        "",
        "The original's µGraphs (github.com/mirage-project/mirage, its `evaluation` branch, "
        "h100) are lowered "
        "through our backends and timed on their own program form (the original's: no "
        "eps, unscaled attention, QKNorm on Q and V) at the same shapes; LoRA and GatedMLP only "
        "at b=1, where the shapes agree.",
        "",
        "## The original's reported figures (quoted as reported, not measured here)",
        "",
    ]
    lines += [f"- {x['claim']} ({x['source']})" for x in results.get("reported", REPORTED)]
    return "\n".join(lines) + "\n"


def _imported_cell(r: dict) -> str:
    imp = r.get("imported_best")
    if imp:
        return f"{_fmt(imp['us'])} ({_fmt(imp.get('speedup'), '.2f')})"
    status = (r.get("imported_plan") or {}).get("status", "")
    if status == "ok":  # planned but not timed (lowering or float check failed)
        cs = [c for c in r.get("contenders", []) if c.get("kind") == "imported"]
        status = cs[0].get("status", "") if cs else ""
    return "– " + f"({status})" if status else "–"


def _short(c: dict) -> str:
    """ " (#1 triton)" from "mirage_jax #1 (triton)"."""
    label = c["label"].removeprefix("mirage_jax ").replace("(", "").replace(")", "")
    return f" ({label})"


def _ours_status(r: dict) -> str:
    ours = [c for c in r["contenders"] if c.get("kind") == "ours"]
    return ours[0].get("status", "–") if ours else "–"


def write(results: dict[str, Any], out_dir: str | Path, stem: str) -> list[Path]:
    """Write `<stem>.md`, and `<stem>.png`/`.svg` where matplotlib imports; the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    md.write_text(markdown(results), encoding="utf-8")
    written = [md]
    try:
        fig = figure(results)
    except ImportError:
        return written
    for ext in ("png", "svg"):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, format=ext, metadata={"Date": None} if ext == "svg" else None)
        written.append(p)
    return written
