"""Reads of jobs and executions used by the CLI, the dashboard and the API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from jobs import schedules
from jobs.models import Job, JobExecution, ScheduleType
from jobs.validation import WRITABLE_FIELDS


def job_list(*, enabled: bool | None = None, search: str = "") -> QuerySet[Job]:
    jobs = Job.objects.all()
    if enabled is not None:
        jobs = jobs.filter(enabled=enabled)
    if search:
        jobs = jobs.filter(name__icontains=search)
    return jobs


def job_schedule_description(job: Job) -> str:
    """The job's schedule in words ("Every 5 minutes (Europe/Berlin)"), "" if it cannot be read."""
    try:
        return schedules.describe_schedule(
            schedule_type=job.schedule_type,
            cron_expression=job.cron_expression,
            interval_seconds=job.interval_seconds,
            run_at=job.run_at,
            timezone=job.timezone,
            dst_repeated=job.dst_repeated,
            dst_missing=job.dst_missing,
        )
    except schedules.ScheduleError:
        return ""


def job_get_by_name_or_id(ref: str) -> Job:
    """A job by exact name, or by numeric id. Raises Job.DoesNotExist."""
    job = Job.objects.filter(name=ref).first()
    if job is None and ref.isdigit():
        job = Job.objects.filter(pk=int(ref)).first()
    if job is None:
        raise Job.DoesNotExist(f"no job named {ref!r}")
    return job


def job_definitions_export(*, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Job definitions as plain data (the format ``jobs apply`` reads back).

    A one-off job that already fired is exported disabled, so applying the file elsewhere never
    fires it a second time."""
    jobs = Job.objects.all() if not names else Job.objects.filter(name__in=names)
    out = []
    for job in jobs.order_by("name"):
        definition: dict[str, Any] = {}
        for field in WRITABLE_FIELDS:
            value = getattr(job, field)
            definition[field] = value.isoformat() if isinstance(value, datetime) else value
        if job.schedule_type == ScheduleType.ONCE and job.last_fire_at and not job.next_fire_at:
            definition["enabled"] = False
        out.append(definition)
    return out


def execution_list(
    *,
    job_id: int | None = None,
    statuses: list[str] | None = None,
    node: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    search: str = "",
) -> QuerySet[JobExecution]:
    # The jobs in a second query (one per page), not a join: with a join the database reads the
    # (few) jobs first and then sorts every run of theirs to find a page's newest.
    executions = JobExecution.objects.prefetch_related("job")
    if search:
        # A run's number, or words of its job's name, its node, its reason or its error.
        text = (
            Q(job__name__icontains=search)
            | Q(node__icontains=search)
            | Q(reason__icontains=search)
            | Q(error__icontains=search)
        )
        number = search.removeprefix("#")
        executions = executions.filter(text | Q(pk=int(number)) if number.isdigit() else text)
    if job_id is not None:
        executions = executions.filter(job_id=job_id)
    if statuses:
        executions = executions.filter(status__in=statuses)
    if node:
        executions = executions.filter(node=node)
    if since:
        executions = executions.filter(scheduled_for__gte=since)
    if until:
        executions = executions.filter(scheduled_for__lt=until)
    return executions


def tagged(tag: str) -> Q:
    """Jobs carrying ``tag``: its quoted form in the stored JSON list (exact: "bill" does not find
    "billing"), a plain text match on every database."""
    return Q(tags__icontains=json.dumps(tag))
