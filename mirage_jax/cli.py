"""The `mirage-jax` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _bench(args: argparse.Namespace) -> int:
    import jax

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
    if args.check:
        import numpy as np

        xs = bench.make_inputs(seed=0)
        got = np.asarray(jax.jit(lax_ir.rebuild(part))(*xs), np.float64)
        want = bench.reference(*xs)
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        print(f"rebuilt function vs float64 reference: max error {err:.2e} (relative to max |ref|)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `mirage-jax` (one subcommand per job)."""
    parser = argparse.ArgumentParser(
        prog="mirage-jax",
        description="A multi-level tensor-program superoptimizer for JAX (after Mirage, OSDI'25).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser(
        "bench",
        help="capture and partition a benchmark of experiments/benchmarks.py and print it",
        description="Capture a benchmark program as a lax_ir Program, partition it into Lax "
        "regions and print both. Names: " + ", ".join(_benchmark_names()),
    )
    bench.add_argument("name", help="benchmark name, e.g. rmsnorm, gqa, gated_mlp")
    bench.add_argument("--batch", "-b", type=int, default=1, help="batch size b (default 1)")
    bench.add_argument("--small", action="store_true", help="reduced shapes (fast on a CPU)")
    bench.add_argument(
        "--check",
        action="store_true",
        help="run the rebuilt function against the float64 reference",
    )
    bench.set_defaults(func=_bench)
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
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
