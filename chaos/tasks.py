"""The chaos run's task: it logs its own side effects, so the checker can tell which bodies ran.

Node processes import this module through ``SCHEDULER_TASK_MODULES=chaos.tasks``; nothing
in production registers it (``cluster`` has no ``tasks`` module of its own to autodiscover).
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any

from jobs.registry import TaskArgumentError, TaskContext, task

ERR_PATH_REQUIRED = "path must be a non-empty string (the side-effect log)"
ERR_BAD_SECONDS = "sleep_s and long_s must be numbers between 0 and 60"
ERR_BAD_EVERY = "long_every must be an integer >= 0"
MAX_SLEEP_S = 60.0
# How often a sleeping body looks at its cancel flag.
CANCEL_POLL_S = 0.02


def true_time() -> float:
    """The machine's time, even on a node whose wall clock the nemesis has stepped: the step is
    read from the file the node's clock shim reads (``CLOCK_SHIM_FILE``) and taken back off, so
    the side-effect log stays on the one clock the checker judges by."""
    now = time.time()
    path = os.environ.get("CLOCK_SHIM_FILE")
    if not path:
        return now
    try:
        with open(path, "rb") as shim:
            (offset_ns,) = struct.unpack("<q", shim.read(8))
    except (OSError, struct.error):
        return now
    return now - offset_ns / 1e9


def append_line(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line with a single write on an O_APPEND descriptor: lines written by several
    processes at once never interleave (one short write to a local file is atomic)."""
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _validate(args: list, kwargs: dict) -> None:
    if not isinstance(kwargs.get("path"), str) or not kwargs["path"]:
        raise TaskArgumentError("kwargs", ERR_PATH_REQUIRED)
    for name in ("sleep_s", "long_s"):
        value = kwargs.get(name, 0.0)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= MAX_SLEEP_S
        ):
            raise TaskArgumentError("kwargs", ERR_BAD_SECONDS)
    every = kwargs.get("long_every", 0)
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise TaskArgumentError("kwargs", ERR_BAD_EVERY)


@task("chaos.record", takes_context=True, validate=_validate)
def record(
    path: str,
    *,
    context: TaskContext,
    job_id: int | None = None,
    sleep_s: float = 0.0,
    long_s: float = 0.0,
    long_every: int = 0,
    fenced: bool = False,
) -> dict[str, Any]:
    """Log {"event": "start"} first thing, sleep (``long_s`` on every ``long_every``-th slot, so a
    forbid job sometimes really overlaps its next slot), then log {"event": "end"}. A ``fenced``
    job's body ends with a fenced write of its token to the job's row (``fenced_write``), and its
    end line says what became of it."""
    started = true_time()  # before anything else: the line says when the body began
    slot = context.scheduled_for.timestamp() if context.scheduled_for else None
    base = {
        "execution_id": context.execution_id,
        "job_id": job_id,
        "scheduled_for": slot,
        "attempt": context.attempt,
        "node": os.environ.get("SCHEDULER_NODE_ID", ""),
        "pid": os.getpid(),
    }
    append_line(path, {"event": "start", **base, "at": started})
    seconds = sleep_s
    if long_every and slot is not None and round(slot) % long_every == 0:
        seconds = long_s
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not context.cancelled:
        time.sleep(min(CANCEL_POLL_S, max(0.0, deadline - time.monotonic())))
    end: dict[str, Any] = {"cancelled": context.cancelled}
    if fenced and job_id is not None:
        end.update(fenced_write(job_id, context))
    append_line(path, {"event": "end", **base, "at": true_time(), **end})
    return {"pid": os.getpid(), "slept_s": seconds}


def fence_row(job_id: int) -> str:
    """The row standing for the shop's own record that a fenced job writes (a SchedulerSetting:
    any table with an integer token column will do)."""
    return f"chaos-fence-{job_id}"


def fenced_write(job_id: int, context: TaskContext) -> dict[str, Any]:
    """What a careful task does with its work: write it through the fence. Returns the end line's
    fields: its token, whether it still held its claim just before, and "accepted", "refused"
    (a newer run had written) or "error: ..." (the database did not answer)."""
    from django.db import DatabaseError, close_old_connections

    from jobs.fencing import StaleToken, fenced_update
    from jobs.models import SchedulerSetting

    owner = context.still_owner()
    try:
        fenced_update(
            SchedulerSetting.objects.filter(name=fence_row(job_id)),
            token=int(context.fencing_token or 0),
            field="value",
        )
        outcome = "accepted"
    except StaleToken:
        outcome = "refused"
    except DatabaseError as exc:
        outcome = f"error: {type(exc).__name__}"
        close_old_connections()
    return {"token": context.fencing_token, "still_owner": owner, "fenced": outcome}
