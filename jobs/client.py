"""Enqueueing runs from application code: ``jobs.enqueue(...)`` and a task's ``.enqueue(...)``.

The same service as ``POST /api/jobs/{id}/enqueue/`` (the same checks, the same audit row, with
the source ``code``), called in-process. The run is a row of the application's own database, so
enqueueing is part of the caller's transaction: inside ``transaction.atomic()`` the run exists,
and the nodes are woken, only once that transaction commits; a rollback leaves no run.

    from django.db import transaction
    from myapp.tasks import send_report

    with transaction.atomic():
        report = Report.objects.create(owner=request.user)
        send_report.enqueue(report_id=report.pk)  # never runs before the report is committed
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs import services
from jobs.models import AuditSource, Job, JobExecution
from jobs.states import ExecutionStatus
from jobs.validation import JobValidationError

ERR_NO_JOB = (
    "no job runs task {task!r}: define one (the dashboard, the API, `jobs apply`) "
    "and enqueue into it, or name it with enqueue_call(job=...)"
)
ERR_MANY_JOBS = (
    "{count} jobs run task {task!r} ({names}) and none is named after it: "
    "name the one to use with enqueue_call(job=...)"
)


class NoJobForTask(LookupError):
    """A task's ``.enqueue`` found no job to run it, or several and none named after the task."""


@dataclass(frozen=True)
class Run:
    """What ``enqueue`` returns: the run's id, its job and whether this call made it (False when
    its idempotency key already had a run). ``status()`` and ``execution()`` read it again."""

    id: int
    job_id: int
    job_name: str
    newly_enqueued: bool

    def execution(self) -> JobExecution:
        return JobExecution.objects.get(pk=self.id)

    def status(self) -> ExecutionStatus:
        return ExecutionStatus(
            JobExecution.objects.filter(pk=self.id).values_list("status", flat=True).get()
        )


def _job(job: Job | str | int) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, bool) or not isinstance(job, str | int):
        raise TypeError(f"job must be a Job, its name or its id, got {job!r}")
    if isinstance(job, int):
        return Job.objects.get(pk=job)
    found = Job.objects.filter(name=job).first()
    if found is None:
        raise Job.DoesNotExist(f"no job named {job!r}")
    return found


def job_for_task(task: str) -> Job:
    """The job a task's ``.enqueue`` uses: the one named after the task, else the only job that
    runs it. Raises :class:`NoJobForTask` naming what to do when there is none or several."""
    named = Job.objects.filter(name=task, task=task).first()
    if named is not None:
        return named
    found = list(Job.objects.filter(task=task).order_by("name")[:6])
    if not found:
        raise NoJobForTask(ERR_NO_JOB.format(task=task))
    if len(found) > 1:
        names = ", ".join(repr(job.name) for job in found[:5])
        count = Job.objects.filter(task=task).count()
        raise NoJobForTask(ERR_MANY_JOBS.format(count=count, task=task, names=names))
    return found[0]


def enqueue(
    job: Job | str | int,
    *,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    idempotency_key: str | None = None,
    user: Any = None,
) -> Run:
    """Enqueue one run of ``job`` (a Job, its name or its id): its ``args``/``kwargs`` (absent:
    the job's), not before ``run_at`` (absent or past: now), at ``priority`` (absent: the job's).
    A ``idempotency_key`` the job already has a run for returns that run and makes none. ``user``
    (optional) is recorded as who enqueued it. Raises Job.DoesNotExist, or
    ``jobs.validation.JobValidationError`` (errors by field) with nothing written."""
    target = _job(job)
    item: dict[str, Any] = {}
    for name, value in (
        ("args", args),
        ("kwargs", kwargs),
        ("run_at", run_at),
        ("priority", priority),
        ("idempotency_key", idempotency_key),
    ):
        if value is not None:
            item[name] = value
    actor = services.Actor(user=user, source=AuditSource.CODE)
    try:
        (execution,) = services.runs_enqueue(job_id=target.pk, items=[item], by=actor)
    except JobValidationError as exc:
        # Keyed "<index>.<field>" for a request of many runs; here there is one: by field.
        raise JobValidationError(
            {key.removeprefix("0."): reasons for key, reasons in exc.errors.items()}
        ) from None
    return Run(
        id=execution.pk,
        job_id=target.pk,
        job_name=target.name,
        newly_enqueued=execution.newly_enqueued,
    )


def enqueue_task(task: str, *, job: Job | str | int | None = None, **options: Any) -> Run:
    """``enqueue`` (the same ``options``) into ``job``, or, absent, into the task's own job
    (:func:`job_for_task`)."""
    target = job_for_task(task) if job is None else _job(job)
    if target.task != task:
        raise NoJobForTask(f"job {target.name!r} runs task {target.task!r}, not {task!r}")
    return enqueue(target, **options)
