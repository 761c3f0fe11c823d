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
