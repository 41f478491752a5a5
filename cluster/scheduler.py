"""The leader's work: turn due jobs into executions, advance ``next_fire_at``, reap dead nodes.

Everything here runs inside ``fenced_transaction(term)``: a stale leader writes nothing.
A tick reads only the jobs due before the horizon through the (enabled, next_fire_at) index, in
batches, so its cost follows what is due, not how many jobs exist.

Misfires. A slot is *late* when it is more than the job's ``misfire_grace_seconds`` in the past
(typically because no leader was alive). Then:
  run_once  one execution for the most recent missed slot; the earlier ones are recorded as skipped;
  skip      every missed slot is recorded as skipped; the schedule continues from now;
  run_all   an execution for each of the most recent ``run_all_max`` missed slots (oldest first);
            older ones are recorded as skipped.
At most ``MAX_RECORDED_MISSES`` skipped rows are written per job and tick; further missed slots are
counted in the log only (a 1-second job down for a day would otherwise write 86,400 rows).

Concurrency at fire time: ``replace`` asks the running execution to cancel; ``buffer_one`` records
the slot as skipped when a run is already waiting; ``forbid`` is enforced when the run starts (the
job lock, see executor), ``allow`` runs everything.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from cluster import doorbell, tracing
from cluster.fencing import fenced_transaction
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode, TermEndReason
from jobs import bulk, executions, schedules
from jobs.models import (
    ConcurrencyPolicy,
    Job,
    JobExecution,
    MisfirePolicy,
    ScheduleType,
)
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500
# Fires one job may get in a single tick within the horizon (a 1 s job with a 2 s look-ahead: 2-3).
MAX_FIRES_PER_JOB_PER_TICK = 20
MAX_RECORDED_MISSES = 100
# Cron slots walked one by one when counting a long outage before estimating the rest.
MAX_MISSED_SCAN = 2000

REASON_MISFIRE_COALESCED = "misfire: coalesced into one run (run_once)"
REASON_MISFIRE_SKIPPED = "misfire: skipped by policy (skip)"
REASON_MISFIRE_BEYOND_BOUND = "misfire: beyond run_all_max (run_all)"
REASON_BUFFER_FULL = "buffer_one: a run is already waiting"
REASON_REPLACED = "replaced by a newer fire (replace)"
REASON_NODE_DIED = "node {node} stopped heartbeating"
REASON_NODE_STOPPED = "node {node} stopped without finishing the run"
REASON_STUCK = "running past its timeout plus the dead threshold"
REASON_NODE_CUT_OFF = (
    "node {node} could not reach the database for {seconds:.0f} s; its outcome was never recorded"
)


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


def _next_slot(job: Job, after: datetime) -> datetime | None:
    if job.schedule_type == ScheduleType.ONCE:
        return None
    return schedules.next_fire_after(
        schedule_type=job.schedule_type,
        after=after,
        cron_expression=job.cron_expression,
        timezone=job.timezone,
        interval_seconds=job.interval_seconds,
        start_at=job.start_at,
    )


def _missed_slots(
    job: Job, first: datetime, now: datetime, keep: int
) -> tuple[list[datetime], int]:
    """The most recent ``keep`` slots in [first, now], oldest first, and how many there are in all.

    Interval slots are counted by arithmetic. Cron slots are walked one by one up to
    MAX_MISSED_SCAN; past that, the walk restarts close to ``now`` (from the average spacing seen so
    far) and the total is an estimate, good enough for a log line."""
    if job.schedule_type == ScheduleType.INTERVAL:
        step = timedelta(seconds=job.interval_seconds)
        total = int((now - first) / step) + 1
        last = first + (total - 1) * step
        return [last - k * step for k in reversed(range(min(keep, total)))], total
    recent: deque[datetime] = deque(maxlen=keep)
    slot: datetime | None = first
    walked = 0
    while slot is not None and slot <= now and walked < MAX_MISSED_SCAN:
        recent.append(slot)
        walked += 1
        slot = _next_slot(job, slot)
    if slot is None or slot > now:
        return list(recent), walked
    spacing = (slot - first) / walked
    restart = now - spacing * (keep + 2)
    skipped_over = max(0, int((restart - slot) / spacing))
    recent.clear()
    slot = _next_slot(job, max(restart, slot))
    tail = 0
    while slot is not None and slot <= now:
        recent.append(slot)
        tail += 1
        slot = _next_slot(job, slot)
    return list(recent), walked + skipped_over + tail


def _plan_job(
    job: Job,
    *,
    now: datetime,
    horizon: datetime,
    term: int,
    running: bool,
    waiting: bool,
    result: TickResult,
) -> list[JobExecution]:
    """The executions (to run or skipped) for one due job; advances job.next_fire_at in memory.

    ``running``: a run of the job is RUNNING; ``waiting``: a run is already pending behind it. A
    buffer_one slot is skipped only when both hold: one run goes on, one waits, no more."""
    rows: list[JobExecution] = []
    slot = job.next_fire_at
    grace = timedelta(seconds=job.misfire_grace_seconds)
    if slot is not None and now - slot > grace:
        keep = max(job.run_all_max, 1) + MAX_RECORDED_MISSES
        missed, total = _missed_slots(job, slot, now, keep)
        slot = _next_slot(job, now)
        if job.misfire_policy == MisfirePolicy.RUN_ONCE:
            run, skip, reason = missed[-1:], missed[:-1], REASON_MISFIRE_COALESCED
        elif job.misfire_policy == MisfirePolicy.SKIP:
            run, skip, reason = [], missed, REASON_MISFIRE_SKIPPED
        else:
            run, skip = missed[-job.run_all_max :], missed[: -job.run_all_max]
            reason = REASON_MISFIRE_BEYOND_BOUND
        recorded = skip[-MAX_RECORDED_MISSES:]
        unrecorded = total - len(run) - len(recorded)
        result.unrecorded_misses += unrecorded
        rows += [
            executions.new_fire(
                job, s, term=term, now=now, status=ExecutionStatus.SKIPPED, reason=reason
            )
            for s in recorded
        ]
        rows += [executions.new_fire(job, s, term=term, now=now) for s in run]
        if unrecorded:
            logger.warning(
                "job %s missed %d slots; the newest %d recorded as skipped",
                job.name,
                total - len(run),
                len(recorded),
                extra={"job": job.pk, "term": term},
            )
        if run:
            job.last_fire_at = run[-1]
    fires = 0
    while slot is not None and slot <= horizon and fires < MAX_FIRES_PER_JOB_PER_TICK:
        if job.concurrency_policy == ConcurrencyPolicy.BUFFER_ONE and running and waiting:
            rows.append(
                executions.new_fire(
                    job,
                    slot,
                    term=term,
                    now=now,
                    status=ExecutionStatus.SKIPPED,
                    reason=REASON_BUFFER_FULL,
                )
            )
        else:
            rows.append(executions.new_fire(job, slot, term=term, now=now))
            waiting = waiting or running
            job.last_fire_at = slot
        fires += 1
        slot = _next_slot(job, slot)
    job.next_fire_at = slot
    return rows


def scheduler_tick(
    *,
    term: int,
    now: datetime | None = None,
    lookahead: timedelta = timedelta(0),
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> TickResult:
    """One fenced pass: create the executions of every job due before now + lookahead."""
    now = now or timezone.now()
    horizon = now + lookahead
    result = TickResult()
    # Look before taking locks (the fence row, and SQLite's database-wide write lock).
    if not (
        Job.objects.filter(enabled=True, next_fire_at__lte=horizon).exists()
        or JobExecution.objects.filter(
            status=ExecutionStatus.RETRY_SCHEDULED, run_after__lte=horizon
        ).exists()
    ):
        return result
    with fenced_transaction(term):
        jobs = list(
            Job.objects.select_for_update()
            .filter(enabled=True, next_fire_at__lte=horizon)
            .order_by("next_fire_at", "pk")[:batch_size]
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
                )
            created = executions.create_fires(rows)
            for job in jobs:
                job.updated_at = now  # "the row changed": the dashboard streams next/last fire
            columns = ("next_fire_at", "last_fire_at", "updated_at")
            bulk.update(
                Job, [(job.pk, {c: getattr(job, c) for c in columns}) for job in jobs], columns
            )
            replace_ids = [j.pk for j in jobs if j.concurrency_policy == ConcurrencyPolicy.REPLACE]
            if replace_ids:
                executions.request_cancel_jobs(replace_ids, reason=REASON_REPLACED)
            result.jobs = len(jobs)
            result.fired = sum(r.status == ExecutionStatus.PENDING for r in created)
            result.skipped = len(created) - result.fired
            result.fired_ids = [r.pk for r in created if r.status == ExecutionStatus.PENDING]
            result.more = len(jobs) == batch_size
            traced = created if tracing.enabled() else []
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


def earliest_next_fire() -> datetime | None:
    """The next instant any enabled job is due (one index lookup)."""
    return (
        Job.objects.filter(enabled=True, next_fire_at__isnull=False)
        .order_by("next_fire_at")
        .values_list("next_fire_at", flat=True)
        .first()
    )


@dataclass
class ReapResult:
    dead_nodes: list[str] = field(default_factory=list)
    lost: int = 0
    unclaimed: int = 0
    stuck: int = 0
    # Nodes alive in the coordination store but cut off from the database whose work was taken.
    cut_off_nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CutOff:
    """What a node alive in the coordination store but cut off from its database says in its
    presence: since when (the cluster's reference time), the runs whose bodies it still runs
    (left alone: a body cannot be stopped from here) and the runs it made active but never
    started (handed back, not lost)."""

    since: datetime
    bodies: frozenset[int] = frozenset()
    unstarted: frozenset[int] = frozenset()


def read_cut_off(
    presences: dict[str, dict[str, object]], *, now: datetime, after: timedelta
) -> dict[str, CutOff]:
    """The live nodes whose presence says they have not reached the database for ``after``
    (payloads as ``backend.live_nodes()`` returns them; a malformed one is ignored)."""
    found: dict[str, CutOff] = {}
    for node_id, payload in presences.items():
        if payload.get("database") != "unreachable":
            continue
        try:
            since_ms = float(payload["database_since_ms"])  # type: ignore[arg-type]
            bodies = frozenset(int(pk) for pk in payload.get("bodies") or ())  # type: ignore[union-attr]
            unstarted = frozenset(int(pk) for pk in payload.get("unstarted") or ())  # type: ignore[union-attr]
        except (KeyError, TypeError, ValueError):
            continue
        since = datetime.fromtimestamp(since_ms / 1000, tz=now.tzinfo)
        if now - since >= after:
            found[node_id] = CutOff(since, bodies, unstarted)
    return found


def _take_cut_off_work(
    cut_off: dict[str, CutOff], *, now: datetime, cutoff: datetime, result: ReapResult
) -> None:
    """(Inside the fenced transaction.) The work of nodes cut off from the database, claimed before
    the cut: claims go back to the queue, runs whose bodies are not running end lost (retried per
    policy), runs never started go back to the queue. Only while the node's row has not been
    written since ``cutoff`` (locked, so a node that answers again and heartbeats first keeps its
    work; one whose heartbeat waits on this lock finds its stale runs taken, fenced by their claim
    tokens). Runs claimed after the outage began are not touched."""
    stale = set(
        SchedulerNode.objects.select_for_update()
        .filter(
            node_id__in=list(cut_off),
            status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING],
            last_heartbeat__lt=cutoff,
        )
        .values_list("node_id", flat=True)
    )
    for node_id in sorted(stale):
        said = cut_off[node_id]
        seconds = (now - said.since).total_seconds()
        reason = REASON_NODE_CUT_OFF.format(node=node_id, seconds=seconds)
        mine = JobExecution.objects.filter(node=node_id, claimed_at__lt=said.since).order_by()
        unclaimed = mine.filter(status=ExecutionStatus.PENDING).update(
            claim_token=None, node="", claimed_at=None
        )
        lost = 0
        running = list(
            mine.select_related("job")
            .filter(status=ExecutionStatus.RUNNING)
            .exclude(pk__in=list(said.bodies))
            .order_by("pk")
        )
        for execution in running:
            if execution.pk in said.unstarted:
                unclaimed += executions.hand_back_unstarted(execution)
            elif executions.end_running(
                execution, status=ExecutionStatus.LOST, reason=reason, now=now
            ):
                lost += 1
        if unclaimed or lost:
            result.cut_off_nodes.append(node_id)
            result.unclaimed += unclaimed
            result.lost += lost
            transaction.on_commit(doorbell.ring)


def reap_dead_nodes(
    *,
    term: int,
    now: datetime,
    dead_after: timedelta,
    live: Collection[str],
    cut_off: dict[str, CutOff] | None = None,
) -> ReapResult:
    """Mark dead the nodes whose presence has expired (not in ``live``, the coordination backend's
    answer) and whose heartbeat row is as old; their running work becomes lost (and is retried per
    policy), their claimed-but-unstarted work goes back to the queue. Also times out runs stuck past
    timeout + dead threshold on any node, and takes the work of live nodes ``cut_off`` from the
    database (``read_cut_off``): alive, they keep their rows; unable to record, not their runs.

    A node only starts work while it can show its presence has not expired (cluster/membership.py),
    so work taken here can no longer start there. The row's age is a second condition, never the
    only one: a coordination store that lost every key (a Redis restart) must not kill live nodes.
    """
    result = ReapResult()
    cutoff = now - dead_after
    silent = SchedulerNode.objects.filter(
        status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING], last_heartbeat__lt=cutoff
    ).exclude(node_id__in=list(live))
    stuck_candidates = JobExecution.objects.filter(
        status=ExecutionStatus.RUNNING, job__timeout_seconds__isnull=False
    )
    # A node that stopped (drained) must have left nothing behind; if it did (a crash at the very
    # end of a drain), its leftovers are treated like a dead node's.
    stopped_nodes = SchedulerNode.objects.filter(status=NodeStatus.STOPPED).values("node_id")
    orphans = JobExecution.objects.filter(
        status__in=[ExecutionStatus.RUNNING, ExecutionStatus.PENDING],
        claim_token__isnull=False,
        node__in=stopped_nodes,
    )
    if not (cut_off or silent.exists() or stuck_candidates.exists() or orphans.exists()):
        return result
    with fenced_transaction(term):
        if cut_off:
            _take_cut_off_work(cut_off, now=now, cutoff=cutoff, result=result)
        dead = list(silent.values_list("node_id", flat=True))
        stopped_with_work = list(orphans.values_list("node", flat=True).distinct())
        if dead:
            SchedulerNode.objects.filter(node_id__in=dead, last_heartbeat__lt=cutoff).update(
                status=NodeStatus.DEAD, running_count=0
            )
            result.dead_nodes = dead
            transaction.on_commit(doorbell.ring)
            # A leader that died lost its lease by expiry: the next leader closed its term as
            # lease_lost; now that the node is known dead, say so.
            LeadershipTerm.objects.filter(
                node_id__in=dead, end_reason=TermEndReason.LEASE_LOST, ended_at__gte=cutoff
            ).update(end_reason=TermEndReason.NODE_DIED)
        gone = [*dead, *stopped_with_work]
        if gone:
            running = list(
                JobExecution.objects.select_related("job")
                .filter(node__in=gone, status=ExecutionStatus.RUNNING)
                .order_by("pk")  # not the default (by slot): MariaDB walked the table for it
            )
            for execution in running:
                reason = REASON_NODE_DIED if execution.node in dead else REASON_NODE_STOPPED
                if executions.end_running(
                    execution,
                    status=ExecutionStatus.LOST,
                    reason=reason.format(node=execution.node),
                    now=now,
                ):
                    result.lost += 1
            result.unclaimed = executions.hand_back_nodes(gone)
        stuck = list(
            JobExecution.objects.select_related("job")
            .filter(status=ExecutionStatus.RUNNING, job__timeout_seconds__isnull=False)
            .order_by("pk")
        )
        for execution in stuck:
            limit = timedelta(seconds=execution.job.timeout_seconds) + dead_after
            if execution.started_at and now - execution.started_at > limit:
                if executions.end_running(
                    execution, status=ExecutionStatus.TIMED_OUT, reason=REASON_STUCK, now=now
                ):
                    result.stuck += 1
    return result
