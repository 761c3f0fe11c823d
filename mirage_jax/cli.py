"""The `mirage-jax` command line: optimize, explain, bench, cache, reproduce."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mirage_jax.cli_args import (
    CommandError,
    Parser,
    UsageError,
    at_least_one,
    function_and_args,
    one_line,
    os_reason,
    positive_seconds,
    static_argnums,
)
from mirage_jax.cli_args import parse_arg as parse_arg  # the tests' import
from mirage_jax.cli_cache import (
    cache_clear,
    cache_export,
    cache_import,
    cache_ls,
    cache_path,
    cache_show,
    open_cache,
)
from mirage_jax.lower import backends

TRACEBACK_VAR = "MIRAGE_JAX_TRACEBACK"
"""Set it to 1 to get the traceback of an unexpected error instead of its one-line message."""
ARG_HELP = (
    "one positional argument of FUNCTION, in order: an array spec DTYPE[d0,d1,...] "
    "(f16, bf16, f32, f64, i32, ... or a numpy name; f32[] is a scalar), or a Python literal "
    "(int, float, string, tuple), which is passed as a static value"
)
BACKEND_HELP = "kernel backend: " + backends.describe() + " (default: %(default)s)"
SEARCH_HELP = (
    "cached: read the cache only; auto: also search each region missing from it; "
    "off: plain XLA (default: %(default)s)"
)
CACHE_HELP = (
    "the cache database (default: $MIRAGE_JAX_CACHE, else "
    "$XDG_CACHE_HOME/mirage_jax/cache.sqlite, i.e. ~/.cache/mirage_jax/cache.sqlite)"
)


# ---------------------------------------------------------------------- optimize
def _optimize(args: argparse.Namespace) -> int:
    import mirage_jax
    from mirage_jax.explain import _region_lines

    if args.models is not None or args.ray != "off":
        return _optimize_many(args)
    if args.target is None:
        raise UsageError("give MODULE:FUNCTION (with --arg specs), or --models NAMES")
    fn, values = function_and_args(args.target, args.arg or [])
    cache = open_cache(args)
    cache.check_writable()  # before the search: its results would be lost
    record = mirage_jax.superoptimize(
        fn,
        *values,
        backend=args.backend,
        budget_s=math.inf if args.reproducible else args.budget_s,
        max_candidates=args.max_candidates,
        cache=cache,
        seed=args.seed,
        workers=args.workers,
        static_argnums=static_argnums(values) or None,
        progress=not args.quiet,
    )
    if record.error:
        raise CommandError(f"capture failed: {record.error}")
    searched = [d for d in record.decisions if d.source == "search" and d.mugraph is not None]
    lost = [d for d in searched if not d.cache_key or cache.get_raw(d.cache_key) is None]
    if cache.failed_writes or lost:
        why = f": {one_line(cache.failed_writes[0])}" if cache.failed_writes else ""
        raise CommandError(
            f"{max(len(cache.failed_writes), len(lost))} search result(s) were not stored in "
            f"{cache.path}{why}; this run's results will not be found again"
        )
    n = len(record.decisions)
    kernels = sum(d.status == "kernel" for d in record.decisions)
    print(f"# {record.name}: {n} region(s), {kernels} fused kernel(s); cache {cache.path}")
    for d in record.decisions:
        for line in _region_lines(d):
            print(_flags(line))
    open_regions = [d for d in record.decisions if "trivial" not in d.reason]
    if open_regions and all(d.source == "none" for d in open_regions):
        print(
            f"mirage-jax optimize: nothing was optimised: {_flags(open_regions[0].reason)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _optimize_many(args: argparse.Namespace) -> int:
    """`optimize --models ...` (or `--ray`): many functions and shapes (`mirage_jax.zoo`)."""
    from mirage_jax import zoo
    from mirage_jax.ray_backend import RayUnavailable
    from mirage_jax.search.workers import default_workers

    jobs: list[Any] = []
    if args.target is not None:
        fn, values = function_and_args(args.target, args.arg or [])
        jobs.append(zoo.Job(args.target, fn, tuple(values)))
    if args.models is not None:
        _experiments("optimize --models", "models")
        names = [n for n in args.models.split(",") if n]
        try:
            jobs += zoo.model_jobs(names, tuple(args.batch or (1, 8)), args.size)
        except (KeyError, ValueError) as e:
            raise UsageError(one_line(e.args[0] if e.args else e)) from None
    cache = open_cache(args)
    cache.check_writable()  # before the search: its results would be lost
    try:
        report = zoo.optimize_many(
            jobs, backend=args.backend, budget_s=args.budget_s, cache=cache, seed=args.seed,
            workers=args.workers or default_workers(), ray=args.ray, progress=not args.quiet,
            reproducible=args.reproducible, max_candidates=args.max_candidates,
        )  # fmt: skip
    except RayUnavailable as e:
        raise CommandError(one_line(e, 1000)) from e
    print(_flags(report.text()))
    print(f"# cache {cache.path}")
    if report.failed:
        return 1
    if report.plan.backend is None and report.results:
        why = _flags(report.plan.why_not)
        print(f"mirage-jax optimize: nothing was optimised: {why}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------- explain
def _explain(args: argparse.Namespace) -> int:
    import mirage_jax

    fn, values = function_and_args(args.target, args.arg or [])
    out = Path(args.svg) if args.svg else None
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CommandError(f"cannot create the picture directory {out}: {os_reason(e)}") from e
    jitted = mirage_jax.jit(
        fn,
        backend=args.backend,
        search=args.search,
        budget_s=args.budget_s,
        cache=open_cache(args),
        workers=args.workers,
        static_argnums=static_argnums(values) or None,
    )
    expl = mirage_jax.explain(jitted, *values, search=args.search)
    print(_flags(expl.text(listing=args.listing)))
    if out is not None:
        _write_pictures(expl, out)
    return 0


def _write_pictures(expl: Any, out: Path) -> None:
    """region<i>.svg in `out` for each region with a µGraph; a line saying why for the rest."""
    from mirage_jax.mugraph import to_svg

    drawn = [d for d in expl.decisions if d.mugraph is not None]
    if not drawn:
        print(f"no picture was written to {out}: {_flags(_why_no_picture(expl))}")
    for d in drawn:
        path = out / f"region{d.index}.svg"
        try:
            svg = to_svg(d.mugraph)
        except Exception as e:  # a picture is optional: the report above stands
            why = f"{type(e).__name__}: {one_line(e)}"
            print(f"no picture of region {d.index} was written: drawing it failed ({why})")
            continue
        try:
            path.write_text(svg, encoding="utf-8")
        except OSError as e:
            raise CommandError(f"cannot write {path}: {os_reason(e)}") from e
        print(f"wrote {path}")


def _why_no_picture(expl: Any) -> str:
    record = expl.record
    if record.error or record.program is None:
        return "the capture failed, so the function runs as plain XLA"
    if not expl.decisions:
        return "the function has no Lax region, so all of it runs as XLA"
    reasons = "; ".join(f"region {d.index}: {d.reason}" for d in expl.decisions)
    return one_line(f"no region has a µGraph, all run as XLA ({reasons})", 1000)


NEEDS_CLONE = (
    "needs the repository's `experiments` package, which a wheel does not install: clone the "
    "repository and install it with `pip install -e .`"
)


def _experiments(command: str, module: str) -> Any:
    """`experiments.<module>` (the benchmarks and reproduction scripts, in an editable install
    of a clone), or a CommandError saying what is missing and how to get it."""
    import importlib

    try:
        return importlib.import_module(f"experiments.{module}")
    except ModuleNotFoundError as e:
        if e.name not in ("experiments", f"experiments.{module}"):
            raise  # a dependency of the module is missing: its own message says which
        raise CommandError(f"{NEEDS_CLONE} ({e})") from e


# ---------------------------------------------------------------------- bench
def _bench(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    import lax_ir

    benchmarks = _experiments("bench", "benchmarks")

    try:
        bench = benchmarks.get(args.name, args.batch)
    except KeyError as e:
        print(f"mirage-jax bench: {e.args[0]}", file=sys.stderr)
        return 2
    if args.small:
        bench = bench.small()
    if args.small:  # the notes describe the full-size shapes
        full = f"; at full size: {bench.notes}" if bench.notes else ""
        print(f"# {bench.key} at --small size (shapes scaled down for a CPU{full})")
    else:
        print(f"# {bench.key}: {bench.notes}" if bench.notes else f"# {bench.key}")
    program = lax_ir.capture(bench.fn, *bench.inputs)
    print(program)
    part = lax_ir.partition(program)
    print()
    print(part.explain())
    print(f"\ncanonical hash: {program.canonical_hash}")
    print(
        f"memory floor: {bench.floor_bytes / 1e6:.2f} MB of inputs and outputs to move, "
        f"{bench.floor_us():.2f} µs at an H100's 3.0 TB/s (no implementation is faster)"
    )
    xs = bench.make_inputs(seed=0) if (args.check or args.jit) else []
    want = bench.reference(*xs) if xs else None

    def error(got: Any) -> float:
        got = np.asarray(got, np.float64)
        return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))

    if args.check:
        err = error(jax.jit(lax_ir.rebuild(part))(*xs))
        print(f"rebuilt function vs float64 reference: max error {err:.2e} (relative to max |ref|)")
    if args.jit:
        import mirage_jax
        from mirage_jax.explain import _region_lines

        f = mirage_jax.jit(bench.fn, backend=args.backend, search=args.search, cache=args.cache)
        t0 = time.perf_counter()
        got = jax.block_until_ready(f(*xs))
        first = time.perf_counter() - t0
        print()
        where = f.cache.path if f.cache is not None else "no cache"
        print(f"first call (capture, cache lookup, search on a miss, lowering): {first:.1f} s")
        print(f"kernel cache: {where}")
        for d in f.last.decisions if f.last else ():
            for line in _region_lines(d):
                print(_flags(line))
        print(f"\nmirage_jax.jit vs float64 reference: max error {error(got):.2e}")
        print(f"jax.jit       vs float64 reference: max error {error(jax.jit(bench.fn)(*xs)):.2e}")
    return 0


# ---------------------------------------------------------------------- reproduce
def _reproduce(args: argparse.Namespace) -> int:
    reproduce = _experiments("reproduce", "reproduce")
    return reproduce.run(args, prog="mirage-jax reproduce")


def _add_reproduce_args(p: argparse.ArgumentParser) -> None:
    try:
        from experiments.reproduce import add_arguments
    except Exception:  # the help text must never fail: without the clone, any arguments
        p.description = f"{p.description} This command {NEEDS_CLONE}."
        p.set_defaults(any_arguments=True)  # reach _reproduce, which says what is missing
        return
    add_arguments(p)


# ---------------------------------------------------------------------- parser
def _add_function_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument(
        "target",
        nargs="?" if optional else None,
        metavar="MODULE:FUNCTION",
        help="the function to optimise: a dotted module path or a .py file, a colon, and the "
        "function's name (e.g. experiments.benchmarks:rmsnorm or experiments/models/sdpa.py:sdpa)",
    )
    p.add_argument("--arg", "-a", action="append", metavar="SPEC", help=ARG_HELP)


def _add_search_args(p: argparse.ArgumentParser, when: str = "", seed: bool = True) -> None:
    """--budget-s, --seed and --workers, with their defaults (those of `mirage_jax.jit`)."""
    from mirage_jax.api import DEFAULT_BUDGET_S

    p.add_argument(
        "--budget-s",
        type=positive_seconds,
        default=DEFAULT_BUDGET_S,
        help=when + "search budget per region, in seconds (> 0; default: %(default)s)",
    )
    if seed:
        p.add_argument("--seed", type=int, default=0, help="search seed (default: %(default)s)")
    from mirage_jax.search.workers import MAX_DEFAULT_WORKERS, default_workers

    p.add_argument(
        "--workers",
        type=at_least_one,
        default=None,
        help=when + "search worker processes (>= 1; default: the CPUs less two, at most "
        f"{MAX_DEFAULT_WORKERS}: {default_workers()} here)",
    )


def _add_many_args(p: argparse.ArgumentParser) -> None:
    """optimize's --models, --size, --batch, --ray (`mirage_jax.zoo`), --reproducible and
    --max-candidates."""
    from mirage_jax.zoo import RAY_MODES

    p.add_argument(
        "--models",
        metavar="NAMES",
        help="optimise models of experiments/models at once, comma-separated, or 'all' "
        "(each distinct region is searched once; regions already cached are skipped)",
    )
    p.add_argument(
        "--size", default="tiny", help="with --models: tiny, realistic or llama7b (default: tiny)"
    )
    p.add_argument(
        "--batch",
        "-b",
        type=at_least_one,
        action="append",
        help="with --models: a batch size; repeat it for several (default: 1 and 8)",
    )
    p.add_argument(
        "--ray",
        choices=RAY_MODES,
        default="off",
        help="off: search with the local process pool (--workers regions at once); auto: "
        "join the running Ray cluster (`ray start --head`); local: start one on this machine. "
        "Ray searches on CPUs and times on GPUs, one GPU per task "
        '(pip install "mirage-jax[ray]"; default: %(default)s)',
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="no wall-clock stop (--budget-s unused): each search ends when exhausted or after "
        "--max-candidates, so the entries depend on the seed only, not on the machine's load, "
        "--workers or --ray",
    )
    p.add_argument(
        "--max-candidates",
        type=at_least_one,
        metavar="N",
        help="closed graphs each search examines at most (default: 20000)",
    )


def _add_cache_arg(p: argparse.ArgumentParser, default: Any = None) -> None:
    p.add_argument("--cache", metavar="PATH", default=default, help=CACHE_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `mirage-jax` (one subcommand per job)."""
    from mirage_jax import BACKENDS, SEARCH_MODES, __version__

    parser = Parser(
        prog="mirage-jax",
        description="A multi-level tensor-program superoptimizer for JAX (after Mirage, OSDI'25). "
        "It captures a JAX function, cuts out its Lax regions, searches verified µGraphs for "
        "them, keeps the fastest against XLA in a persistent cache, and runs them from "
        "@mirage_jax.jit.",
        epilog="Run `mirage-jax COMMAND --help` for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"mirage-jax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    opt = sub.add_parser(
        "optimize",
        help="search kernels for a function at given input shapes and fill the cache",
        description="Import MODULE:FUNCTION, capture it at the given input shapes, partition "
        "it, search each Lax region not yet in the cache (progress bar on stderr), select the "
        "fastest verified µGraph or XLA, and store the choice in the cache so that "
        "@mirage_jax.jit finds it. Example: mirage-jax optimize experiments.benchmarks:rmsnorm "
        "--arg 'f16[2,4096]' --arg 'f16[4096,6144]'. With --models, many models at several "
        "batch sizes at once, each distinct region searched once, on this machine or a Ray "
        "cluster (--ray), with a summary table per region: mirage-jax optimize --models all "
        "-b 1 -b 8 --ray local",
    )
    _add_function_args(opt, optional=True)
    _add_search_args(opt)
    opt.add_argument("--backend", choices=BACKENDS, default="auto", help=BACKEND_HELP)
    opt.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_cache_arg(opt)
    _add_many_args(opt)
    opt.set_defaults(func=_optimize)

    exp = sub.add_parser(
        "explain",
        help="show what mirage_jax.jit does with a function, region by region",
        description="Import MODULE:FUNCTION, capture it at the given input shapes and print the "
        "captured program, its partition (regions, and which ops kept what out of them), and "
        "per region the cached µGraph, its verification bound and its time against XLA. Reads "
        "the cache only, unless --search auto.",
    )
    _add_function_args(exp)
    exp.add_argument("--backend", choices=BACKENDS, default="auto", help=BACKEND_HELP)
    exp.add_argument("--search", choices=SEARCH_MODES, default="cached", help=SEARCH_HELP)
    _add_search_args(exp, when="with --search auto: ", seed=False)
    exp.add_argument(
        "--listing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print the captured program's listing (default: only when it is short)",
    )
    exp.add_argument("--svg", metavar="DIR", help="write each chosen µGraph's picture to DIR")
    _add_cache_arg(exp)
    exp.set_defaults(func=_explain)

    bench = sub.add_parser(
        "bench",
        help="capture and partition a benchmark of experiments/benchmarks.py and print it",
        description="Capture a benchmark program as a lax_ir Program, partition it into Lax "
        "regions and print both; --check runs the rebuilt function against the float64 "
        "reference, --jit runs it through mirage_jax.jit. Names: " + ", ".join(_benchmark_names()),
    )
    bench.add_argument("name", help="benchmark name, e.g. rmsnorm, gqa, gated_mlp")
    bench.add_argument(
        "--batch", "-b", type=at_least_one, default=1, help="batch size b (default: %(default)s)"
    )
    bench.add_argument("--small", action="store_true", help="reduced shapes (fast on a CPU)")
    bench.add_argument(
        "--check",
        action="store_true",
        help="run the rebuilt function against the float64 reference",
    )
    bench.add_argument(
        "--jit",
        action="store_true",
        help="run it through mirage_jax.jit and report each region's decision and the error",
    )
    bench.add_argument(
        "--backend", choices=BACKENDS, default="auto", help="for --jit: " + BACKEND_HELP
    )
    bench.add_argument(
        "--search", choices=SEARCH_MODES, default="cached", help="for --jit: " + SEARCH_HELP
    )
    _add_cache_arg(bench)
    bench.set_defaults(func=_bench)

    cache = sub.add_parser(
        "cache",
        help="list, show, clear, export or import the kernel cache",
        description="Manage the persistent kernel cache (an SQLite database). Export and "
        "import move entries as JSON lines, so a team can share tuned kernels; imported "
        "entries are checked again (verification record, optionally a fresh field trial) "
        "before they are used.",
    )
    _add_cache_arg(cache)
    csub = cache.add_subparsers(dest="cache_command", metavar="ACTION")
    actions: list[tuple[str, str, Callable[[argparse.Namespace], int]]] = [
        (
            "ls",
            "list the entries (key, region, µGraph or XLA, bound, speedup, the function and "
            "shapes it came from)",
            cache_ls,
        ),
        ("show", "print one entry: fields, verification record, timings, µGraph", cache_show),
        ("clear", "delete every entry", cache_clear),
        ("export", "write every entry to a JSON-lines file", cache_export),
        ("import", "read entries from a JSON-lines file written by export", cache_import),
        ("path", "print the database path", cache_path),
    ]
    for name, text, func in actions:
        p = csub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        if name == "show":
            p.add_argument("key", help="an entry key or a unique prefix of one (hexadecimal)")
        if name == "ls":
            p.add_argument(
                "prefix", nargs="?", help="only keys starting with this hexadecimal prefix"
            )
        if name in ("export", "import"):
            p.add_argument("path", help="the JSON-lines file")
        if name == "clear":
            p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
        _add_cache_arg(p, default=argparse.SUPPRESS)
        p.set_defaults(func=func)
    cache.set_defaults(func=lambda a: (cache.print_help(), 0)[1])

    rep = sub.add_parser(
        "reproduce",
        help="reproduce the paper's figure: search (CPU), time (GPU), draw the figure",
        description="Search each benchmark of experiments/benchmarks.py (--phase search, on a "
        "CPU), time our µGraphs against XLA, cuDNN, the Pallas reference ops, tokamax and the "
        "original's µGraphs on the GPU (--phase time), and draw the speedup figure and table "
        "(--phase figure). --quick runs the whole path on the CPU at small shapes, untimed. "
        "Same as python -m experiments.reproduce.",
    )
    _add_reproduce_args(rep)
    rep.set_defaults(func=_reproduce)
    return parser


def _benchmark_names() -> list[str]:
    try:
        from experiments import benchmarks

        return benchmarks.names()
    except Exception:  # the help text must never fail
        return []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `mirage-jax`: every error is one line on stderr and a non-zero status
    (2 for a bad command line, 1 otherwise); $MIRAGE_JAX_TRACEBACK=1 shows the traceback of
    an unexpected one."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    command = " ".join(c for c in (args.command, getattr(args, "cache_command", None)) if c)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return int(args.func(args) or 0)
        except UsageError as e:
            print(f"mirage-jax {command}: {one_line(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"mirage-jax {command}: interrupted", file=sys.stderr)
            return 130
        except Exception as e:
            from mirage_jax.cache import CacheUnavailable

            if os.environ.get(TRACEBACK_VAR) == "1":
                raise
            expected = isinstance(e, (CommandError, CacheUnavailable))
            what = "" if expected else f"unexpected {type(e).__name__}: "
            hint = "" if expected else f" (set {TRACEBACK_VAR}=1 for the traceback)"
            print(f"mirage-jax {command}: {what}{one_line(e)}{hint}", file=sys.stderr)
            return 1


def _show_warning(message: Any, category: Any, *_: Any, **__: Any) -> None:
    """Warnings on one line each: "mirage-jax: CacheWarning: ..."."""
    print(f"mirage-jax: {category.__name__}: {_flags(one_line(message, 1000))}", file=sys.stderr)


def _flags(text: str) -> str:
    """The library's hints name Python keywords (`pass backend='pallas-interpret'`); on the
    command line they name the flag (`pass --backend pallas-interpret`)."""
    return re.sub(r"\bbackend='([\w-]+)'", r"--backend \1", text)


if __name__ == "__main__":
    sys.exit(main())
