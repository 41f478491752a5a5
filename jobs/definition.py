"""The job definition: one table of field rules, and what is derived from it.

Every surface that accepts a job reads this table and nothing else for what a field is: its type,
default, bounds, length, pattern, choices, the schedule type that uses it, its label and help text.

- ``jobs.validation.clean_job`` checks each field by its rule (then the rules no single field can
  state: a cron expression parses, the task accepts its arguments, a spread is below the interval,
  a one-off is not in the past);
- the REST API's request schemas (``json_schema``: OpenAPI, and so schemathesis and every client
  generator), one variant per schedule type;
- the dashboard's job form and the admin's form (labels, help, bounds);
- ``jobs apply`` and the services, through ``JOB_DEFAULTS``;
- the model's defaults are checked against this table by a test (a migration would be needed to
  derive them, and the check is as strong).
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jobs.models import (
    MAX_BACKOFF_S,
    MAX_FLOW_LIMIT,
    MAX_GRACE_S,
    MAX_INTERVAL_S,
    MAX_PRIORITY,
    MAX_RATE_PERIOD_S,
    MAX_RETRIES,
    MAX_RUN_ALL_CATCHUP,
    MAX_SPREAD_S,
    MAX_TIMEOUT_S,
    ConcurrencyPolicy,
    DstMissing,
    DstRepeated,
    Isolation,
    MisfirePolicy,
    ScheduleType,
)

MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 10_000
MAX_BACKOFF_FACTOR = 10.0
# Starts and ends with a letter, digit or symbol (never a space), spaces allowed inside.
NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9 _.:@/+-]*[A-Za-z0-9_.:@/+-])?$"
QUEUE_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
ERR_NAME_FORMAT = (
    "Must start with a letter or digit, not end with a space, and contain only letters, digits, "
    "spaces and _ . : @ / + -"
)
ERR_QUEUE_FORMAT = "Lower-case letters, digits, _ . - only, at most 64 characters."

# Jobs one outcome of a job may chain to (jobs.chains): a chain fans out, it does not broadcast.
MAX_CHAIN_TARGETS = 20
CHAIN_TARGET_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME_CHARS,
    "pattern": NAME_PATTERN,
}
CHAIN_FIELDS = ("on_success", "on_failure", "on_end")

# The kinds of value a field holds (JSON-like, as a client sends them).
TEXT = "text"
INTEGER = "integer"
NUMBER = "number"
BOOLEAN = "boolean"
CHOICE = "choice"
DATETIME = "datetime"
LIST = "list"
OBJECT = "object"

REQUIRED = object()  # the default of a field a new job must be given
# A schedule field a job of its type must have.
REQUIRED_BY_SCHEDULE = ("cron_expression", "interval_seconds", "run_at")


@lru_cache(maxsize=1)
def timezone_names() -> tuple[str, ...]:
    """The IANA time zones a cron schedule may use (what this machine's zone database holds)."""
    return tuple(sorted(zoneinfo.available_timezones()))


def task_names() -> tuple[str, ...]:
    from jobs import registry

    return tuple(registry.task_names())


@dataclass(frozen=True)
class FieldRule:
    name: str
    kind: str
    help: str
    label: str = ""
    default: Any = REQUIRED
    low: float | None = None
    high: float | None = None
    max_length: int | None = None
    pattern: str | None = None
    pattern_error: str = ""
    # A TextChoices class, or a function returning the allowed values (read when used).
    choices: Any = None
    # The error for a value not among many choices ({value!r}); few choices are listed instead.
    choice_error: str = ""
    nullable: bool = False
    # The schedule type this field belongs to (None: every job has it).
    schedule: str | None = None
    # A list's items and its length, for its JSON Schema (None: any items, any length).
    items: dict[str, Any] | None = None
    max_items: int | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def title(self) -> str:
        return self.label or self.name.replace("_", " ").capitalize()

    def allowed(self) -> tuple[str, ...]:
        if self.choices is None:
            return ()
        if isinstance(self.choices, type):
            return tuple(c.value for c in self.choices)
        return tuple(self.choices())

    def choice_pairs(self) -> list[tuple[str, str]]:
        if isinstance(self.choices, type):
            return list(self.choices.choices)
        return [(value, value) for value in self.allowed()]


FIELDS: tuple[FieldRule, ...] = (
    FieldRule(
        "name",
        TEXT,
        "Unique name of the job.",
        max_length=MAX_NAME_CHARS,
        pattern=NAME_PATTERN,
        pattern_error=ERR_NAME_FORMAT,
    ),
    FieldRule("description", TEXT, "Free text.", default="", max_length=MAX_DESCRIPTION_CHARS),
    FieldRule(
        "task",
        CHOICE,
        "A registered task, e.g. noop, sleep, log, http_request.",
        choices=task_names,
    ),
    FieldRule(
        "args",
        LIST,
        "Positional arguments: a JSON list, e.g. [30]. A credential is given as "
        '{"$secret": "NAME"}.',
        label="Arguments",
        default=[],
    ),
    FieldRule(
        "kwargs",
        OBJECT,
        'Keyword arguments: a JSON object, e.g. {"message": "hi"}. A credential is given as '
        '{"$secret": "NAME"}.',
        label="Keyword arguments",
        default={},
    ),
    FieldRule(
        "schedule_type",
        CHOICE,
        "cron, interval or once; decides which schedule fields apply.",
        choices=ScheduleType,
    ),
    FieldRule(
        "cron_expression",
        TEXT,
        "5 fields (minute hour day month weekday) or 6 with seconds first; @daily etc.",
        default="",
        max_length=200,
        schedule=ScheduleType.CRON,
    ),
    FieldRule(
        "timezone",
        CHOICE,
        "IANA time zone the cron fields are read in, e.g. Europe/Berlin.",
        label="Time zone",
        default="UTC",
        choices=timezone_names,
        choice_error="unknown time zone {value!r} (use an IANA name such as 'Europe/Berlin')",
        schedule=ScheduleType.CRON,
    ),
    FieldRule(
        "dst_repeated",
        CHOICE,
        "When the clocks go back and the fire's wall time happens twice: cron (once for a fixed "
        "hour, both times for a wildcard hour), first, last or both.",
        label="Repeated hour (DST)",
        default=DstRepeated.CRON.value,
        choices=DstRepeated,
        schedule=ScheduleType.CRON,
    ),
    FieldRule(
        "dst_missing",
        CHOICE,
        "When the clocks go forward and the fire's wall time does not happen: cron (shift a "
        "fixed hour, skip a wildcard hour), shift (fire just after the change) or skip.",
        label="Skipped hour (DST)",
        default=DstMissing.CRON.value,
        choices=DstMissing,
        schedule=ScheduleType.CRON,
    ),
    FieldRule(
        "interval_seconds",
        INTEGER,
        "Seconds between runs.",
        default=None,
        low=1,
        high=MAX_INTERVAL_S,
        nullable=True,
        schedule=ScheduleType.INTERVAL,
    ),
    FieldRule(
        "start_at",
        DATETIME,
        "Optional anchor of the interval slots (absent: slots are aligned to the Unix epoch).",
        default=None,
        nullable=True,
        schedule=ScheduleType.INTERVAL,
    ),
    FieldRule(
        "run_at",
        DATETIME,
        "When the job runs; now or later for an enabled job.",
        default=None,
        nullable=True,
        schedule=ScheduleType.ONCE,
    ),
    FieldRule("enabled", BOOLEAN, "A paused job does not fire.", default=True),
    FieldRule(
        "misfire_policy",
        CHOICE,
        "What a fire later than its grace does: run once, run all (up to run_all_max), skip.",
        default=MisfirePolicy.RUN_ONCE.value,
        choices=MisfirePolicy,
    ),
    FieldRule(
        "misfire_grace_seconds",
        INTEGER,
        "How late a fire may still start before the misfire policy applies.",
        default=60,
        low=0,
        high=MAX_GRACE_S,
    ),
    FieldRule(
        "run_all_max",
        INTEGER,
        "Most missed fires 'Run all' catches up.",
        default=10,
        low=1,
        high=MAX_RUN_ALL_CATCHUP,
    ),
    FieldRule(
        "concurrency_policy",
        CHOICE,
        "Whether runs of this job may overlap: allow, forbid (skip a fire while one runs), "
        "replace, buffer one.",
        default=ConcurrencyPolicy.FORBID.value,
        choices=ConcurrencyPolicy,
    ),
    FieldRule(
        "max_retries", INTEGER, "Retries after a failed run.", default=0, low=0, high=MAX_RETRIES
    ),
    FieldRule(
        "retry_backoff_base",
        NUMBER,
        "Seconds before the first retry.",
        default=1.0,
        low=0,
        high=MAX_BACKOFF_S,
    ),
    FieldRule(
        "retry_backoff_factor",
        NUMBER,
        "Each further delay is multiplied by this.",
        default=2.0,
        low=1,
        high=MAX_BACKOFF_FACTOR,
    ),
    FieldRule(
        "retry_backoff_max",
        NUMBER,
        "Longest single delay, in seconds.",
        default=300.0,
        low=0,
        high=MAX_BACKOFF_S,
    ),
    FieldRule("retry_jitter", BOOLEAN, "Randomise delays a little.", default=True),
    FieldRule(
        "max_concurrent",
        INTEGER,
        "At most this many runs of the job at once across the cluster; more wait their turn. "
        "Empty means no bound beyond the concurrency policy.",
        default=None,
        low=1,
        high=MAX_FLOW_LIMIT,
        nullable=True,
    ),
    FieldRule(
        "rate_limit",
        INTEGER,
        "At most this many runs of the job start in any rate_period_seconds across the cluster; "
        "more wait their turn. Empty means no rate limit.",
        default=None,
        low=1,
        high=MAX_FLOW_LIMIT,
        nullable=True,
    ),
    FieldRule(
        "rate_period_seconds",
        INTEGER,
        "The period rate_limit counts over, in seconds.",
        default=60,
        low=1,
        high=MAX_RATE_PERIOD_S,
    ),
    FieldRule(
        "timeout_seconds",
        INTEGER,
        "A run still going after this many seconds is stopped; empty means no timeout.",
        default=None,
        low=1,
        high=MAX_TIMEOUT_S,
        nullable=True,
    ),
    FieldRule(
        "isolation",
        CHOICE,
        "Where a run executes: a thread of the node, or a child process (can be killed).",
        default=Isolation.THREAD.value,
        choices=Isolation,
    ),
    FieldRule(
        "priority",
        INTEGER,
        "Higher runs first when nodes are busy.",
        default=0,
        low=-MAX_PRIORITY,
        high=MAX_PRIORITY,
    ),
    FieldRule(
        "queue",
        TEXT,
        "Only nodes serving this queue run the job.",
        default="default",
        max_length=64,
        pattern=QUEUE_PATTERN,
        pattern_error=ERR_QUEUE_FORMAT,
    ),
    FieldRule(
        "tags",
        LIST,
        'Labels to find and act on jobs together, e.g. ["billing", "nightly"]: lower-case '
        "letters, digits, - _ . (up to 32 characters each), at most 20.",
        default=[],
    ),
    FieldRule(
        "spread_seconds",
        INTEGER,
        "Delay each fire by a stable per-job offset below this, to avoid stampedes; below "
        "interval_seconds for an interval job.",
        default=0,
        low=0,
        high=MAX_SPREAD_S,
    ),
    *(
        FieldRule(
            f"on_{outcome}",
            LIST,
            f"Jobs to run, by name, when a run of this job {when} (its last attempt: a run "
            "that will be retried has not ended yet). A job's own name, or a chain that leads "
            "back to it, is refused.",
            label=f"On {outcome}",
            default=[],
            items=CHAIN_TARGET_SCHEMA,
            max_items=MAX_CHAIN_TARGETS,
        )
        for outcome, when in (
            ("success", "succeeds"),
            ("failure", "fails, times out or is lost"),
            ("end", "succeeds, fails, times out or is lost"),
        )
    ),
)

RULES: dict[str, FieldRule] = {rule.name: rule for rule in FIELDS}
# Fields a client may set, in the table's order.
WRITABLE_FIELDS: tuple[str, ...] = tuple(RULES)
# Each schedule-only field and the schedule type it belongs to.
SCHEDULE_FIELDS: dict[str, str] = {r.name: r.schedule for r in FIELDS if r.schedule is not None}
SCHEDULE_DEFAULTS: dict[str, Any] = {name: RULES[name].default for name in SCHEDULE_FIELDS}
# Defaults of a new job: every field but the three a job must be given.
JOB_DEFAULTS: dict[str, Any] = {r.name: r.default for r in FIELDS if not r.required}


def foreign_empty(rule: FieldRule) -> tuple[Any, ...]:
    """What a field of another schedule type may still carry when it is sent: its empty value
    (null, its default, or "" for text), because exports and forms send every field."""
    values: list[Any] = [None]
    if rule.kind in (TEXT, CHOICE):
        values += [v for v in ("", rule.default) if v not in values]
    return tuple(values)


# --- JSON Schema (OpenAPI 3.0) --------------------------------------------------------------------


def field_schema(rule: FieldRule) -> dict[str, Any]:
    """The JSON Schema of one field's value."""
    schema: dict[str, Any]
    if rule.kind == TEXT:
        schema = {"type": "string"}
        if rule.max_length is not None:
            schema["maxLength"] = rule.max_length
        if rule.pattern is not None:
            schema["pattern"] = rule.pattern
    elif rule.kind in (INTEGER, NUMBER):
        schema = {"type": rule.kind}
        if rule.low is not None:
            schema["minimum"] = rule.low
        if rule.high is not None:
            schema["maximum"] = rule.high
    elif rule.kind == BOOLEAN:
        schema = {"type": "boolean"}
    elif rule.kind == CHOICE:
        schema = {"type": "string", "enum": list(rule.allowed())}
    elif rule.kind == DATETIME:
        schema = {"type": "string", "format": "date-time"}
    elif rule.kind == LIST:
        schema = {"type": "array", "items": dict(rule.items or {})}
        if rule.max_items is not None:
            schema["maxItems"] = rule.max_items
    elif rule.kind == OBJECT:
        schema = {"type": "object", "additionalProperties": True}
    else:  # pragma: no cover - the table holds only the kinds above
        raise ValueError(f"unknown kind {rule.kind!r}")
    if rule.nullable:
        schema["nullable"] = True
    schema["description"] = rule.help
    if not rule.required and rule.default not in ([], {}):
        schema["default"] = rule.default
    return schema


def _foreign_schema(rule: FieldRule) -> dict[str, Any]:
    kind = "string" if rule.kind in (TEXT, CHOICE, DATETIME) else rule.kind
    return {
        "type": kind,
        "nullable": True,
        "enum": list(foreign_empty(rule)),
        "description": f"Only for a {rule.schedule} schedule; elsewhere only its empty value.",
    }


DATETIME_NOTE = (
    "Date-times carry a zone and lie between 1000-01-02 and 9999-12-30 (UTC). Rules no schema "
    "can state are checked on the server (400, keyed by field): the cron expression parses, the "
    "task accepts its arguments, spread_seconds is below interval_seconds, an enabled one-off is "
    "not in the past, a credential in the arguments is a secret reference, and the names in "
    "on_success, on_failure and on_end are jobs whose chains lead back to none they started from."
)


def json_schema(schedule_type: str | None, *, version: bool = False) -> dict[str, Any]:
    """A request body. For one schedule type (create, replace): every field, those of other types
    only empty, and what a job of that type must have required. ``schedule_type`` None: a partial
    update (PATCH), nothing required but ``version``; it applies over the stored job, so only the
    server can say which schedule fields fit. ``version``: the version the client read."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for rule in FIELDS:
        if schedule_type is not None and rule.schedule not in (None, schedule_type):
            properties[rule.name] = _foreign_schema(rule)
            continue
        schema = field_schema(rule)
        if schedule_type is not None and rule.name in REQUIRED_BY_SCHEDULE:
            schema.pop("nullable", None)
            schema.pop("default", None)
            if rule.kind == TEXT:
                schema["minLength"] = 1
        if rule.name == "schedule_type" and schedule_type is not None:
            schema = {**schema, "enum": [schedule_type]}
        properties[rule.name] = schema
        if schedule_type is not None and (rule.required or rule.name in REQUIRED_BY_SCHEDULE):
            required.append(rule.name)
    if version:
        properties["version"] = {
            "type": "integer",
            "minimum": 1,
            "description": "The version the client read (optimistic locking): 409 if it moved.",
        }
        required.append("version")
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def job_body_schema(*, version: bool = False) -> dict[str, Any]:
    """The body of a create (or, with ``version``, a replace): one variant per schedule type."""
    return {
        "oneOf": [json_schema(kind, version=version) for kind in ScheduleType.values],
        "description": DATETIME_NOTE,
    }
