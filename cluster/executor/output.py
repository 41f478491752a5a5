"""A task's prints, captured per run: thread-isolated tasks share the process's ``sys.stdout``, so
a replacement sends each task thread's writes to its own run's output."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable
from typing import Any

from jobs import fencing, registry


class ThreadOutput(io.TextIOBase):
    """sys.stdout replacement that sends a task thread's prints to its own buffer.

    ``print("a", 1)`` arrives as several writes ("a", " ", "1", "\\n"): text is kept per thread
    until a newline completes the line, so one print is one line of output."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.local = threading.local()

    def write(self, text: str) -> int:
        context = getattr(self.local, "context", None)
        if context is None:
            return self.original.write(text)
        pending = getattr(self.local, "pending", "") + text
        *lines, pending = pending.split("\n")
        for line in lines:
            if line.strip():
                context.log(line)
        self.local.pending = pending
        return len(text)

    def attach(self, context: registry.TaskContext) -> None:
        self.local.context = context
        self.local.pending = ""

    def detach(self) -> None:
        """The task ended: keep its last, unterminated line, then stop capturing."""
        context = getattr(self.local, "context", None)
        pending = getattr(self.local, "pending", "")
        if context is not None and pending.strip():
            context.log(pending)
        self.local.context = None
        self.local.pending = ""

    def flush(self) -> None:
        if getattr(self.local, "context", None) is None:
            self.original.flush()


_stdout: ThreadOutput | None = None
_stdout_lock = threading.Lock()


def install_output_capture() -> ThreadOutput:
    """The process's capturing stdout, installed (again) if someone replaced it."""
    global _stdout
    current = _stdout
    if current is not None and sys.stdout is current:
        return current  # installed already (every run asks: no lock for the usual answer)
    with _stdout_lock:
        if _stdout is None:
            _stdout = ThreadOutput(sys.stdout)
        if sys.stdout is not _stdout:
            # Someone (a test runner, a library) put its own stream back: wrap that one.
            _stdout.original = sys.stdout
            sys.stdout = _stdout
        return _stdout


def call_task(
    spec: registry.TaskSpec, args: list, kwargs: dict, context: registry.TaskContext
) -> Any:
    """Call a task's function, with its context if it takes one."""
    if spec.takes_context:
        return spec.func(*args, context=context, **kwargs)
    return spec.func(*args, **kwargs)


def task_context(
    execution: Any,
    cancel_event: threading.Event,
    owner_check: Callable[[], bool] | None = None,
) -> registry.TaskContext:
    """The context a run's task is given: its fencing token and idempotency key
    (``jobs.fencing``) and, given ``owner_check``, whether its claim still holds."""
    return registry.TaskContext(
        execution_id=execution.pk,
        job_name=execution.job.name,
        attempt=execution.attempt,
        scheduled_for=execution.scheduled_for,
        cancel_event=cancel_event,
        fencing_token=execution.pk,
        idempotency_key=fencing.run_key(execution),
        owner_check=owner_check,
    )
