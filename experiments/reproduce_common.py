"""What the phases of `experiments.reproduce` share: paths, tolerances, versions, the suite."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "experiments" / "results"
QUICK_OUT = ROOT / "build" / "reproduce-quick"
FP16_TOL = 2e-2
"""Largest max|out − ref| / max|ref| accepted for an fp16 contender against float64."""
SCHEMA = 1
COMPARABLE = {
    "gqa": "same program and shapes",
    "qknorm": "the original's form (Q and V normalised, unscaled, no eps), same shapes",
    "rmsnorm": "the original's form (no eps), same shapes",
    "ntrans": "the original's form (no eps), same shapes",
    "lora": "same program; shapes agree at b=1 only",
    "gated_mlp": "same program; shapes agree at b=1 only",
}
"""How the original's µGraph for a benchmark compares with our program (rows it is shown in)."""


# ---------------------------------------------------------------------------- helpers
def today() -> str:
    return _dt.date.today().isoformat()


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _err(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def versions() -> dict[str, Any]:
    """Versions of everything that changes a result (and the git commit where there is one)."""
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("jax", "jaxlib", "numpy", "mirage-jax", "triton", "jax-triton", "tokamax"):
        out[name] = _dist_version(name)
    for name in ("galois", "egglog", "matplotlib"):
        out[name] = _dist_version(name)
    try:
        import mirage_jax

        out["mirage_jax"] = mirage_jax.__version__
    except Exception:
        pass
    try:  # on the GPU machine: the driver and cuDNN
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        if smi.returncode == 0:
            out["nvidia_smi"] = smi.stdout.strip()
            from jax._src.lib import cuda_versions  # private, version reporting only

            out["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            out["git_dirty"] = bool(dirty.stdout.strip())
    except Exception:
        pass
    if os.environ.get(COMMIT_ENV):  # a copy whose git metadata is not the code's (the device)
        out["git_commit"], out["git_dirty"] = os.environ[COMMIT_ENV], False
        out["commit_from"] = COMMIT_ENV
    return out


COMMIT_ENV = "MIRAGE_JAX_COMMIT"
"""Set to the commit of the code being run where the working tree's git metadata is not that
code's: the device tool copies the working tree with the `.git` of the session's start, so
`git rev-parse HEAD` there names an older commit (and `git_dirty` is true)."""


def commit_label(v: dict[str, Any]) -> str:
    """`versions()`' commit for a results file: its first 10 digits, and whether the working
    tree differed from it."""
    label = str(v.get("git_commit"))[:10]
    return label + (" with uncommitted changes" if v.get("git_dirty") else "")


def find_peer(peer: str | Path | None) -> Path | None:
    """The folder holding `h100/*.json` (`experiments.peer.find`), or None."""
    from experiments import peer as peer_mod

    return peer_mod.find(peer)


def newest(directory: Path, pattern: str) -> Path | None:
    files = sorted(directory.glob(pattern), key=lambda p: (p.stat().st_mtime, p.name))
    return files[-1] if files else None


def suite(names: Sequence[str], batches: Sequence[int], quick: bool) -> list[Any]:
    """The benchmarks to run, batch-major (so a run cut short still covers whole batches)."""
    from experiments import benchmarks as B

    out = []
    for b in batches:
        for n in names:
            bm = B.get(n, b)
            out.append(bm.small() if quick else bm)
    return out


def _region_programs(bm: Any) -> tuple[Any, Any, list[Any]]:
    import lax_ir

    program = lax_ir.capture(bm.fn, *bm.inputs)
    part = lax_ir.partition(program)
    return program, part, [r for r in part.regions if not r.is_trivial]


def _output_order(verdict: Any, n_outputs: int) -> list[int]:
    """order[j] = the µGraph output equal to region output j."""
    matching = getattr(verdict, "matching", None)
    if not matching:
        return list(range(n_outputs))
    order = [0] * len(matching)
    for i, j in enumerate(matching):
        order[j] = i
    return order
