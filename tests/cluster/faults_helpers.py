"""Small helpers for the worker fault tests (test_worker_faults.py): job factories, row dumps for
failure diagnosis, and process inspection through /proc."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone

from jobs import services
from jobs.models import Job, JobExecution
from tests.cluster.harness import read_records

ROW_FIELDS = (
    "pk",
    "scheduled_for",
    "attempt",
    "status",
    "node",
    "term",
    "trigger",
    "reason",
    "claimed_at",
    "started_at",
    "finished_at",
)


def make_job(name: str, task: str, kwargs: dict[str, Any], **fields: Any) -> Job:
    return services.job_create(
        data={"name": name, "task": task, "kwargs": kwargs, **fields}, by=services.SYSTEM
    )


def make_interval_job(name: str, task: str, kwargs: dict[str, Any], **fields: Any) -> Job:
    return make_job(name, task, kwargs, schedule_type="interval", interval_seconds=1, **fields)


def make_manual_job(name: str, task: str, kwargs: dict[str, Any], **fields: Any) -> Job:
    """A one-off job due in a day: it only runs when triggered (or retried) during a test."""
    return make_job(
        name,
        task,
        kwargs,
        schedule_type="once",
        run_at=timezone.now() + timedelta(days=1),
        **fields,
    )


def rows(job: Job) -> list[dict[str, Any]]:
    return list(
        JobExecution.objects.filter(job=job)
        .order_by("scheduled_for", "attempt")
        .values(*ROW_FIELDS)
    )


def dump(job: Job) -> str:
    """Every execution of ``job`` as text (printed, so pytest shows it when an assertion fails)."""
    text = "\n".join(" ".join(str(row[f]) for f in ROW_FIELDS) for row in rows(job))
    print(f"--- executions of {job.name} ---\n{text}")
    return text


def record_count(path: Path) -> int:
    return len(read_records(path))


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def spawned_task_children(parent_pid: int) -> set[int]:
    """PIDs of multiprocessing ``spawn`` children of ``parent_pid`` that run a task (not the
    resource tracker)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent_pid and b"spawn_main" in cmdline:
            found.add(int(entry))
    return found
