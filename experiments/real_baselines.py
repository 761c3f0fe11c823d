"""The real-model set against every baseline, in one run: jax.jit, mirage_jax.jit, library attention.

For each model of `experiments/models` (`--models`, `--sizes`) at each `--model-batches`, in
one process and on the same inputs (the model's `make(seed)` sets):

- `jax.jit(fn)`: the reference every other contender is checked against and divided by;
- `mirage_jax.jit(fn)` with an empty cache and its own search (`never_slower.measure`);
- `jax.jit` of the same block with its attention core computed by a library kernel
  (`experiments.models.attention`): cuDNN through `jax.nn.dot_product_attention`, Pallas
  `decode_attention.gqa` (decode steps only), tokamax (mosaic, triton) where it imports.

Each contender's outputs are compared with jax.jit's (`never_slower._max_rel`, tolerance by
dtype) and it is timed by `mirage_jax.profile.time_trace` (device time from a profiler trace,
median over calls with rotating input sets). One row per model × batch × contender is appended
to `<out>/real_baselines.json` and `.md` as it finishes; a contender that does not apply gives
a row saying why, one that fails a row with its error. `--resume` keeps the rows already there
(errors are tried again); `--stop-after-s` starts no row after that many seconds (one always
runs), so a run under a time limit keeps what it measured. The figure (`.png`, `.svg`): speedup
over jax.jit per model × batch, one bar per contender.

    python -m experiments.real_baselines --models all --sizes realistic --model-batches 1 8 \\
        --out experiments/results --calls 30 --stop-after-s 420 --resume       # GPU
    python -m experiments.real_baselines --models all --sizes tiny --check-only --out /tmp/r
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from experiments import never_slower
from experiments.models import attention as attn
from mirage_jax.search.workers import default_workers

NAME = "real_baselines"
"""Stem of the files written under --out."""
ATTENTIONS = ("cudnn", "pallas_decode", "tokamax_mosaic", "tokamax_triton")
"""The library attention kernels timed by default (`attention.IMPLEMENTATIONS` lists all)."""
CONTENDERS = ("jax.jit", "mirage_jax.jit", *ATTENTIONS)
LABELS = {
    "jax.jit": "jax.jit",
    "mirage_jax.jit": "mirage_jax.jit (fresh cache)",
    "xla": "jax.nn attention (xla)",
    "cudnn": "cuDNN attention",
    "pallas_decode": "Pallas decode_attention",
    "tokamax_mosaic": "tokamax attention (mosaic)",
    "tokamax_triton": "tokamax attention (triton)",
}
"""How each contender is named in the table and the figure."""
COLORS = {"mirage_jax.jit": "C3", "xla": "C7", "cudnn": "C0", "pallas_decode": "C2",
          "tokamax_mosaic": "C1", "tokamax_triton": "C4"}  # fmt: skip
Timer = Callable[..., Any]
"""`profile.time_trace`'s signature: timer(fn, inputs(seed) -> args, calls=N) -> a Timing."""


def _err(e: BaseException, limit: int = 400) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check(got: Any, want: Any, dtype: str) -> dict[str, Any]:
    """The float check against jax.jit's outputs, as never_slower makes it."""
    err = never_slower._max_rel(got, want)
    tol = never_slower.TOL.get(dtype, 2e-2)
    return {"max_rel_error": err, "tolerance": tol, "matches": bool(err <= tol)}


def _timed(timer: Timer | None, fn: Any, inputs: Any, calls: int) -> dict[str, Any]:
    if timer is None:
        return {"status": "checked"}
    t = timer(fn, inputs, calls=calls)
    return {"status": "ok", "median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us}


def measure_jax(model: Any, inputs: Any, timer: Timer | None, calls: int) -> tuple[dict, Any]:
    """The jax.jit row of `model` and its outputs on input set 0 (what the others must match)."""
    ref = jax.jit(model.fn)
    want = jax.block_until_ready(ref(*inputs(0)))
    row = {"max_rel_error": 0.0, "tolerance": 0.0, "matches": True}
    return {**row, **_timed(timer, ref, inputs, calls)}, want


def measure_attention(
    model: Any, impl: str, inputs: Any, want: Any, timer: Timer | None, calls: int
) -> dict[str, Any]:
    """The row of `model` with its attention by `impl`: not applicable, checked and timed."""
    reason = model.not_applicable(impl)
    if reason is not None:
        return {"status": "n/a", "reason": reason}
    fn = jax.jit(model.with_attention(impl).fn)
    got = jax.block_until_ready(fn(*inputs(0)))
    return {**_check(got, want, str(model.dtype)), **_timed(timer, fn, inputs, calls)}


def measure_mirage(
    model: Any, inputs: Any, timer: Timer, args: argparse.Namespace
) -> dict[str, Any]:
    """The mirage_jax.jit row: a fresh cache, its own search (`never_slower.measure`)."""
    r = never_slower.measure(model.key, model.fn, inputs, str(model.dtype), args, timer=timer)
    keep = ("first_call_s", "kernels", "regions", "function_check", "warnings")
    return {
        "status": "ok",
        "median_us": r["mirage_us"],
        "p10_us": r["mirage_p10_p90"][0],
        "p90_us": r["mirage_p10_p90"][1],
        "max_rel_error": r["max_rel_error"],
        "tolerance": r["tolerance"],
        "matches": r["matches"],
        "jax_jit_us_same_call": r["jax_jit_us"],
        **{k: r[k] for k in keep},
    }


def cases(
    names: Sequence[str], sizes: Sequence[str], batches: Sequence[int], dtype: str | None = None
) -> list[Any]:
    """The models to run, in table order: each size, then each model, then each batch (in
    `dtype`, default each size's)."""
    from experiments import models as M

    names = M.names() if list(names) == ["all"] else list(names)
    return [M.get(n, batch=b, size=s, dtype=dtype) for s in sizes for n in names for b in batches]


def _speedups(doc: dict) -> None:
    """Each timed row's speedup over the jax.jit row of the same model × batch."""
    base = {
        r["case"]: r["median_us"]
        for r in doc["rows"]
        if r["contender"] == "jax.jit" and r.get("median_us")
    }
    for r in doc["rows"]:
        b, t = base.get(r["case"]), r.get("median_us")
        r["speedup"] = b / t if b and t else None


def method(calls: int | None, workers: int, options: dict | None = None) -> str:
    """The method paragraph of the table."""
    timing = (
        "not timed (--check-only or no GPU): every contender built and checked only"
        if calls is None
        else f"device time per call, `mirage_jax.profile.time_trace` (the sum of the GPU's "
        f"kernel durations per call from a profiler trace, each call alone, rotating input "
        f"sets; median and p10/p90 of {calls} calls)"
    )
    return (
        f"Method: {timing}. All contenders of a model × batch run in one process on the same "
        f"inputs (`Model.make(seed)`); each output is checked against jax.jit's on input set 0 "
        f"(max error relative to each output's magnitude; tolerance "
        f"{', '.join(f'{k} {v:g}' for k, v in never_slower.TOL.items())}). mirage_jax.jit: an "
        f"empty cache and its own search ({workers} workers, default budget"
        f"{f', options {options}' if options else ''}), first call by "
        f"wall clock. Library attention: the same block under jax.jit with its attention core "
        f"(after RoPE and the cache write, before the output projection) computed by the "
        f"kernel, GQA without repeating K/V, the decode mask as valid lengths pos + 1 "
        f"(`experiments/models/attention.py`); speedup = jax.jit's time / the contender's."
    )


def new_doc(args: argparse.Namespace) -> dict:
    """An empty results document: date, machine, versions, method."""
    from experiments.reproduce_common import versions
    from experiments.reproduce_time import machine_name

    device = str(getattr(jax.devices()[0], "device_kind", jax.devices()[0].platform))
    timed = not args.check_only
    return {
        "date": _dt.date.today().isoformat(),
        "machine": {"device": device, "name": machine_name(device)},
        "versions": versions(),
        "method": method(args.calls if timed else None, args.workers, never_slower.options(args)),
        "calls": args.calls if timed else None,
        "workers": args.workers,
        "options": never_slower.options(args),
        "rows": [],
    }


def _fmt_us(r: dict) -> str:
    if r.get("median_us") is None:
        return "–"
    return f"{r['median_us']:.2f} ({r['p10_us']:.1f}–{r['p90_us']:.1f})"


def _fmt_result(r: dict) -> str:
    if r["status"] in ("n/a", "skipped"):
        return f"{r['status']}: {r['reason']}"
    if r["status"] == "error":
        return "error: " + r["error"]
    note = "" if r.get("matches", True) else f"MISMATCH (max rel {r['max_rel_error']:.2e}) "
    if r.get("first_call_s") is not None:
        note += f"first call {r['first_call_s']} s, {r['kernels']} kernel(s)"
    return note.strip() or "matches"


def markdown(doc: dict) -> str:
    """The results table."""
    from experiments.reproduce_common import commit_label

    m = doc["machine"]
    v = doc.get("versions", {})
    lines = [
        f"# Real models against jax.jit, mirage_jax.jit and library attention ({doc['date']}, "
        f"{m['device']})",
        "",
        doc["method"],
        "",
        f"jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, tokamax {v.get('tokamax')}, cuDNN "
        f"{v.get('cudnn')}, commit {commit_label(v)}.",
        "",
        "| model | size | batch | contender | µs (p10–p90) | speedup over jax.jit | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        sp = f"{r['speedup']:.3f}×" if r.get("speedup") else "–"
        lines.append(
            f"| {r['model']} | {r['size']} | {r['batch']} | {LABELS.get(r['contender'], r['contender'])} "
            f"| {_fmt_us(r)} | {sp} | {_fmt_result(r).replace('|', '/')} |"
        )
    if doc.get("stopped"):
        lines += ["", f"Stopped: {doc['stopped']}."]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> None:
    """The JSON and the table, rewritten whole after every row."""
    _speedups(doc)
    (out / f"{NAME}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False))
    (out / f"{NAME}.md").write_text(markdown(doc))


def figure(doc: dict, out: Path) -> list[Path]:
    """Grouped bars: speedup over jax.jit per model × batch, one bar per contender (png, svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _speedups(doc)
    groups = list(dict.fromkeys(r["case"] for r in doc["rows"]))
    shown = [c for c in dict.fromkeys(r["contender"] for r in doc["rows"]) if c != "jax.jit"]
    by = {(r["case"], r["contender"]): r for r in doc["rows"]}
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.15 * len(groups) * (len(shown) + 1)), 4.2))
    for j, c in enumerate(shown):
        xs, ys = [], []
        for i, g in enumerate(groups):
            r = by.get((g, c))
            x = i - 0.4 + width * (j + 0.5)
            if r is not None and r.get("speedup"):
                xs.append(x)
                ys.append(r["speedup"])
            elif r is not None:  # not applicable, failed or untimed: marked, no bar
                ax.text(x, 0.02, "n/a" if r["status"] == "n/a" else "×", ha="center",
                        va="bottom", fontsize=6, rotation=90)  # fmt: skip
        if xs:
            ax.bar(xs, ys, width, label=LABELS.get(c, c), color=COLORS.get(c))
        else:  # no bar to carry the colour: the legend still names the contender, marked ×
            ax.bar([0], [0], 0, label=f"{LABELS.get(c, c)} (×)", color=COLORS.get(c))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="jax.jit")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g.replace("_", " ") for g in groups], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speedup over jax.jit (device time)")
    ax.set_title(
        f"Real models, {doc['machine']['device']}, {doc['date']}\n"
        "(n/a: does not apply; ×: failed or not timed)",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths = [out / f"{NAME}.png", out / f"{NAME}.svg"]
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def _kept(args: argparse.Namespace) -> set[str]:
    """Row statuses `--resume` keeps: errors are tried again, untimed rows by a timed run."""
    return {"ok", "n/a"} | ({"checked", "skipped"} if args.check_only else set())


def _measure(
    c: str,
    model: Any,
    inputs: Any,
    want: Any,
    timer: Timer | None,
    args: argparse.Namespace,
    mirage: Callable[..., dict],
) -> dict:
    """One contender's row fields, given jax.jit's outputs `want`."""
    if c == "mirage_jax.jit":
        if timer is None:
            return {
                "status": "skipped",
                "reason": "mirage_jax.jit selects by device time: timed runs only",
            }
        return mirage(model, inputs, timer, args)
    return measure_attention(model, c, inputs, want, timer, args.calls)


def run(
    args: argparse.Namespace,
    timer: Timer | None = None,
    mirage: Callable[..., dict] | None = None,
) -> dict:
    """Measure every missing row of `args` (see `parse`), writing after each; the document.

    `timer` defaults to `profile.time_trace` (none with --check-only); `mirage` to
    `measure_mirage` (tests pass stand-ins for both).
    """
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{NAME}.json"
    if timer is None and not args.check_only:
        from mirage_jax.profile import time_trace

        timer = time_trace
    mirage = measure_mirage if mirage is None else mirage
    doc = json.loads(path.read_text()) if args.resume and path.exists() else new_doc(args)
    doc["rows"] = [r for r in doc["rows"] if r["status"] in _kept(args)]
    doc.pop("stopped", None)
    done = {r["key"] for r in doc["rows"]}
    models = cases(args.models, args.sizes, args.model_batches, args.dtype)
    contenders = ["jax.jit", *[c for c in args.contenders if c != "jax.jit"]]
    t0, measured = time.perf_counter(), 0
    for model in models:
        todo = [c for c in contenders if f"{model.key}/{c}" not in done]
        if not todo:
            continue
        inputs = functools.lru_cache(maxsize=None)(lambda s, m=model: m.make(s).args)
        want = None
        if "jax.jit" not in todo:  # resumed: jax.jit's outputs again, untimed
            try:
                want = jax.block_until_ready(jax.jit(model.fn)(*inputs(0)))
            except Exception as e:
                print(f"{model.key}: jax.jit failed: {_err(e)}", flush=True)
        for c in todo:
            late = args.stop_after_s is not None and time.perf_counter() - t0 > args.stop_after_s
            if late and measured:  # one row always runs, so repeated runs make progress
                doc["stopped"] = f"time limit ({args.stop_after_s} s) before {model.key}/{c}"
                print(f"stopping: {doc['stopped']}", flush=True)
                break
            t1 = time.perf_counter()
            try:
                if c == "jax.jit":
                    row, want = measure_jax(model, inputs, timer, args.calls)
                elif want is None:
                    row = {"status": "error", "error": "jax.jit failed: nothing to check against"}
                else:
                    row = _measure(c, model, inputs, want, timer, args, mirage)
            except Exception as e:  # a failing contender is a row, never the end of the run
                row = {"status": "error", "error": _err(e)}
            row = {
                "key": f"{model.key}/{c}",
                "case": model.key,
                "model": model.name,
                "size": model.size,
                "batch": model.batch,
                "contender": c,
                "seconds": round(time.perf_counter() - t1, 2),
                **row,
            }
            doc["rows"].append(row)
            measured += 1
            write(doc, out)
            print(f"{row['key']:>44}  {_fmt_us(row):>24}  {_fmt_result(row)[:100]}", flush=True)
        if doc.get("stopped"):
            break
    _sort(doc, [m.key for m in models])
    write(doc, out)
    return doc


def _sort(doc: dict, keys: Sequence[str]) -> None:
    """Rows in table order: `keys` (cases), then CONTENDERS; rows of other runs last."""
    order = {k: i for i, k in enumerate(keys)}
    names = [*CONTENDERS, *attn.IMPLEMENTATIONS]
    doc["rows"].sort(
        key=lambda r: (
            order.get(r["case"], len(order)),
            r["case"],
            names.index(r["contender"]) if r["contender"] in names else len(names),
        )
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["all"], help="model names, or 'all'")
    p.add_argument("--sizes", nargs="+", default=["realistic"])
    p.add_argument("--model-batches", nargs="+", type=int, default=[1, 8])
    p.add_argument(
        "--dtype", default=None, help="the models' dtype (default: each size's; bfloat16, ...)"
    )
    p.add_argument(
        "--contenders",
        nargs="+",
        default=list(CONTENDERS),
        choices=["jax.jit", "mirage_jax.jit", *attn.IMPLEMENTATIONS[1:]],
        help="what to time beside jax.jit (default: %(default)s)",
    )
    p.add_argument("--calls", type=int, default=30, help="calls per profiler trace")
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),  # mirage_jax.jit's, recorded as the number it is here
        help="search workers (default: mirage_jax.jit's, %(default)s here)",
    )
    p.add_argument("--out", default="experiments/results")
    p.add_argument(
        "--stop-after-s", type=float, default=None, help="start no row after this (one always runs)"
    )
    p.add_argument("--resume", action="store_true", help="keep the rows already in the file")
    p.add_argument("--check-only", action="store_true", help="build and check, time nothing")
    p.add_argument("--figure-only", action="store_true", help="redraw the figure from the JSON")
    never_slower.add_reread(p)
    args = p.parse_args(argv)
    if not args.check_only and not args.figure_only and jax.default_backend() != "gpu":
        print("no GPU: --check-only (contenders built and checked, nothing timed)", flush=True)
        args.check_only = True
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run, then draw the figure."""
    args = parse(argv)
    out = Path(args.out)
    doc = json.loads((out / f"{NAME}.json").read_text()) if args.figure_only else run(args)
    try:
        for p in figure(doc, out):
            print(f"wrote {p}")
    except ImportError as e:
        print(f"no figure: {_err(e)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
