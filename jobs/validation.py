"""Validation of job definitions: one function used by the API, the admin, the CLI and the services.

``clean_job`` takes the submitted fields (JSON-like values: strings, numbers, lists, dicts) merged over
the job's current values, checks every field and every cross-field rule, and returns values ready to be
written — or raises ``JobValidationError`` with ``{field: [reason, ...]}``. Nothing is written here.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

from jobs import registry, schedules, secrets
from jobs.models import (
    MAX_BACKOFF_S,
    MAX_GRACE_S,
    MAX_INTERVAL_S,
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_RUN_ALL_CATCHUP,
    MAX_SPREAD_S,
    MAX_TIMEOUT_S,
    ConcurrencyPolicy,
    Isolation,
    MisfirePolicy,
    ScheduleType,
)

MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 10_000
MAX_BACKOFF_FACTOR = 10.0
# A one-off job may be submitted "due now": allow run_at this far in the past (client/server skew).
ONCE_PAST_TOLERANCE = timedelta(seconds=60)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:@/+-]*$")
QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

ERR_REQUIRED = "This field is required."
ERR_NOT_INTEGER = "Must be an integer."
ERR_NOT_NUMBER = "Must be a number."
ERR_NOT_BOOLEAN = "Must be true or false."
ERR_NOT_STRING = "Must be a string."
ERR_NOT_DATETIME = "Must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T10:00:00Z."
ERR_RANGE = "Must be between {low} and {high}."
ERR_TOO_LONG = "At most {limit} characters."
ERR_CHOICE = "{value!r} is not one of: {choices}."
ERR_NAME_FORMAT = (
    "Must start with a letter or digit and contain only letters, digits, spaces and _ . : @ / + -"
)
ERR_QUEUE_FORMAT = "Lower-case letters, digits, _ . - only, at most 64 characters."
ERR_NOT_FOR_TYPE = "Only allowed for a {kind} schedule."
ERR_ONCE_IN_PAST = "Is in the past ({value}); a one-off job must be due now or later."
ERR_ARGS_TOO_LARGE = "Serialized arguments are {size} bytes; the limit is {limit} bytes."
ERR_SPREAD_VS_INTERVAL = "Must be smaller than interval_seconds ({interval})."
ERR_UNKNOWN_FIELD = "Unknown field."
ERR_NOT_UNICODE = "Contains a lone surrogate (U+D800 to U+DFFF): not valid Unicode text."
# Every instant the scheduler stores or compares with: MariaDB's DATETIME range, a day inside it so
# that no time-zone offset can push a value out (Python's own range overflowed into 500s).
DATETIME_MIN = datetime(1000, 1, 2, tzinfo=UTC)
DATETIME_MAX = datetime(9999, 12, 30, tzinfo=UTC)
ERR_DATETIME_RANGE = "Must be between 1000-01-02 and 9999-12-30 (UTC)."
ERR_READ_ONLY = "Read-only field."

# Fields a client may set, and the schedule type each schedule-only field belongs to.
WRITABLE_FIELDS = (
    "name",
    "description",
    "task",
    "args",
    "kwargs",
    "schedule_type",
    "cron_expression",
    "timezone",
    "interval_seconds",
    "start_at",
    "run_at",
    "enabled",
    "misfire_policy",
    "misfire_grace_seconds",
    "run_all_max",
    "concurrency_policy",
    "max_retries",
    "retry_backoff_base",
    "retry_backoff_factor",
    "retry_backoff_max",
    "retry_jitter",
    "timeout_seconds",
    "isolation",
    "priority",
    "queue",
    "spread_seconds",
)
SCHEDULE_FIELDS = {
    "cron_expression": ScheduleType.CRON,
    "timezone": ScheduleType.CRON,
    "interval_seconds": ScheduleType.INTERVAL,
    "start_at": ScheduleType.INTERVAL,
    "run_at": ScheduleType.ONCE,
}
SCHEDULE_DEFAULTS: dict[str, Any] = {
    "cron_expression": "",
    "timezone": "UTC",
    "interval_seconds": None,
    "start_at": None,
    "run_at": None,
}
# Defaults of a new job (mirrors jobs.models.Job).
JOB_DEFAULTS: dict[str, Any] = {
    "description": "",
    "args": [],
    "kwargs": {},
    **SCHEDULE_DEFAULTS,
    "enabled": True,
    "misfire_policy": MisfirePolicy.RUN_ONCE.value,
    "misfire_grace_seconds": 60,
    "run_all_max": 10,
    "concurrency_policy": ConcurrencyPolicy.FORBID.value,
    "max_retries": 0,
    "retry_backoff_base": 1.0,
    "retry_backoff_factor": 2.0,
    "retry_backoff_max": 300.0,
    "retry_jitter": True,
    "timeout_seconds": None,
    "isolation": Isolation.THREAD.value,
    "priority": 0,
    "queue": "default",
    "spread_seconds": 0,
}


class JobValidationError(Exception):
    """Bad job input: ``errors`` maps a field name to its reasons."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in errors.items()))
        self.errors = errors


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.by_field.setdefault(field, []).append(message)

    def __contains__(self, field: str) -> bool:
        return field in self.by_field


def _integer(
    errors: _Errors, field: str, value: Any, low: int, high: int, *, nullable: bool = False
) -> int | None:
    if value is None:
        if not nullable:
            errors.add(field, ERR_REQUIRED)
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        errors.add(field, ERR_NOT_INTEGER)
        return None
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except ValueError:
        number = None
    if number is None or (isinstance(value, str) and value.strip() != str(number)):
        errors.add(field, ERR_NOT_INTEGER)
        return None
    if not low <= number <= high:
        errors.add(field, ERR_RANGE.format(low=low, high=high))
        return None
    return number


def _number(errors: _Errors, field: str, value: Any, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        errors.add(field, ERR_NOT_NUMBER if value is not None else ERR_REQUIRED)
        return None
    try:
        number = float(value)
    except ValueError:
        errors.add(field, ERR_NOT_NUMBER)
        return None
    if not math.isfinite(number):
        errors.add(field, ERR_NOT_NUMBER)
        return None
    if not low <= number <= high:
        errors.add(field, ERR_RANGE.format(low=low, high=high))
        return None
    return number


def _boolean(errors: _Errors, field: str, value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    errors.add(field, ERR_NOT_BOOLEAN)
    return None


def is_unicode(text: str) -> bool:
    """False for text holding a lone surrogate (JSON lets a client send one; no database or
    encoder can store it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def in_datetime_range(value: datetime) -> bool:
    """Whether an aware (or UTC-naive) datetime lies in [DATETIME_MIN, DATETIME_MAX]."""
    try:
        utc = value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)
    except (OverflowError, ValueError):
        return False
    return DATETIME_MIN <= utc <= DATETIME_MAX


def _string(errors: _Errors, field: str, value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        errors.add(field, ERR_NOT_STRING if value is not None else ERR_REQUIRED)
        return None
    if len(value) > limit:
        errors.add(field, ERR_TOO_LONG.format(limit=limit))
        return None
    if not is_unicode(value):
        errors.add(field, ERR_NOT_UNICODE)
        return None
    return value


def _choice(errors: _Errors, field: str, value: Any, choices: type) -> str | None:
    allowed = [c.value for c in choices]
    if value not in allowed:
        errors.add(field, ERR_CHOICE.format(value=value, choices=", ".join(allowed)))
        return None
    return value


def _datetime(errors: _Errors, field: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
    else:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        errors.add(field, ERR_NOT_DATETIME)
        return None
    if not in_datetime_range(parsed):
        errors.add(field, ERR_DATETIME_RANGE)
        return None
    return parsed


def _call_arguments(errors: _Errors, task: str | None, args: Any, kwargs: Any) -> None:
    """A task call's arguments: they must bind to the task (when it is known) and stay within
    SCHEDULER_MAX_ARGS_BYTES each, as JSON; a credential in them must be a secret reference
    (``jobs.secrets``), checked against the task with a stand-in for the secret."""
    plain = [
        problem
        for field, value in (("args", args), ("kwargs", kwargs))
        for problem in secrets.problems(value, field)
    ]
    for path, message in plain:
        errors.add(path, message)
    if task is not None and not plain:
        try:
            registry.validate_task_call(
                task, secrets.placeholders(args), secrets.placeholders(kwargs)
            )
        except registry.UnknownTask as exc:
            errors.add("task", str(exc))
        except registry.TaskArgumentError as exc:
            errors.add(exc.field, exc.message)
    limit = settings.SCHEDULER_MAX_ARGS_BYTES
    for field, value in (("args", args), ("kwargs", kwargs)):
        try:
            size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        except UnicodeEncodeError:
            errors.add(field, ERR_NOT_UNICODE)
            continue
        except (TypeError, ValueError):
            errors.add(field, "Must be JSON.")
            continue
        if size > limit:
            errors.add(field, ERR_ARGS_TOO_LARGE.format(size=size, limit=limit))


ERR_FOREIGN_SECRET = (
    "refers to secrets its job's own arguments do not use ({names}); an admin adds them to the job"
)
# The fields of one run sent to the enqueue API.
ENQUEUE_FIELDS = ("args", "kwargs", "run_at", "priority")


def clean_enqueued_run(
    item: dict[str, Any], *, task: str, job_args: list, job_kwargs: dict
) -> dict[str, Any]:
    """One run for the enqueue API: ``args``/``kwargs`` (absent: the job's), ``run_at`` (absent:
    now; a past instant means now too) and ``priority`` (absent: the job's). The call is checked
    against the task as a job's would be. Returns the cleaned values (None where absent); raises
    JobValidationError keyed by field."""
    errors = _Errors()
    for key in item:
        if key not in ENQUEUE_FIELDS:
            errors.add(key, ERR_UNKNOWN_FIELD)
    args = item.get("args")
    kwargs = item.get("kwargs")
    _call_arguments(
        errors,
        task,
        job_args if args is None else args,
        job_kwargs if kwargs is None else kwargs,
    )
    # A run may use only the secrets its job (defined by an admin) already uses: enqueueing is an
    # operator's right, and an operator must not be able to have any node secret printed.
    allowed = secrets.referenced(job_args) | secrets.referenced(job_kwargs)
    for field, value in (("args", args), ("kwargs", kwargs)):
        foreign = sorted(secrets.referenced(value) - allowed)
        if foreign:
            errors.add(field, ERR_FOREIGN_SECRET.format(names=", ".join(foreign)))
    run_at = _datetime(errors, "run_at", item.get("run_at"))
    priority = _integer(
        errors, "priority", item.get("priority"), -MAX_PRIORITY, MAX_PRIORITY, nullable=True
    )
    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return {"args": args, "kwargs": kwargs, "run_at": run_at, "priority": priority}


def unknown_fields(data: dict[str, Any]) -> dict[str, list[str]]:
    return {key: [ERR_UNKNOWN_FIELD] for key in data if key not in WRITABLE_FIELDS}


def clean_job(
    submitted: dict[str, Any],
    *,
    now: datetime,
    current: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate ``submitted`` over ``current`` (the stored values, None when creating).

    Returns the complete cleaned set of writable fields. Schedule fields that belong to another
    schedule type are reset when the type changes, but sending one explicitly is an error.
    """
    errors = _Errors()
    for field, reasons in unknown_fields(submitted).items():
        for reason in reasons:
            errors.add(field, reason)
    base = dict(JOB_DEFAULTS) if current is None else dict(current)
    values = {**base, **{k: v for k, v in submitted.items() if k in WRITABLE_FIELDS}}
    out: dict[str, Any] = {}

    name = values.get("name")
    if _string(errors, "name", name, MAX_NAME_CHARS) is not None:
        if not name.strip() or not NAME_RE.match(name) or name != name.strip():
            errors.add("name", ERR_NAME_FORMAT)
        else:
            out["name"] = name
    out["description"] = _string(
        errors, "description", values.get("description"), MAX_DESCRIPTION_CHARS
    )

    # --- schedule --------------------------------------------------------------------------------
    schedule_type = _choice(errors, "schedule_type", values.get("schedule_type"), ScheduleType)
    out["schedule_type"] = schedule_type
    if schedule_type is not None:
        for field, kind in SCHEDULE_FIELDS.items():
            if kind == schedule_type:
                continue
            sent = field in submitted and submitted[field] not in (None, "", "UTC")
            if sent:
                errors.add(field, ERR_NOT_FOR_TYPE.format(kind=kind.value))
            values[field] = SCHEDULE_DEFAULTS[field]
    out.update({field: values[field] for field in SCHEDULE_DEFAULTS})

    if schedule_type == ScheduleType.CRON:
        expression = _string(errors, "cron_expression", values["cron_expression"], 200)
        tz_name = _string(errors, "timezone", values["timezone"], 64)
        if expression is not None:
            try:
                schedules.parse_cron(expression.strip())
                out["cron_expression"] = expression.strip()
            except schedules.ScheduleError as exc:
                errors.add("cron_expression", exc.message)
        if tz_name is not None:
            try:
                schedules.validate_timezone(tz_name)
            except schedules.ScheduleError as exc:
                errors.add("timezone", exc.message)
    elif schedule_type == ScheduleType.INTERVAL:
        out["interval_seconds"] = _integer(
            errors, "interval_seconds", values["interval_seconds"], 1, MAX_INTERVAL_S
        )
        out["start_at"] = _datetime(errors, "start_at", values["start_at"])
    elif schedule_type == ScheduleType.ONCE:
        run_at = _datetime(errors, "run_at", values["run_at"])
        if values["run_at"] is None:
            errors.add("run_at", ERR_REQUIRED)
        elif run_at is not None:
            unchanged = current is not None and current.get("run_at") == run_at
            # A disabled one-off never fires, so a past run_at is harmless there (this is how an
            # exported one-off that already ran is restored).
            if run_at < now - ONCE_PAST_TOLERANCE and not unchanged and values.get("enabled"):
                errors.add("run_at", ERR_ONCE_IN_PAST.format(value=run_at.isoformat()))
        out["run_at"] = run_at

    # --- task ------------------------------------------------------------------------------------
    task = _string(errors, "task", values.get("task"), 200)
    args, kwargs = values.get("args"), values.get("kwargs")
    if task is not None:
        out["task"] = task
    _call_arguments(errors, task, args, kwargs)
    out["args"], out["kwargs"] = args, kwargs

    # --- policies and numbers ----------------------------------------------------------------------
    out["enabled"] = _boolean(errors, "enabled", values.get("enabled"))
    out["retry_jitter"] = _boolean(errors, "retry_jitter", values.get("retry_jitter"))
    out["misfire_policy"] = _choice(
        errors, "misfire_policy", values.get("misfire_policy"), MisfirePolicy
    )
    out["isolation"] = _choice(errors, "isolation", values.get("isolation"), Isolation)
    out["concurrency_policy"] = _choice(
        errors, "concurrency_policy", values.get("concurrency_policy"), ConcurrencyPolicy
    )
    integer_fields = {
        "misfire_grace_seconds": (0, MAX_GRACE_S),
        "run_all_max": (1, MAX_RUN_ALL_CATCHUP),
        "max_retries": (0, MAX_RETRIES),
        "priority": (-MAX_PRIORITY, MAX_PRIORITY),
        "spread_seconds": (0, MAX_SPREAD_S),
    }
    for field, (low, high) in integer_fields.items():
        out[field] = _integer(errors, field, values.get(field), low, high)
    out["timeout_seconds"] = _integer(
        errors, "timeout_seconds", values.get("timeout_seconds"), 1, MAX_TIMEOUT_S, nullable=True
    )
    out["retry_backoff_base"] = _number(
        errors, "retry_backoff_base", values.get("retry_backoff_base"), 0, MAX_BACKOFF_S
    )
    out["retry_backoff_factor"] = _number(
        errors, "retry_backoff_factor", values.get("retry_backoff_factor"), 1, MAX_BACKOFF_FACTOR
    )
    out["retry_backoff_max"] = _number(
        errors, "retry_backoff_max", values.get("retry_backoff_max"), 0, MAX_BACKOFF_S
    )
    queue = _string(errors, "queue", values.get("queue"), 64)
    if queue is not None and not QUEUE_RE.match(queue):
        errors.add("queue", ERR_QUEUE_FORMAT)
    out["queue"] = queue
    interval = out.get("interval_seconds")
    spread = out.get("spread_seconds")
    if interval and spread and spread >= interval and "spread_seconds" not in errors:
        errors.add("spread_seconds", ERR_SPREAD_VS_INTERVAL.format(interval=interval))

    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return out


MAX_PREVIEW_COUNT = 50


def schedule_preview_args(params: Any, *, default_count: int) -> tuple[dict[str, Any], int]:
    """Parse a schedule preview request (query parameters) into ``schedules`` keyword arguments."""
    errors = _Errors()
    schedule_type = _choice(errors, "schedule_type", params.get("schedule_type"), ScheduleType)
    kwargs: dict[str, Any] = {"schedule_type": schedule_type}
    if schedule_type == ScheduleType.CRON:
        kwargs["cron_expression"] = params.get("cron_expression", "")
        kwargs["timezone"] = params.get("timezone") or "UTC"
    elif schedule_type == ScheduleType.INTERVAL:
        kwargs["interval_seconds"] = _integer(
            errors, "interval_seconds", params.get("interval_seconds"), 1, MAX_INTERVAL_S
        )
        kwargs["start_at"] = _datetime(errors, "start_at", params.get("start_at") or None)
    elif schedule_type == ScheduleType.ONCE:
        kwargs["run_at"] = _datetime(errors, "run_at", params.get("run_at"))
        if params.get("run_at") is None:
            errors.add("run_at", ERR_REQUIRED)
    count = _integer(errors, "count", params.get("count", default_count), 1, MAX_PREVIEW_COUNT)
    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return kwargs, count or default_count
