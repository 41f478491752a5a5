"""The benchmark's task: record when its body started (first thing), for which job and slot."""

from __future__ import annotations

import os
import threading
import time

from jobs.registry import TaskContext, task

# One descriptor per record file and process, as the Celery peer's task keeps one (opening and
# closing the file per run cost ours about 30 us a run more than the peer's body).
_files: dict[tuple[str, int], int] = {}
_files_lock = threading.Lock()


def _descriptor(path: str) -> int:
    key = (path, os.getpid())
    fd = _files.get(key)
    if fd is None:
        with _files_lock:
            fd = _files.get(key)
            if fd is None:
                fd = _files[key] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return fd


@task("bench.record", takes_context=True)
def record(path: str, context: TaskContext, name: str = "") -> None:
    """``name`` tells apart runs of one job enqueued with arguments of their own (W2)."""
    started = time.time()
    slot = context.scheduled_for.timestamp() if context.scheduled_for else 0.0
    line = f"{name or context.job_name} {slot:.6f} {context.attempt} {started:.6f} {os.getpid()}\n"
    # One O_APPEND write per run: whole lines, whatever other threads write meanwhile.
    os.write(_descriptor(path), line.encode())
