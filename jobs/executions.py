"""Every write of a JobExecution, in one place.

Creation (a scheduled fire, a manual run, a retry), claiming, starting, handing back, skipping,
finishing, ending a run its worker can no longer report on, promoting due retries, cancelling. Each
status change is checked against the state machine (``jobs.states``) and is one conditional UPDATE on
the status it leaves and, where the writer holds one, its claim token: a stale writer matches no row
and changes nothing. Each announces itself after commit (``jobs.events``), so nobody sees a state the
database rolled back.

Callers own the transactions: a function here either runs in the caller's transaction or, where it
says so, opens its own.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils.timezone import now as timezone_now

from jobs import bulk, driver, events
from jobs.models import MAX_OUTPUT_CHARS, Job, JobExecution, ScheduleType, Trigger
from jobs.schedules import spread_offset
from jobs.states import RETRYABLE_STATES, ExecutionStatus, check_transition

logger = logging.getLogger(__name__)

S = ExecutionStatus
RESULT_MAX_CHARS = 64 * 1024
ERROR_MAX_CHARS = 8192
REASON_MAX_CHARS = 255
_ANY_TOKEN = object()
# Slots read past the last wanted one when enqueued runs are spread a microsecond apart.
ENQUEUE_SLOT_MARGIN = 1000


def announce(*, execution_id: int, job_id: int, status: str) -> None:
    """Tell the dashboard and the wake-ups that an execution changed, once the transaction commits."""
    announce_many([(execution_id, job_id, status)])


def announce_many(changes: list[tuple[int, int, str]]) -> None:
    """``announce`` for many executions ((execution_id, job_id, status) each): one signal, sent
    once the transaction commits."""
    if changes:
        events.send_after_commit(
            events.executions_changed, changes=[events.ExecutionChange(*c) for c in changes]
        )


def transition(
    execution_id: int,
    *,
    source: str,
    target: str,
    job_id: int | None = None,
    claim_token: Any = _ANY_TOKEN,
    **fields: Any,
) -> bool:
    """Move one execution from ``source`` to ``target``; return whether this writer won.

    The UPDATE matches only while the row is still in ``source`` and, when ``claim_token`` is given,
    still carries that token (``None`` means "unclaimed"). Zero rows means another writer got there
    first or this writer is stale; nothing is changed then. ``claim_token_new`` in ``fields`` sets
    the row's token (the filter names the one the writer holds). Announced when ``job_id`` is given.
    """
    check_transition(source, target)
    filters: dict[str, Any] = {"pk": execution_id, "status": source}
    if claim_token is not _ANY_TOKEN:
        if claim_token is None:
            filters["claim_token__isnull"] = True
        else:
            filters["claim_token"] = claim_token
    if "claim_token_new" in fields:
        fields["claim_token"] = fields.pop("claim_token_new")
    won = JobExecution.objects.filter(**filters).update(status=target, **fields) == 1
    if won and job_id is not None:
        announce(execution_id=execution_id, job_id=job_id, status=target)
    return won


# --- creation -----------------------------------------------------------------------------------------


def new_fire(
    job: Job,
    slot: datetime,
    *,
    term: int,
    now: datetime,
    due: datetime | None = None,
    status: str = S.PENDING,
    reason: str = "",
) -> JobExecution:
    """A scheduled fire of ``job`` for ``slot``, due at ``due`` (its plan's: the slot plus the job's
    spread; by default computed here) (unsaved; ``create_fires`` stores a batch)."""
    if status not in (S.PENDING, S.SKIPPED):
        raise ValueError(f"a fire is created pending or skipped, not {status}")
    if due is None:
        offset = spread_offset(job.name, job.spread_seconds) if job.spread_seconds else 0.0
        due = slot + timedelta(seconds=offset)
    return JobExecution(
        job_id=job.pk,
        scheduled_for=slot,
        attempt=1,
        trigger=Trigger.SCHEDULE,
        status=status,
        run_after=due,
        queue=job.queue,
        priority=job.priority,
        term=term,
        reason=reason[:REASON_MAX_CHARS],
        finished_at=now if status == S.SKIPPED else None,
        created_at=now,
    )


def create_fires(rows: list[JobExecution]) -> list[JobExecution]:
    """Store a batch of fires in one statement (inside the leader's fenced transaction). Not
    announced one by one: the leader wakes the nodes once per batch, and the dashboard reads rows
    by their update time.

    A fire whose slot already has its row is left out, not inserted again: one job whose next
    fire was set back onto a slot it had already fired (a pause and resume within the lookahead)
    made the unique constraint fail the whole tick, every tick, and no job of the cluster fired
    again (found by a 30-minute chaos run)."""
    if not rows:
        return []
    existing = set(
        JobExecution.objects.filter(
            job_id__in={row.job_id for row in rows},
            scheduled_for__in={row.scheduled_for for row in rows},
        ).values_list("job_id", "scheduled_for", "attempt")
    )
    fresh = [r for r in rows if (r.job_id, r.scheduled_for, r.attempt) not in existing]
    if len(fresh) < len(rows):
        logger.warning(
            "%d fires already had their rows (a slot fired again after a reschedule); not "
            "inserted twice",
            len(rows) - len(fresh),
        )
    bulk.insert_instances(fresh)
    return fresh


def create_manual_run(
    job: Job, *, trigger: str, now: datetime, triggered_by: Any = None
) -> JobExecution:
    """A run of ``job`` outside its schedule, due now (run now, the API's trigger)."""
    execution = JobExecution.objects.create(
        job=job,
        scheduled_for=now,
        attempt=1,
        trigger=trigger,
        status=S.PENDING,
        run_after=now,
        queue=job.queue,
        priority=job.priority,
        triggered_by=triggered_by,
    )
    announce(execution_id=execution.pk, job_id=job.pk, status=execution.status)
    return execution


def create_retry_now(
    original: JobExecution, *, run_after: datetime, triggered_by: Any = None
) -> JobExecution:
    """An operator's retry: the next attempt of ``original``'s fire slot, pending at once. Raises
    IntegrityError if that attempt exists already (the unique constraint decides a race)."""
    job = original.job
    retry = JobExecution.objects.create(
        job_id=original.job_id,
        scheduled_for=original.scheduled_for,
        attempt=original.attempt + 1,
        trigger=Trigger.RETRY,
        status=S.PENDING,
        run_after=run_after,
        queue=job.queue,
        priority=job.priority,
        term=original.term,
        triggered_by=triggered_by,
        args=original.args,
        kwargs=original.kwargs,
    )
    announce(execution_id=retry.pk, job_id=retry.job_id, status=retry.status)
    return retry


def _schedule_phase_us(job: Job) -> int:
    """The microsecond every fire of ``job``'s schedule falls on."""
    if job.schedule_type == ScheduleType.INTERVAL and job.start_at is not None:
        return job.start_at.microsecond
    if job.schedule_type == ScheduleType.ONCE and job.run_at is not None:
        return job.run_at.microsecond
    return 0


def _free_slots(
    wanted: list[datetime], taken: set[datetime], avoid: set[int], step: timedelta
) -> list[datetime]:
    """A slot per wanted instant: the first at or after it that is not taken, not on a
    microsecond in ``avoid``, and not given to an earlier run of the same request."""
    taken = set(taken)
    slots = []
    # Where the search resumes, per wanted instant (linear, not quadratic, in the number of runs
    # wanting the same instant).
    resume: dict[datetime, datetime] = {}
    for instant in wanted:
        slot = resume.get(instant, instant)
        while slot in taken or slot.microsecond in avoid:
            slot += step
        taken.add(slot)
        slots.append(slot)
        resume[instant] = slot + step
    return slots


def create_enqueued(
    job: Job, runs: list[dict[str, Any]], *, now: datetime, triggered_by: Any = None
) -> list[JobExecution]:
    """Many runs of ``job`` at once (the enqueue API), each with its own arguments, due instant
    priority and idempotency key (``jobs.validation.clean_enqueued_run``), in one INSERT. Call inside a
    transaction.

    A run's fire slot (``scheduled_for``) is unique per job and attempt, like every execution's:
    runs due at the same instant are set a microsecond apart, in the order they were sent, and
    clear of the job's existing runs. Raises IntegrityError if a concurrent writer took a slot
    meanwhile (the caller tries again). Announced once, not once per run."""
    step = timedelta(microseconds=1)
    # Clear of the job's own schedule: a fire whose slot already has a row is not inserted
    # (create_fires), so an enqueued run on a slot the schedule fires at would cancel that fire.
    # Every fire of a job shares one microsecond phase (cron: whole seconds; an interval: its
    # start's; a one-off: its run_at's), and enqueued runs never take it, nor a whole second.
    avoid = {0, _schedule_phase_us(job)}
    wanted = [max(run["run_at"] or now, now) for run in runs]
    low = min(wanted)
    high = max(wanted) + step * (len(runs) + ENQUEUE_SLOT_MARGIN)
    taken: set[datetime] = set()
    read_to = low - step
    while True:
        # The job's slots read so far cover [low, read_to]; read on when the search passed it.
        taken.update(
            JobExecution.objects.filter(
                job_id=job.pk, attempt=1, scheduled_for__gt=read_to, scheduled_for__lte=high
            ).values_list("scheduled_for", flat=True)
        )
        read_to = high
        slots = _free_slots(wanted, taken, avoid, step)
        if max(slots) <= read_to:
            break
        high = max(slots) + step * ENQUEUE_SLOT_MARGIN
    stamp = timezone_now()
    priorities = [job.priority if run["priority"] is None else run["priority"] for run in runs]
    # Every concrete column of each run, as the instance returned will hold it.
    meta = JobExecution._meta
    fields = meta.concrete_fields
    shared = {
        "job_id": job.pk,
        "attempt": 1,
        "trigger": Trigger.ENQUEUE,
        "status": S.PENDING,
        "queue": job.queue,
        "node": "",
        "cancel_requested": False,
        "reason": "",
        "triggered_by_id": getattr(triggered_by, "pk", None),
        "created_at": stamp,
        "updated_at": stamp,
        "error": "",
        "traceback": "",
        "output": "",
    }
    own = ["scheduled_for", "run_after", "priority", "args", "kwargs", "idempotency_key"]
    # The columns every run shares are prepared for the database once; the rest per run.
    constant = {
        meta.get_field(name): meta.get_field(name).get_db_prep_save(value, connection)
        for name, value in shared.items()
    }
    args_field, kwargs_field = meta.get_field("args"), meta.get_field("kwargs")
    adapt_datetime = connection.ops.adapt_datetimefield_value
    rows = []
    for run, slot, priority in zip(runs, slots, priorities, strict=True):
        at = adapt_datetime(slot)
        rows.append(
            (
                at,
                at,
                priority,
                args_field.get_db_prep_save(run["args"], connection),
                kwargs_field.get_db_prep_save(run["kwargs"], connection),
                run.get("idempotency_key"),
            )
        )
    ids = bulk.insert(JobExecution, [meta.get_field(name) for name in own], rows, shared=constant)
    # The instances returned: every concrete column in the model's order, from a template.
    names = [field.attname for field in fields]
    template = [shared.get(name) for name in names]
    slots_at = [names.index(name) for name in ("id", *own)]
    created = []
    for pk, run, slot, priority in zip(ids, runs, slots, priorities, strict=True):
        values = template.copy()
        for index, value in zip(
            slots_at,
            (pk, slot, slot, priority, run["args"], run["kwargs"], run.get("idempotency_key")),
            strict=True,
        ):
            values[index] = value
        created.append(JobExecution.from_db(connection.alias, names, values))
    announce(execution_id=created[0].pk, job_id=job.pk, status=S.PENDING)
    return created


def backoff_delay(job: Job, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before attempt ``attempt + 1``: base * factor^(attempt-1), capped, with full jitter
    between half and all of it when enabled."""
    delay = min(
        job.retry_backoff_max, job.retry_backoff_base * job.retry_backoff_factor ** (attempt - 1)
    )
    if job.retry_jitter:
        delay *= 0.5 + (rng or random).random() * 0.5
    return delay


def create_retry_if_allowed(execution: JobExecution, *, now: datetime) -> JobExecution | None:
    """After a failure/timeout/loss: the next attempt, in ``retry_scheduled``, if policy allows."""
    job = execution.job
    if execution.attempt > job.max_retries:
        return None
    delay = backoff_delay(job, execution.attempt)
    retry, created = JobExecution.objects.get_or_create(
        job_id=execution.job_id,
        scheduled_for=execution.scheduled_for,
        attempt=execution.attempt + 1,
        defaults={
            "trigger": Trigger.RETRY,
            "status": S.RETRY_SCHEDULED,
            "run_after": now + timedelta(seconds=delay),
            "queue": job.queue,
            "priority": job.priority,
            "term": execution.term,
            "args": execution.args,
            "kwargs": execution.kwargs,
        },
    )
    return retry if created else None


def promote_due_retries(*, horizon: datetime) -> int:
    """retry_scheduled -> pending for every retry whose backoff ends before ``horizon``."""
    check_transition(S.RETRY_SCHEDULED, S.PENDING)
    return JobExecution.objects.filter(status=S.RETRY_SCHEDULED, run_after__lte=horizon).update(
        status=S.PENDING
    )


# --- claiming and handing back ------------------------------------------------------------------------

# A claim reads this many times as many candidates as it wants (see claim_batch).
CLAIM_CANDIDATES_FACTOR = 2


def claim_batch(
    *,
    node_id: str,
    queues: list[str],
    limit: int,
    horizon: datetime,
    now: datetime,
    start_now: Callable[[list[JobExecution]], list[JobExecution]] | None = None,
    prefix: str | None = None,
) -> list[JobExecution]:
    """Claim up to ``limit`` pending, unclaimed executions due before ``horizon``, highest priority
    and earliest due first (one transaction; ``SKIP LOCKED`` where the engine has it; on SQLite
    the write transaction serialises claimers).

    ``start_now`` picks, from the rows claimed, those to mark running at ``now`` in the same
    statement: runs already due that need nothing looked at before they start save a commit and
    a hand-over to the starter. Those come back with status ``running``.

    ``prefix`` is the batch's claim token prefix (each row's token is ``<prefix><id>``), chosen by
    the caller so that it knows the claim's rows before the claim returns.

    The hot path of every node, so it is written in SQL and counted in round trips (each costs
    the node and the server about 80 us of CPU together on the 2-core machine): a look for
    candidates and their jobs' version stamps, outside any transaction (most polls find nothing,
    and on SQLite a write transaction takes the one database-wide write lock); then, in one
    transaction, the rows themselves (locked) and one UPDATE that claims them all and starts
    those that start now. Five round trips on MariaDB (look, BEGIN, lock, UPDATE, COMMIT)."""
    if limit <= 0:
        return []
    prefix = prefix or new_claim_prefix()
    sql = _ClaimSQL.of(connection)
    queue_marks = ", ".join(["%s"] * len(queues))
    due = [S.PENDING, *queues, _db_datetime(horizon)]
    with connection.cursor() as cursor:
        # More candidates than wanted: those another claimer holds are skipped (SKIP LOCKED) and
        # the next ones taken instead, in the same transaction.
        cursor.execute(
            sql.candidates.format(queues=queue_marks), [*due, limit * CLAIM_CANDIDATES_FACTOR]
        )
        found = cursor.fetchall()
    if not found:
        return []
    candidates = [row[0] for row in found]
    # The jobs' version stamps, read with the candidates (a query of their own in the claim's
    # transaction before): a job is read again only when its row changed since it was cached.
    stamps = {job_id: (version, updated) for _, job_id, version, updated in found}
    picked_ids: set[int] = set()
    with driver.transaction_script() as script:
        claimed = _lock_claimable(script, sql, candidates, queue_marks, due, limit)
        if not claimed:
            return []
        attach_jobs(claimed, stamps)
        picked = start_now(claimed) if start_now is not None else []
        # Stamped now, not at the claim's ``now``: the claim may have waited for the write lock
        # (SQLite), and a row running "since" before that wait looks older than it is.
        started_at = timezone_now()
        picked_ids = {execution.pk for execution in picked}
        # Each row gets its own token "<batch>-<id>"; the runs to start now are claimed and
        # marked running in the same statement (one row change each, not two). The rows are
        # locked by this transaction, so every one of them matches; the statement still asks
        # that each be pending and unclaimed.
        statement, params = _claim_statement(
            sql, claimed, picked_ids, prefix, node_id, now, started_at
        )
        matched = script.execute_and_commit(statement, params)
    if matched != len(claimed):
        # Committed with the statement: the claim is what the rows say.
        logger.warning(
            "claim %s matched %d of the %d rows it had locked; keeping those that carry its token",
            prefix,
            matched,
            len(claimed),
        )
        claimed = _claimed_after_all(claimed, prefix)
        picked_ids &= {execution.pk for execution in claimed}
    for execution in claimed:
        execution.claim_token = f"{prefix}{execution.pk}"
        execution.node, execution.claimed_at, execution.updated_at = node_id, now, started_at
        if execution.pk in picked_ids:
            execution.status, execution.started_at = S.RUNNING, started_at
    announce_many([(e.pk, e.job_id, S.RUNNING) for e in claimed if e.pk in picked_ids])
    return claimed


def _claimed_after_all(claimed: list[JobExecution], prefix: str) -> list[JobExecution]:
    """The rows of ``claimed`` that carry this claim's token (read after its commit)."""
    tokens = {f"{prefix}{execution.pk}": execution for execution in claimed}
    won = set(
        JobExecution.objects.filter(claim_token__in=list(tokens)).values_list(
            "claim_token", flat=True
        )
    )
    return [execution for token, execution in tokens.items() if token in won]


def _claim_statement(
    sql: _ClaimSQL,
    claimed: list[JobExecution],
    picked_ids: set[int],
    prefix: str,
    node_id: str,
    now: datetime,
    started_at: datetime,
) -> tuple[str, list[Any]]:
    """The claim's one UPDATE and its parameters: every row of ``claimed`` gets its token, the
    ones in ``picked_ids`` are marked running too."""
    ids = [execution.pk for execution in claimed]
    claim = [prefix, node_id, _db_datetime(now), _db_datetime(started_at)]
    marks = ", ".join(["%s"] * len(ids))
    unclaimed = [*ids, S.PENDING]
    if not picked_ids:
        return sql.claim.format(ids=marks), [*claim, *unclaimed]
    check_transition(S.PENDING, S.RUNNING)
    if len(picked_ids) == len(ids):
        started = [S.RUNNING, _db_datetime(started_at)]
        return sql.claim_and_start.format(ids=marks), [*claim, *started, *unclaimed]
    picked = list(picked_ids)
    statement = sql.claim_some_started.format(ids=marks, picked=", ".join(["%s"] * len(picked)))
    return statement, [*claim, *picked, S.RUNNING, *picked, _db_datetime(started_at), *unclaimed]


def _lock_claimable(
    script: driver.Transaction,
    sql: _ClaimSQL,
    candidates: list[int],
    queue_marks: str,
    due: list[Any],
    limit: int,
) -> list[JobExecution]:
    """In the claim's transaction: the claimable rows, locked, at most ``limit``.

    With SKIP LOCKED (MariaDB): the candidates (in claim order) by their ids, still pending and
    unclaimed, skipping rows another claimer holds; then the next candidates for what is still
    missing. Locking rows through the claim's index instead cost more with every row claimed
    before (a locking read steps over the index entries the claims left for purge: 0.5 ms for
    64 rows at the start of a 10,000-run backlog, 4.5 ms at its end), a read by id does not.
    Without (SQLite): the write transaction holds the whole database, so the claim's own query,
    read again inside it, is the truth."""
    load = _row_loader(connection.vendor)
    if sql.lock_by_ids is None:
        cursor = script.execute(sql.ordered.format(queues=queue_marks), [*due, limit])
        return [load(row) for row in cursor.fetchall()]
    rows: list[JobExecution] = []
    taken = 0
    while len(rows) < limit and taken < len(candidates):
        batch = candidates[taken : taken + limit - len(rows)]
        taken += len(batch)
        marks = ", ".join(["%s"] * len(batch))
        cursor = script.execute(sql.lock_by_ids.format(ids=marks), [*batch, S.PENDING])
        rows += [load(row) for row in cursor.fetchall()]
    # Claim order (priority first, then due time), as the candidates were read.
    order = {pk: index for index, pk in enumerate(candidates)}
    rows.sort(key=lambda row: order[row.pk])
    return rows


@dataclass(frozen=True)
class _ClaimSQL:
    """The claim's statements for one database engine (table and column names from the model;
    every value a parameter; ``{queues}``, ``{ids}`` and ``{picked}`` become as many
    placeholders)."""

    candidates: str
    ordered: str
    lock_by_ids: str | None
    claim: str
    claim_and_start: str
    claim_some_started: str

    @staticmethod
    @functools.cache
    def _build(vendor: str, skip_locked: bool) -> _ClaimSQL:
        # Only the model's own table and column names go into the text (S608: reviewed).
        q = connection.ops.quote_name
        table = q(JobExecution._meta.db_table)
        jobs = q(Job._meta.db_table)
        columns = ", ".join(q(field.column) for field in JobExecution._meta.concrete_fields)
        where = (
            f"{q('status')} = %s AND {q('queue')} IN ({{queues}}) AND {q('claim_token')} IS NULL"
            f" AND {q('run_after')} <= %s"
        )
        order = f"ORDER BY {q('priority')} DESC, {q('run_after')}, {q('id')} LIMIT %s"
        # The same range and order, read through the claim's index first (a derived table: the
        # candidates are found before any join), then each with its job's version stamp (its
        # primary key). A plain join let MariaDB start from the job and sort every pending run
        # of it (a whole backlog of one job, for each claim).
        look_columns = f"{q('id')}, {q('job_id')}, {q('priority')}, {q('run_after')}"
        look = f"SELECT {look_columns} FROM {table} WHERE {where} {order}"  # noqa: S608
        look_order = f"ORDER BY c.{q('priority')} DESC, c.{q('run_after')}, c.{q('id')}"
        token = "CONCAT(%s, id)" if vendor == "mysql" else "(%s || id)"
        claim = (
            f"UPDATE {table} SET {q('claim_token')} = {token}, {q('node')} = %s, "  # noqa: S608
            f"{q('claimed_at')} = %s, {q('updated_at')} = %s"
        )
        by_ids = f"WHERE {q('id')} IN ({{ids}})"
        still_unclaimed = f"{by_ids} AND {q('status')} = %s AND {q('claim_token')} IS NULL"
        return _ClaimSQL(
            candidates=(
                f"SELECT c.{q('id')}, c.{q('job_id')}, j.{q('version')}, "  # noqa: S608
                f"j.{q('updated_at')} FROM ({look}) c JOIN {jobs} j ON j.{q('id')} = "
                f"c.{q('job_id')} {look_order}"
            ),
            ordered=f"SELECT {columns} FROM {table} WHERE {where} {order}",  # noqa: S608
            # By primary key always: with few rows pending when its estimate is made, MariaDB
            # may choose a status index, and a locking read through it walks (and locks) every
            # pending row of a burst that arrives meanwhile.
            lock_by_ids=(
                f"SELECT {columns} FROM {table} FORCE INDEX (PRIMARY) {by_ids} "  # noqa: S608
                f"AND {q('status')} = %s AND {q('claim_token')} IS NULL FOR UPDATE SKIP LOCKED"
                if skip_locked
                else None
            ),
            claim=f"{claim} {still_unclaimed}",
            claim_and_start=(
                f"{claim}, {q('status')} = %s, {q('started_at')} = %s {still_unclaimed}"
            ),
            claim_some_started=(
                f"{claim}, {q('status')} = CASE WHEN {q('id')} IN ({{picked}}) THEN %s ELSE "
                f"{q('status')} END, {q('started_at')} = CASE WHEN {q('id')} IN ({{picked}}) "
                f"THEN %s ELSE {q('started_at')} END {still_unclaimed}"
            ),
        )

    @classmethod
    def of(cls, conn: Any) -> _ClaimSQL:
        return cls._build(conn.vendor, conn.features.has_select_for_update_skip_locked)


def _db_datetime(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


@functools.cache
def _row_loader(vendor: str) -> Callable[[tuple], JobExecution]:
    """A function from a row (every concrete column, in order) to an instance, equal to what the
    ORM reads (the test of claimed rows compares every field).

    The instance is made without ``Model.__init__`` (its generic handling of positional, keyword
    and deferred values cost more than the row's query): its attributes are set in its
    ``__dict__`` and its state marked loaded, which is what ``__init__`` and ``from_db`` leave
    (the model has no init signal receivers). On MariaDB/MySQL, whose DATETIMEs arrive naive in
    the connection's time zone (UTC), the columns are converted in place by kind (dates made
    aware, JSON decoded, booleans) instead of through the converters' generic signature; any
    other column or engine goes through the converters themselves."""
    from django.db.models.base import ModelState

    fields = JobExecution._meta.concrete_fields
    names = [field.attname for field in fields]
    dates: list[int] = []
    documents: list[int] = []
    flags: list[int] = []
    generic = []
    specialised = vendor == "mysql" and settings.USE_TZ and connection.timezone_name == "UTC"
    for index, field in enumerate(fields):
        kind = field.get_internal_type()
        if specialised and kind == "DateTimeField":
            dates.append(index)
        elif specialised and kind == "JSONField" and field.decoder is None:
            documents.append(index)
        elif specialised and kind == "BooleanField":
            flags.append(index)
        else:
            column = field.get_col(JobExecution._meta.db_table)
            functions = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            if functions:
                generic.append((index, column, functions))
    alias = connection.alias
    conn = connection
    new = JobExecution.__new__
    loads = json.loads

    def load(row: tuple) -> JobExecution:
        values = list(row)
        for index in dates:
            value = values[index]
            if value is not None:
                values[index] = value.replace(tzinfo=UTC)
        for index in documents:
            value = values[index]
            if value is not None:
                # As JSONField.from_db_value: a value that is not JSON stays as it is.
                with contextlib.suppress(json.JSONDecodeError):
                    values[index] = loads(value)
        for index in flags:
            if values[index] in (0, 1):
                values[index] = bool(values[index])
        for index, column, functions in generic:
            value = values[index]
            for function in functions:
                value = function(value, column, conn)
            values[index] = value
        execution = new(JobExecution)
        state = execution._state = ModelState()
        state.adding, state.db = False, alias
        execution.__dict__.update(zip(names, values, strict=True))
        return execution

    return load


def attach_jobs(rows: list[JobExecution], stamps: dict[int, tuple[Any, Any]] | None = None) -> None:
    """Give each execution its job: one instance per job (not a copy per row, as a join would
    build), from this process's cache when the job's row still carries the version and update
    stamp it was cached with (``stamps``, read with the claim's candidates; else one small query
    for the batch), else read again with the ORM."""
    ids = {row.job_id for row in rows}
    jobs = _job_cache.current(ids, stamps)
    # The relation's cache set directly: each row's job_id is the job's already (the descriptor's
    # assignment would set it again and check the instance, 2 us a row).
    cache = JobExecution.job.field.set_cached_value
    for row in rows:
        cache(row, jobs[row.job_id])


class _JobCache:
    """Jobs as the claims last read them, checked against their rows' ``version`` (every edit of
    a definition raises it) and ``updated_at`` (every write of the row stamps it) before use."""

    # Forget everything past this many jobs (a bound, not a policy: claims read again).
    LIMIT = 10_000

    def __init__(self) -> None:
        self._jobs: dict[int, tuple[tuple[Any, Any], Job]] = {}
        self._lock = threading.Lock()

    def current(
        self, ids: set[int], known: dict[int, tuple[Any, Any]] | None = None
    ) -> dict[int, Job]:
        """The jobs of ``ids``; ``known`` gives their stamps as just read (else they are read)."""
        if not ids:
            return {}
        if known is not None and ids <= known.keys():
            stamps = {pk: known[pk] for pk in ids}
        else:
            stamps = self._stamps(ids)
        found: dict[int, Job] = {}
        with self._lock:
            for pk, stamp in stamps.items():
                cached = self._jobs.get(pk)
                if cached is not None and cached[0] == stamp:
                    found[pk] = cached[1]
        stale = set(stamps) - set(found)
        if stale:
            fresh = Job.objects.in_bulk(stale)
            found.update(fresh)
            with self._lock:
                if len(self._jobs) + len(fresh) > self.LIMIT:
                    self._jobs.clear()
                for pk, job in fresh.items():
                    self._jobs[pk] = (stamps[pk], job)
        return found

    @staticmethod
    def _stamps(ids: set[int]) -> dict[int, tuple[Any, Any]]:
        q = connection.ops.quote_name
        marks = ", ".join(["%s"] * len(ids))
        sql = (
            f"SELECT {q('id')}, {q('version')}, {q('updated_at')} FROM {q(Job._meta.db_table)} "  # noqa: S608
            f"WHERE {q('id')} IN ({marks})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, list(ids))
            return {pk: (version, updated) for pk, version, updated in cursor.fetchall()}


_job_cache = _JobCache()


# Claim prefixes: random per process (64 bits, drawn once), then counted. A fresh uuid4 per claim
# read the kernel's random source every time: 0.36 ms a call on the development VM, about 10 us
# a run in a burst.
_PREFIX_NONCE = uuid.uuid4().hex[:12]
_prefix_counter = itertools.count(1)


def new_claim_prefix() -> str:
    """A claim batch's token prefix (unique: this process's nonce and a count); each row's token
    is ``<prefix><id>``."""
    return f"{_PREFIX_NONCE}{next(_prefix_counter):x}-"


def claim_prefix_of(token: str | None) -> str:
    """The batch prefix of a claim token ("" for none)."""
    return (token or "")[: (token or "").rfind("-") + 1]


def hand_back(execution: JobExecution, *, run_after: datetime | None = None) -> bool:
    """Give a claimed, unstarted execution back to the queue (drain, a lock service that cannot
    answer, a buffer_one run waiting its turn), due again at ``run_after`` when given."""
    fields: dict[str, Any] = {"claim_token": None, "node": "", "claimed_at": None}
    if run_after is not None:
        fields["run_after"] = run_after
    return bool(
        JobExecution.objects.filter(
            pk=execution.pk, status=S.PENDING, claim_token=execution.claim_token
        ).update(**fields)
    )


def hand_back_unstarted(execution: JobExecution) -> bool:
    """running -> pending for a run marked running ahead of its instant whose body never started
    (its node could not confirm its claim). Conditional on the claim token: a run the cluster has
    already declared lost or handed to another node is left alone."""
    return transition(
        execution.pk,
        source=S.RUNNING,
        target=S.PENDING,
        job_id=execution.job_id,
        claim_token=execution.claim_token,
        claim_token_new=None,
        node="",
        claimed_at=None,
        started_at=None,
    )


def hand_back_claims(*, node: str, claimed_before: datetime) -> int:
    """The claimed, unstarted executions ``node`` took before ``claimed_before`` go back to the
    queue (a node cut off from the database since then cannot start them)."""
    return JobExecution.objects.filter(
        node=node, claimed_at__lt=claimed_before, status=S.PENDING
    ).update(claim_token=None, node="", claimed_at=None)


def hand_back_nodes(nodes: Iterable[str]) -> int:
    """Every claimed, unstarted execution of these (dead or stopped) nodes goes back to the queue."""
    return JobExecution.objects.filter(node__in=list(nodes), status=S.PENDING).update(
        claim_token=None, node="", claimed_at=None
    )


# --- starting -----------------------------------------------------------------------------------------


def start_batch(group: list[JobExecution], *, planned: datetime) -> set[int]:
    """pending -> running for the runs due together, in one statement, just ahead of their
    instant (write-ahead: a run may start only once the row says so). Returns the ids that won; a
    row cancelled or taken meanwhile does not match and must not start.

    A row matches on its id and the claim token this writer holds. Every token names its own
    row ("<batch>-<id>"), so "id in ids and token in tokens" is the same condition as "(id,
    token) pairs", at the cost of two IN lists instead of one OR term per row. When every row
    matched (the usual case) no second read is needed to know who won."""
    if not group:
        return set()
    check_transition(S.PENDING, S.RUNNING)
    ids = [e.pk for e in group]
    tokens = [e.claim_token for e in group]
    updated = JobExecution.objects.filter(
        pk__in=ids, claim_token__in=tokens, status=S.PENDING
    ).update(status=S.RUNNING, started_at=planned)
    if updated == len(group):
        won = set(ids)
    else:
        won = set(
            JobExecution.objects.filter(
                pk__in=ids, status=S.RUNNING, claim_token__in=tokens
            ).values_list("pk", flat=True)
        )
    for execution in group:
        if execution.pk in won:
            execution.status, execution.started_at = S.RUNNING, planned
    announce_many([(e.pk, e.job_id, S.RUNNING) for e in group if e.pk in won])
    return won


def skip(execution: JobExecution, *, reason: str, now: datetime) -> bool:
    """pending -> skipped (a claimed run that will not run: forbid, a stale misfire)."""
    return transition(
        execution.pk,
        source=S.PENDING,
        target=S.SKIPPED,
        job_id=execution.job_id,
        claim_token=execution.claim_token,
        finished_at=now,
        reason=reason[:REASON_MAX_CHARS],
    )


# --- ending -------------------------------------------------------------------------------------------


def bounded_text(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """At most ``limit`` characters, and always storable: lone surrogates (a file name that was
    not UTF-8, decoded with os.fsdecode) become backslash escapes instead of failing the write."""
    if not text.isascii():  # (ASCII cannot hold a surrogate: most outputs skip the round trip)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "\n...[truncated]"


def jsonable_result(value: Any) -> Any:
    if (
        value is None
        or isinstance(value, (bool, int))
        or (type(value) is str and len(value) < 1024)
    ):
        return value  # JSON as it is, and short: nothing to check (the common results)
    try:
        # allow_nan=False: NaN/Infinity are not JSON, and the database's JSON column refuses them.
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return {"repr": bounded_text(repr(value), RESULT_MAX_CHARS)}
    if len(encoded) > RESULT_MAX_CHARS:
        return {"truncated": encoded[:RESULT_MAX_CHARS]}
    return value


def _outcome_fields(
    execution: JobExecution,
    *,
    status: str,
    now: datetime,
    result: Any = None,
    error: str = "",
    tb: str = "",
    output: str = "",
    reason: str = "",
    started: float | None = None,
    ended: float | None = None,
) -> dict[str, Any]:
    """The columns an outcome writes. ``started`` and ``ended`` are the wall times the body began
    and ended at, when known: the run's ``finished_at`` is when its body ended, not when the
    outcome was written (outcomes are written in batches, a little later), so the next run of a
    forbid job, which may start as soon as the body ends, never seems to overlap it."""
    started_at = datetime.fromtimestamp(started, tz=UTC) if started else execution.started_at
    started_at = started_at or now
    finished_at = datetime.fromtimestamp(ended, tz=UTC) if ended else now
    finished_at = max(finished_at, started_at)
    return {
        "status": status,
        "started_at": started_at,
        "finished_at": finished_at,
        "duration_ms": (finished_at - started_at).total_seconds() * 1000,
        "result": jsonable_result(result),
        "error": bounded_text(error, ERROR_MAX_CHARS),
        "traceback": bounded_text(tb),
        "output": bounded_text(output),
        "reason": reason[:REASON_MAX_CHARS],
    }


def _fenced(execution: JobExecution, status: str) -> None:
    logger.warning(
        "fenced: execution %s is no longer ours (claim %s); outcome %s dropped",
        execution.pk,
        execution.claim_token,
        status,
        extra={"execution": execution.pk, "claim_token": execution.claim_token},
    )


def save_output_so_far(execution: JobExecution, output: str, *, now: datetime) -> bool:
    """Save a running run's output so far (its final output is written with its outcome). Only
    while the claim that runs it still holds the row: False once the run has ended or been taken
    over, and nothing is written."""
    return bool(
        JobExecution.objects.filter(
            pk=execution.pk, status=S.RUNNING, claim_token=execution.claim_token
        ).update(output=output, updated_at=now)
    )


def finish(execution: JobExecution, *, status: str, now: datetime, **outcome: Any) -> bool:
    """running -> status, conditional on the claim token, plus the next attempt when the outcome
    allows one. Call inside a transaction. False when the writer no longer owns the run (fenced).
    ``outcome``: result, error, tb, output, reason, started (see ``_outcome_fields``)."""
    fields = _outcome_fields(execution, status=status, now=now, **outcome)
    del fields["status"]
    won = transition(
        execution.pk,
        source=S.RUNNING,
        target=status,
        job_id=execution.job_id,
        claim_token=execution.claim_token,
        **fields,
    )
    if won and status in RETRYABLE_STATES:
        # The backoff runs from the run's end.
        create_retry_if_allowed(execution, now=fields["finished_at"])
    if not won:
        _fenced(execution, status)
    return won


# One outcome UPDATE carries at most this much text (result, output, traceback...); a batch with
# more is written in several statements (MariaDB's max_allowed_packet is 16 MiB by default).
FINISH_STATEMENT_CHARS = 1_000_000


def finish_batch(outcomes: list[tuple[JobExecution, dict[str, Any]]], *, now: datetime) -> set[int]:
    """``finish`` for many runs in one UPDATE statement (several when their text is large): each
    column is set to a ``CASE`` on the row's id (or to one value when every row has the same),
    and a row is written only while it is still running under this writer's claim token, as in
    ``finish``. Returns the ids written; the others were fenced.

    Opens its own transaction only when it writes more than that one statement (large text, or a
    next attempt to create): a batch of outcomes is usually one UPDATE, committed by itself, one
    round trip instead of four. In a caller's transaction, it is part of that one.

    ``outcomes`` pairs each execution with its ``finish`` keywords (``status`` included)."""
    if not outcomes:
        return set()
    stamp = timezone_now()
    rows: list[tuple[JobExecution, dict[str, Any]]] = []
    retries = False
    for execution, outcome in outcomes:
        status = outcome["status"]
        check_transition(S.RUNNING, status)
        values = _outcome_fields(execution, now=now, **outcome)
        values["updated_at"] = stamp
        rows.append((execution, values))
        retries = retries or (
            status in RETRYABLE_STATES and execution.attempt <= execution.job.max_retries
        )
    chunks = list(_chunks_by_text(rows))
    alone = (len(chunks) == 1 and not retries) or connection.in_atomic_block
    with contextlib.nullcontext() if alone else transaction.atomic():
        matched = sum(_update_outcomes(chunk) for chunk in chunks)
        wanted = {execution.pk: values for execution, values in rows}
        if matched == len(rows):
            won = set(wanted)
        else:
            # Some rows were no longer ours: the ones written carry this writer's outcome and time.
            tokens = {execution.pk: execution.claim_token for execution, _ in outcomes}
            won = {
                pk
                for pk, status, finished_at, token in JobExecution.objects.filter(
                    pk__in=list(wanted)
                ).values_list("pk", "status", "finished_at", "claim_token")
                if status == wanted[pk]["status"]
                and finished_at == wanted[pk]["finished_at"]
                and token == tokens[pk]
            }
        for execution, outcome in outcomes:
            status = outcome["status"]
            if execution.pk not in won:
                _fenced(execution, status)
            elif status in RETRYABLE_STATES:
                # The backoff runs from the body's end.
                create_retry_if_allowed(execution, now=wanted[execution.pk]["finished_at"])
    announce_many([(e.pk, e.job_id, o["status"]) for e, o in outcomes if e.pk in won])
    return won


OUTCOME_COLUMNS = (
    "status",
    "started_at",
    "finished_at",
    "duration_ms",
    "result",
    "error",
    "traceback",
    "output",
    "reason",
    "updated_at",
)


def _chunks_by_text(
    rows: list[tuple[JobExecution, dict[str, Any]]],
) -> Iterable[list[tuple[JobExecution, dict[str, Any]]]]:
    chunk: list[tuple[JobExecution, dict[str, Any]]] = []
    size = 0
    for row in rows:
        values = row[1]
        text = sum(len(values[name]) for name in ("error", "traceback", "output", "reason"))
        text += len(json.dumps(values["result"])) if values["result"] is not None else 0
        if chunk and size + text > FINISH_STATEMENT_CHARS:
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += text
    if chunk:
        yield chunk


def _update_outcomes(rows: list[tuple[JobExecution, dict[str, Any]]]) -> int:
    """One UPDATE writing ``rows``' outcome columns, only where each row is still running under
    this writer's claim token; returns the rows it matched."""
    quote = connection.ops.quote_name
    tokens = [execution.claim_token for execution, _ in rows]
    # Every token names its own row ("<batch>-<id>"): "id in ids and token in tokens" is the
    # pairwise condition.
    return bulk.update(
        JobExecution,
        [(execution.pk, values) for execution, values in rows],
        OUTCOME_COLUMNS,
        where=f"{quote('status')} = %s AND {quote('claim_token')} IN ({', '.join(['%s'] * len(rows))})",
        where_params=[S.RUNNING, *tokens],
    )


def declare_lost(execution: JobExecution, *, reason: str, now: datetime) -> bool:
    """The one way a run becomes lost: its node can no longer report on it (the node died, was
    cut off, stopped without finishing it, or its body never started there), with the reason;
    retried per policy. Call inside a transaction."""
    return end_running(execution, status=S.LOST, reason=reason, now=now)


def end_running(execution: JobExecution, *, status: str, reason: str, now: datetime) -> bool:
    """End a run its worker can no longer report on (node dead, stuck, drained, its node gone
    while it blocked a policy): running -> lost or timed_out, and the next attempt when policy
    allows. Call inside a transaction."""
    won = transition(
        execution.pk,
        source=S.RUNNING,
        target=status,
        job_id=execution.job_id,
        claim_token=execution.claim_token,
        finished_at=now,
        reason=reason[:REASON_MAX_CHARS],
    )
    if won:
        create_retry_if_allowed(execution, now=now)
    return won


def cancel_waiting(execution: JobExecution, *, reason: str, now: datetime) -> bool:
    """pending | retry_scheduled -> cancelled, whoever holds the claim (an operator's cancel)."""
    return transition(
        execution.pk,
        source=execution.status,
        target=S.CANCELLED,
        job_id=execution.job_id,
        finished_at=now,
        reason=reason[:REASON_MAX_CHARS],
    )


def request_cancel(execution: JobExecution, *, reason: str) -> bool:
    """Ask the node running ``execution`` to stop it (it sees the flag on its next heartbeat)."""
    won = bool(
        JobExecution.objects.filter(pk=execution.pk, status=S.RUNNING).update(
            cancel_requested=True, reason=reason[:REASON_MAX_CHARS]
        )
    )
    if won:
        announce(execution_id=execution.pk, job_id=execution.job_id, status=S.RUNNING)
    return won


def request_cancel_jobs(job_ids: list[int], *, reason: str) -> int:
    """``replace``: ask every running execution of these jobs to stop, for a newer fire."""
    return JobExecution.objects.filter(
        job_id__in=job_ids, status=S.RUNNING, cancel_requested=False
    ).update(cancel_requested=True, reason=reason[:REASON_MAX_CHARS])
