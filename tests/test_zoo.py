"""`mirage_jax.zoo` (`mirage-jax optimize --models`): many functions and shapes at once, on the
local process pool and on a local 2-CPU Ray cluster; deduplication, resumability, retries.

Every run is reproducible (`reproducible=True`: no wall-clock stop, each search ends when
exhausted or by its candidate budget), so entries depend on the seed only, not on the
machine's load or the executor. Most tests use the tiny set's attention entries (sdpa_decode,
sdpa) at batches 1 and 2: four distinct regions searched to exhaustion in seconds. Backend
pallas-interpret: nothing is timed on the CPU, the cost model's best µGraph that lowers and
passes the float check is stored.
"""

from __future__ import annotations

import json
import warnings

import jax
import numpy as np
import pytest

from mirage_jax import zoo
from mirage_jax.cache import Cache

MODELS = ("sdpa_decode", "sdpa")
BATCHES = (1, 2)
OPTS = dict(backend="pallas-interpret", reproducible=True, seed=0, progress=False)

# The README's command runs each test file on one xdist worker (`--dist loadfile`), so this
# module's fixtures (a local pool's run, a Ray cluster) are built once; under another
# distribution `local_run` is still searched once a run (`once_per_run`)
pytestmark = [pytest.mark.usefixtures("quiet_mirage")]


def jobs() -> list[zoo.Job]:
    """The set, plus sdpa_decode at batch 1 again under another name (its region is shared)."""
    out = zoo.model_jobs(MODELS, BATCHES, "tiny")
    first = out[0]
    return [*out, zoo.Job("again_" + first.name, first.fn, first.args)]


def entries(cache: Cache) -> dict[str, dict]:
    """Every entry but its creation date and wall-clock seconds (`zoo.comparable`), by key."""
    return {e.key: zoo.comparable(e) for e in cache.entries()}


@pytest.fixture(scope="module")
def local_run(once_per_run, tmp_path_factory):
    """The set optimised with the local process pool (2 workers): the reference entries.

    Searched once a run (`once_per_run`), not once per xdist worker, wherever the module's tests
    land: with `--dist load` they were spread over both workers and each built this fixture
    (75-93 s of setup apiece with -n 2, both at once; `xdist_group` is ignored by pytest-xdist
    3.8 with pytest 9.2, pytest-xdist#1386). Another worker reads the report back and opens the
    same database (WAL: several processes read it at once; no test writes to it)."""

    def produce() -> tuple[str, zoo.Report]:
        path = tmp_path_factory.mktemp("zoo") / "local.sqlite"
        report = zoo.optimize_many(jobs(), cache=Cache(path), workers=2, ray="off", **OPTS)
        return str(path), report

    path, report = once_per_run("zoo_local_run", produce)
    return Cache(path), report


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    with warnings.catch_warnings():  # Ray forks only to exec its own processes
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_local_pool_searches_each_distinct_region_once(local_run):
    cache, report = local_run
    assert len(report.results) == 4  # 5 jobs, 5 regions, 4 distinct
    assert sum(len(r.users) for r in report.results) == 5
    assert report.searched == 4 and not report.failed
    assert {r.status for r in report.results} == {"kernel"}
    assert set(entries(cache)) == {r.key for r in report.results}
    text = report.text()
    assert "again_sdpa_decode_tiny_b1" not in text and "(+1)" in text
    assert "matmul" in text  # the structure chosen


def test_ray_entries_equal_local_pool_entries_and_rerun_skips_them(
    local_run, ray_cluster, tmp_path
):
    cache = Cache(tmp_path / "ray.sqlite")
    report = zoo.optimize_many(jobs(), cache=cache, ray="local", **OPTS)
    assert report.executor.startswith("Ray (2 CPU")
    assert report.searched == 4 and not report.failed
    assert entries(cache) == entries(local_run[0])
    again = zoo.optimize_many(jobs(), cache=cache, ray="local", **OPTS)
    assert again.searched == 0 and {r.source for r in again.results} == {"cache"}
    assert [r.status for r in again.results] == [r.status for r in report.results]
    assert ray_cluster.is_initialized()  # a cluster it did not start is left running


TINY_SET = ("llama_decode_nnx",)
"""The models of the whole-set test, at batch 1 (`TINY_BATCHES`): a decode block with its cache
writes, with kernel and XLA entries both. With GPT-2's prefill block too, this test took 52 s
alone and 187 s in a suite run on 2 cores (2026-11-27: Ray's processes beside the other worker's
searches), and what that block adds is another library's block. Library attention
(sdpa_decode) and batch 2 are left out:
`test_ray_entries_equal_local_pool_entries_and_rerun_skips_them` already checks Ray against the
local pool for sdpa and sdpa_decode at b=1,2, searched to exhaustion, and the batch-2 blocks'
regions are the batch-1 ones with more rows, which took half of this test's time. All 7 of the
tiny set took 165 s of the CPU suite's 14 min on 2 cores (2026-11-26); with equinox's decode
block too, this test took 80-92 s of 15 min (2026-11-27), and the executors' equality does not
depend on the library that wrote the block; the suite has a 15 min allowance."""
TINY_BATCHES = (1,)


@pytest.mark.slow
def test_the_tiny_set_stores_the_same_entries_on_the_local_pool_and_on_ray(ray_cluster, tmp_path):
    """The real-model blocks of `TINY_SET` at b=1, reproducible, one candidate a search (each
    search stops at its first closed graph: the whole set exhausted takes ~6 min a run here,
    experiments/results/zoo_tiny_cpu_2026-11-25b.txt): the local pool and Ray store the same
    entries, and a rerun reads every one back. The local pool has one worker (all 12 regions in
    one process, Ray spreads them over two): one spawned process fewer, ~5 s less CPU."""
    jobs = zoo.model_jobs(TINY_SET, TINY_BATCHES, "tiny")
    local, on_ray = Cache(tmp_path / "local.sqlite"), Cache(tmp_path / "ray.sqlite")
    a = zoo.optimize_many(jobs, cache=local, workers=1, ray="off", max_candidates=1, **OPTS)
    b = zoo.optimize_many(jobs, cache=on_ray, ray="local", max_candidates=1, **OPTS)
    assert a.searched == b.searched == len(a.results) and not a.failed and not b.failed
    assert "at most 1 candidates per search" in a.text()
    assert entries(local) == entries(on_ray)
    again = zoo.optimize_many(jobs, cache=on_ray, ray="local", max_candidates=1, **OPTS)
    assert again.searched == 0  # every entry is read back (none rejected on load)


def test_killed_workers_are_retried_once_then_reported_and_a_rerun_finishes_the_rest(
    local_run, ray_cluster, tmp_path, monkeypatch
):
    """Three of the set's four regions on Ray: one whose worker is killed on its first attempt,
    one whose worker is killed on every attempt (the region two jobs share), one left alone;
    sdpa at b=2, the longest search, is left out (what it would add is one more region left
    alone)."""
    some = [j for j in jobs() if j.name != "sdpa_tiny_b2"]
    assert len(some) == len(jobs()) - 1
    by_user = {r.users[0].rsplit(".r", 1)[0]: r for r in local_run[1].results}
    once, always = by_user["sdpa_tiny_b1"], by_user["sdpa_decode_tiny_b1"]
    ref = entries(local_run[0])
    ref.pop(by_user["sdpa_tiny_b2"].key)
    hash_of = lambda r: r.entry.region_hash[:16]  # noqa: E731
    monkeypatch.setenv(zoo.FAULT_VAR, f"{hash_of(once)},{hash_of(always)}:always")
    cache = Cache(tmp_path / "killed.sqlite")
    report = zoo.optimize_many(some, cache=cache, ray="local", **OPTS)
    assert len(report.results) == 3 and report.searched == 2  # `always`: no search ended
    status = {r.key: r for r in report.results}
    assert status[once.key].retried == 1 and status[once.key].status == "kernel"
    failed = status[always.key]
    assert failed.status == "failed" and failed.attempts == 2 and failed.retried == 1
    assert "search task failed (WorkerCrashedError" in failed.reason
    assert "after 2 attempts" in failed.reason
    assert "failed" in report.text()
    got = entries(cache)
    assert set(got) == set(ref) - {always.key}  # everything else finished and is stored
    assert all(got[k] == ref[k] for k in got)

    monkeypatch.delenv(zoo.FAULT_VAR)
    rerun = zoo.optimize_many(some, cache=cache, ray="local", **OPTS)
    assert rerun.searched == 1  # only what was missing
    assert not rerun.failed
    assert entries(cache) == ref


def test_jit_uses_exported_and_imported_entries_without_searching(local_run, tmp_path):
    import mirage_jax
    from experiments import models

    path = tmp_path / "entries.jsonl"
    assert local_run[0].export(path) == 4
    other = Cache(tmp_path / "other.sqlite")
    assert other.import_(path).imported == 4
    m = models.get("sdpa_decode", 2, "tiny")
    case = m.make(seed=0)
    f = mirage_jax.jit(m.fn, backend="pallas-interpret", search="cached", cache=other)
    got = f(*case.args)
    assert f.stats.searches == 0 and f.stats.cache_hits == 1 and f.stats.kernels == 1
    want = jax.jit(m.fn)(*case.args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_cli_optimizes_models_from_the_cache_and_names_what_is_wrong(local_run, capsys, tmp_path):
    from mirage_jax.cli import main

    path = tmp_path / "cli.jsonl"
    local_run[0].export(path)
    db = tmp_path / "cli.sqlite"
    Cache(db).import_(path)
    argv = ["optimize", "--models", ",".join(MODELS), "-b", "1", "-b", "2", "--size", "tiny",
            "--backend", "pallas-interpret", "--cache", str(db), "-q"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "4 cached, 0 searched" in out and "sdpa_tiny_b2.r0" in out
    assert main(["optimize", "--models", "no_such_model", "--cache", str(db)]) == 2
    assert "no model 'no_such_model'" in capsys.readouterr().err
    assert main(["optimize", "--cache", str(db)]) == 2
    assert "--models" in capsys.readouterr().err


def test_ray_auto_without_a_cluster_says_how_to_start_one(capsys, monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")

    def no_cluster(*args, **kwargs):  # what ray.init(address="auto") raises with none running
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    from mirage_jax.cli import main

    argv = ["optimize", "--models", "sdpa_decode", "-b", "1", "--ray", "auto",
            "--cache", str(tmp_path / "c.sqlite")]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no running Ray cluster" in err and "ray start --head" in err and "--ray local" in err


def test_a_killed_driver_loses_nothing_finished_and_the_rerun_does_the_rest(local_run, tmp_path):
    """The CLI (local pool, one worker) is killed once it has stored a region; what it stored
    stays, and a rerun searches exactly the regions that were missing. sdpa_decode alone (two
    regions, searched one after the other, ~5 s apart): the kill lands between them, and the
    rerun has one region to search, not three (sdpa's two add nothing to what is checked)."""
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "killed.sqlite"
    decode = zoo.model_jobs(MODELS[:1], BATCHES, "tiny")
    argv = [sys.executable, "-m", "mirage_jax.cli", "optimize", "--models", MODELS[0],
            "-b", "1", "-b", "2", "--backend", "pallas-interpret", "--reproducible",
            "--workers", "1", "--cache", str(db), "-q"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = 0
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            stored = len(Cache(db).entries()) if db.exists() else 0
            if stored:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    kept = entries(Cache(db))
    assert len(kept) == 1  # one of the two regions
    ref = entries(local_run[0])
    ref = {r.key: ref[r.key] for r in local_run[1].results if r.users[0].startswith("sdpa_decode_")}
    assert len(ref) == 2 and set(kept) < set(ref)
    assert all(kept[k] == ref[k] for k in kept)
    rerun = zoo.optimize_many(decode, cache=Cache(db), workers=2, ray="off", **OPTS)
    assert rerun.searched == 1 and not rerun.failed
    assert entries(Cache(db)) == ref


def test_zoo_timing_spreads_selection_over_the_gpu_processes(tmp_path, capsys):
    """experiments/zoo_timing.py on the CPU with two pretended GPUs (local executor): each GPU
    process gets work, both runs make the same choices, the result file says so (untimed).
    One search process (`--cpus 1`): the two regions' searches one after the other, one spawned
    process fewer to start; the GPU processes, what this test is about, are as many."""

    from experiments import zoo_timing

    argv = ["--size", "tiny", "--models", "sdpa_decode", "--batches", "1", "2", "--fake-gpus",
            "2", "--backend", "pallas-interpret", "--executor", "local", "--budget-s", "600",
            "--cpus", "1", "--out", str(tmp_path)]  # fmt: skip
    assert zoo_timing.main(argv) == 0
    out = capsys.readouterr().out
    assert "[gpu 0]" in out and "[gpu 1]" in out
    (path,) = tmp_path.glob("zoo_timing_*.json")
    doc = json.loads(path.read_text())
    assert [r["gpus"] for r in doc["runs"]] == [1, 2]
    assert set(doc["runs"][0]["per_gpu"]) == {"0"}
    assert set(doc["runs"][1]["per_gpu"]) == {"0", "1"}
    assert doc["comparison"]["same_choices"] is True and doc["regions"] == 2
    assert doc["versions"]["jax"] and doc["machine"]["cpus"]
