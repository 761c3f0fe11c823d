"""How much memory a verification trial takes, and a gate that keeps trials within the machine's.

A trial interprets both programs on field arrays of every intermediate's full shape, so its
memory grows with the region: about 9.2 bytes per element of the region's nodes, both sides
together (GPT-2's attention region at 16 heads × 512², 31.8 M elements: 278 MB over the
interpreter's own, measured on this project's CPU machine, 2026-11-25). At GPT-2 XL size and
batch 8 that is about 17 GB per trial, and a pool of workers running trials side by side
outgrew a 128 GB machine (a worker was killed; the search of that region failed). Trials are
therefore admitted against the memory the machine has available: `verify` waits for room
in-process, `trial_bytes` lets a pool run its trials in waves that fit, and a trial larger
than the room there is at all is refused with `TooLarge` instead of being run.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

BYTES_PER_ELEMENT = 12
"""Bytes a trial takes per element of the region's nodes (9.2 measured, rounded up)."""

SHARE = 0.5
"""The share of the machine's available memory verification may take at once."""


LARGE_TRIAL = 4 * 2**30
"""A trial estimated above this is large: the search does not verify such a region's µGraphs
at full size, and `select` times them first and verifies only the fastest (then the next, if
it is not equal). At GPT-2 XL size and batch 8 (about 23 GB a trial by this estimate) the
search's full-size verification of its first four µGraphs took 146 s of a 186 s first call
(H100 machine, 2026-11-25)."""


class TooLarge(MemoryError):
    """A verification trial that needs more memory than the machine has available."""


def elements(program: Any) -> int:
    """Elements of every node of `program` (a `lax_ir.Program`); of its inputs and outputs for
    anything else (a µGraph, whose kernel intermediates mirror its region's)."""
    nodes = getattr(program, "nodes", None)
    if nodes is not None and all(hasattr(n, "shape") for n in nodes):
        return sum(math.prod(n.shape) for n in nodes)
    avals = [*getattr(program, "input_avals", ()), *getattr(program, "output_avals", ())]
    return sum(math.prod(getattr(a, "shape", a[0] if isinstance(a, tuple) else ())) for a in avals)


def trial_bytes(a: Any, b: Any) -> int:
    """Estimated peak memory of one trial comparing `a` and `b` (the larger side decides)."""
    return BYTES_PER_ELEMENT * max(elements(a), elements(b))


def available() -> int:
    """The machine's available memory in bytes (`MemAvailable` of /proc/meminfo where there
    is one, else the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def room() -> int:
    """The memory verification may take at once: `SHARE` of what is available now."""
    return int(SHARE * available())


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def too_large(need: int, have: int) -> str:
    """Why a trial was refused, for the user."""
    return (
        f"one verification trial of this region needs about {gib(need)} of memory, more than "
        f"the {gib(have)} verification may take here ({SHARE:.0%} of the available memory); "
        "the region runs as XLA (use a machine with more memory, or a smaller batch)"
    )


class _Gate:
    """Admits trials while their estimates fit in `room()` together (one process)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held = 0

    @contextlib.contextmanager
    def admit(self, need: int) -> Iterator[None]:
        """Run the body once `need` bytes fit beside the trials already admitted (counted as
        if they had not allocated yet: safe, if cautious); `TooLarge` where it never can."""
        with self.cond:
            while True:
                have = room()
                if self.held + need <= have:
                    break
                if self.held == 0:
                    raise TooLarge(too_large(need, have))
                self.cond.wait()
            self.held += need
        try:
            yield
        finally:
            with self.cond:
                self.held -= need
                self.cond.notify_all()


GATE = _Gate()
"""This process's gate: `verify` runs its trials inside `GATE.admit(trial_bytes(a, b))`."""
