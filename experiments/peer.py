"""Where the original Mirage's µGraph checkpoints are, and how to get them.

They are not part of this repository: they are the files the original saved in the
`evaluation` branch of its public repository, https://github.com/mirage-project/mirage
(`benchmark/saved_mugraphs_hopper/` for the H100, `benchmark/saved_mugraphs/` for the A100;
Apache License 2.0). `find` accepts a clone of that branch, or a folder holding them as
`h100/*.json` and `a100/*.json`, and returns the latter layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

ENV = "MIRAGE_PEER_DIR"
ROOT = Path(__file__).resolve().parents[1]
# Inside the clone; `shared/` is where this project's own copy travels (beside or inside it).
DEFAULTS = (
    ROOT / "build" / "peer",
    ROOT / "shared" / "peer",
    ROOT.parent / "shared" / "peer",
)
HOW_TO_GET = (
    "the original Mirage's µGraph checkpoints are not part of this repository; get them with "
    "`git clone --depth 1 --branch evaluation https://github.com/mirage-project/mirage "
    f"/tmp/mirage` and set {ENV}=/tmp/mirage (or pass --peer /tmp/mirage)"
)
CLONE_FOLDERS = (("h100", "saved_mugraphs_hopper"), ("a100", "saved_mugraphs"))


def find(peer: str | Path | None = None) -> Path | None:
    """The folder holding the checkpoints as `h100/*.json` (and `a100/*.json`), or None.

    Arguments:
        peer: a folder to look in; else `$MIRAGE_PEER_DIR`, then `DEFAULTS`. Each may be such
            a folder, its parent, or a clone of the original's `evaluation` branch.
    """
    if peer:
        roots = [Path(peer)]
    else:
        roots = [Path(os.environ[ENV])] if os.environ.get(ENV) else []
        roots += DEFAULTS
    for root in roots:
        for d in (root, root / "mirage_mugraphs"):
            if (d / "h100").is_dir():
                return d
        if (root / "benchmark" / "saved_mugraphs_hopper").is_dir():
            return _linked(root / "benchmark")
    return None


def _linked(benchmark: Path) -> Path:
    """A folder of links h100 → saved_mugraphs_hopper, a100 → saved_mugraphs of a clone."""
    tag = hashlib.sha1(str(benchmark.resolve()).encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"mirage_jax_peer_{tag}"
    out.mkdir(exist_ok=True)
    for name, folder in CLONE_FOLDERS:
        link, target = out / name, (benchmark / folder).resolve()
        if target.is_dir() and not link.exists():
            with contextlib.suppress(FileExistsError):  # another process made it first
                link.symlink_to(target, target_is_directory=True)
    return out
