"""experiments/reproduce.py and experiments/figures.py: the --quick path end to end, the table and
figure from results, the summary arithmetic, the `mirage-jax reproduce` subcommand."""

from __future__ import annotations

import json
import math

import pytest

from experiments import figures, reproduce, reproduce_common, reproduce_time
from experiments.benchmarks import PAPER_NAMES


def _contender(label, kind, us=None, status="ok", valid=True, **extra):
    c = {"label": label, "kind": kind, "status": status, "valid": valid, **extra}
    if us is not None:
        c["time"] = {"median_us": us, "p10_us": us * 0.9, "p90_us": us * 1.1, "n": 5}
    return c


def _row(name, batch, ours_us, xla_us, other_us=None, imported_us=None):
    cs = [
        _contender("XLA", "baseline", xla_us),
        _contender(
            "mirage_jax #1 (pallas)",
            "ours",
            ours_us,
            candidates=[{"hash": "h", "cost": {}, "verification": {"bound": 1e-10}}],
        ),
        _contender("mirage_jax #2 (pallas)", "ours", None, status="float check failed"),
    ]
    if other_us is not None:
        cs.append(_contender("cuDNN attention", "baseline", other_us))
    if imported_us is not None:
        cs.append(_contender("original's µGraph [3] (pallas)", "imported", imported_us))
        cs.append(_contender("XLA (original's form)", "imported_xla", xla_us))
    row = {
        "key": f"{name}_b{batch}",
        "name": name,
        "batch": batch,
        "floor_bytes": 3_000_000,
        "search": [{"stop_reason": "exhausted", "seconds": 3.0, "candidates": 2}],
        "contenders": cs,
    }
    return reproduce_time.summarize(row, 3.0e12)


def _results(rows):
    res = {
        "kind": "mirage_jax reproduce results",
        "device": "NVIDIA H100 80GB HBM3",
        "date": "2026-01-01",
        "timed": True,
        "complete": True,
        "command": "python -m experiments.reproduce --phase time",
        "method": "chained",
        "bandwidth": {"bytes_per_s": 3.0e12},
        "reported": figures.REPORTED,
        "benchmarks": rows,
    }
    res["summary"] = figures.summary(res)
    return res


def test_summarize_speedup_floor_and_jit():
    row = _row("gqa", 1, ours_us=5.0, xla_us=15.0, other_us=10.0, imported_us=8.0)
    assert row["best_baseline"] == {"label": "cuDNN attention", "us": 10.0}
    assert row["speedup"] == pytest.approx(2.0)
    assert row["speedup_vs_xla"] == pytest.approx(3.0)
    assert row["jit_us"] == 5.0
    assert row["floor_us"] == pytest.approx(1.0)  # 3 MB at 3 TB/s
    assert row["fraction_of_floor"] == pytest.approx(0.2)
    assert row["imported_best"]["speedup"] == pytest.approx(10.0 / 8.0)
    assert row["imported_best"]["speedup_vs_xla_same_form"] == pytest.approx(15.0 / 8.0)


def test_summarize_slower_than_xla_keeps_xla_for_jit():
    row = _row("rmsnorm", 8, ours_us=30.0, xla_us=20.0)
    assert row["speedup"] == pytest.approx(20.0 / 30.0)
    assert row["jit_us"] == 20.0  # mirage_jax.jit never runs slower than XLA


def test_summarize_ignores_invalid_contenders():
    row = _row("lora", 1, ours_us=2.0, xla_us=6.0)
    row["contenders"][1]["valid"] = False  # a float-check failure never wins
    row = reproduce_time.summarize(row, 3.0e12)
    assert row["ours"] is None and row["speedup"] is None
    assert row["fraction_of_floor"] is None and row["jit_us"] == 6.0


def test_summary_geomean_and_wins():
    rows = [_row("gqa", 1, 5.0, 10.0), _row("lora", 1, 4.0, 2.0), _row("gqa", 8, 10.0, 40.0)]
    s = figures.summary(_results(rows))
    assert s["geomean_speedup"] == pytest.approx(
        math.exp((math.log(2) + math.log(0.5) + math.log(4)) / 3)
    )
    assert s["max_speedup"] == pytest.approx(4.0) and s["max_at"] == "gqa_b8"
    assert s["faster_than_best_baseline"] == 2
    assert s["by_batch"]["1"]["geomean_speedup"] == pytest.approx(1.0)


def test_figure_and_table_from_results(tmp_path):
    rows = [
        _row("gqa", 1, 5.0, 15.0, other_us=10.0, imported_us=8.0),
        _row("rmsnorm", 1, 25.0, 21.0),
        _row("gqa", 8, 20.0, 60.0),
        _row("rmsnorm", 8, 24.0, 24.0),
    ]
    written = figures.write(_results(rows), tmp_path, "h100-test")
    assert {p.suffix for p in written} == {".md", ".png", ".svg"}
    md = (tmp_path / "h100-test.md").read_text()
    assert "| gqa | 1 | 5.0 [4.5–5.5] (#1 pallas) | cuDNN attention 10.0 | 15.0 | 2.00 |" in md
    assert "float check failed" in md  # every contender is listed
    assert "quoted as reported, not measured here" in md
    assert "up to 3.3x over the best baseline" in md
    assert (tmp_path / "h100-test.png").stat().st_size > 10_000
    assert "<svg" in (tmp_path / "h100-test.svg").read_text()


def test_figure_phase_redraws_from_a_results_file(tmp_path):
    path = tmp_path / "h100-2026-01-01.json"
    path.write_text(json.dumps(_results([_row("lora", 1, 2.0, 6.0)])))
    assert reproduce.main(["--phase", "figure", "--results", str(path)]) == 0
    assert (tmp_path / "h100-2026-01-01.png").exists()
    assert "| lora | 1 |" in (tmp_path / "h100-2026-01-01.md").read_text()
    assert figures.newest_results(tmp_path) == path


def test_machine_name():
    assert reproduce_time.machine_name("NVIDIA H100 80GB HBM3") == "h100"
    assert reproduce_time.machine_name("NVIDIA H200") == "h200"
    assert reproduce_time.machine_name("NVIDIA A100-SXM4-80GB") == "a100"
    assert reproduce_time.machine_name("Some GPU") == "some-gpu"


def test_cli_reproduce_help(capsys):
    from mirage_jax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["reproduce", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--phase" in out and "--quick" in out and "--peer" in out


def test_quick_reproduction_end_to_end(tmp_path):
    """The whole path on the CPU: search, plan, lower (interpret), float checks, table, figure.

    A search budget of 2 s a region, not --quick's 10 s: the budget bounds the enumeration
    only, and the full-size instances of every structure it accepts (the numbers phase) come
    after it, so a longer enumeration mostly buys more numbers work (lora: 74 structures and
    18 s at 2 s, 114 and 34 s at 10 s; the run took 77 s alone, 135 s in the 2-process suite,
    2026-11-27). Every benchmark's search but qknorm's still finds µGraphs at 2 s (qknorm's
    finds none at 10 s either); what the searches find is tested in test_search.py."""
    assert reproduce.main(["--quick", "--budget-s", "2", "--out", str(tmp_path)]) == 0
    for name in ("plan.json", "quick.json", "quick.md", "quick.png", "quick.svg"):
        assert (tmp_path / name).exists(), name
    plan = json.loads((tmp_path / "plan.json").read_text())
    res = json.loads((tmp_path / "quick.json").read_text())
    assert plan["quick"] and res["quick"] and not res["timed"] and res["complete"]
    assert "not timed" in res["method"]
    assert [r["name"] for r in res["benchmarks"]] == list(PAPER_NAMES)
    assert plan["options"]["search"]["budget_s"] == 2.0
    planned = [e["key"] for e in plan["benchmarks"] if any(r["candidates"] for r in e["regions"])]
    assert planned, "no benchmark got a µGraph: the path below was not exercised"
    for entry in plan["benchmarks"]:
        for region in entry["regions"]:
            assert region["search"]["stop_reason"] in (
                "exhausted",
                "time",
                "candidates",
                "no-candidates",
            )
            for c in region["candidates"]:
                assert c["verification"]["verified"] == "full"
                assert c["verification"]["bound"] <= 1e-9
    for row in res["benchmarks"]:
        by_label = {c["label"]: c for c in row["contenders"]}
        if row["key"] in planned:  # our µGraphs were lowered and float-checked
            assert by_label["mirage_jax #1 (pallas)"]["status"] == "ok (not timed)", row["key"]
        assert by_label["XLA"]["status"] == "ok (not timed)"
        assert by_label["XLA"]["rel_err"] <= reproduce_common.FP16_TOL
        for c in row["contenders"]:
            assert "time" not in c
            if c["kind"] in ("ours", "baseline") and "rel_err" in c:
                # every verified µGraph and every baseline matches the float64 reference
                assert c["status"] == "ok (not timed)", (row["key"], c)
            assert not c["status"].startswith(("failed", "lowering failed")), (row["key"], c)
    md = (tmp_path / "quick.md").read_text()
    assert "Not timed" in md and "| gqa | 1 |" in md
    assert "Nothing was timed or measured here" in md  # issue 17: no "medians", no bandwidth
    assert "at the measured bandwidth" not in md and "Times are medians" not in md


def test_merge_keeps_rows_this_run_did_not_time(tmp_path):
    plan = {"benchmarks": [{"key": k} for k in ("gqa_b1", "lora_b1", "gqa_b16")]}
    old = _results([_row("gqa", 1, 5.0, 10.0), _row("gqa", 16, 50.0, 100.0)])
    (tmp_path / "old.json").write_text(json.dumps(old))
    new = _results([_row("lora", 1, 2.0, 6.0), _row("gqa", 1, 4.0, 10.0)])
    reproduce_time._merge(new, plan, tmp_path / "old.json")
    assert [r["key"] for r in new["benchmarks"]] == ["gqa_b1", "lora_b1", "gqa_b16"]
    assert new["benchmarks"][0]["ours"]["us"] == 4.0  # this run's row wins
    assert new["merged_from"]["file"] == "old.json"
    other = dict(old, device="NVIDIA H200")
    (tmp_path / "h200.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="not NVIDIA H100"):
        reproduce_time._merge(new, plan, tmp_path / "h200.json")
