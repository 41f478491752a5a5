"""Tasks used by the cluster tests and benchmarks. Node processes import this module through
SCHEDULER_TASK_MODULES=tests.cluster.tasks; nothing in production registers them."""

from __future__ import annotations

import os
import time
from typing import Any

from jobs.registry import TaskContext, task


@task("test.record", takes_context=True)
def record(path: str, context: TaskContext) -> dict[str, Any]:
    """Append one line per run: execution id, slot, attempt, start time, pid. The first thing
    done is taking the time, so the line says when the body started."""
    started = time.time()
    slot = context.scheduled_for.timestamp() if context.scheduled_for else 0.0
    line = f"{context.execution_id} {slot:.6f} {context.attempt} {started:.6f} {os.getpid()}\n"
    # O_APPEND writes of one short line are atomic across processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {"pid": os.getpid()}


@task("test.record_and_sleep", takes_context=True)
def record_and_sleep(path: str, seconds: float, context: TaskContext) -> None:
    """Record the start, then sleep (cancellable)."""
    record(path, context=context)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not context.cancelled:
        time.sleep(0.05)


@task("test.hang")
def hang(pid_file: str, seconds: float = 3600) -> None:
    """Write our pid, then block ignoring cancellation: only a kill stops it."""
    with open(pid_file, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)


@task("test.fail")
def fail(message: str = "boom") -> None:
    raise RuntimeError(message)


@task("test.cpus")
def cpus(path: str) -> None:
    """Write the CPUs this (process-isolated) run may use."""
    with open(path, "w") as handle:
        handle.write(",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))))
