"""What a newcomer meets before any code runs (issue 17): the Python the clone selects and
the message a wrong Python gets."""

from __future__ import annotations

import runpy
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_python_version_file_selects_a_python_the_project_accepts():
    chosen = (ROOT / ".python-version").read_text().strip()
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == ">=3.12"
    assert tuple(int(p) for p in chosen.split(".")[:2]) >= (3, 12)


def test_readme_opens_with_the_two_commands_ci_runs():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert block[0].startswith("python3.12 -m venv .venv && .venv/bin/pip install")
    assert block[1].startswith(".venv/bin/python -m pytest")


def test_an_older_python_is_told_which_python_is_needed(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 11, 7, "final", 0))
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / "setup.py"))
    assert "needs Python 3.12 or newer" in str(e.value) and ".python-version" in str(e.value)


@pytest.mark.parametrize(
    "path", ["README.md", *sorted(p.name for p in ROOT.glob("notebooks/*.ipynb"))]
)
def test_no_reference_to_files_a_user_does_not_have(path):
    text = (ROOT / path if path == "README.md" else ROOT / "notebooks" / path).read_text()
    for outside in ("../shared", "BENCHMARKS.md", "build/prev.json"):
        assert outside not in text, (path, outside)


def test_the_files_the_readme_links_exist():
    import re

    text = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)\)", text))
    assert linked and all((ROOT / p).exists() for p in linked), linked


def test_the_main_jobs_output_explains_itself(capsys, tmp_path):
    """Issue 17: the --small run named the full-size W, the floor was unexplained, the op count
    disagreed with its list, and neither the first call's time nor the cache path was printed."""
    from mirage_jax.cli import main

    rc = main(["bench", "rmsnorm", "--small", "--check", "--jit", "--backend", "xla",
               "--search", "off", "--cache", str(tmp_path / "c.sqlite")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "at --small size (shapes scaled down for a CPU" in out
    assert "(no implementation is faster)" in out
    assert "10 ops (" in out and "2 constant(s) copied in" in out
    assert "first call (capture, cache lookup, search on a miss, lowering):" in out
    assert "kernel cache:" in out


def test_a_wheel_installs_the_projects_own_names_and_a_clone_also_experiments():
    """Issue 17: the wheel put a generic `experiments` at the top level of site-packages."""
    packages = runpy.run_path(str(ROOT / "setup.py"))["packages"]
    wheel = packages(["setup.py", "bdist_wheel", "--dist-dir", "x"])
    assert {p.split(".")[0] for p in wheel} == {"mirage_jax", "lax_ir", "fields"}
    editable = packages(["setup.py", "editable_wheel", "--dist-dir", "x"])
    assert {p.split(".")[0] for p in editable} == {"mirage_jax", "lax_ir", "fields", "experiments"}
    assert "experiments.models" in editable and "mirage_jax.search" in wheel


def test_without_the_clone_the_commands_that_need_it_say_so(capsys, monkeypatch):
    from mirage_jax import zoo
    from mirage_jax.cli import main

    for name in [m for m in sys.modules if m.split(".")[0] == "experiments"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "experiments", None)  # as in a wheel's install
    assert main(["bench", "rmsnorm", "--small"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mirage-jax bench: needs the repository's `experiments` package")
    assert "pip install -e ." in err
    assert main(["reproduce", "--quick", "--budget-s", "5"]) == 1  # not 'unrecognized arguments'
    assert "which a wheel does not install" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    assert "pip install -e ." in " ".join(capsys.readouterr().out.split())
    with pytest.raises(ModuleNotFoundError, match="pip install -e"):
        zoo.model_jobs(["sdpa"])


def test_notebook_05_plots_the_h100_runs_the_readme_quotes():
    import re

    readme = (ROOT / "README.md").read_text()
    quoted = set(re.findall(r"results/(real_baselines_h100_[\w-]+)\.md\)", readme))
    notebook = (ROOT / "notebooks" / "05_real_models.ipynb").read_text()
    assert quoted and all(f"{run}.json" in notebook for run in quoted), quoted
