"""Rows for the leader's tests (the tick, the reaper) and admission's facts: jobs created through
the service, runs and nodes written directly, on a fixed instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cluster.executor.runs import Scheduled
from cluster.models import NodeStatus, SchedulerNode
from jobs.models import Job, JobExecution
from jobs.services import SYSTEM, job_create
from jobs.states import ExecutionStatus

S = ExecutionStatus
T0 = datetime(
    2030, 1, 1, tzinfo=UTC
)  # a whole minute: the first slot of a 60 s job created before it
TERM = 1
MINUTE = timedelta(seconds=60)
SECOND = timedelta(seconds=1)
DEAD_AFTER = timedelta(seconds=5)


def make_job(name: str = "job", *, now: datetime = T0 - 30 * SECOND, **fields: object) -> Job:
    """A job created through the service (validated, audited) at ``now``: a 60 s interval by default."""
    data = {
        "name": name,
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 60,
        **fields,
    }
    return job_create(data=data, by=SYSTEM, now=now)


def bulk_jobs(count: int, *, next_fire_at: datetime | None, prefix: str = "bulk") -> list[Job]:
    """Many plain 60 s jobs at once (job_create per job would dominate the test's run time)."""
    return Job.objects.bulk_create(
        Job(
            name=f"{prefix}-{i:05d}",
            task="noop",
            schedule_type="interval",
            interval_seconds=60,
            next_fire_at=next_fire_at,
        )
        for i in range(count)
    )


def add_execution(job: Job, *, slot: datetime, status: str, **fields: object) -> JobExecution:
    defaults: dict[str, object] = {"run_after": slot, "queue": job.queue, "term": TERM}
    if status == S.RUNNING:
        defaults.update(started_at=slot, node="node-a", claim_token="token-a")
    return JobExecution.objects.create(
        job=job, scheduled_for=slot, status=status, **{**defaults, **fields}
    )


def rows(job: Job, status: str | None = None) -> list[JobExecution]:
    qs = JobExecution.objects.filter(job=job).order_by("scheduled_for", "attempt")
    return list(qs.filter(status=status) if status else qs)


def slots(executions: list[JobExecution]) -> list[datetime]:
    return [e.scheduled_for for e in executions]


def make_node(node_id: str, *, heartbeat: datetime) -> SchedulerNode:
    return SchedulerNode.objects.create(
        node_id=node_id,
        hostname="host",
        pid=1,
        started_at=heartbeat - timedelta(hours=1),
        last_heartbeat=heartbeat,
        status=NodeStatus.ACTIVE,
    )


def scheduled(execution: JobExecution) -> Scheduled:
    """The run as a node's starter holds it once claimed (its job loaded, due at its run_after)."""
    execution = JobExecution.objects.select_related("job").get(pk=execution.pk)
    return Scheduled(due=execution.run_after.timestamp(), seq=execution.pk, execution=execution)
