"""Pinning a node's threads to chosen CPUs (``runnode --cpus``, ``SCHEDULER_CPUS``).

A node is one Python process whose threads take turns on one interpreter lock: it never runs
Python on two CPUs at once, but the kernel still spreads its threads over every CPU, and each hand
over of the lock to a thread on another CPU is a cross-CPU wake-up. On the 2-core development VM a
thread switch cost about 30 us across CPUs and 2.5 us on one (two threads passing a lock back and
forth); 64 task bodies released together at a whole second started 70 us apart unpinned and 25 us
apart pinned. Off by default: a thread-isolated task that computes outside the lock (NumPy, a C
library) gets only the pinned CPUs. Process-isolated tasks are never pinned (their child process
gets back the CPUs the node had before).

Linux only (``os.sched_setaffinity``); elsewhere a request to pin is refused when the settings
load (``cluster.conf``, which also refuses CPUs the process may not use).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

# The CPUs this process could use before it pinned itself (None: never pinned).
_unpinned: set[int] | None = None


def pin(cpus: list[int]) -> None:
    """Pin every thread of this process (and every thread it starts later) to ``cpus``."""
    global _unpinned
    if not cpus:
        return
    if _unpinned is None:
        _unpinned = set(os.sched_getaffinity(0))
    wanted = set(cpus)
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), wanted)
        except (ProcessLookupError, PermissionError):  # a thread that has just ended
            continue
    logger.info("pinned to CPUs %s", sorted(wanted))


def unpinned() -> list[int] | None:
    """The CPUs this process had before it pinned itself (None: it never did)."""
    return None if _unpinned is None else sorted(_unpinned)


def restore(cpus: list[int] | None) -> None:
    """In a child process: use ``cpus`` again (the parent's CPUs before it pinned itself)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
