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

from django.utils.dateparse import parse_datetime

from jobs import chains, registry, schedules, secrets
from jobs.conf import app_setting
from jobs.definition import (  # noqa: F401 - re-exported: the names every caller knows
    BOOLEAN,
    CHAIN_FIELDS,
    CHOICE,
    DATETIME,
    ERR_NAME_FORMAT,
    ERR_QUEUE_FORMAT,
    FIELDS,
    INTEGER,
    JOB_DEFAULTS,
    MAX_BACKOFF_FACTOR,
    MAX_CHAIN_TARGETS,
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    NAME_PATTERN,
    NUMBER,
    REQUIRED_BY_SCHEDULE,
    RULES,
    SCHEDULE_FIELDS,
    TEXT,
    WRITABLE_FIELDS,
    FieldRule,
    foreign_empty,
)
from jobs.models import MAX_PRIORITY, ScheduleType

# A one-off job may be submitted "due now": allow run_at this far in the past (client/server skew).
ONCE_PAST_TOLERANCE = timedelta(seconds=60)

ERR_REQUIRED = "This field is required."
ERR_NOT_INTEGER = "Must be an integer."
ERR_NOT_NUMBER = "Must be a number."
ERR_NOT_BOOLEAN = "Must be true or false."
ERR_NOT_STRING = "Must be a string."
ERR_NOT_DATETIME = "Must be an ISO 8601 date-time with a time zone, e.g. 2026-12-01T10:00:00Z."
ERR_RANGE = "Must be between {low} and {high}."
ERR_TOO_LONG = "At most {limit} characters."
ERR_CHOICE = "{value!r} is not one of: {choices}."
ERR_NOT_FOR_TYPE = "Only allowed for a {kind} schedule."
ERR_ONCE_IN_PAST = "Is in the past ({value}); a one-off job must be due now or later."
ERR_ARGS_TOO_LARGE = "Serialized arguments are {size} bytes; the limit is {limit} bytes."
ERR_ARGS_TOO_DEEP = (
    "Arguments are nested deeper than {limit} levels (lists and objects in each other)."
)
ERR_SPREAD_VS_INTERVAL = "Must be smaller than interval_seconds ({interval})."
ERR_UNKNOWN_FIELD = "Unknown field."
ERR_NUL = "Contains a NUL character (U+0000)."
ERR_NOT_UNICODE = "Contains a lone surrogate (U+D800 to U+DFFF): not valid Unicode text."
# Every instant the scheduler stores or compares with: MariaDB's DATETIME range, a day inside it so
# that no time-zone offset can push a value out (Python's own range overflowed into 500s).
DATETIME_MIN = datetime(1000, 1, 2, tzinfo=UTC)
DATETIME_MAX = datetime(9999, 12, 30, tzinfo=UTC)
ERR_DATETIME_RANGE = "Must be between 1000-01-02 and 9999-12-30 (UTC)."
ERR_READ_ONLY = "Read-only field."


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


# A choice among more values than this is refused without listing them all.
MAX_LISTED_CHOICES = 12


def _allowed(
    errors: _Errors, field: str, value: Any, allowed: tuple[str, ...], error: str
) -> str | None:
    if isinstance(value, str) and value in allowed:
        return value
    if value is None or value == "":
        errors.add(field, ERR_REQUIRED)
    elif not isinstance(value, str):
        errors.add(field, ERR_NOT_STRING)
    elif len(allowed) > MAX_LISTED_CHOICES and error:
        errors.add(field, error.format(value=value))
    else:
        errors.add(field, ERR_CHOICE.format(value=value, choices=", ".join(allowed)))
    return None


def check_field(errors: _Errors, rule: FieldRule, value: Any) -> Any:
    """One field's value checked by its rule in ``jobs.definition``: returns it cleaned, or None
    with the reason recorded. (Lists and objects are checked with the task they are passed to.)"""
    if value is None and rule.nullable:
        return None
    if rule.kind == TEXT:
        text = _string(errors, rule.name, value, rule.max_length or MAX_DESCRIPTION_CHARS)
        if text is not None and rule.pattern is not None and not re.fullmatch(rule.pattern, text):
            errors.add(rule.name, rule.pattern_error)
            return None
        return text
    if rule.kind == INTEGER:
        return _integer(errors, rule.name, value, int(rule.low), int(rule.high))
    if rule.kind == NUMBER:
        return _number(errors, rule.name, value, rule.low, rule.high)
    if rule.kind == BOOLEAN:
        return _boolean(errors, rule.name, value)
    if rule.kind == CHOICE:
        return _allowed(errors, rule.name, value, rule.allowed(), rule.choice_error)
    if rule.kind == DATETIME:
        if value is None:
            errors.add(rule.name, ERR_REQUIRED)
        return _datetime(errors, rule.name, value)
    return value


def check_values(values: dict[str, Any], rules: dict[str, FieldRule]) -> dict[str, Any]:
    """Each of ``values`` checked by its rule in ``rules`` (a name without a rule is unknown; a
    rule may be another field's, its errors keyed by the name given here): the values cleaned, or
    JobValidationError keyed by name."""
    found: dict[str, list[str]] = {}
    cleaned = {}
    for name, value in values.items():
        if name not in rules:
            found[name] = [ERR_UNKNOWN_FIELD]
            continue
        errors = _Errors()
        cleaned[name] = check_field(errors, rules[name], value)
        for messages in errors.by_field.values():
            found.setdefault(name, []).extend(messages)
    if found:
        raise JobValidationError(found)
    return cleaned


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


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in ``value`` nest more than ``limit`` levels (a list is level 1,
    a list in it level 2; scalars add none). A loop, not recursion: safe at any depth."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _call_arguments(errors: _Errors, task: str | None, args: Any, kwargs: Any) -> None:
    """A task call's arguments: they must bind to the task (when it is known) and stay within
    SCHEDULER_MAX_ARGS_BYTES each, as JSON, and SCHEDULER_MAX_ARGS_DEPTH levels of nesting; a
    credential in them must be a secret reference (``jobs.secrets``), checked against the task
    with a stand-in for the secret."""
    # First: the checks below walk the values recursively (a RecursionError, a 500, when deep).
    depth = app_setting("SCHEDULER_MAX_ARGS_DEPTH")
    too_deep = [
        field
        for field, value in (("args", args), ("kwargs", kwargs))
        if nested_deeper_than(value, depth)
    ]
    for field in too_deep:
        errors.add(field, ERR_ARGS_TOO_DEEP.format(limit=depth))
    if too_deep:
        return
    plain = [
        problem
        for field, value in (("args", args), ("kwargs", kwargs))
        for problem in secrets.problems(value, field)
    ]
    for path, message in plain:
        errors.add(path, message)
    # Each value encoded once, for the size limit and the plain-JSON check (validate_task_call's).
    limit = app_setting("SCHEDULER_MAX_ARGS_BYTES")
    plain_json: dict[str, bool] = {}
    for field, value in (("args", args), ("kwargs", kwargs)):
        try:
            encoded = registry.encode_plain(value)
            plain_json[field] = json.loads(encoded) == value
        except UnicodeEncodeError:
            errors.add(field, ERR_NOT_UNICODE)
            continue
        except (TypeError, ValueError, RecursionError):
            plain_json[field] = False
            try:  # not plain JSON (NaN, a tuple key...): measured as it would be stored
                encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
            except (TypeError, ValueError):
                errors.add(field, "Must be JSON.")
                continue
        if len(encoded) > limit:
            errors.add(field, ERR_ARGS_TOO_LARGE.format(size=len(encoded), limit=limit))
    if task is not None and not plain:
        try:
            registry.validate_task_call(
                task,
                secrets.placeholders(args),
                secrets.placeholders(kwargs),
                plain_json=(plain_json.get("args", False), plain_json.get("kwargs", False)),
            )
        except registry.UnknownTask as exc:
            errors.add("task", str(exc))
        except registry.TaskArgumentError as exc:
            errors.add(exc.field, exc.message)


ERR_FOREIGN_SECRET = (
    "refers to secrets its job's own arguments do not use ({names}); an admin adds them to the job"
)
# The fields of one run sent to the enqueue API.
ENQUEUE_FIELDS = ("args", "kwargs", "run_at", "priority", "idempotency_key")
MAX_IDEMPOTENCY_KEY = 200
ERR_IDEMPOTENCY_KEY_FORMAT = "Must be 1 to 200 characters, none of them a control character."
# Control characters (Unicode's Cc: C0, DEL and C1), which a key never needs and a log line breaks on.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
ERR_IDEMPOTENCY_KEY_REPEATED = "Repeats the idempotency_key of run {index} of this request."


def clean_enqueued_run(
    item: dict[str, Any], *, task: str, job_args: list, job_kwargs: dict
) -> dict[str, Any]:
    """One run for the enqueue API: ``args``/``kwargs`` (absent: the job's), ``run_at`` (absent:
    now; a past instant means now too), ``priority`` (absent: the job's) and ``idempotency_key``
    (absent: none; the caller's key, unique per job). The call is checked
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
    for field, value in (("args", args), ("kwargs", kwargs)):
        if field in errors.by_field:
            continue  # e.g. nested too deep to walk
        wanted = secrets.referenced(value)
        if not wanted:
            continue
        foreign = sorted(wanted - secrets.referenced(job_args) - secrets.referenced(job_kwargs))
        if foreign:
            errors.add(field, ERR_FOREIGN_SECRET.format(names=", ".join(foreign)))
    run_at = _datetime(errors, "run_at", item.get("run_at"))
    priority = _integer(
        errors, "priority", item.get("priority"), -MAX_PRIORITY, MAX_PRIORITY, nullable=True
    )
    key = item.get("idempotency_key")
    if key is not None:
        key = _string(errors, "idempotency_key", key, MAX_IDEMPOTENCY_KEY)
        if key is not None and (not key or CONTROL_CHARACTERS.search(key)):
            errors.add("idempotency_key", ERR_IDEMPOTENCY_KEY_FORMAT)
    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return {
        "args": args,
        "kwargs": kwargs,
        "run_at": run_at,
        "priority": priority,
        "idempotency_key": key,
    }


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

    # Every field by its rule; a schedule field of another type is reset to its default (sending
    # one with a value is an error), one of this type that the type needs must be there.
    schedule_type = check_field(errors, RULES["schedule_type"], values.get("schedule_type"))
    for rule in FIELDS:
        name = rule.name
        if name in ("task", "args", "kwargs", "schedule_type"):
            continue  # the task and its arguments are checked together, below
        if rule.schedule is not None and rule.schedule != schedule_type:
            if schedule_type is not None and submitted.get(name) not in foreign_empty(rule):
                errors.add(name, ERR_NOT_FOR_TYPE.format(kind=rule.schedule))
            out[name] = rule.default
            continue
        value = values.get(name)
        if name in REQUIRED_BY_SCHEDULE and value in (None, ""):
            errors.add(name, ERR_REQUIRED)
            out[name] = None
            continue
        if name == "cron_expression" and isinstance(value, str):
            value = value.strip()
        out[name] = check_field(errors, rule, value)
    out["schedule_type"] = schedule_type

    # --- what no single field's rule says ----------------------------------------------------------
    if out.get("cron_expression"):
        try:
            schedules.parse_cron(out["cron_expression"])
        except schedules.ScheduleError as exc:
            errors.add("cron_expression", exc.message)
            out["cron_expression"] = None
    run_at = out.get("run_at")
    if schedule_type == ScheduleType.ONCE and run_at is not None:
        unchanged = current is not None and current.get("run_at") == run_at
        # A disabled one-off never fires, so a past run_at is harmless there (this is how an
        # exported one-off that already ran is restored).
        if run_at < now - ONCE_PAST_TOLERANCE and not unchanged and values.get("enabled"):
            errors.add("run_at", ERR_ONCE_IN_PAST.format(value=run_at.isoformat()))
    task = _string(errors, "task", values.get("task"), RULES["task"].max_length or 200)
    args, kwargs = values.get("args"), values.get("kwargs")
    if task is not None:
        out["task"] = task
    _call_arguments(errors, task, args, kwargs)
    out["args"], out["kwargs"] = args, kwargs
    if "tags" not in errors.by_field:
        out["tags"] = clean_tags(errors, out.get("tags"))
    for field in CHAIN_FIELDS:
        out[field] = clean_chain(errors, field, out.get(field), own_name=out.get("name"))
    interval = out.get("interval_seconds")
    spread = out.get("spread_seconds")
    if interval and spread and spread >= interval and "spread_seconds" not in errors:
        errors.add("spread_seconds", ERR_SPREAD_VS_INTERVAL.format(interval=interval))

    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return {name: out.get(name) for name in WRITABLE_FIELDS}


MAX_PREVIEW_COUNT = 50
MAX_TAGS = 20
TAG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
ERR_TAGS_TOO_MANY = "At most {limit} tags."
ERR_TAGS_NOT_LIST = "Expected a list of tags."
ERR_TAG_FORMAT = (
    "{value!r} is not a tag: lower-case letters, digits, - _ . (starting with a letter or digit), "
    "up to 32 characters."
)


def clean_tags(errors: _Errors, value: Any) -> list[str]:
    """A job's tags: each a short lower-case label, duplicates dropped, their order kept."""
    if value is None:
        return []
    if not isinstance(value, list):
        errors.add("tags", ERR_TAGS_NOT_LIST)
        return []
    if len(value) > MAX_TAGS:
        errors.add("tags", ERR_TAGS_TOO_MANY.format(limit=MAX_TAGS))
        return []
    tags: list[str] = []
    for item in value:
        if not isinstance(item, str) or not TAG_PATTERN.match(item):
            errors.add("tags", ERR_TAG_FORMAT.format(value=item))
        elif item not in tags:
            tags.append(item)
    return tags


def clean_chain(errors: _Errors, field: str, value: Any, *, own_name: str | None) -> list[str]:
    """One of a job's chains (``jobs.chains``): a list of job names, each once, never the job's
    own. Whether each is a job and whether the chains make a cycle needs the other jobs: the
    services check that (``jobs.chains.check_definitions``)."""
    if value is None:
        return []
    if not isinstance(value, list):
        errors.add(field, chains.ERR_NOT_NAMES)
        return []
    if len(value) > MAX_CHAIN_TARGETS:
        errors.add(field, chains.ERR_TOO_MANY.format(limit=MAX_CHAIN_TARGETS))
        return []
    names: list[str] = []
    for item in value:
        if not isinstance(item, str) or not re.fullmatch(NAME_PATTERN, item):
            errors.add(field, f"{item!r}: {ERR_NAME_FORMAT}")
        elif item in names:
            errors.add(field, chains.ERR_DUPLICATE.format(name=item))
        elif item == own_name:
            errors.add(field, chains.ERR_SELF)
        else:
            names.append(item)
    return names


def schedule_preview_args(params: Any, *, default_count: int) -> tuple[dict[str, Any], int]:
    """Parse a schedule preview request (query parameters) into ``schedules`` keyword arguments.
    Each schedule parameter sent is checked by its rule (one of another type too, then unused)."""
    errors = _Errors()
    schedule_type = check_field(errors, RULES["schedule_type"], params.get("schedule_type"))
    sent = {}
    for name in SCHEDULE_FIELDS:
        if name not in params:
            continue
        if "\x00" in params[name]:
            # What the schema says of every free-text query parameter (a NUL is never text).
            errors.add(name, ERR_NUL)
            continue
        sent[name] = check_field(errors, RULES[name], params[name])
    kwargs: dict[str, Any] = {"schedule_type": schedule_type}
    for name, kind in SCHEDULE_FIELDS.items():
        if kind != schedule_type:
            continue
        if name in REQUIRED_BY_SCHEDULE and name not in params:
            errors.add(name, ERR_REQUIRED)
        kwargs[name] = sent.get(name, RULES[name].default)
    count = _integer(errors, "count", params.get("count", default_count), 1, MAX_PREVIEW_COUNT)
    if errors.by_field:
        raise JobValidationError(errors.by_field)
    return kwargs, count or default_count
