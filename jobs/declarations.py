"""Jobs declared in code, beside their tasks, and applied with ``jobs apply --from-code``.

A declaration is a job definition in the format ``jobs export`` writes and ``jobs apply`` reads
(``docs/jobs.md``): nothing is written when it is declared, and the operator's ``jobs apply
--from-code`` (``--dry-run`` shows the diff first) creates or updates the jobs by name through
the same checks as a file. ``@task(schedule=...)`` is the shorthand for a job named after its
task.

    from jobs.declarations import declare_job
    from jobs.registry import task

    @task(schedule="0 3 * * *")          # a job "myapp.tasks.purge" at 03:00 UTC
    def purge(): ...

    declare_job("hourly-report", task="myapp.tasks.report", cron_expression="0 * * * *",
                kwargs={"format": "pdf"}, timezone="Europe/Paris")
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any


class DuplicateJobDeclaration(ValueError):
    """A different definition is already declared under this job name."""


_lock = threading.Lock()
_declared: dict[str, dict[str, Any]] = {}


def declare_job(name: str, *, task: str, **fields: Any) -> dict[str, Any]:
    """Declare the job ``name`` running ``task`` with the other fields of a job definition (a
    ``cron_expression``, an ``interval_seconds`` or a ``run_at``; ``schedule_type`` may be left
    out: it follows from which of them is given). Checked in full when applied, not here.
    Declaring the same definition again is a no-op; a different one under a taken name raises
    :class:`DuplicateJobDeclaration`. Returns the definition."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"a job name must be a non-empty string, got {name!r}")
    if not isinstance(task, str) or not task.strip():
        raise TypeError(f"a task name must be a non-empty string, got {task!r}")
    definition = {"name": name, "task": task, **fields}
    if "schedule_type" not in definition:
        for field, kind in (
            ("cron_expression", "cron"),
            ("interval_seconds", "interval"),
            ("run_at", "once"),
        ):
            if field in definition:
                definition["schedule_type"] = kind
                break
    with _lock:
        existing = _declared.get(name)
        if existing is not None and existing != definition:
            raise DuplicateJobDeclaration(
                f"job {name!r} is already declared with another definition "
                f"(task {existing['task']!r})"
            )
        _declared[name] = definition
    return dict(definition)


def schedule_fields(schedule: Any) -> dict[str, Any]:
    """The fields of ``@task(schedule=...)``: a cron expression (str), or an interval (seconds,
    int, or a timedelta of whole seconds)."""
    if isinstance(schedule, str):
        return {"cron_expression": schedule}
    if isinstance(schedule, timedelta):
        seconds = schedule.total_seconds()
        if seconds != int(seconds):
            raise TypeError(f"schedule must be whole seconds, got {schedule!r}")
        return {"interval_seconds": int(seconds)}
    if isinstance(schedule, int) and not isinstance(schedule, bool):
        return {"interval_seconds": schedule}
    raise TypeError(
        f"schedule must be a cron expression (str) or an interval (int seconds, timedelta), "
        f"got {schedule!r}"
    )


def declared_jobs() -> list[dict[str, Any]]:
    """Every declared definition, by name (copies)."""
    with _lock:
        return [dict(_declared[name]) for name in sorted(_declared)]


def forget(name: str) -> None:
    """Drop a declaration (tests)."""
    with _lock:
        _declared.pop(name, None)
