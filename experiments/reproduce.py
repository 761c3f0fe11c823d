"""Reproduce the paper's figure: search on the CPU, time every contender on the GPU, draw it.

Three phases, each run where its dependencies are (the GPU machine has jax, numpy and
matplotlib, but no galois, egglog or network):

- ``--phase search`` (CPU): per benchmark of the suite, capture and partition it and search
  each Lax region, or reuse a previous plan's entry for the same program hash and options;
  µGraphs of mirage_jax's kernel cache for the region join as candidates. The best
  ``--candidates`` K by the cost model that plan, lower for CUDA (`export_for_gpu`) and are
  verified at full size are kept. The original's µGraphs for the benchmark (``--peer``) are
  ranked the same way and the kept ones verified; only their file, index and hash go into the
  plan, never the µGraphs. Writes ``plan-<date>.json``.
- ``--phase time`` (GPU): reads the plan, lowers the candidates (Pallas; jax-triton where
  importable), builds the baselines (XLA, cuDNN attention, the Pallas reference ops, tokamax
  where importable) and imports the original's µGraphs from ``--peer``; checks every contender
  against the float64 reference; times them all with `mirage_jax.profile.time_device`; writes
  ``<machine>-<date>.json`` and ``.md``, and ``.png``/``.svg`` where matplotlib imports.
- ``--phase figure``: redraws the table and the figure from a results file.
- ``--phase real`` (GPU): the real-model set (`experiments/models`) against jax.jit, a fresh
  mirage_jax.jit, cuDNN, Pallas decode and tokamax attention (`experiments.real_baselines`).

``--quick`` runs search and time on the CPU at reduced shapes (`Benchmark.small`) with a small
budget, Pallas in interpret mode and no timing: every path runs (CI), nothing is measured.

    python -m experiments.reproduce --quick --out /tmp/q           # CI: the whole path, CPU
    python -m experiments.reproduce --phase search                 # here: writes the plan
    python -m experiments.reproduce --phase time --peer build/peer --out $OUT   # on the GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401

from experiments.reproduce_common import QUICK_OUT, RESULTS
from experiments.reproduce_search import phase_search
from experiments.reproduce_time import _has_gpu, _load_plan, phase_time


# ---------------------------------------------------------------------------- figure phase
def phase_figure(args: argparse.Namespace) -> list[Path]:
    """Redraw the table and the figure of a results file (default: the newest)."""
    from experiments import figures

    path = Path(args.results) if args.results else figures.newest_results(args.out)
    if path is None:
        raise SystemExit(f"reproduce: no results file in {args.out}")
    results = json.loads(path.read_text())
    results["summary"] = figures.summary(results)
    written = figures.write(results, Path(args.out) if args.out_given else path.parent, path.stem)
    for p in written:
        print(f"wrote {p}")
    return written


# ---------------------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `python -m experiments.reproduce` / `mirage-jax reproduce`."""
    p.add_argument("--phase", choices=("search", "time", "figure", "real", "all"), default="all",
                   help="search (CPU: writes the plan), time (GPU: reads the plan, writes the "
                   "results), figure (redraws from a results file), real (GPU: the real-model "
                   "baselines, experiments.real_baselines), all (search then time; the default)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="CPU smoke run: reduced shapes, small budget, Pallas interpret mode, "
                   "float checks only, no timing (CI)")  # fmt: skip
    p.add_argument(
        "--names",
        nargs="+",
        metavar="NAME",
        help="benchmark names (default: experiments.benchmarks.PAPER_NAMES)",
    )
    p.add_argument(
        "--batches",
        nargs="+",
        type=int,
        metavar="B",
        help="batch sizes (default: 1 8 16; --quick: 1)",
    )
    p.add_argument(
        "--plan",
        metavar="PATH",
        help="the plan file (search writes, time reads; "
        "default: experiments/results/plan-<date>.json / the newest plan-*.json)",
    )
    p.add_argument("--results", metavar="PATH", help="figure phase: the results JSON")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where results, table and figure go "
        "(default experiments/results/; --quick: build/reproduce-quick/)",
    )
    p.add_argument(
        "--peer",
        metavar="DIR",
        help="the original's µGraph checkpoints: a clone of the evaluation branch of "
        "github.com/mirage-project/mirage, or a folder with h100/*.json (default: "
        "$MIRAGE_PEER_DIR, else build/peer)",
    )
    p.add_argument(
        "--budget-s", type=float, help="search budget per region, s (default 120; --quick: 10)"
    )
    p.add_argument(
        "--candidates", type=int, help="our µGraphs kept per region (default 3; --quick: 2)"
    )
    p.add_argument(
        "--imported", type=int, help="original's µGraphs kept per benchmark (default 2; --quick: 1)"
    )
    p.add_argument(
        "--workers", type=int, default=1, help="search worker processes (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="search and verification seed (default: %(default)s)"
    )
    p.add_argument(
        "--reuse",
        nargs="?",
        const=True,
        default=True,
        metavar="PLAN",
        help="reuse entries of PLAN (default: the newest plan) whose program hash "
        "and search options match",
    )
    p.add_argument("--no-reuse", dest="reuse", action="store_false", help="search everything")
    p.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also take µGraphs from mirage_jax's kernel cache (default path if no PATH)",
    )
    p.add_argument(
        "--gpu-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lower each kept candidate for CUDA here (jax.export) before planning it "
        "(default: on)",
    )
    p.add_argument(
        "--triton-candidates",
        type=int,
        default=9,
        help="time phase: candidates also lowered through jax-triton (default 9: all)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=("trace", "chained"),
        default=["trace", "chained"],
        help="time phase: timing methods, the first is the headline (default: trace chained)",
    )
    p.add_argument(
        "--calls", type=int, default=30, help="calls per profiler trace (default: %(default)s)"
    )
    p.add_argument(
        "--chain",
        type=int,
        default=32,
        help="calls per chained timing program (default: %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=25,
        help="timing repeats (median, p10/p90) (default: %(default)s)",
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed runs before timing (default: %(default)s)"
    )
    p.add_argument(
        "--merge",
        metavar="RESULTS",
        help="time phase: also keep the rows of this earlier results file (same "
        "device) that this run does not time, e.g. after a run split by --batches",
    )
    p.add_argument("--deadline-s", type=float, default=500.0,
                   help="time phase: stop timing after this many seconds and write what was "
                   "timed (default: %(default)s s; keep it below any time limit the run is under, "
                   "so that its results are saved)")  # fmt: skip
    return p


def _defaults(
    args: argparse.Namespace, argv: Sequence[str] | None, prog: str
) -> argparse.Namespace:
    from experiments.benchmarks import PAPER_NAMES

    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.argv[:1] == ["reproduce"]:  # called as `mirage-jax reproduce ...`
        args.argv = args.argv[1:]
    args.prog = prog
    args.out_given = args.out is not None
    args.out = Path(args.out) if args.out else (QUICK_OUT if args.quick else RESULTS)
    args.plan_dir = RESULTS
    if args.phase in ("search", "all"):
        args.names = args.names or list(PAPER_NAMES)
        args.batches = args.batches or ([1] if args.quick else [1, 8, 16])
    args.budget_s = args.budget_s or (10.0 if args.quick else 120.0)
    args.candidates = args.candidates or (2 if args.quick else 3)
    args.imported = args.imported if args.imported is not None else (1 if args.quick else 2)
    if args.quick:
        args.reuse = False if args.reuse is True else args.reuse
    return args


def run(
    args: argparse.Namespace,
    argv: Sequence[str] | None = None,
    prog: str = "python -m experiments.reproduce",
) -> int:
    """Run the phases `args.phase` names (`args` from a parser given `add_arguments`)."""
    args = _defaults(args, argv, prog)
    if args.phase in ("time", "all") and not args.quick and not _has_gpu():
        plan_quick = args.phase == "time" and _load_plan(args)[1].get("quick")
        if not plan_quick:
            raise SystemExit(
                f"{prog}: --phase {args.phase} times on a GPU and this machine has none: run "
                "--phase search here and --phase time on the GPU, or --quick (CPU, untimed)"
            )
    if args.phase == "figure":
        phase_figure(args)
        return 0
    if args.phase == "real":  # resumes, so a run cut by --deadline-s is continued by the next
        from experiments import real_baselines

        argv = ["--out", str(args.out), "--calls", str(args.calls), "--resume"]
        return real_baselines.main([*argv, "--stop-after-s", str(args.deadline_s)])
    if args.phase in ("search", "all"):
        args.plan = str(phase_search(args))
    if args.phase in ("time", "all"):
        phase_time(args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="python -m experiments.reproduce",
            description=(__doc__ or "").split("\n\n")[0],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return run(parser.parse_args(argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
