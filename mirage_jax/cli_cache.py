"""The `mirage-jax cache` actions: ls, show, clear, export, import, path."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mirage_jax.cli_args import CommandError, UsageError, key_prefix, one_line, os_reason


def open_cache(args: argparse.Namespace) -> Any:
    from mirage_jax.cache import Cache

    return Cache(args.cache)


def cache_ls(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    prefix = key_prefix(args.prefix) if args.prefix is not None else None
    entries = cache.entries(prefix=prefix)
    print(f"# {cache.path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    if entries:
        print(
            f"{'key':16}  {'region':12}  {'kind':9}  {'backend':16}  {'bound':8}  {'speedup':7}  "
            f"{'origin':7}  {'device':24}  from"
        )
    for e in entries:
        v = e.verification.get("verdict") or {}
        t = e.timings
        try:
            speedup = f"{float(t['xla_us']) / float(t['mugraph_us']):.2f}x"
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            speedup = "-"
        bound = f"{float(v['bound']):.0e}" if "bound" in v else "-"
        kind = "runner-up" if e.runner_up else "xla" if e.is_xla else "µgraph"
        print(
            f"{e.key[:16]}  {e.region_hash[:12]}  {kind:9}  {e.backend:16}  {bound:8}  "
            f"{speedup:7}  {e.origin:7}  {e.device_kind:24}  {t.get('from', '-')}"
        )
    return 0


def cache_show(args: argparse.Namespace) -> int:
    import json
    import time

    key = key_prefix(args.key)
    cache = open_cache(args)
    try:
        e = cache.get_raw(key)
    except KeyError as err:
        raise UsageError(f"{err.args[0]}; give a longer prefix") from None
    if e is None:
        raise UsageError(f"no entry {args.key!r} in {cache.path} (see mirage-jax cache ls)")
    print(f"key:          {e.key}")
    print(f"region hash:  {e.region_hash}")
    print(f"device kind:  {e.device_kind}")
    print(f"backend:      {e.backend}")
    print(f"library:      {e.lib_version}")
    print(f"origin:       {e.origin}")
    print(f"options:      {json.dumps(e.options, sort_keys=True)}")
    print(f"created:      {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.created_at))}")
    print(f"timings:      {json.dumps(e.timings, sort_keys=True) if e.timings else '-'}")
    if e.is_xla:
        print(f"choice:       XLA ({e.timings.get('reason') or 'the reason was not stored'})")
    if e.mugraph_json is None:
        return 0
    if e.runner_up:
        print("runner-up:    a µGraph the whole-function check tries beside XLA's other regions")
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


def cache_clear(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    n = len(cache.entries())
    entries = f"{n} entr{'y' if n == 1 else 'ies'}"
    if n and not args.yes:
        if not sys.stdin.isatty():
            raise CommandError(
                f"cache clear would delete {entries} from {cache.path}; pass --yes to confirm"
            )
        answer = input(f"delete {entries} of {cache.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    n = cache.clear()
    print(f"cleared {n} entr{'y' if n == 1 else 'ies'} from {cache.path}")
    return 0


def cache_export(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    try:
        n = cache.export(args.path)
    except OSError as e:
        raise CommandError(f"cannot write {args.path}: {os_reason(e)}") from e
    print(f"exported {n} entr{'y' if n == 1 else 'ies'} from {cache.path} to {args.path}")
    return 0


def cache_import(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    try:
        report = cache.import_(args.path)
    except OSError as e:
        raise CommandError(f"cannot read {args.path}: {os_reason(e)}") from e
    for lineno, reason in report.rejected:
        print(f"{args.path}:{lineno}: rejected: {one_line(reason)}", file=sys.stderr)
    n, bad = report.imported, len(report.rejected)
    rejected = f"; rejected {bad} line{'' if bad == 1 else 's'}" if bad else ""
    print(
        f"imported {n} entr{'y' if n == 1 else 'ies'} from {args.path} into {cache.path}" + rejected
    )
    return 1 if bad else 0


def cache_path(args: argparse.Namespace) -> int:
    print(open_cache(args).path)
    return 0
