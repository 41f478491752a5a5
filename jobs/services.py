"""Writes on jobs and executions. Every write records an AuditEvent and notifies after commit.

Services are keyword-only and named ``<entity>_<action>``. Views, serializers, admin actions and
management commands call these and nothing else to change data. Longer than most modules because
it is the one writer of jobs (and of the audit trail): each function is short, and they share the
same checks, the same audit record and the same announcements.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Lower
from django.utils import timezone

from jobs import (
    bulk,
    chains,
    events,
    executions,
    firing,
    partitioning,
    registry,
    retention,
    schedules,
)
from jobs.definition import CHAIN_FIELDS
from jobs.models import AuditEvent, AuditSource, Job, JobExecution, ScheduleType, Trigger
from jobs.retry import retry_on_conflict
from jobs.states import RETRYABLE_STATES, ExecutionStatus
from jobs.validation import (
    ERR_IDEMPOTENCY_KEY_REPEATED,
    JOB_DEFAULTS,
    WRITABLE_FIELDS,
    JobValidationError,
    clean_enqueued_run,
    clean_job,
)

ERR_VERSION_CONFLICT = (
    "The job was changed by someone else (your version {expected}, current version {current}). "
    "Reload it and apply your change again."
)
ERR_NAME_TAKEN = "A job with this name already exists (names are compared ignoring case)."
ERR_CANNOT_CANCEL = "Cannot cancel an execution that is {status}."
ERR_CANNOT_RETRY = (
    "Only a failed, timed-out, lost or cancelled execution can be retried; this one is {status}."
)
ERR_ALREADY_RETRIED = "This fire slot already has a later attempt."
ERR_VERSION_REQUIRED = "Required for updates: the version you last read (optimistic locking)."

# Fields whose change moves the next fire time (the name and the spread decide the job's offset
# from its slots).
SCHEDULE_INPUTS = (
    "schedule_type",
    "cron_expression",
    "timezone",
    "interval_seconds",
    "start_at",
    "run_at",
    "spread_seconds",
    "dst_repeated",
    "dst_missing",
)


class VersionConflict(Exception):
    def __init__(self, *, expected: int, current: int) -> None:
        super().__init__(ERR_VERSION_CONFLICT.format(expected=expected, current=current))
        self.expected = expected
        self.current = current


class ActionNotAllowed(Exception):
    """The object is not in a state that allows the action (HTTP 409)."""


@dataclass(frozen=True)
class Actor:
    """Who is acting and from where; every service takes one for the audit trail."""

    user: Any = None
    source: str = AuditSource.SYSTEM
    remote_addr: str | None = None

    @property
    def name(self) -> str:
        if self.user is not None and getattr(self.user, "is_authenticated", False):
            return self.user.get_username()
        return self.source

    @property
    def user_or_none(self) -> Any:
        return self.user if getattr(self.user, "is_authenticated", False) else None


SYSTEM = Actor()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def job_snapshot(job: Job) -> dict[str, Any]:
    """The writable fields of a job as stored (Python values)."""
    return {field: getattr(job, field) for field in WRITABLE_FIELDS}


def audit_record(*, by: Actor, **fields: Any) -> AuditEvent:
    """Record an audit row now (fields as ``audit_event`` takes them)."""
    event = audit_event(by=by, **fields)
    event.save()
    return event


def audit_event(
    *,
    by: Actor,
    action: str,
    object_type: str,
    object_id: Any,
    object_repr: str = "",
    changes: dict[str, Any] | None = None,
) -> AuditEvent:
    """An audit row, not saved yet (batch writes insert many at once)."""
    return AuditEvent(
        actor=by.user_or_none,
        actor_name=by.name,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        object_repr=object_repr[:255],
        changes={k: [_jsonable(v) for v in pair] for k, pair in (changes or {}).items()},
        source=by.source,
        remote_addr=by.remote_addr,
    )


def job_first_fire(
    values: dict[str, Any], *, now: datetime, last_fire: datetime | None = None
) -> datetime | None:
    """When the first fire of a (new or rescheduled) job's validated ``values`` is due: its slot
    plus the job's spread (``jobs.firing.first_fire``)."""
    spread = values.get("spread_seconds") or 0
    return firing.first_fire(
        firing.Schedule.from_values(values),
        enabled=bool(values.get("enabled")),
        now=now,
        last_fire=last_fire,
        spread_s=schedules.spread_offset(values["name"], spread) if spread else 0.0,
    )


def jobs_advance(*, jobs: list[Job], now: datetime) -> None:
    """The leader's tick, inside its fenced transaction: each job's ``next_fire_at`` and
    ``last_fire_at`` as its plan left them (``jobs.firing``), in one statement, its ``updated_at``
    moved (the dashboard streams the fire times by it). Not audited: the schedule's own doing."""
    for job in jobs:
        job.updated_at = now
    columns = ("next_fire_at", "last_fire_at", "updated_at")
    bulk.update(Job, [(job.pk, {c: getattr(job, c) for c in columns}) for job in jobs], columns)


def _check_name_free(name: str, *, exclude_pk: int | None = None) -> None:
    """Names are unique ignoring case on every database (MariaDB's collation already compares
    case-insensitively; SQLite's does not), so "Report" and "report" never coexist."""
    taken = Job.objects.filter(name__iexact=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise JobValidationError({"name": [ERR_NAME_TAKEN]})


def _chain_problems(
    proposed: dict[str, dict[str, Any]], *, replacing: Collection[str] = ()
) -> list[chains.Problem]:
    """What is wrong with the chains of ``proposed`` (name -> cleaned values) over the stored
    jobs, ``replacing`` (stored names about to go: a rename's old name) left out."""
    stored = {n: v for n, v in chains.stored_chains().items() if n not in replacing}
    wanted = {target for values in proposed.values() for _, target in chains.edges(values)}
    known = (chains.existing_names(wanted) - set(replacing)) | set(proposed)
    return chains.check_definitions(proposed, stored=stored, known=known)


def job_check_chains(*, values: dict[str, Any], old_name: str | None = None) -> None:
    """One job's chains (``jobs.chains``), and, when it is renamed, that no other job chains to
    it by its old name. Raises JobValidationError keyed by field. (The writes below run it; a
    form that shows errors by field, the admin's, runs it first.)"""
    errors: dict[str, list[str]] = {}
    renamed = old_name is not None and old_name != values["name"]
    if renamed:
        named_by = chains.referrers(old_name, chains.stored_chains())
        if named_by:
            errors["name"] = [chains.ERR_RENAME_REFERENCED.format(referrers=", ".join(named_by))]
    if any(values.get(field) for field in CHAIN_FIELDS):
        replacing = [old_name] if renamed and old_name else []
        for problem in _chain_problems({values["name"]: values}, replacing=replacing):
            errors.setdefault(problem.field, []).append(problem.message)
    if errors:
        raise JobValidationError(errors)


@retry_on_conflict
def job_create(*, data: dict[str, Any], by: Actor, now: datetime | None = None) -> Job:
    now = now or timezone.now()
    values = clean_job(data, now=now)
    _check_name_free(values["name"])
    job_check_chains(values=values)
    try:
        with transaction.atomic():
            job = Job(
                **values,
                next_fire_at=job_first_fire(values, now=now),
                created_by=by.user_or_none,
                updated_by=by.user_or_none,
            )
            partitioning.assign([job])
            job.save()
            audit_record(
                by=by,
                action="job.create",
                object_type="job",
                object_id=job.pk,
                object_repr=job.name,
                changes={field: [None, value] for field, value in values.items()},
            )
            events.send_after_commit(events.job_changed, job_id=job.pk, change="created")
    except IntegrityError as exc:
        if Job.objects.filter(name__iexact=values["name"]).exists():
            raise JobValidationError({"name": [ERR_NAME_TAKEN]}) from exc
        raise
    return job


# A batch is one transaction: bounded so that one request cannot hold the database for long.
MAX_BATCH_JOBS = 1000
ERR_BATCH_EMPTY = "Send at least one job."
ERR_BATCH_TOO_LARGE = "At most {limit} jobs per batch; this one has {count}."
ERR_BATCH_ITEM_NOT_OBJECT = "Each job must be an object."
ERR_BATCH_DUPLICATE_NAME = "The name appears more than once in the batch (ignoring case)."


@retry_on_conflict
def jobs_create_batch(
    *, items: list[Any], by: Actor, now: datetime | None = None, check_chains: bool = True
) -> list[Job]:
    """Create many jobs at once, all or none: every item is validated first (errors keyed
    ``"<index>.<field>"``), names are checked in one query, then the jobs and their audit rows are
    inserted in bulk in one transaction, and the scheduler is woken once. Raises
    JobValidationError (nothing written) if any item is bad. A chain may name a job of the same
    batch. ``check_chains=False``: the caller checked the chains of a larger whole (``jobs
    apply``'s file), whose jobs are not all written yet."""
    now = now or timezone.now()
    if not items:
        raise JobValidationError({"jobs": [ERR_BATCH_EMPTY]})
    if len(items) > MAX_BATCH_JOBS:
        raise JobValidationError(
            {"jobs": [ERR_BATCH_TOO_LARGE.format(limit=MAX_BATCH_JOBS, count=len(items))]}
        )
    errors: dict[str, list[str]] = {}
    cleaned: list[tuple[int, dict[str, Any]]] = []
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            errors[f"{index}"] = [ERR_BATCH_ITEM_NOT_OBJECT]
            continue
        try:
            values = clean_job(item, now=now)
        except JobValidationError as exc:
            errors.update((f"{index}.{field}", reasons) for field, reasons in exc.errors.items())
            continue
        key = values["name"].lower()
        if key in first_index:
            errors[f"{index}.name"] = [ERR_BATCH_DUPLICATE_NAME]
            continue
        first_index[key] = index
        cleaned.append((index, values))
    if first_index:
        taken = Job.objects.annotate(lowered=Lower("name")).filter(lowered__in=list(first_index))
        for name in taken.values_list("name", flat=True):
            errors[f"{first_index[name.lower()]}.name"] = [ERR_NAME_TAKEN]
    if check_chains and not errors:
        # A chain may name a job of the same batch: the whole batch is checked together.
        if any(values[field] for _, values in cleaned for field in CHAIN_FIELDS):
            at = {values["name"]: index for index, values in cleaned}
            for problem in _chain_problems({values["name"]: values for _, values in cleaned}):
                errors.setdefault(f"{at[problem.job]}.{problem.field}", []).append(problem.message)
    if errors:
        raise JobValidationError(dict(sorted(errors.items(), key=lambda e: _index_key(e[0]))))
    jobs = [
        Job(
            **values,
            next_fire_at=job_first_fire(values, now=now),
            created_by=by.user_or_none,
            updated_by=by.user_or_none,
        )
        for _, values in cleaned
    ]
    partitioning.assign(jobs)
    try:
        with transaction.atomic():
            bulk.insert_instances(jobs)
            bulk.insert_instances(
                [
                    audit_event(
                        by=by,
                        action="job.create",
                        object_type="job",
                        object_id=job.pk,
                        object_repr=job.name,
                        changes={field: [None, value] for field, value in values.items()},
                    )
                    for job, (_, values) in zip(jobs, cleaned, strict=True)
                ]
            )
            events.send_after_commit(events.job_changed, job_id=jobs[0].pk, change="created")
    except IntegrityError as exc:
        # A name taken between the check and the insert (a concurrent create).
        raise JobValidationError({"jobs": [ERR_NAME_TAKEN]}) from exc
    return jobs


def _by_name(key: str, items: list[dict[str, Any]]) -> str:
    """A batch error key "<index>.<field>" as "<name>.<field>"."""
    head, _, field = key.partition(".")
    if head.isdigit() and int(head) < len(items):
        return (
            f"{items[int(head)].get('name')}.{field}"
            if field
            else str(items[int(head)].get("name"))
        )
    return key


def _index_key(key: str) -> tuple[int, str]:
    head, _, rest = key.partition(".")
    return (int(head), rest) if head.isdigit() else (-1, key)


@retry_on_conflict
def job_update(
    *,
    job_id: int,
    expected_version: int | None,
    changes: dict[str, Any],
    by: Actor,
    replace: bool = False,
    now: datetime | None = None,
    check_chains: bool = True,
) -> Job:
    """Apply ``changes`` if the job is still at ``expected_version``; else raise VersionConflict.

    ``replace=True`` (HTTP PUT) treats ``changes`` as the whole definition: fields left out return
    to their defaults. Otherwise (PATCH, admin, CLI) they keep their current values.
    ``check_chains=False``: the caller checked the chains of the whole set being written (``jobs
    apply``), whose intermediate states may not be acyclic on their own.
    """
    now = now or timezone.now()
    if expected_version is None:
        raise JobValidationError({"version": [ERR_VERSION_REQUIRED]})
    job = Job.objects.get(pk=job_id)
    if job.version != expected_version:
        raise VersionConflict(expected=expected_version, current=job.version)
    before = job_snapshot(job)
    # With replace, the base is the defaults; run_at is kept so that an unchanged past run_at of a
    # one-off job is not mistaken for a new one in the past.
    base = {**JOB_DEFAULTS, "run_at": before["run_at"]} if replace else before
    values = clean_job(changes, now=now, current=base)
    diff = {f: [before[f], values[f]] for f in WRITABLE_FIELDS if before[f] != values[f]}
    if not diff:
        return job
    if "name" in diff:
        _check_name_free(values["name"], exclude_pk=job_id)
    if check_chains and any(field in diff for field in (*CHAIN_FIELDS, "name")):
        job_check_chains(values=values, old_name=before["name"])
    update: dict[str, Any] = {
        **values,
        "version": expected_version + 1,
        "updated_at": now,
        "updated_by": by.user_or_none,
    }
    if "name" in diff:
        update["partition"] = partitioning.of_name(values["name"], partitioning.count())
    if any(field in diff for field in (*SCHEDULE_INPUTS, "enabled")) or (
        values.get("spread_seconds") and "name" in diff
    ):
        update["next_fire_at"] = job_first_fire(values, now=now, last_fire=job.last_fire_at)
        if (
            values["schedule_type"] == ScheduleType.ONCE
            and "run_at" not in diff
            and job.last_fire_at
        ):
            update["next_fire_at"] = None  # a one-off that already fired stays done
    try:
        with transaction.atomic():
            won = Job.objects.filter(pk=job_id, version=expected_version).update(**update)
            if not won:
                raise VersionConflict(
                    expected=expected_version,
                    current=Job.objects.filter(pk=job_id).values_list("version", flat=True).first()
                    or 0,
                )
            audit_record(
                by=by,
                action="job.update",
                object_type="job",
                object_id=job_id,
                object_repr=values["name"],
                changes=diff,
            )
            events.send_after_commit(events.job_changed, job_id=job_id, change="updated")
    except IntegrityError as exc:
        if Job.objects.filter(name__iexact=values["name"]).exclude(pk=job_id).exists():
            raise JobValidationError({"name": [ERR_NAME_TAKEN]}) from exc
        raise
    job.refresh_from_db()
    return job


@retry_on_conflict
def job_set_enabled(
    *, job_id: int, enabled: bool, by: Actor, now: datetime | None = None
) -> tuple[Job, bool]:
    """Pause (``enabled=False``) or resume a job; the job, and whether this call changed it (False:
    it already was so, nothing is written or audited). Bulk actions report only the changed."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.enabled == enabled:
            return job, False
        values = job_snapshot(job)
        values["enabled"] = enabled
        next_fire = job_first_fire(values, now=now, last_fire=job.last_fire_at) if enabled else None
        if enabled and job.schedule_type == ScheduleType.ONCE and job.last_fire_at:
            next_fire = None
        Job.objects.filter(pk=job_id).update(
            enabled=enabled,
            next_fire_at=next_fire,
            version=job.version + 1,
            updated_at=now,
            updated_by=by.user_or_none,
        )
        action = "resume" if enabled else "pause"
        audit_record(
            by=by,
            action=f"job.{action}",
            object_type="job",
            object_id=job_id,
            object_repr=job.name,
            changes={"enabled": [not enabled, enabled]},
        )
        events.send_after_commit(events.job_changed, job_id=job_id, change=f"{action}d")
    job.refresh_from_db()
    return job, True


def job_pause(*, job_id: int, by: Actor, now: datetime | None = None) -> Job:
    return job_set_enabled(job_id=job_id, enabled=False, by=by, now=now)[0]


def job_resume(*, job_id: int, by: Actor, now: datetime | None = None) -> Job:
    return job_set_enabled(job_id=job_id, enabled=True, by=by, now=now)[0]


@retry_on_conflict
def job_delete(
    *,
    job_id: int,
    by: Actor,
    expected_version: int | None = None,
    check_chains: bool = True,
) -> None:
    """Delete a job and its runs. Refused (ActionNotAllowed) while another job chains to it:
    its name would dangle there. ``check_chains=False``: the caller checked (``jobs apply
    --prune`` deletes a job and those that chain to it together)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if expected_version is not None and job.version != expected_version:
            raise VersionConflict(expected=expected_version, current=job.version)
        if check_chains:
            named_by = chains.referrers(job.name, chains.stored_chains())
            if named_by:
                raise ActionNotAllowed(
                    chains.ERR_DELETE_REFERENCED.format(referrers=", ".join(named_by))
                )
        snapshot = job_snapshot(job)
        job.delete()
        audit_record(
            by=by,
            action="job.delete",
            object_type="job",
            object_id=job_id,
            object_repr=snapshot["name"],
            changes={field: [value, None] for field, value in snapshot.items()},
        )
        events.send_after_commit(events.job_changed, job_id=job_id, change="deleted")


@retry_on_conflict
def job_trigger(
    *,
    job_id: int,
    by: Actor,
    now: datetime | None = None,
    args: Any = None,
    kwargs: Any = None,
) -> JobExecution:
    """Run a job now, outside its schedule (works for paused jobs too), with ``args``/``kwargs``
    of its own when given (None: the job's), checked against the task as an enqueued run's are
    (JobValidationError keyed by field; nothing written)."""
    now = now or timezone.now()
    trigger = Trigger.API if by.source == AuditSource.API else Trigger.MANUAL
    with transaction.atomic():
        job = Job.objects.get(pk=job_id)
        call: dict[str, Any] = {}
        if args is not None or kwargs is not None:
            item = {k: v for k, v in (("args", args), ("kwargs", kwargs)) if v is not None}
            cleaned = clean_enqueued_run(
                item, task=job.task, job_args=job.args, job_kwargs=job.kwargs
            )
            call = {"args": cleaned["args"], "kwargs": cleaned["kwargs"]}
        execution = executions.create_manual_run(
            job, trigger=trigger, now=now, triggered_by=by.user_or_none, **call
        )
        changes: dict[str, Any] = {"execution": [None, execution.pk]}
        changes.update({name: [None, value] for name, value in call.items() if value is not None})
        audit_record(
            by=by,
            action="job.trigger",
            object_type="job",
            object_id=job_id,
            object_repr=job.name,
            changes=changes,
        )
        events.send_after_commit(events.job_changed, job_id=job_id, change="triggered")
    return execution


# One enqueue request is one transaction: bounded like a batch of jobs.
MAX_ENQUEUE_RUNS = 5000
ERR_ENQUEUE_NOT_LIST = "Expected a list of runs."
ERR_ENQUEUE_EMPTY = "Send at least one run."
ERR_ENQUEUE_TOO_LARGE = "At most {limit} runs per request; this one has {count}."
ERR_ENQUEUE_ITEM_NOT_OBJECT = "Each run must be an object (send {} for the job's own arguments)."
# Attempts at inserting enqueued runs when a concurrent writer took one of their slots.
ENQUEUE_ATTEMPTS = 3


@retry_on_conflict
def runs_enqueue(
    *, job_id: int, items: Any, by: Actor, now: datetime | None = None
) -> list[JobExecution]:
    """Enqueue many runs of a job, each with arguments of its own (what Celery's ``apply_async``
    is to a task): all or none. Every item is checked against the job's task first (errors keyed
    ``"<index>.<field>"``; a task not loaded here is one ``"task"`` error); then the runs are
    inserted in one statement, one audit row records the request, and the nodes are woken once
    the transaction commits (inside a caller's transaction: when that one commits; a rollback
    leaves no run and wakes nobody). Works for a paused job, like a manual trigger.

    An item with an ``idempotency_key`` the job already has a run for gets that run back instead
    of a new one. The list returned follows the items; each run's ``newly_enqueued`` says whether
    this call made it. Raises Job.DoesNotExist, or JobValidationError with nothing written."""
    now = now or timezone.now()
    if not isinstance(items, list):
        raise JobValidationError({"runs": [ERR_ENQUEUE_NOT_LIST]})
    if not items:
        raise JobValidationError({"runs": [ERR_ENQUEUE_EMPTY]})
    if len(items) > MAX_ENQUEUE_RUNS:
        raise JobValidationError(
            {"runs": [ERR_ENQUEUE_TOO_LARGE.format(limit=MAX_ENQUEUE_RUNS, count=len(items))]}
        )
    job = Job.objects.get(pk=job_id)
    try:
        registry.get_task(job.task)
    except registry.UnknownTask as exc:
        # The job's task is not loaded in this process: one error for the request, not the same
        # one for each of its (up to 5,000) runs.
        raise JobValidationError({"task": [str(exc)]}) from None
    errors: dict[str, list[str]] = {}
    runs: list[dict[str, Any]] = []
    first_with_key: dict[str, int] = {}  # each key's first item, by its index in the request
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            errors[f"{index}"] = [ERR_ENQUEUE_ITEM_NOT_OBJECT]
            continue
        try:
            run = clean_enqueued_run(item, task=job.task, job_args=job.args, job_kwargs=job.kwargs)
        except JobValidationError as exc:
            errors.update((f"{index}.{field}", reasons) for field, reasons in exc.errors.items())
            continue
        runs.append(run)
        key = run["idempotency_key"]
        if key is None:
            continue
        if key in first_with_key:
            errors[f"{index}.idempotency_key"] = [
                ERR_IDEMPOTENCY_KEY_REPEATED.format(index=first_with_key[key])
            ]
        else:
            first_with_key[key] = index
    if errors:
        raise JobValidationError(errors)
    for attempt in range(1, ENQUEUE_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                existing = _runs_by_key(job.pk, list(first_with_key))
                new = [run for run in runs if run["idempotency_key"] not in existing]
                created = (
                    executions.create_enqueued(job, new, now=now, triggered_by=by.user_or_none)
                    if new
                    else []
                )
                if created:
                    audit_record(
                        by=by,
                        action="job.enqueue",
                        object_type="job",
                        object_id=job.pk,
                        object_repr=job.name,
                        changes={"runs": [None, len(created)]},
                    )
            made = iter(created)
            answer = []
            for run in runs:
                found = existing.get(run["idempotency_key"])
                execution = found if found is not None else next(made)
                execution.newly_enqueued = found is None
                answer.append(execution)
            return answer
        except IntegrityError:
            if not Job.objects.filter(pk=job.pk).exists():
                raise Job.DoesNotExist(f"job {job.pk} was deleted") from None
            # Another writer took one of the slots after we read them: read them again.
            if attempt == ENQUEUE_ATTEMPTS:
                raise
            now = timezone.now()
    raise AssertionError("unreachable")


def _runs_by_key(job_id: int, keys: list[str]) -> dict[str, JobExecution]:
    """The job's runs enqueued with one of ``keys``, by key."""
    if not keys:
        return {}
    found = JobExecution.objects.filter(job_id=job_id, idempotency_key__in=keys)
    return {run.idempotency_key: run for run in found}


def runs_purge(
    *,
    older_than_days: float,
    by: Actor,
    batch: int = retention.PURGE_BATCH,
    max_rows: int = retention.PURGE_MAX_ROWS,
    dry_run: bool = False,
    now: datetime | None = None,
) -> retention.PurgeResult:
    """Run history retention (``jobs.retention``): delete terminal runs finished more than
    ``older_than_days`` ago, and record what went in the audit log. Raises
    ``retention.BadPurgeArgument`` (naming the argument) with nothing deleted."""
    retention.check_purge_arguments(older_than_days, batch, max_rows)
    result = retention.purge_finished_runs(
        older_than=timedelta(days=older_than_days),
        now=now,
        batch=batch,
        max_rows=max_rows,
        dry_run=dry_run,
    )
    if result.deleted and not dry_run:
        audit_record(
            by=by,
            action="runs.purge",
            object_type="execution",
            object_id="*",
            object_repr=f"runs finished before {result.cutoff:%Y-%m-%d %H:%M:%S} UTC",
            changes={"deleted": [None, result.deleted], "older_than_days": [None, older_than_days]},
        )
    return result


@retry_on_conflict
def execution_cancel(*, execution_id: int, by: Actor, now: datetime | None = None) -> JobExecution:
    """Cancel a waiting execution at once; for a running one, record a request the node acts on."""
    now = now or timezone.now()
    reason = f"cancelled by {by.name}"
    with transaction.atomic():
        execution = JobExecution.objects.select_related("job").get(pk=execution_id)
        status = execution.status
        if status in (ExecutionStatus.PENDING, ExecutionStatus.RETRY_SCHEDULED):
            won = executions.cancel_waiting(execution, reason=reason, now=now)
        elif status == ExecutionStatus.RUNNING:
            won = executions.request_cancel(execution, reason=reason)
        else:
            won = False
        if not won:
            execution.refresh_from_db()
            raise ActionNotAllowed(ERR_CANNOT_CANCEL.format(status=execution.status))
        audit_record(
            by=by,
            action="execution.cancel",
            object_type="execution",
            object_id=execution_id,
            object_repr=str(execution),
            changes={"status": [status, ExecutionStatus.CANCELLED]}
            if status != ExecutionStatus.RUNNING
            else {"cancel_requested": [False, True]},
        )
        execution.refresh_from_db()
    return execution


@retry_on_conflict
def execution_retry(*, execution_id: int, by: Actor, now: datetime | None = None) -> JobExecution:
    """Run a finished-without-success execution again: a new attempt of the same fire slot."""
    now = now or timezone.now()
    original = JobExecution.objects.select_related("job").get(pk=execution_id)
    if original.status not in (*RETRYABLE_STATES, ExecutionStatus.CANCELLED):
        raise ActionNotAllowed(ERR_CANNOT_RETRY.format(status=original.status))
    try:
        with transaction.atomic():
            latest = (
                JobExecution.objects.filter(
                    job_id=original.job_id, scheduled_for=original.scheduled_for
                )
                .order_by("-attempt")
                .values_list("attempt", flat=True)
                .first()
            )
            if latest != original.attempt:
                raise ActionNotAllowed(ERR_ALREADY_RETRIED)
            retry = executions.create_retry_now(
                original, run_after=now, triggered_by=by.user_or_none
            )
            audit_record(
                by=by,
                action="execution.retry",
                object_type="execution",
                object_id=execution_id,
                object_repr=str(original),
                changes={"retry": [None, retry.pk]},
            )
    except IntegrityError as exc:
        # Two retries raced for the same attempt number: the unique constraint let one through.
        raise ActionNotAllowed(ERR_ALREADY_RETRIED) from exc
    return retry


def _file_chain_errors(
    cleaned: dict[str, dict[str, Any]], *, pruned: Collection[str]
) -> dict[str, list[str]]:
    """The chains of a whole definitions file, as they will stand once it is applied (its jobs
    over the stored ones, ``pruned`` gone): every target a job, no cycle, and no job left
    chaining to a pruned one. Keyed "<name>.<field>" (a pruned job: "<name>")."""
    stored = {n: v for n, v in chains.stored_chains().items() if n not in pruned}
    wanted = {target for values in cleaned.values() for _, target in chains.edges(values)}
    known = (chains.existing_names(wanted) - set(pruned)) | set(cleaned)
    errors: dict[str, list[str]] = {}
    for problem in chains.check_definitions(cleaned, stored=stored, known=known):
        errors.setdefault(f"{problem.job}.{problem.field}", []).append(problem.message)
    final = {**stored, **cleaned}
    for name in sorted(pruned):
        named_by = chains.referrers(name, final, ignoring=pruned)
        if named_by:
            errors[name] = [chains.ERR_DELETE_REFERENCED.format(referrers=", ".join(named_by))]
    return errors


@dataclass(frozen=True)
class ApplyResult:
    name: str
    action: str  # created, updated, unchanged, deleted
    changes: dict[str, list[Any]]


ERR_DEFINITION_NOT_OBJECT = "Each job definition must be an object with a name."
ERR_DUPLICATE_DEFINITION = "The name appears more than once in the file."


@retry_on_conflict
def job_apply_definitions(
    *,
    definitions: list[Any],
    by: Actor,
    dry_run: bool = False,
    prune: bool = False,
    now: datetime | None = None,
) -> list[ApplyResult]:
    """Create or update jobs by name so they match ``definitions``; idempotent.

    All definitions are validated before anything is written, and the writes happen in one
    transaction: a bad file changes nothing. ``prune`` also deletes jobs absent from the file.
    Raises JobValidationError with keys ``"<name or #index>.<field>"``.
    """
    now = now or timezone.now()
    errors: dict[str, list[str]] = {}
    plan: list[tuple[str, dict[str, Any], Job | None, dict[str, list[Any]]]] = []
    cleaned: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    existing = {job.name: job for job in Job.objects.all()}
    for index, definition in enumerate(definitions):
        if not isinstance(definition, dict) or not isinstance(definition.get("name"), str):
            errors[f"#{index}"] = [ERR_DEFINITION_NOT_OBJECT]
            continue
        name = definition["name"]
        if name in seen:
            errors[f"{name}.name"] = [ERR_DUPLICATE_DEFINITION]
            continue
        seen.add(name)
        current_job = existing.get(name)
        current = job_snapshot(current_job) if current_job else None
        try:
            values = clean_job(definition, now=now, current=current)
        except JobValidationError as exc:
            for field, reasons in exc.errors.items():
                errors[f"{name}.{field}"] = reasons
            continue
        base = current or {field: None for field in WRITABLE_FIELDS}
        diff = {f: [base[f], values[f]] for f in WRITABLE_FIELDS if base[f] != values[f]}
        plan.append((name, definition, current_job, diff))
        cleaned[name] = values
    pruned = {name for name in existing if name not in seen} if prune else set()
    if not errors:
        errors.update(_file_chain_errors(cleaned, pruned=pruned))
    if errors:
        raise JobValidationError(errors)

    # The file's chains were checked as a whole, above: its jobs are written without checking
    # each against a half-written state (B -> A added before A -> B is dropped is no cycle).
    results: list[ApplyResult] = []
    creates = [definition for _, definition, current_job, _ in plan if current_job is None]
    with transaction.atomic():
        if creates and not dry_run:
            # New jobs go first (an updated job may chain to one), in bulk (a few statements
            # per thousand jobs, not a few per job).
            for start in range(0, len(creates), MAX_BATCH_JOBS):
                chunk = creates[start : start + MAX_BATCH_JOBS]
                try:
                    jobs_create_batch(items=chunk, by=by, now=now, check_chains=False)
                except JobValidationError as exc:
                    # Keyed by name, as the file's other errors ("<name>.<field>").
                    raise JobValidationError(
                        {_by_name(key, chunk): reasons for key, reasons in exc.errors.items()}
                    ) from exc
        for name, definition, current_job, diff in plan:
            if current_job is None:
                action = "created"
            elif diff:
                action = "updated"
                if not dry_run:
                    job_update(
                        job_id=current_job.pk,
                        expected_version=current_job.version,
                        changes={k: v for k, v in definition.items() if k in diff or k == "name"},
                        by=by,
                        now=now,
                        check_chains=False,
                    )
            else:
                action = "unchanged"
            results.append(
                ApplyResult(
                    name, action, {k: [_jsonable(a), _jsonable(b)] for k, (a, b) in diff.items()}
                )
            )
        for name in sorted(pruned):
            if not dry_run:
                job_delete(job_id=existing[name].pk, by=by, check_chains=False)
            results.append(ApplyResult(name, "deleted", {}))
    return results
