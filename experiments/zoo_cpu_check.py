"""The whole tiny real-model set at b=1,2 through `mirage_jax.zoo` on the CPU: the local pool
(2 workers) against a 2-CPU local Ray cluster, same seed, then a rerun; compares the entries.

    python experiments/zoo_cpu_check.py BUDGET_S DIR        # e.g. 5 /tmp/zoo (caches in DIR)
    python experiments/zoo_cpu_check.py inf DIR --kill      # reproducible, then killed workers

BUDGET_S `inf` is the reproducible mode (`optimize_many(reproducible=True)`: no wall-clock
stop; `--max-candidates N` bounds each search). `--kill` adds a Ray run on a fresh cache in
which the search task of one region kills its worker once (retried) and another's on every
attempt (reported failed), then a rerun without faults; its entries are compared too.
Backend pallas-interpret: nothing is timed. Searches stopped by their time budget are not
reproducible on a loaded machine; for each differing entry the last lines say what each run's
search reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401


def rows(path: str) -> dict[str, dict]:
    from mirage_jax.cache import Cache
    from mirage_jax.zoo import comparable

    return {e.key: comparable(e) for e in Cache(path).entries()}


def compare(name: str, A: dict, B: dict) -> list[str]:
    """Print how entries `A` (the local pool's) and `B` compare; the differing keys."""
    diff = [k for k in sorted(set(A) | set(B)) if A.get(k) != B.get(k)]
    print(f"entries, local pool vs {name}: local {len(A)}, {name} {len(B)}, "
          f"equal {len(set(A) | set(B)) - len(diff)}, differing {len(diff)}")  # fmt: skip
    for k in diff:
        ea, eb = A.get(k) or {}, B.get(k) or {}
        fields = sorted(f for f in set(ea) | set(eb) if ea.get(f) != eb.get(f))
        ta = json.loads(ea.get("timings_json") or "{}")
        tb = json.loads(eb.get("timings_json") or "{}")
        print(f"  {k[:12]} {ta.get('from') or tb.get('from')}: fields {fields}; same µGraph "
              f"{ea.get('mugraph_json') == eb.get('mugraph_json')}; local search: "
              f"{ta.get('search')!r}; {name} search: {tb.get('search')!r}")  # fmt: skip
    return diff


def summary(name: str, r, seconds: float) -> None:
    print(f"{name}: {seconds:.1f} s, searched {r.searched}, kernels {r.count(status='kernel')}, "
          f"xla {r.count(status='xla')}, not stored {r.count(status='not stored')}, "
          f"failed {len(r.failed)}, retried {sum(x.retried for x in r.results)}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("budget_s", type=float, help="seconds per region, or inf (reproducible)")
    ap.add_argument("folder", help="where the caches are written (must not hold them yet)")
    ap.add_argument("--max-candidates", type=int, default=None)
    ap.add_argument("--kill", action="store_true", help="also a run with killed workers")
    ap.add_argument("--models", default="all", help="comma-separated (default: all)")
    args = ap.parse_args(argv)
    import ray

    from mirage_jax import zoo
    from mirage_jax.cache import Cache

    jobs = zoo.model_jobs(args.models.split(","), (1, 2), "tiny")
    opts = dict(backend="pallas-interpret", budget_s=args.budget_s, seed=0, progress=False,
                reproducible=math.isinf(args.budget_s), max_candidates=args.max_candidates)  # fmt: skip
    d = args.folder
    local, on_ray, killed = f"{d}/local.sqlite", f"{d}/ray.sqlite", f"{d}/killed.sqlite"
    t = time.time()
    a = zoo.optimize_many(jobs, cache=Cache(local), workers=2, ray="off", **opts)
    local_s, t = time.time() - t, time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    b = zoo.optimize_many(jobs, cache=Cache(on_ray), ray="local", **opts)
    ray_s, t = time.time() - t, time.time()
    c = zoo.optimize_many(jobs, cache=Cache(on_ray), ray="local", **opts)
    rerun_s = time.time() - t
    runs = [("local pool (2 workers)", a, local_s), ("Ray (2 CPUs)", b, ray_s),
            ("Ray rerun, same cache", c, rerun_s)]  # fmt: skip
    if args.kill:
        hashes = sorted(r.entry.region_hash for r in a.results if r.entry is not None)
        once, always = hashes[0], hashes[1]
        os.environ[zoo.FAULT_VAR] = f"{once[:16]},{always[:16]}:always"
        t = time.time()
        k = zoo.optimize_many(jobs, cache=Cache(killed), ray="local", **opts)
        runs.append((f"Ray, killed workers ({once[:12]} once, {always[:12]} always)", k,
                     time.time() - t))  # fmt: skip
        del os.environ[zoo.FAULT_VAR]
        t = time.time()
        kr = zoo.optimize_many(jobs, cache=Cache(killed), ray="local", **opts)
        runs.append(("Ray rerun of the killed run", kr, time.time() - t))
    ray.shutdown()
    print(b.text())
    print()
    users = sum(len(r.users) for r in b.results)
    print(f"jobs {len(jobs)}, distinct regions {len(b.results)}, region occurrences {users}")
    for name, r, s in runs:
        summary(name, r, s)
    if args.kill:
        failed = [(r.key[:12], r.reason) for r in runs[3][1].failed]
        print(f"killed run: failed {failed}")
    A = rows(local)
    diff = compare("ray", A, rows(on_ray))
    if args.kill:
        diff += compare("killed+rerun", A, rows(killed))
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
