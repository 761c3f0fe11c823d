"""Every `mirage-jax` usage or environment error is one line on stderr and a non-zero exit
(issue 14): no tracebacks, no success reported for a run that stored nothing."""

from __future__ import annotations

import pytest

from mirage_jax.cli import main

FN = "experiments.benchmarks:rmsnorm_mirage"
ARGS = ["--arg", "f16[2,256]", "--arg", "f16[256,384]"]
UNOPENABLE = "/proc/mirage-jax-test/c.sqlite"  # /proc refuses new files, even to root


pytestmark = pytest.mark.usefixtures("quiet_mirage")


def fails_in_one_line(capsys, *argv) -> str:
    """Run the CLI; assert a non-zero exit with a one-line message; return the message."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc not in (0, None), (argv, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "args, words",
    [
        ([], ["takes 2", "--arg"]),
        (["--arg", "f16[2,256]"], ["takes 2", "got 1"]),
        (["--arg", "f16[2,256]", "--arg", "f16[128,384]"], ["--arg", "dot_general"]),
    ],
    ids=["no-args", "too-few-args", "mismatched-shapes"],
)
def test_optimize_with_arguments_the_function_rejects(capsys, tmp_path, args, words):
    err = fails_in_one_line(
        capsys, "optimize", FN, *args, "--cache", str(tmp_path / "c.sqlite"), "-q"
    )
    for w in words:
        assert w in err


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--budget-s", "-5", ["--budget-s", "positive"]),
        ("--budget-s", "0", ["--budget-s", "positive"]),
        ("--budget-s", "nan", ["--budget-s", "finite"]),
        ("--budget-s", "inf", ["--budget-s", "finite"]),
        ("--workers", "0", ["--workers", "at least 1"]),
    ],
)
def test_numeric_options_are_validated(capsys, option, value, words):
    err = fails_in_one_line(capsys, "optimize", FN, *ARGS, option, value)
    for w in words:
        assert w in err


@pytest.mark.parametrize("spec", ["f16[2,,64]", "f16[,64]", "f16[2,]", "f16[,]", "f16[2 64]"])
def test_malformed_array_specs_are_rejected(capsys, spec):
    err = fails_in_one_line(capsys, "explain", FN, "--arg", spec, "--arg", "f16[256,384]")
    assert spec in err


def test_optimize_into_a_cache_it_cannot_write_fails_before_searching(capsys):
    err = fails_in_one_line(capsys, "optimize", FN, *ARGS, "--cache", UNOPENABLE, "-q")
    assert UNOPENABLE in err and "--cache" in err


@pytest.mark.parametrize("action", [["ls"], ["clear"], ["show", "abcd"], ["export", "x.jsonl"]])
def test_cache_actions_on_a_database_that_cannot_be_opened(capsys, action):
    err = fails_in_one_line(capsys, "cache", *action, "--cache", UNOPENABLE)
    assert UNOPENABLE in err


def test_cache_export_to_paths_it_cannot_write(capsys, tmp_path):
    db = ["--cache", str(tmp_path / "c.sqlite")]
    for target in (tmp_path / "missing" / "x.jsonl", tmp_path, "/proc/x.jsonl"):
        err = fails_in_one_line(capsys, "cache", "export", str(target), *db)
        assert str(target) in err
    assert not list(tmp_path.glob("*.tmp*"))  # no half-written file left behind


def test_cache_import_from_paths_it_cannot_read(capsys, tmp_path):
    db = ["--cache", str(tmp_path / "c.sqlite")]
    for source in (tmp_path / "missing.jsonl", tmp_path):
        err = fails_in_one_line(capsys, "cache", "import", str(source), *db)
        assert str(source) in err


def test_cache_import_reports_rejected_lines_and_exits_non_zero(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"key": 1}\n\xff\n')
    rc = main(["cache", "import", str(bad), "--cache", str(tmp_path / "c.sqlite")])
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err
    assert f"{bad}:1: rejected" in err and f"{bad}:2: rejected" in err
    assert "imported 0 entries" in out and "rejected 2 lines" in out


def test_explain_svg_into_a_directory_it_cannot_create(capsys, tmp_path):
    err = fails_in_one_line(
        capsys, "explain", FN, *ARGS, "--cache", str(tmp_path / "c.sqlite"),
        "--backend", "reference", "--svg", "/proc/mirage-jax-svg",
    )  # fmt: skip
    assert "/proc/mirage-jax-svg" in err


def test_show_with_an_empty_or_non_hex_prefix(capsys, tmp_path):
    from mirage_jax.cache import Cache

    cache = Cache(tmp_path / "c.sqlite")
    cache.put(Cache.entry("ab" * 32, "cpu", "pallas"))  # one entry that a LIKE '%' would match
    db = ["--cache", str(cache.path)]
    for key in ("", "%", "zz"):
        err = fails_in_one_line(capsys, "cache", "show", key, *db)
        assert "hexadecimal" in err or "no entry" in err


def test_optimize_that_stored_nothing_does_not_report_success(capsys, tmp_path, monkeypatch):
    from mirage_jax.cache import Cache, CacheUnavailable

    def refuse(self, entry):
        raise CacheUnavailable("disk full")

    monkeypatch.setattr(Cache, "_write", refuse)  # opens, but every write fails
    argv = [*ARGS, "--cache", str(tmp_path / "c.sqlite"), "--backend", "reference", "-q"]
    rc = main(["optimize", FN, *argv, "--budget-s", "2"])
    out, err = capsys.readouterr()
    assert rc == 1 and "fused kernel" not in out
    assert err.count("\n") == 1 and "not stored" in err and "disk full" in err


def test_bench_without_the_experiments_package_says_what_it_needs(monkeypatch, capsys) -> None:
    """An installation without `experiments` gets one line naming it and how to get it."""
    import sys

    from mirage_jax import cli

    for mod in [m for m in sys.modules if m == "experiments" or m.startswith("experiments.")]:
        monkeypatch.setitem(sys.modules, mod, None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "experiments", None)
    monkeypatch.setattr(cli, "_benchmark_names", lambda: [])
    assert cli.main(["bench", "rmsnorm", "--small"]) != 0
    err = capsys.readouterr().err
    assert "needs the repository's `experiments` package" in err and "pip install -e ." in err
