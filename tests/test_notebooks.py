"""Every notebook in notebooks/ runs top to bottom on the CPU (nbclient) and shows its pictures.

The kernel is this interpreter (a kernelspec written to a temporary JUPYTER_PATH), so the test
works in a fresh clone after the README's install command, whatever kernels the machine has.
Notebooks run with the repository root as their working directory and a temporary kernel
cache; they are kept in git with their outputs cleared.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PICTURES = ("image/png", "image/svg+xml")
KERNEL = "mirage-jax-tests"


@pytest.fixture
def kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec for this interpreter, found through a temporary JUPYTER_PATH."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "mirage_jax tests",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MIRAGE_JAX_CACHE", str(tmp_path / "cache.sqlite"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return KERNEL


def _pictures(nb) -> int:
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            n += any(k in data for k in PICTURES) or "<svg" in str(data.get("text/html", ""))
    return n


def test_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names == [
        "01_quickstart.ipynb",
        "02_mugraphs.ipynb",
        "03_search.ipynb",
        "04_paper_figures.ipynb",
        "05_real_models.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_outputs_are_cleared(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: clear outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel, tmp_path):
    from jupyter_client.manager import AsyncKernelManager

    nb = nbformat.read(path, as_version=4)
    # IPC sockets in tmp_path: no TCP port races between kernels started in parallel.
    km = AsyncKernelManager(kernel_name=kernel, transport="ipc", ip=str(tmp_path / "kernel-ipc"))
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=900,
        kernel_name=kernel,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()  # raises CellExecutionError naming the cell on any exception
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    if not path.name.startswith("01"):  # 01 draws only when a kernel is chosen
        assert _pictures(nb) >= 1, f"{path.name} shows no picture"


def test_a_saved_progress_bar_shows_its_final_state(kernel, tmp_path):
    """Executed headless, a notebook's progress bar is saved with its final text ("3/3"), not
    the widget's starting "0%" (`mirage_jax.progress`); a bar that goes away leaves no text."""
    from jupyter_client.manager import AsyncKernelManager

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from mirage_jax.progress import progress_bar\n"
            "for _ in progress_bar(range(3), desc='regions'):\n"
            "    pass\n"
            "bar = progress_bar(total=2, desc='tasks', leave=False)\n"
            "bar.update(2)\n"
            "bar.close()"
        )
    ]
    km = AsyncKernelManager(kernel_name=kernel, transport="ipc", ip=str(tmp_path / "kernel-ipc"))
    client = nbclient.NotebookClient(
        nb, km=km, timeout=300, kernel_name=kernel, resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    texts = [o["data"].get("text/plain", "") for o in nb.cells[0].outputs if "data" in o]
    assert len(texts) == 2, nb.cells[0].outputs
    assert "100%" in texts[0] and "3/3" in texts[0], texts
    assert texts[1] == "", texts
