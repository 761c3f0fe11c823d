"""The whole tiny real-model set at b=1,2 through `mirage_jax.zoo` on the CPU: the local pool
(2 workers) against a 2-CPU local Ray cluster, same seed, then a rerun; compares the entries.

    python experiments/zoo_cpu_check.py BUDGET_S DIR   # e.g. 5 /tmp/zoo (two caches in DIR)

Backend pallas-interpret: nothing is timed. Searches stopped by their time budget are not
reproducible between runs on a loaded machine; for each differing entry the last lines say
what each run's search reported.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

if not __package__:  # python experiments/X.py: see experiments/_path.py
    import _path  # noqa: F401


def rows(path: str) -> dict[str, dict]:
    from mirage_jax.cache import Cache

    out = {}
    for e in Cache(path).entries():
        d = dataclasses.asdict(e)
        d.pop("created_at")
        out[e.key] = d
    return out


def main(budget_s: float, folder: str) -> None:
    import ray

    from mirage_jax import zoo
    from mirage_jax.cache import Cache

    jobs = zoo.model_jobs(None, (1, 2), "tiny")
    opts = dict(backend="pallas-interpret", budget_s=budget_s, seed=0, progress=False)
    local, on_ray = f"{folder}/local.sqlite", f"{folder}/ray.sqlite"
    t = time.time()
    a = zoo.optimize_many(jobs, cache=Cache(local), workers=2, ray="off", **opts)
    local_s, t = time.time() - t, time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    b = zoo.optimize_many(jobs, cache=Cache(on_ray), ray="local", **opts)
    ray_s, t = time.time() - t, time.time()
    c = zoo.optimize_many(jobs, cache=Cache(on_ray), ray="local", **opts)
    rerun_s = time.time() - t
    ray.shutdown()
    A, B = rows(local), rows(on_ray)
    diff = [k for k in sorted(set(A) | set(B)) if A.get(k) != B.get(k)]
    print(b.text())
    print()
    users = sum(len(r.users) for r in b.results)
    print(f"jobs {len(jobs)}, distinct regions {len(b.results)}, region occurrences {users}")
    for name, r, s in (("local pool (2 workers)", a, local_s), ("Ray (2 CPUs)", b, ray_s)):
        print(f"{name}: {s:.1f} s, searched {r.searched}, kernels {r.count(status='kernel')}, "
              f"not stored {r.count(status='not stored')}, failed {len(r.failed)}")  # fmt: skip
    print(f"Ray rerun: {rerun_s:.1f} s, searched {c.searched}")
    print(f"entries: local {len(A)}, ray {len(B)}, equal {len(set(A) | set(B)) - len(diff)}, "
          f"differing {len(diff)}")  # fmt: skip
    for k in diff:
        ea, eb = A.get(k) or {}, B.get(k) or {}
        fields = sorted(f for f in set(ea) | set(eb) if ea.get(f) != eb.get(f))
        ta = json.loads(ea.get("timings_json") or "{}")
        tb = json.loads(eb.get("timings_json") or "{}")
        print(f"  {k[:12]} {ta.get('from') or tb.get('from')}: fields {fields}; same µGraph "
              f"{ea.get('mugraph_json') == eb.get('mugraph_json')}; local search: "
              f"{ta.get('search')!r}; ray search: {tb.get('search')!r}")  # fmt: skip


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2])
