"""The leader's tick: turn due jobs into executions and advance their ``next_fire_at``.

Everything here runs inside ``fenced_transaction(term)``: a stale leader writes nothing.
A tick reads only the jobs due before the horizon through the (enabled, next_fire_at) index, in
batches, so its cost follows what is due, not how many jobs exist.

When a job fires (its misfire and concurrency rules at fire time) is a pure plan of
``jobs.firing``; this module writes the plans of every due job in one fenced batch, advances their
``next_fire_at``, asks ``replace`` jobs' running runs to cancel and promotes due retries. The
reaper is ``cluster.reaper``.

Catch-up. The runs ``run_all`` plans for slots missed past the grace are released on a budget
(``catch_up_per_s``: the partition's share of the cluster's): their ``run_after`` instants are
paced oldest slot first across the tick's jobs (``jobs.firing.pace_catch_up``), continuing after
the latest instant this partition has already paced. That instant is read from the pending
catch-up rows, not kept in memory, so a new leader (after a failover, or a whole-cluster restart
while a backlog drains) goes on from where its predecessor left off instead of releasing a second
stream beside the first. With no budget (0) they are written as ordinary late fires, due at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Max
from django.utils import timezone

from cluster import partitions, tracing
from cluster.fencing import fenced_transaction
from jobs import executions, firing, services
from jobs.models import (
    ConcurrencyPolicy,
    Job,
    JobExecution,
)
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500
# What a plan reads of a due job (not its arguments, description or audit columns: decoding a
# thousand jobs' JSON a second for nothing was a share of the leader's pass).
PLAN_FIELDS = (
    "name",
    *services.SCHEDULE_INPUTS,
    "enabled",
    "next_fire_at",
    "last_fire_at",
    "misfire_policy",
    "misfire_grace_seconds",
    "run_all_max",
    "concurrency_policy",
    "queue",
    "priority",
)
# The same, as the tick reads them (the primary key first).
PLAN_COLUMNS = ("id", *PLAN_FIELDS)
REASON_REPLACED = "replaced by a newer fire (replace)"


@dataclass
class TickResult:
    fired: int = 0
    skipped: int = 0
    jobs: int = 0
    promoted: int = 0
    more: bool = False  # a full batch: call again at once
    unrecorded_misses: int = 0
    fired_ids: list[int] = field(default_factory=list)
    # How long after the earliest of its slots the tick began (0 when it was ahead of them).
    late_s: float = 0.0
    # Catch-up runs written (paced on the budget), and when the last of them is released.
    caught_up: int = 0
    catch_up_until: datetime | None = None


def _plan_job(
    job: Job,
    *,
    now: datetime,
    horizon: datetime,
    term: int,
    running: bool,
    waiting: bool,
    result: TickResult,
    pacing: bool,
) -> list[JobExecution]:
    """The rows of one due job's plan (``jobs.firing``); advances the job's fire times in memory."""
    plan = firing.plan_fires(
        firing.Schedule.of(job),
        firing.Policy.of(job),
        next_fire_at=job.next_fire_at,
        now=now,
        horizon=horizon,
        running=running,
        waiting=waiting,
    )
    if plan.unrecorded_misses:
        result.unrecorded_misses += plan.unrecorded_misses
        logger.warning(
            "job %s missed %d slots beyond the %d recorded as skipped",
            job.name,
            plan.unrecorded_misses,
            firing.MAX_RECORDED_MISSES,
            extra={"job": job.pk, "term": term},
        )
    job.next_fire_at = plan.next_fire_at
    if plan.last_fire_at is not None:
        job.last_fire_at = plan.last_fire_at
    return [
        executions.new_fire(
            job,
            fire.slot,
            term=term,
            now=now,
            due=fire.due,
            status=ExecutionStatus.PENDING if fire.skip_reason is None else ExecutionStatus.SKIPPED,
            reason=fire.skip_reason or "",
            catch_up=fire.catch_up and pacing,
        )
        for fire in plan.fires
    ]


def scheduler_tick(
    *,
    term: int,
    now: datetime | None = None,
    lookahead: timedelta = timedelta(0),
    batch_size: int = DEFAULT_BATCH_SIZE,
    partition: int = 0,
    catch_up_per_s: float = 0.0,
) -> TickResult:
    """One pass of a partition's leader, fenced by the partition's fence: create the executions of
    every job of the partition due before now + lookahead. Partition 0's pass also promotes the
    retries that fell due (cluster-wide). ``catch_up_per_s``: this partition's catch-up budget
    (runs a second; 0: none, catch-up runs are due at once)."""
    now = now or timezone.now()
    horizon = now + lookahead
    result = TickResult()
    due = Job.objects.filter(partition=partition, enabled=True, next_fire_at__lte=horizon)
    # Look before taking locks (the fence row, and SQLite's database-wide write lock).
    if not (
        due.exists()
        or (
            partition == 0
            and JobExecution.objects.filter(
                status=ExecutionStatus.RETRY_SCHEDULED, run_after__lte=horizon
            ).exists()
        )
    ):
        return result
    with fenced_transaction(term, fence=partitions.fence_name(partition)):
        jobs = executions.load_rows(
            due.select_for_update().order_by("next_fire_at", "pk"), PLAN_COLUMNS, batch_size
        )
        if jobs:
            earliest = min(j.next_fire_at for j in jobs if j.next_fire_at is not None)
            result.late_s = max(0.0, (now - earliest).total_seconds())
            ids_buffer = [
                j.pk for j in jobs if j.concurrency_policy == ConcurrencyPolicy.BUFFER_ONE
            ]
            running_jobs: set[int] = set()
            waiting_jobs: set[int] = set()
            if ids_buffer:
                for job_id, status in (
                    JobExecution.objects.filter(
                        job_id__in=ids_buffer,
                        status__in=[ExecutionStatus.RUNNING, ExecutionStatus.PENDING],
                        run_after__lte=now,
                    )
                    .order_by()  # not the model's order (by slot): nothing here needs one
                    .values_list("job_id", "status")
                ):
                    if status == ExecutionStatus.RUNNING:
                        running_jobs.add(job_id)
                    else:
                        waiting_jobs.add(job_id)
            rows: list[JobExecution] = []
            for job in jobs:
                rows += _plan_job(
                    job,
                    now=now,
                    horizon=horizon,
                    term=term,
                    running=job.pk in running_jobs,
                    waiting=job.pk in waiting_jobs,
                    result=result,
                    pacing=catch_up_per_s > 0,
                )
            _pace_catch_up(
                rows,
                per_s=catch_up_per_s,
                now=now,
                start=horizon,
                partition=partition,
                result=result,
            )
            created = executions.create_fires(rows)
            services.jobs_advance(jobs=jobs, now=now)
            replace_ids = [j.pk for j in jobs if j.concurrency_policy == ConcurrencyPolicy.REPLACE]
            if replace_ids:
                executions.request_cancel_jobs(replace_ids, reason=REASON_REPLACED)
            result.jobs = len(jobs)
            result.fired = sum(r.status == ExecutionStatus.PENDING for r in created)
            result.skipped = len(created) - result.fired
            result.fired_ids = [r.pk for r in created if r.status == ExecutionStatus.PENDING]
            result.more = len(jobs) == batch_size
            traced = created if tracing.enabled() else []
        if partition == 0:
            result.promoted = executions.promote_due_retries(horizon=horizon)
    if jobs and traced:
        names = {job.pk: job.name for job in jobs}
        tracing.fires(  # committed: the fires exist
            [
                (r.pk, names.get(r.job_id, ""), r.scheduled_for)
                for r in traced
                if r.status == ExecutionStatus.PENDING
            ],
            at=now,
            term=term,
        )
    return result


def _pace_catch_up(
    rows: list[JobExecution],
    *,
    per_s: float,
    now: datetime,
    start: datetime,
    partition: int,
    result: TickResult,
) -> None:
    """Give the tick's catch-up rows their paced ``run_after`` (in memory, before they are
    stored), after the latest instant the partition's pending catch-up runs already have, and
    from ``start`` at the earliest: the tick's horizon, as far ahead as on-time fires are written,
    so the nodes claim the stream ahead of its instants as they claim those (from ``now``, its
    first second would be due before a node could claim it, and start all at once)."""
    catch_up = [row for row in rows if row.catch_up]
    if not catch_up:
        return
    # Only runs still ahead matter (a paced instant already past is no later than now); pending
    # rows are few beside the history, and this runs only in a tick that has catch-up fires.
    after = JobExecution.objects.filter(
        status=ExecutionStatus.PENDING,
        catch_up=True,
        run_after__gt=now,
        job__partition=partition,
    ).aggregate(last=Max("run_after"))["last"]
    paced = firing.pace_catch_up(
        [(row.run_after, row.job_id) for row in catch_up], per_s=per_s, now=start, after=after
    )
    for row, run_after in zip(catch_up, paced, strict=True):
        row.run_after = run_after
    result.caught_up = len(catch_up)
    result.catch_up_until = max(paced)
    logger.info(
        "catch-up: %d runs of %d jobs released at %g a second until %s",
        len(catch_up),
        len({row.job_id for row in catch_up}),
        per_s,
        result.catch_up_until.isoformat(),
        extra={"partition": partition},
    )


def earliest_next_fire(partition: int | None = None) -> datetime | None:
    """The next instant any enabled job (of ``partition``, or of any) is due (one index lookup)."""
    jobs = Job.objects.filter(enabled=True, next_fire_at__isnull=False)
    if partition is not None:
        return (
            jobs.filter(partition=partition)
            .order_by("next_fire_at")
            .values_list("next_fire_at", flat=True)
            .first()
        )
    earliest = earliest_fire_and_partition()
    return earliest[0] if earliest else None


def earliest_fire_and_partition() -> tuple[datetime, int] | None:
    """The next instant any enabled job is due, and that job's partition (one index lookup)."""
    return (
        Job.objects.filter(enabled=True, next_fire_at__isnull=False)
        .order_by("next_fire_at")
        .values_list("next_fire_at", "partition")
        .first()
    )
