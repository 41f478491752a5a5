"""The facts admission decides on (``cluster.admission``), gathered for a batch of claimed runs:
the job lock per forbid run, the blocking run per job and whether its node is alive, and whether
an older fire of the job is still waiting. One query per kind for the whole batch."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from cluster import node_metrics
from cluster.admission import Blocker, Facts, Lock
from cluster.coordination import (
    CoordinationBackend,
    CoordinationError,
    LockKeeper,
    LockWatchdog,
)
from cluster.dbhealth import UNREACHABLE
from cluster.executor.runs import REASON_BLOCKER_GONE, Scheduled
from cluster.membership import Liveness, node_liveness, renewed_at_ms
from cluster.models import NodeStatus, SchedulerNode
from jobs import executions
from jobs.firing import fires_kept
from jobs.models import JobExecution, Trigger
from jobs.schedules import spread_offset
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus


def due_instant(execution: JobExecution) -> datetime:
    """When the fire was due: its slot plus the job's spread for a scheduled fire (``run_after`` may
    since have moved, e.g. deferred while the lock service was down), else its ``run_after``."""
    if execution.trigger == Trigger.SCHEDULE:
        job = execution.job
        offset = spread_offset(job.name, job.spread_seconds) if job.spread_seconds else 0.0
        return execution.scheduled_for + timedelta(seconds=offset)
    return execution.run_after


def is_fire(execution: JobExecution) -> bool:
    """A fire of the schedule (its first attempt): what misfire policies are about."""
    return execution.trigger == Trigger.SCHEDULE and execution.attempt == 1


def facts(
    execution: JobExecution, *, due: float, now: float, claiming: bool, **gathered: Any
) -> Facts:
    """The facts of one run; ``gathered`` adds what the batch's queries found."""
    job = execution.job
    return Facts(
        policy=job.concurrency_policy,
        scheduled=execution.trigger == Trigger.SCHEDULE,
        now=now,
        due=due,
        due_instant=due_instant(execution).timestamp(),
        runnable_since=max(execution.run_after, execution.created_at).timestamp(),
        grace_s=job.misfire_grace_seconds,
        claiming=claiming,
        misfire_policy=job.misfire_policy,
        run_all_max=job.run_all_max,
        catch_up=execution.catch_up,
        **gathered,
    )


# Two fires of a job are at least this far apart (seconds: the shortest interval, the finest cron
# field): a fire less late than this cannot have a later fire of its job due yet.
SHORTEST_SLOT_STEP_S = 1.0


def may_be_overtaken(execution: JobExecution, *, now: datetime) -> bool:
    """A fire late enough that a later fire of its job may be due already."""
    return is_fire(execution) and due_instant(execution) <= now - timedelta(
        seconds=SHORTEST_SLOT_STEP_S
    )


def newer_due(items: list[Scheduled], *, now: datetime) -> dict[int, tuple[int, int]]:
    """Per fire of ``items`` late enough to have been overtaken: how many later fires of its job
    are due (their slot plus the job's spread has passed), whatever became of them: waiting (a
    fire handed back to wait for a lock service is due all the same), running or done already
    (the job moved on without this one), or skipped; and how many of those are catch-up fires
    (what a catch-up run is judged on). One query, bounded by how late the late fires are, and
    none at all while every fire is on time (the usual case: fires are admitted just ahead of
    their instant)."""
    late = [i.execution for i in items if may_be_overtaken(i.execution, now=now)]
    if not late:
        return {}
    later_fires = list(
        JobExecution.objects.filter(
            job_id__in={e.job_id for e in late},
            trigger=Trigger.SCHEDULE,
            attempt=1,
            scheduled_for__gt=min(e.scheduled_for for e in late),
            scheduled_for__lte=now,  # the spread only adds to it
        )
        .order_by()
        .values_list("job_id", "scheduled_for", "catch_up")
    )
    counts: dict[int, tuple[int, int]] = {}
    for execution in late:
        job = execution.job
        spread = timedelta(
            seconds=spread_offset(job.name, job.spread_seconds) if job.spread_seconds else 0.0
        )
        later = [
            catch_up
            for job_id, scheduled_for, catch_up in later_fires
            if job_id == execution.job_id
            and scheduled_for > execution.scheduled_for
            and scheduled_for + spread <= now
        ]
        if later:
            counts[execution.pk] = (len(later), sum(later))
    return counts


def released(presence: dict[str, Any] | None, execution_id: int) -> bool:
    """Whether a live node says it gave this run's job lock up while the body ran (it could no
    longer do the run's work): its body may still be inside the task, unrecorded."""
    return _listed(presence, "released", execution_id)


def _listed(presence: dict[str, Any] | None, key: str, execution_id: int) -> bool:
    """Whether the presence's list under ``key`` holds the run (a list of ids; anything else
    holds nothing)."""
    try:
        return execution_id in {int(pk) for pk in (presence or {}).get(key) or ()}
    except (TypeError, ValueError):
        return False


def body_listed_at(presence: dict[str, Any] | None, execution_id: int) -> float | None:
    """When the run's node last listed the run's body as running (the cluster's time, seconds),
    if its newest presence lists it."""
    if not _listed(presence, "bodies", execution_id):
        return None
    try:
        return int(presence["bodies_at_ms"]) / 1000  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None


def cut_off_body(presence: dict[str, Any] | None, execution_id: int) -> bool:
    """Whether a live node cut off from its database says this run's body runs there (it gives
    the body's lock up past the dead threshold, and its presence may not say so yet)."""
    if not presence or presence.get("database") != UNREACHABLE:
        return False
    return _listed(presence, "bodies", execution_id)


def blockers(
    items: list[Scheduled],
    *,
    backend: CoordinationBackend,
    ttl_s: float,
    heartbeat_s: float,
    now: datetime,
) -> dict[int, Blocker]:
    """Per job of ``items``: the latest-started other RUNNING run that may really be active.

    The latest, not the earliest: that is the run that holds the job lock if anyone does (a run is
    marked running just after it takes the lock, and a body releases the lock as it ends). An older
    row still ``running`` is a run whose outcome is not written yet (its node frozen or its finisher
    behind) — its body may have ended long ago, and taking it for the lock holder once made a
    forbid run skip behind a late catch-up run that had only just taken the lock (a chaos run).

    A run whose node's presence has expired is not active: it is ended as ``lost`` on the spot
    (retried per policy), so a dead node's leftovers never make a policy skip or wait. One query for
    the batch, and one read of the live nodes when any run blocks.
    """
    if not items:
        return {}
    q = connection.ops.quote_name
    others = executions.select_rows(
        JobExecution,
        f"{q('job_id')} IN ({_ids(i.execution.job_id for i in items)}) AND {q('status')} = %s "
        f"AND {q('id')} NOT IN ({_ids(i.execution.pk for i in items)})",
        [S.RUNNING],
        order=f"{q('started_at')} DESC, {q('id')} DESC",
    )
    if not others:
        return {}
    executions.attach_jobs(others)
    try:
        live = backend.live_nodes()
    except CoordinationError:
        live = None  # cannot tell: nothing is ended, nothing is certain
    now_ms = int(now.timestamp() * 1000)
    # As for the reaper, an expired presence alone is not death: a coordination store that lost
    # its keys (a Redis restart) must not end live nodes' runs. The node's row must have gone as
    # silent (or say it stopped or died).
    silent_since = now - timedelta(seconds=ttl_s)
    rows = {
        node_id: (status in (NodeStatus.DEAD, NodeStatus.STOPPED) or beat < silent_since)
        for node_id, status, beat in SchedulerNode.objects.filter(
            node_id__in={o.node for o in others}
        ).values_list("node_id", "status", "last_heartbeat")
    }
    found: dict[int, Blocker] = {}
    gone: list[JobExecution] = []
    for other in others:
        state = (
            Liveness.SUSPECT
            if live is None
            else node_liveness(
                live, other.node, now_ms=now_ms, ttl_s=ttl_s, heartbeat_s=heartbeat_s
            )
        )
        if state == Liveness.GONE and not rows.get(other.node, True):
            state = Liveness.SUSPECT
        if state == Liveness.GONE:
            gone.append(other)
        elif other.job_id not in found:
            started = other.started_at.timestamp() if other.started_at else None
            # Certain only if its node renewed since the run's start: a run marked running ahead
            # of an instant its node did not live to see (SIGKILLed just before) has no body,
            # though the presence has not expired yet.
            renewed = None if live is None else renewed_at_ms(live, other.node, ttl_s=ttl_s)
            # A run its node gave the lock of up is not known to be active; one whose cut-off
            # node still runs its body is (it holds the lock: a run behind it skips), until it
            # gives the lock up. A run that takes the lock meanwhile waits for either to end.
            presence = live.get(other.node) if live is not None else None
            given_up = released(presence, other.pk)
            found[other.job_id] = Blocker(
                started_at=started,
                certain=state == Liveness.ALIVE
                and not given_up
                and started is not None
                and renewed is not None
                and renewed >= started * 1000,
                # Live nodes that cannot be read (the store restarting) say nothing of this
                # node: it may have given the lock up as its membership ran out, its body still
                # on. A run holding the lock waits, as behind a node gone silent.
                silent=state == Liveness.SUSPECT or given_up or cut_off_body(presence, other.pk),
                execution_id=other.pk,
                listed_at=body_listed_at(presence, other.pk),
            )
    if gone:
        with transaction.atomic():
            for other in gone:
                executions.declare_lost(
                    other,
                    reason=REASON_BLOCKER_GONE.format(node=other.node or "?"),
                    now=now,
                )
    return found


def older_waiting(items: list[Scheduled], *, now: datetime) -> dict[int, bool]:
    """The runs of ``items`` behind an earlier fire of the same job that is due and not started:
    that one goes first (catch-up runs keep their order, and a catch-up run whose paced instant
    has come goes before its job's on-time fire: a forbid job's runs go one at a time, oldest
    first). Maps each such run to whether one of those earlier fires is held by no node. One
    query.

    Except an earlier on-time fire that another node holds and that this run, a fire of the
    schedule now due itself, has already superseded (a job whose misfire policy keeps one fire:
    that one is skipped at its next look). Waiting for it waited on its node: a node whose
    database path slowed down holds such a fire, unstarted, for as long as its admission's
    statements take, and every later fire of the job, claimed by healthy nodes, waited behind
    it until the next fire superseded them too (a chaos run's job ran nothing for 5.8 s). The
    job lock still keeps the two from running together."""
    if not items:
        return {}
    q = connection.ops.quote_name
    pending: dict[int, list[JobExecution]] = {}
    # No ORDER BY (the model's is by slot): a sort for nothing, or a walk down the slot index.
    for row in executions.select_rows(
        JobExecution,
        f"{q('job_id')} IN ({_ids(i.execution.job_id for i in items)}) AND {q('status')} = %s "
        f"AND {q('run_after')} <= %s",
        [S.PENDING, connection.ops.adapt_datetimefield_value(now)],
        names=PENDING_FIELDS,
    ):
        pending.setdefault(row.job_id, []).append(row)
    older: dict[int, bool] = {}
    for item in items:
        execution = item.execution
        supersedes = _supersedes_held_fires(item, now=now)
        before = [
            row.claim_token
            for row in pending.get(execution.job_id, ())
            if row.scheduled_for < execution.scheduled_for
            and row.pk != execution.pk
            and not (
                supersedes
                and row.claim_token is not None
                and row.trigger == Trigger.SCHEDULE
                and row.attempt == 1
                and not row.catch_up
            )
        ]
        if before:
            older[execution.pk] = any(token is None for token in before)
    return older


# What ``older_waiting`` reads of the pending runs of a batch's jobs.
PENDING_FIELDS = ("id", "job_id", "scheduled_for", "claim_token", "trigger", "attempt", "catch_up")


def _ids(values: Iterable[int]) -> str:
    """Ids as SQL text (whole numbers only: nothing else can reach the statement)."""
    return ", ".join({str(int(value)) for value in values})


def _supersedes_held_fires(item: Scheduled, *, now: datetime) -> bool:
    """Whether ``item`` supersedes every earlier on-time fire of its job that is still waiting: it
    is an on-time fire of the schedule, due now, of a job whose misfire policy keeps one fire
    (``jobs.firing.fires_kept``; the earlier one is skipped as superseded when it is looked at)."""
    execution = item.execution
    job = execution.job
    return (
        is_fire(execution)
        and not execution.catch_up
        and fires_kept(job.misfire_policy, job.run_all_max) == 1
        and item.due <= now.timestamp()
    )


def try_job_locks(
    backend: CoordinationBackend,
    batch: list[JobExecution],
    ttl_ms: int,
    keeper: LockKeeper,
    on_taken: Callable[[LockWatchdog], None] = lambda watchdog: None,
) -> list[tuple[Lock, LockWatchdog | None]]:
    """The job lock of each execution, asked for all at once (``backend.acquire_locks``: one round
    trip per Redlock master); a lock taken is kept alive by the node's ``keeper``. Two runs of one
    job in the batch: the first gets the lock, the second finds it taken."""
    if not batch:
        return []
    names = [f"job:{execution.job_id}" for execution in batch]
    began = time.monotonic()
    try:
        results = backend.acquire_locks(names, ttl_ms)
    except CoordinationError as exc:
        results = [exc] * len(batch)
    node_metrics.locks(
        (
            "unavailable"
            if isinstance(result, CoordinationError)
            else "taken"
            if result is None
            else "held"
            for result in results
        ),
        time.monotonic() - began,
    )
    locks: list[tuple[Lock, LockWatchdog | None]] = []
    for execution, result in zip(batch, results, strict=True):
        if isinstance(result, CoordinationError):
            logger.warning(
                "job lock for execution %s unavailable (%s)",
                execution.pk,
                result,
                extra={"execution": execution.pk},
            )
            locks.append((Lock.UNAVAILABLE, None))
        elif result is None:
            locks.append((Lock.TAKEN, None))
        else:
            watchdog = LockWatchdog(backend, result, ttl_ms)
            on_taken(watchdog)  # owned before the keeper extends it: see Ledger.rightful_locks
            locks.append((Lock.HELD, keeper.keep(watchdog)))
    return locks
