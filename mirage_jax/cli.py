"""The `mirage-jax` command line: optimize, explain, bench, cache, reproduce."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mirage_jax.lower import backends

DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u32": "uint32",
    "bool": "bool",
    "pred": "bool",
}
_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[\s*([0-9,\s]*)\]\s*$")
ARG_HELP = (
    "one positional argument of FUNCTION, in order: an array spec DTYPE[d0,d1,...] "
    "(f16, bf16, f32, f64, i32, ... or a numpy name; f32[] is a scalar), or a Python literal "
    "(int, float, string, tuple), which is passed as a static value"
)
BACKEND_HELP = "kernel backend: " + backends.describe()
CACHE_HELP = (
    "the cache database (default: $MIRAGE_JAX_CACHE, else "
    "$XDG_CACHE_HOME/mirage_jax/cache.sqlite, i.e. ~/.cache/mirage_jax/cache.sqlite)"
)


def parse_arg(text: str) -> Any:
    """`f16[2,4096]` → a ShapeDtypeStruct; anything else → a Python literal (a static value)."""
    import jax
    import jax.numpy as jnp

    m = _SPEC.match(text)
    if m:
        name, dims = m.group(1), m.group(2)
        try:
            dtype = jnp.dtype(DTYPES.get(name, name))
        except TypeError:
            raise UsageError(
                f"unknown dtype {name!r} in {text!r}; use e.g. f16, bf16, f32"
            ) from None
        shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
        return jax.ShapeDtypeStruct(shape, dtype)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"--arg {text!r} is neither an array spec like f16[2,4096] nor a Python literal"
        ) from None


def load_function(target: str) -> Callable[..., Any]:
    """`package.module:function` or `path/to/file.py:function` (attribute paths allowed)."""
    if ":" not in target:
        raise UsageError(f"expected MODULE:FUNCTION, got {target!r}")
    module_name, _, attr = target.rpartition(":")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


class UsageError(ValueError):
    """A bad command line (printed without a traceback)."""


def _function_and_args(args: argparse.Namespace) -> tuple[Callable[..., Any], list[Any]]:
    try:
        fn = load_function(args.target)
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"cannot load {args.target}: {type(e).__name__}: {e}") from e
    return fn, [parse_arg(a) for a in args.arg or []]


def _static_argnums(values: list[Any]) -> tuple[int, ...]:
    import jax

    return tuple(i for i, v in enumerate(values) if not isinstance(v, jax.ShapeDtypeStruct))


# ---------------------------------------------------------------------- optimize
def _optimize(args: argparse.Namespace) -> int:
    import mirage_jax
    from mirage_jax.explain import _region_lines

    fn, values = _function_and_args(args)
    record = mirage_jax.superoptimize(
        fn,
        *values,
        backend=args.backend,
        budget_s=args.budget_s,
        cache=args.cache,
        seed=args.seed,
        workers=args.workers,
        static_argnums=_static_argnums(values) or None,
        progress=not args.quiet,
    )
    if record.error:
        print(f"mirage-jax optimize: capture failed: {record.error}", file=sys.stderr)
        return 1
    n = len(record.decisions)
    kernels = sum(d.status == "kernel" for d in record.decisions)
    where = args.cache or str(mirage_jax.Cache().path)
    print(f"# {record.name}: {n} region(s), {kernels} fused kernel(s); cache {where}")
    for d in record.decisions:
        for line in _region_lines(d):
            print(line)
    open_regions = [d for d in record.decisions if "trivial" not in d.reason]
    if open_regions and all(d.source == "none" for d in open_regions):
        print(
            f"mirage-jax optimize: nothing was optimised: {open_regions[0].reason}",
            file=sys.stderr,
        )
        return 1
    return 0


# ---------------------------------------------------------------------- explain
def _explain(args: argparse.Namespace) -> int:
    import mirage_jax

    fn, values = _function_and_args(args)
    expl = mirage_jax.explain(
        fn,
        *values,
        search=args.search,
        backend=args.backend,
        cache=args.cache,
        static_argnums=_static_argnums(values) or None,
    )
    print(expl.text(listing=args.listing))
    if args.svg:
        out = Path(args.svg)
        out.mkdir(parents=True, exist_ok=True)
        for index, svg in expl.svgs().items():
            path = out / f"region{index}.svg"
            path.write_text(svg, encoding="utf-8")
            print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------- bench
def _bench(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    import lax_ir
    from experiments import benchmarks

    try:
        bench = benchmarks.get(args.name, args.batch)
    except KeyError as e:
        print(f"mirage-jax bench: {e.args[0]}", file=sys.stderr)
        return 2
    if args.small:
        bench = bench.small()
    print(f"# {bench.key}: {bench.notes}" if bench.notes else f"# {bench.key}")
    program = lax_ir.capture(bench.fn, *bench.inputs)
    print(program)
    part = lax_ir.partition(program)
    print()
    print(part.explain())
    print(f"\ncanonical hash: {program.canonical_hash}")
    print(f"floor: {bench.floor_bytes / 1e6:.2f} MB, {bench.floor_us():.2f} µs at 3.0 TB/s")
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
        got = f(*xs)
        print()
        for d in f.last.decisions if f.last else ():
            for line in _region_lines(d):
                print(line)
        print(f"\nmirage_jax.jit vs float64 reference: max error {error(got):.2e}")
        print(f"jax.jit       vs float64 reference: max error {error(jax.jit(bench.fn)(*xs)):.2e}")
    return 0


# ---------------------------------------------------------------------- cache
def _open(args: argparse.Namespace) -> Any:
    from mirage_jax.cache import Cache

    return Cache(args.cache)


def _cache_ls(args: argparse.Namespace) -> int:
    cache = _open(args)
    entries = cache.entries()
    print(f"# {cache.path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    if entries:
        print(
            f"{'key':16}  {'region':12}  {'kind':7}  {'backend':16}  {'bound':8}  {'speedup':7}  device"
        )
    for e in entries:
        v = e.verification.get("verdict") or {}
        t = e.timings
        speedup = (
            f"{t['xla_us'] / t['mugraph_us']:.2f}x"
            if t.get("xla_us") and t.get("mugraph_us")
            else "-"
        )
        bound = f"{float(v['bound']):.0e}" if "bound" in v else "-"
        kind = "xla" if e.is_xla else "µgraph"
        print(
            f"{e.key[:16]}  {e.region_hash[:12]}  {kind:7}  {e.backend:16}  {bound:8}  "
            f"{speedup:7}  {e.device_kind}"
        )
    return 0


def _cache_show(args: argparse.Namespace) -> int:
    import json
    import time

    cache = _open(args)
    try:
        e = cache.get_raw(args.key)
    except KeyError as err:
        print(f"mirage-jax cache show: {err.args[0]}", file=sys.stderr)
        return 2
    if e is None:
        print(f"mirage-jax cache show: no entry {args.key!r} in {cache.path}", file=sys.stderr)
        return 2
    print(f"key:          {e.key}")
    print(f"region hash:  {e.region_hash}")
    print(f"device kind:  {e.device_kind}")
    print(f"backend:      {e.backend}")
    print(f"library:      {e.lib_version}")
    print(f"options:      {json.dumps(e.options, sort_keys=True)}")
    print(f"created:      {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.created_at))}")
    print(f"timings:      {json.dumps(e.timings, sort_keys=True) if e.timings else '-'}")
    if e.is_xla:
        print("choice:       XLA (no µGraph beat it)")
        return 0
    print(f"verification: {json.dumps(e.verification, sort_keys=True)}")
    try:
        from mirage_jax.cache import mugraph_from_json

        print("µGraph:")
        print(
            "\n".join("  " + ln for ln in str(mugraph_from_json(e.mugraph_json or "")).split("\n"))
        )
    except Exception as err:
        print(f"µGraph: does not load ({type(err).__name__}: {err})")
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _open(args)
    n = cache.clear()
    print(f"cleared {n} entr{'y' if n == 1 else 'ies'} from {cache.path}")
    return 0


def _cache_export(args: argparse.Namespace) -> int:
    cache = _open(args)
    n = cache.export(args.path)
    print(f"exported {n} entr{'y' if n == 1 else 'ies'} from {cache.path} to {args.path}")
    return 0


def _cache_import(args: argparse.Namespace) -> int:
    cache = _open(args)
    n = cache.import_(args.path)
    print(f"imported {n} entr{'y' if n == 1 else 'ies'} from {args.path} into {cache.path}")
    return 0


def _cache_path(args: argparse.Namespace) -> int:
    print(_open(args).path)
    return 0


# ---------------------------------------------------------------------- reproduce
def _reproduce(args: argparse.Namespace) -> int:
    from experiments import reproduce

    return reproduce.run(args, prog="mirage-jax reproduce")


def _add_reproduce_args(p: argparse.ArgumentParser) -> None:
    try:
        from experiments.reproduce import add_arguments
    except Exception:  # the help text must never fail
        return
    add_arguments(p)


# ---------------------------------------------------------------------- parser
def _add_function_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="the function to optimise: a dotted module path or a .py file, a colon, and the "
        "function's name (e.g. experiments.benchmarks:rmsnorm or model.py:block)",
    )
    p.add_argument("--arg", "-a", action="append", metavar="SPEC", help=ARG_HELP)


def _add_cache_arg(p: argparse.ArgumentParser, default: Any = None) -> None:
    p.add_argument("--cache", metavar="PATH", default=default, help=CACHE_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `mirage-jax` (one subcommand per job)."""
    from mirage_jax import BACKENDS, SEARCH_MODES, __version__

    parser = argparse.ArgumentParser(
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
        "--arg 'f16[2,4096]' --arg 'f16[4096,6144]'",
    )
    _add_function_args(opt)
    opt.add_argument("--budget-s", type=float, default=60.0, help="search budget per region, s")
    opt.add_argument("--backend", choices=BACKENDS, default="auto", help=BACKEND_HELP)
    opt.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    opt.add_argument("--workers", type=int, default=1, help="search worker processes")
    opt.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_cache_arg(opt)
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
    exp.add_argument(
        "--search", choices=SEARCH_MODES, default="cached", help="cached (default), auto or off"
    )
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
    bench.add_argument("--batch", "-b", type=int, default=1, help="batch size b (default 1)")
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
        "--search", choices=SEARCH_MODES, default="cached", help="search mode for --jit"
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
        ("ls", "list the entries (key, region, µGraph or XLA, bound, speedup)", _cache_ls),
        ("show", "print one entry: fields, verification record, timings, µGraph", _cache_show),
        ("clear", "delete every entry", _cache_clear),
        ("export", "write every entry to a JSON-lines file", _cache_export),
        ("import", "read entries from a JSON-lines file written by export", _cache_import),
        ("path", "print the database path", _cache_path),
    ]
    for name, text, func in actions:
        p = csub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        if name == "show":
            p.add_argument("key", help="an entry key or a unique prefix of one")
        if name in ("export", "import"):
            p.add_argument("path", help="the JSON-lines file")
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
    """Entry point of `mirage-jax`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"mirage-jax {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
