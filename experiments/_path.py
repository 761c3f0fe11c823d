"""Puts the repository root on sys.path, for a script run as `python experiments/X.py`.

Run that way, only experiments/ is on the path, so `lax_ir`, `fields`, `mirage_jax` and
`experiments` import only if the package is installed. A script imports this module first,
only when it runs as a script (`python -m experiments.X` and imports need nothing):

    if not __package__:  # python experiments/X.py: see experiments/_path.py
        import _path  # noqa: F401
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
