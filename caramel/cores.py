"""The CPU cores this process may use: what every pool of host threads is sized by.

A process bound to some cores (``taskset``, MPI launchers and batch schedulers bind ranks) sizes its pools by those
cores, not by the machine's: threads beyond them only wait.
This module imports nothing of caramel, so that every layer can.
"""

from __future__ import annotations

import os


def available() -> int:
    """The number of cores this process may run on (its affinity set; the machine's count where the platform
    has no affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
