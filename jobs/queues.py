"""Queues as an operator sees them: every queue a job names or a setting exists for, with its flow
control (``jobs.flow``), what runs and what waits; set, paused and resumed with an audit row each.

The API (``/api/queues/``), ``manage.py jobs queues`` and ``jobs export`` / ``jobs apply`` go
through here. A queue gets a row the first time something is set on it; a queue without one has
no limit and is not paused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Count, Q

from jobs import flow
from jobs.definition import BOOLEAN, FieldRule
from jobs.definition import RULES as JOB_RULES
from jobs.models import Job, JobExecution, Queue
from jobs.services import Actor, audit_record
from jobs.states import ExecutionStatus
from jobs.validation import JobValidationError, check_values

S = ExecutionStatus

SETTINGS = ("max_concurrent", "rate_limit", "rate_period_seconds", "paused")
DEFAULTS: dict[str, Any] = {
    "max_concurrent": None,
    "rate_limit": None,
    "rate_period_seconds": 60,
    "paused": False,
}
ERR_TWICE = "This queue is in the file twice."
ERR_NO_QUEUE = "No queue {name!r}: no job names it and nothing is set on it."

# A queue's settings are checked by the rules of the job fields of the same names (a queue's
# name by the job's ``queue``), and ``paused`` by its own.
RULES: dict[str, FieldRule] = {
    "name": JOB_RULES["queue"],
    **{name: JOB_RULES[name] for name in ("max_concurrent", "rate_limit", "rate_period_seconds")},
    "paused": FieldRule("paused", BOOLEAN, "A paused queue's runs are not started.", default=False),
}


def check_name(name: Any) -> str:
    return check_values({"name": name}, RULES)["name"]


def clean_settings(
    data: Any, *, base: dict[str, Any] | None = None, named: bool = False
) -> dict[str, Any]:
    """The queue's settings from ``data`` (any of SETTINGS, and its ``name`` when ``named``: a
    file's entry; the rest from ``base``, else the defaults). Raises JobValidationError keyed by
    field, nothing written."""
    if not isinstance(data, dict):
        raise JobValidationError({"non_field_errors": ["Expected an object."]})
    rules = RULES if named else {name: RULES[name] for name in SETTINGS}
    cleaned = check_values(data, rules)
    cleaned.pop("name", None)
    return {**DEFAULTS, **(base or {}), **cleaned}


def settings_of(queue: Queue | None) -> dict[str, Any]:
    if queue is None:
        return dict(DEFAULTS)
    return {key: getattr(queue, key) for key in SETTINGS}


def queue_set(*, name: str, data: Any, by: Actor, partial: bool = True) -> Queue:
    """Set ``data`` (some or all of SETTINGS) on queue ``name``, creating its row if it has none;
    audited. ``partial=False``: what ``data`` leaves out goes back to its default."""
    check_name(name)
    with transaction.atomic():
        existing = Queue.objects.select_for_update().filter(name=name).first()
        before = settings_of(existing)
        values = clean_settings(data, base=before if partial else None)
        changes = {k: [before[k], v] for k, v in values.items() if before[k] != v}
        # get_or_create: two first settings of one queue at once both land (one creates, the
        # other finds it), rather than one failing on the key.
        queue, created = Queue.objects.get_or_create(name=name, defaults=values)
        if not created:
            queue = Queue.objects.select_for_update().get(name=name)
            for key, value in values.items():
                setattr(queue, key, value)
            queue.save()
        if changes or created:
            action = "queue.update"
            if set(changes) == {"paused"}:
                action = "queue.pause" if values["paused"] else "queue.resume"
            audit_record(
                by=by,
                action=action,
                object_type="queue",
                object_id=name,
                object_repr=name,
                changes=changes,
            )
    flow.forget_config()
    return queue


def queue_delete(*, name: str, by: Actor) -> None:
    """Forget a queue's settings (its limits and pause go; its jobs and runs stay); audited."""
    with transaction.atomic():
        queue = Queue.objects.select_for_update().filter(name=name).first()
        if queue is None:
            return
        audit_record(
            by=by,
            action="queue.delete",
            object_type="queue",
            object_id=name,
            object_repr=name,
            changes={k: [v, None] for k, v in settings_of(queue).items()},
        )
        queue.delete()
    flow.forget_config()


def queue_pause(*, name: str, by: Actor) -> Queue:
    return queue_set(name=name, data={"paused": True}, by=by)


def queue_resume(*, name: str, by: Actor) -> Queue:
    return queue_set(name=name, data={"paused": False}, by=by)


@dataclass
class QueueView:
    """A queue as the API and the CLI show it."""

    name: str
    max_concurrent: int | None
    rate_limit: int | None
    rate_period_seconds: int
    paused: bool
    jobs: int = 0
    running: int = 0
    pending: int = 0
    # Pending runs a flow limit holds back (their reason says which).
    held: int = 0
    configured: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def queues_overview(names: list[str] | None = None) -> list[QueueView]:
    """Every queue a job names or a row exists for (or only ``names``), by name."""
    rows = {queue.name: queue for queue in Queue.objects.all()}
    job_counts = dict(
        Job.objects.values_list("queue").annotate(n=Count("id")).values_list("queue", "n")
    )
    wanted = sorted(set(rows) | set(job_counts)) if names is None else names
    runs = {
        row["queue"]: row
        for row in JobExecution.objects.filter(queue__in=wanted, status__in=(S.RUNNING, S.PENDING))
        .values("queue")
        .annotate(
            running=Count("id", filter=Q(status=S.RUNNING)),
            pending=Count("id", filter=Q(status=S.PENDING)),
            held=Count("id", filter=Q(status=S.PENDING, reason__startswith=flow.WAITING)),
        )
    }
    views = []
    for name in wanted:
        settings = settings_of(rows.get(name))
        counts = runs.get(name, {})
        views.append(
            QueueView(
                name=name,
                **settings,
                jobs=job_counts.get(name, 0),
                running=counts.get("running", 0),
                pending=counts.get("pending", 0),
                held=counts.get("held", 0),
                configured=name in rows,
            )
        )
    return views


def queue_view(name: str) -> QueueView:
    """One queue's view; JobValidationError (``name``) if no job names it and it has no row."""
    check_name(name)
    if not Queue.objects.filter(name=name).exists() and not Job.objects.filter(queue=name).exists():
        raise LookupError(ERR_NO_QUEUE.format(name=name))
    return queues_overview([name])[0]


def queues_export() -> list[dict[str, Any]]:
    """Every queue with a row, as ``jobs apply`` reads it back."""
    return [{"name": q.name, **settings_of(q)} for q in Queue.objects.order_by("name")]


@dataclass
class QueueResult:
    name: str
    action: str  # created | updated | unchanged
    changes: dict[str, Any] = field(default_factory=dict)


def queues_apply(definitions: Any, *, by: Actor, dry_run: bool = False) -> list[QueueResult]:
    """Set each queue of ``definitions`` to what it says (settings left out go to their defaults);
    every one is checked first (errors keyed ``"<name or #index>.<field>"``), then all are written
    in one transaction (none with ``dry_run``). Queues absent from the file are left as they
    are."""
    if not isinstance(definitions, list):
        raise JobValidationError({"queues": ["Expected a list of queues."]})
    errors: dict[str, list[str]] = {}
    planned: list[tuple[str, Queue | None, dict[str, Any]]] = []
    seen: set[str] = set()
    for index, item in enumerate(definitions):
        label = item.get("name") if isinstance(item, dict) and item.get("name") else f"#{index}"
        try:
            name = check_name(item.get("name") if isinstance(item, dict) else None)
            values = clean_settings(item, named=True)
        except JobValidationError as exc:
            errors.update((f"{label}.{k}", v) for k, v in exc.errors.items())
            continue
        if name in seen:
            errors[f"{label}.name"] = [ERR_TWICE]
            continue
        seen.add(name)
        planned.append((name, Queue.objects.filter(name=name).first(), values))
    if errors:
        raise JobValidationError(errors)
    results = []
    with transaction.atomic():
        for name, existing, values in planned:
            before = settings_of(existing)
            changes = {k: [before[k], v] for k, v in values.items() if before[k] != v}
            action = "created" if existing is None else "updated" if changes else "unchanged"
            results.append(QueueResult(name, action, changes))
            if action != "unchanged" and not dry_run:
                queue_set(name=name, data=values, by=by, partial=False)
    return results
