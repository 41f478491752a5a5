"""The benchmark's task: record when its body started (first thing), for which job and slot."""

from __future__ import annotations

import os
import time

from jobs.registry import TaskContext, task


@task("bench.record", takes_context=True)
def record(path: str, context: TaskContext, name: str = "") -> None:
    """``name`` tells apart runs of one job enqueued with arguments of their own (W2)."""
    started = time.time()
    slot = context.scheduled_for.timestamp() if context.scheduled_for else 0.0
    line = f"{name or context.job_name} {slot:.6f} {context.attempt} {started:.6f} {os.getpid()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
