"""A run's life after its claim, and its birth: creation (a scheduled fire, a manual run, an
enqueued run, a retry), starting, skipping, finishing, ending a run its worker can no longer report
on, promoting due retries, cancelling; and ``transition``, the one conditional UPDATE every status
change goes through. (Claims and hand-backs: ``claims``.) Longer than most modules because a run's
whole state machine is here, each write one short function beside the others it must agree with."""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils.timezone import now as timezone_now

from jobs import bulk, chains, events
from jobs.models import MAX_OUTPUT_CHARS, Job, JobExecution, ScheduleType, Trigger
from jobs.schedules import spread_offset
from jobs.states import RETRYABLE_STATES, TERMINAL_STATES, ExecutionStatus, check_transition

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
    catch_up: bool = False,
) -> JobExecution:
    """A scheduled fire of ``job`` for ``slot``, due at ``due`` (its plan's: the slot plus the job's
    spread; by default computed here) (unsaved; ``create_fires`` stores a batch). ``catch_up``: a
    run for a slot missed past the grace, released on the catch-up budget (the leader paces its
    ``run_after`` before storing it)."""
    if status not in (S.PENDING, S.SKIPPED):
        raise ValueError(f"a fire is created pending or skipped, not {status}")
    if due is None:
        offset = spread_offset(job.name, job.spread_seconds) if job.spread_seconds else 0.0
        due = slot + timedelta(seconds=offset)
    return bulk.maker(JobExecution)(
        job_id=job.pk,
        scheduled_for=slot,
        attempt=1,
        trigger=Trigger.SCHEDULE,
        status=status,
        run_after=due,
        queue=job.queue,
        priority=job.priority,
        term=term,
        catch_up=catch_up,
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
    job: Job,
    *,
    trigger: str,
    now: datetime,
    triggered_by: Any = None,
    args: list | None = None,
    kwargs: dict | None = None,
) -> JobExecution:
    """A run of ``job`` outside its schedule, due now (run now, the API's trigger), with its own
    arguments when given (None: the job's)."""
    execution = JobExecution.objects.create(
        args=args,
        kwargs=kwargs,
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


def _unscheduled_slots(job: Job, wanted: list[datetime]) -> list[datetime]:
    """A free first-attempt slot of ``job`` per wanted instant (in order, a microsecond apart
    where they meet), for a run outside the schedule that may share its instant with others.

    Clear of the job's own schedule: a fire whose slot already has a row is not inserted
    (create_fires), so a run on a slot the schedule fires at would cancel that fire. Every fire
    of a job shares one microsecond phase (cron: whole seconds; an interval: its start's; a
    one-off: its run_at's), and these runs never take it, nor a whole second."""
    step = timedelta(microseconds=1)
    avoid = {0, _schedule_phase_us(job)}
    low = min(wanted)
    high = max(wanted) + step * (len(wanted) + ENQUEUE_SLOT_MARGIN)
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
            return slots
        high = max(slots) + step * ENQUEUE_SLOT_MARGIN


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
    wanted = [max(run["run_at"] or now, now) for run in runs]
    slots = _unscheduled_slots(job, wanted)
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
        "catch_up": False,
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


# Attempts at inserting a final outcome's chained runs when a concurrent writer took a slot.
CHAIN_INSERT_ATTEMPTS = 3


def create_chained_runs(
    ended: list[tuple[JobExecution, str]], *, now: datetime
) -> list[JobExecution]:
    """The runs the final outcomes in ``ended`` (each run with the status just written) make
    through their jobs' chains (``jobs.chains``): one per target job, pending and due now, or
    skipped with its reason when the target is paused. Call inside the transaction that wrote the
    outcomes, so that a run's outcome and its chained runs commit together or not at all.

    Idempotent: an outcome written again (a batch retried after a commit it did not hear of) finds
    its chained runs made and makes none; the unique (job, parent) is the last line of defence.
    A slot taken by a concurrent writer meanwhile is looked for again (a savepoint, not the
    caller's whole transaction). A target no longer there (deleted or renamed since the chain
    was checked) is logged, as there is no job to give a row to."""
    wanted: dict[int, list[str]] = {}
    for execution, status in ended:
        job = execution.job
        if chains.fires(job, status=status, attempt=execution.attempt):
            wanted[execution.pk] = chains.targets(job, status)
    if not wanted:
        return []
    for attempt in range(1, CHAIN_INSERT_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                created = _insert_chained(wanted, now=now)
            break
        except IntegrityError:
            if attempt == CHAIN_INSERT_ATTEMPTS:
                raise
    announce_many([(e.pk, e.job_id, e.status) for e in created])
    return created


def _insert_chained(wanted: dict[int, list[str]], *, now: datetime) -> list[JobExecution]:
    names = {name for targets in wanted.values() for name in targets}
    jobs = {job.name: job for job in Job.objects.filter(name__in=names) if job.name in names}
    made = set(
        JobExecution.objects.filter(parent_id__in=list(wanted)).values_list("parent_id", "job_id")
    )
    by_job: dict[str, list[int]] = {}
    for parent_id, targets in wanted.items():
        for name in targets:
            job = jobs.get(name)
            if job is None:
                logger.warning(
                    "chain: run %s names job %r, which no longer exists; nothing run",
                    parent_id,
                    name,
                    extra={"execution": parent_id},
                )
            elif (parent_id, job.pk) not in made:
                by_job.setdefault(name, []).append(parent_id)
    rows: list[JobExecution] = []
    for name, parents in by_job.items():
        job = jobs[name]
        skipped = not job.enabled
        for parent_id, slot in zip(
            parents, _unscheduled_slots(job, [now] * len(parents)), strict=True
        ):
            rows.append(
                JobExecution(
                    job_id=job.pk,
                    scheduled_for=slot,
                    attempt=1,
                    trigger=Trigger.CHAIN,
                    status=S.SKIPPED if skipped else S.PENDING,
                    run_after=now,
                    queue=job.queue,
                    priority=job.priority,
                    parent_id=parent_id,
                    reason=chains.REASON_TARGET_DISABLED if skipped else "",
                    finished_at=now if skipped else None,
                    created_at=now,
                    updated_at=now,
                )
            )
    bulk.insert_instances(rows)
    return rows


def promote_due_retries(*, horizon: datetime) -> int:
    """retry_scheduled -> pending for every retry whose backoff ends before ``horizon``."""
    check_transition(S.RETRY_SCHEDULED, S.PENDING)
    return JobExecution.objects.filter(status=S.RETRY_SCHEDULED, run_after__lte=horizon).update(
        status=S.PENDING
    )


# --- starting -----------------------------------------------------------------------------------------


def start_batch(
    group: list[JobExecution], *, planned: datetime | Mapping[int, datetime]
) -> set[int]:
    """pending -> running for a batch of claimed runs, in one statement, just ahead of their
    instants (write-ahead: a run may start only once the row says so). ``planned``: the instant
    every run starts, or each run's own by id (runs of jobs spread over their interval are due
    microseconds apart: one statement still, its ``started_at`` chosen per row). Returns the ids
    that won; a row cancelled or taken meanwhile does not match and must not start.

    A row matches on its id and the claim token this writer holds. Every token names its own
    row ("<batch>-<id>"), so "id in ids and token in tokens" is the same condition as "(id,
    token) pairs", at the cost of two IN lists instead of one OR term per row. When every row
    matched (the usual case) no second read is needed to know who won."""
    if not group:
        return set()
    check_transition(S.PENDING, S.RUNNING)
    ids = [e.pk for e in group]
    tokens = [e.claim_token for e in group]
    instants = (
        dict.fromkeys(ids, planned)
        if isinstance(planned, datetime)
        else {i: planned[i] for i in ids}
    )
    quote = connection.ops.quote_name
    stamp = timezone_now()  # updated_at: readers (the dashboard) ask "what changed since"
    updated = bulk.update(
        JobExecution,
        [
            (pk, {"status": S.RUNNING, "started_at": instants[pk], "updated_at": stamp})
            for pk in ids
        ],
        ("status", "started_at", "updated_at"),
        where=f"{quote('status')} = %s AND {quote('claim_token')} IN ({', '.join(['%s'] * len(ids))})",
        where_params=[S.PENDING, *tokens],
    )
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
            execution.status, execution.started_at = S.RUNNING, instants[execution.pk]
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
    if won:
        create_chained_runs([(execution, status)], now=now)
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
    retries = chained = False
    for execution, outcome in outcomes:
        status = outcome["status"]
        check_transition(S.RUNNING, status)
        values = _outcome_fields(execution, now=now, **outcome)
        values["updated_at"] = stamp
        rows.append((execution, values))
        retries = retries or (
            status in RETRYABLE_STATES and execution.attempt <= execution.job.max_retries
        )
        chained = chained or chains.fires(execution.job, status=status, attempt=execution.attempt)
    chunks = list(_chunks_by_text(rows))
    # Rows made with the outcome (a next attempt, chained runs) commit with it, in one
    # transaction; most batches make none and are one UPDATE committed by itself.
    alone = (len(chunks) == 1 and not retries and not chained) or connection.in_atomic_block
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
        if chained:
            create_chained_runs([(e, o["status"]) for e, o in outcomes if e.pk in won], now=now)
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
        create_chained_runs([(execution, status)], now=now)
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


def purge_finished(ids: list[int], *, finished_before: datetime) -> int:
    """Delete these runs (retention), checked again in the statement: only a run in a final state
    that finished before ``finished_before`` is ever deleted, whatever happened since it was read.
    Returns how many went."""
    _, by_model = JobExecution.objects.filter(
        pk__in=ids, status__in=TERMINAL_STATES, finished_at__lt=finished_before
    ).delete()
    return by_model.get(JobExecution._meta.label, 0)
