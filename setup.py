"""Stops an install under a Python older than 3.12 with a message that says so (pip's own
answer is a confusing 'No matching distribution found for jax'). Everything else is in
pyproject.toml."""

import sys

if sys.version_info < (3, 12):  # noqa: UP036 (this file exists for older Pythons)
    sys.exit(
        f"mirage_jax needs Python 3.12 or newer; this is Python {sys.version.split()[0]} "
        f"({sys.executable}). Create the venv with python3.12 (the repository's "
        ".python-version selects it under pyenv and uv)."
    )

from setuptools import setup

setup()
