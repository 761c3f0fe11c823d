"""The install's two checks that pyproject.toml cannot state.

1. An install under a Python older than 3.12 stops with a message that says so (pip's own
   answer is a confusing 'No matching distribution found for jax').
2. The installed top level holds the project's own names only: a wheel installs `mirage_jax`,
   `lax_ir` and `fields`. The repository's `experiments` (benchmarks, the real-model set, the
   reproduction scripts and their results) is a generic name and needs the clone's files, so
   only an editable install of a clone (`pip install -e .`, the README's) and the sdist carry
   it; the CLI commands that use it (`bench`, `reproduce`, `optimize --models`) say so where it
   is missing (docs/decisions.md).
"""

import os
import sys

if sys.version_info < (3, 12):  # noqa: UP036 (this file exists for older Pythons)
    sys.exit(
        f"mirage_jax needs Python 3.12 or newer; this is Python {sys.version.split()[0]} "
        f"({sys.executable}). Create the venv with python3.12 (the repository's "
        ".python-version selects it under pyenv and uv)."
    )

LIBRARY = ("mirage_jax", "lax_ir", "fields")
WITH_EXPERIMENTS = ("editable_wheel", "develop", "sdist")  # setuptools commands of a clone


def packages(argv):
    """The packages a build with this command line installs (see the module docstring)."""
    here = os.path.dirname(os.path.abspath(__file__))
    clone = any(command in argv for command in WITH_EXPERIMENTS)
    found = []
    for top in (*LIBRARY, "experiments") if clone else LIBRARY:
        for folder, subfolders, files in os.walk(os.path.join(here, top)):
            if "__init__.py" not in files:
                subfolders.clear()  # not a package (data, caches): nothing below it either
                continue
            found.append(os.path.relpath(folder, here).replace(os.sep, "."))
    return sorted(found)


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__
    from setuptools import setup

    setup(packages=packages(sys.argv))
