"""Bad input (docs/api.md): every field validated with a clear 4xx naming the field, nothing half-written.

Every refused request is checked for "nothing written": the Job rows and the audit trail are
exactly as before. Messages are compared with the named constants of the module that raises them.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs import registry, schedules
from jobs.api.parsers import ERR_TOO_LARGE
from jobs.api.views import ERR_BODY_NOT_OBJECT
from jobs.models import (
    MAX_BACKOFF_S,
    MAX_GRACE_S,
    MAX_INTERVAL_S,
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_RUN_ALL_CATCHUP,
    MAX_SPREAD_S,
    MAX_TIMEOUT_S,
    AuditEvent,
    Job,
)
from jobs.services import ERR_NAME_TAKEN
from jobs.validation import (
    ERR_ARGS_TOO_LARGE,
    ERR_CHOICE,
    ERR_NAME_FORMAT,
    ERR_NOT_BOOLEAN,
    ERR_NOT_DATETIME,
    ERR_NOT_FOR_TYPE,
    ERR_NOT_INTEGER,
    ERR_NOT_NUMBER,
    ERR_NOT_STRING,
    ERR_ONCE_IN_PAST,
    ERR_QUEUE_FORMAT,
    ERR_RANGE,
    ERR_REQUIRED,
    ERR_SPREAD_VS_INTERVAL,
    ERR_TOO_LONG,
    ERR_UNKNOWN_FIELD,
    JOB_DEFAULTS,
    MAX_BACKOFF_FACTOR,
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    JobValidationError,
    clean_job,
)

CRON = {"name": "valid", "task": "noop", "schedule_type": "cron", "cron_expression": "* * * * *"}
INTERVAL = {"name": "valid", "task": "noop", "schedule_type": "interval", "interval_seconds": 60}
ANY = object()  # the field must be named; its message is not pinned


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def rng(low, high) -> str:
    return ERR_RANGE.format(low=low, high=high)


def ago(**delta) -> str:
    return (timezone.now() - timedelta(**delta)).isoformat()


def ahead(**delta) -> str:
    return (timezone.now() + timedelta(**delta)).isoformat()


def cron(expression: str) -> dict:
    return {**CRON, "cron_expression": expression}


def out_of_range(field: str, value: int, low: int, high: int) -> str:
    return schedules.ERR_CRON_OUT_OF_RANGE.format(field=field, value=value, low=low, high=high)


class NothingWritten:
    """Snapshot of what a refused request must leave untouched."""

    def __init__(self) -> None:
        self.before = self.state()

    @staticmethod
    def state() -> tuple:
        return (
            list(Job.objects.order_by("pk").values()),
            list(AuditEvent.objects.values_list("pk", flat=True)),
        )

    def check(self) -> None:
        assert self.state() == self.before


def assert_field_error(response, field: str, message) -> None:
    assert response.status_code == 400, (response.status_code, getattr(response, "data", None))
    assert field in response.data, response.data
    if callable(message):
        message = message()
    if message is not ANY:
        assert message in [str(m) for m in response.data[field]], response.data[field]


# (id, body, field, message)
CASES = [
    # --- cron expressions ---
    ("cron-garbage-word", cron("garbage"), "cron_expression", ANY),
    (
        "cron-garbage-token",
        cron("x * * * *"),
        "cron_expression",
        schedules.ERR_CRON_BAD_TOKEN.format(field="minute", token="x"),
    ),
    (
        "cron-unknown-macro",
        cron("@fortnightly"),
        "cron_expression",
        schedules.ERR_CRON_UNKNOWN_MACRO.format(
            macro="@fortnightly", known=", ".join(schedules.MACROS)
        ),
    ),
    ("cron-empty", cron(""), "cron_expression", ERR_REQUIRED),
    (
        "cron-missing",
        {k: v for k, v in CRON.items() if k != "cron_expression"},
        "cron_expression",
        ANY,
    ),
    ("cron-not-a-string", cron(5), "cron_expression", ERR_NOT_STRING),
    (
        "cron-4-fields",
        cron("* * * *"),
        "cron_expression",
        schedules.ERR_CRON_FIELD_COUNT.format(count=4),
    ),
    (
        "cron-7-fields",
        cron("* * * * * * *"),
        "cron_expression",
        schedules.ERR_CRON_FIELD_COUNT.format(count=7),
    ),
    ("cron-second-61", cron("61 * * * * *"), "cron_expression", out_of_range("second", 61, 0, 59)),
    ("cron-minute-60", cron("60 * * * *"), "cron_expression", out_of_range("minute", 60, 0, 59)),
    ("cron-hour-24", cron("0 24 * * *"), "cron_expression", out_of_range("hour", 24, 0, 23)),
    ("cron-dom-32", cron("0 0 32 * *"), "cron_expression", out_of_range("day-of-month", 32, 1, 31)),
    ("cron-dom-0", cron("0 0 0 * *"), "cron_expression", out_of_range("day-of-month", 0, 1, 31)),
    ("cron-month-13", cron("0 0 1 13 *"), "cron_expression", out_of_range("month", 13, 1, 12)),
    ("cron-dow-8", cron("0 0 * * 8"), "cron_expression", out_of_range("day-of-week", 8, 0, 7)),
    (
        "cron-step-0",
        cron("*/0 * * * *"),
        "cron_expression",
        schedules.ERR_CRON_STEP_ZERO.format(field="minute"),
    ),
    (
        "cron-reversed-range",
        cron("0 5-1 * * *"),
        "cron_expression",
        schedules.ERR_CRON_REVERSED_RANGE.format(field="hour", start=5, end=1),
    ),
    (
        "cron-question-mark-in-minute",
        cron("? * * * *"),
        "cron_expression",
        schedules.ERR_CRON_QUESTION_MARK.format(field="minute"),
    ),
    (
        "cron-never-fires",
        cron("0 0 30 2 *"),
        "cron_expression",
        schedules.ERR_CRON_NEVER_FIRES.format(expression="0 0 30 2 *"),
    ),
    (
        "cron-never-fires-short-months",
        cron("0 0 31 4,6,9,11 *"),
        "cron_expression",
        schedules.ERR_CRON_NEVER_FIRES.format(expression="0 0 31 4,6,9,11 *"),
    ),
    (
        "cron-reversed-names",
        cron("0 0 * * FRI-MON"),
        "cron_expression",
        schedules.ERR_CRON_REVERSED_RANGE.format(field="day-of-week", start=5, end=1),
    ),
    ("cron-empty-list-item", cron("1,,2 * * * *"), "cron_expression", ANY),
    ("cron-negative", cron("-1 * * * *"), "cron_expression", ANY),
    ("cron-quartz-L", cron("0 0 L * *"), "cron_expression", ANY),
    ("cron-non-ascii-digit", cron("\u0663 * * * *"), "cron_expression", ANY),
    (
        "cron-too-long",
        cron("0 " + ",".join(["1"] * 150) + " * * *"),
        "cron_expression",
        ANY,
    ),
    # --- time zones ---
    (
        "timezone-unknown",
        {**CRON, "timezone": "Mars/Olympus"},
        "timezone",
        schedules.ERR_TIMEZONE_UNKNOWN.format(name="Mars/Olympus"),
    ),
    (
        "timezone-path",
        {**CRON, "timezone": "../../etc/passwd"},
        "timezone",
        schedules.ERR_TIMEZONE_UNKNOWN.format(name="../../etc/passwd"),
    ),
    ("timezone-empty", {**CRON, "timezone": ""}, "timezone", ERR_REQUIRED),
    ("timezone-number", {**CRON, "timezone": 1}, "timezone", ERR_NOT_STRING),
    # --- schedule type and fields of another type ---
    (
        "schedule-type-unknown",
        {**CRON, "schedule_type": "weekly"},
        "schedule_type",
        ERR_CHOICE.format(value="weekly", choices="cron, interval, once"),
    ),
    ("schedule-type-missing", {"name": "valid", "task": "noop"}, "schedule_type", ANY),
    (
        "interval-field-with-cron",
        {**CRON, "interval_seconds": 60},
        "interval_seconds",
        ERR_NOT_FOR_TYPE.format(kind="interval"),
    ),
    (
        "run-at-with-cron",
        {**CRON, "run_at": ahead(days=1)},
        "run_at",
        ERR_NOT_FOR_TYPE.format(kind="once"),
    ),
    (
        "cron-field-with-interval",
        {**INTERVAL, "cron_expression": "* * * * *"},
        "cron_expression",
        ERR_NOT_FOR_TYPE.format(kind="cron"),
    ),
    (
        "timezone-with-interval",
        {**INTERVAL, "timezone": "Europe/Berlin"},
        "timezone",
        ERR_NOT_FOR_TYPE.format(kind="cron"),
    ),
    (
        "start-at-with-once",
        {
            **INTERVAL,
            "schedule_type": "once",
            "interval_seconds": None,
            "run_at": ahead(days=1),
            "start_at": ahead(days=1),
        },
        "start_at",
        ERR_NOT_FOR_TYPE.format(kind="interval"),
    ),
    # --- interval ---
    ("interval-0", {**INTERVAL, "interval_seconds": 0}, "interval_seconds", rng(1, MAX_INTERVAL_S)),
    (
        "interval-neg",
        {**INTERVAL, "interval_seconds": -5},
        "interval_seconds",
        rng(1, MAX_INTERVAL_S),
    ),
    (
        "interval-huge",
        {**INTERVAL, "interval_seconds": 10**9},
        "interval_seconds",
        rng(1, MAX_INTERVAL_S),
    ),
    ("interval-missing", {**INTERVAL, "interval_seconds": None}, "interval_seconds", ERR_REQUIRED),
    ("interval-bool", {**INTERVAL, "interval_seconds": True}, "interval_seconds", ERR_NOT_INTEGER),
    (
        "interval-string",
        {**INTERVAL, "interval_seconds": "abc"},
        "interval_seconds",
        ERR_NOT_INTEGER,
    ),
    (
        "interval-fraction",
        {**INTERVAL, "interval_seconds": 1.5},
        "interval_seconds",
        ERR_NOT_INTEGER,
    ),
    (
        "start-at-naive",
        {**INTERVAL, "start_at": "2030-01-01T10:00:00"},
        "start_at",
        ERR_NOT_DATETIME,
    ),
    # --- once ---
    (
        "once-missing-run-at",
        {"name": "valid", "task": "noop", "schedule_type": "once"},
        "run_at",
        ERR_REQUIRED,
    ),
    (
        "once-naive",
        {"name": "valid", "task": "noop", "schedule_type": "once", "run_at": "2030-01-01T10:00:00"},
        "run_at",
        ERR_NOT_DATETIME,
    ),
    (
        "once-garbage",
        {"name": "valid", "task": "noop", "schedule_type": "once", "run_at": "tomorrow"},
        "run_at",
        ERR_NOT_DATETIME,
    ),
    (
        "once-number",
        {"name": "valid", "task": "noop", "schedule_type": "once", "run_at": 1893456000},
        "run_at",
        ERR_NOT_DATETIME,
    ),
    # --- task and its arguments ---
    # The message lists the tasks loaded when the request is made (other test modules add
    # some as they are imported): built then, not at collection.
    ("task-unknown", {**CRON, "task": "rm_rf"}, "task", lambda: str(registry.UnknownTask("rm_rf"))),
    ("task-missing", {k: v for k, v in CRON.items() if k != "task"}, "task", ERR_REQUIRED),
    ("task-not-a-string", {**CRON, "task": ["noop"]}, "task", ERR_NOT_STRING),
    ("args-object", {**CRON, "args": {"a": 1}}, "args", ANY),
    ("args-string", {**CRON, "args": "abc"}, "args", ANY),
    ("args-number", {**CRON, "args": 5}, "args", ANY),
    ("args-null", {**CRON, "args": None}, "args", ANY),
    ("kwargs-list", {**CRON, "kwargs": [1]}, "kwargs", ANY),
    ("kwargs-string", {**CRON, "kwargs": "x"}, "kwargs", ANY),
    ("kwargs-number", {**CRON, "kwargs": 3}, "kwargs", ANY),
    ("noop-with-args", {**CRON, "args": [1]}, "args", ANY),
    (
        "sleep-unknown-kwarg",
        {**CRON, "task": "sleep", "args": [1], "kwargs": {"nope": 1}},
        "kwargs",
        ANY,
    ),
    ("sleep-missing-arg", {**CRON, "task": "sleep"}, "kwargs", ANY),
    ("sleep-not-a-number", {**CRON, "task": "sleep", "args": ["abc"]}, "args", ANY),
    ("sleep-negative", {**CRON, "task": "sleep", "args": [-1]}, "args", ANY),
    ("sleep-huge", {**CRON, "task": "sleep", "kwargs": {"seconds": 10**9}}, "kwargs", ANY),
    (
        "sleep-context",
        {**CRON, "task": "sleep", "kwargs": {"seconds": 1, "context": 1}},
        "kwargs",
        ANY,
    ),
    (
        "log-bad-level",
        {**CRON, "task": "log", "kwargs": {"message": "m", "level": "loud"}},
        "kwargs",
        ANY,
    ),
    # --- numbers: negative, absurd, wrong types ---
    ("timeout-0", {**CRON, "timeout_seconds": 0}, "timeout_seconds", rng(1, MAX_TIMEOUT_S)),
    ("timeout-neg", {**CRON, "timeout_seconds": -1}, "timeout_seconds", rng(1, MAX_TIMEOUT_S)),
    ("timeout-huge", {**CRON, "timeout_seconds": 10**9}, "timeout_seconds", rng(1, MAX_TIMEOUT_S)),
    ("timeout-bool", {**CRON, "timeout_seconds": False}, "timeout_seconds", ERR_NOT_INTEGER),
    ("timeout-string", {**CRON, "timeout_seconds": "abc"}, "timeout_seconds", ERR_NOT_INTEGER),
    ("retries-neg", {**CRON, "max_retries": -1}, "max_retries", rng(0, MAX_RETRIES)),
    ("retries-101", {**CRON, "max_retries": 101}, "max_retries", rng(0, MAX_RETRIES)),
    ("retries-bool", {**CRON, "max_retries": True}, "max_retries", ERR_NOT_INTEGER),
    ("retries-null", {**CRON, "max_retries": None}, "max_retries", ERR_REQUIRED),
    (
        "grace-neg",
        {**CRON, "misfire_grace_seconds": -1},
        "misfire_grace_seconds",
        rng(0, MAX_GRACE_S),
    ),
    ("run-all-max-0", {**CRON, "run_all_max": 0}, "run_all_max", rng(1, MAX_RUN_ALL_CATCHUP)),
    ("priority-huge", {**CRON, "priority": 10**6}, "priority", rng(-MAX_PRIORITY, MAX_PRIORITY)),
    (
        "priority-neg-huge",
        {**CRON, "priority": -(10**6)},
        "priority",
        rng(-MAX_PRIORITY, MAX_PRIORITY),
    ),
    ("priority-bool", {**CRON, "priority": True}, "priority", ERR_NOT_INTEGER),
    ("priority-string", {**CRON, "priority": "abc"}, "priority", ERR_NOT_INTEGER),
    ("priority-object", {**CRON, "priority": {"v": 1}}, "priority", ERR_NOT_INTEGER),
    ("spread-neg", {**CRON, "spread_seconds": -1}, "spread_seconds", rng(0, MAX_SPREAD_S)),
    (
        "spread-equal-interval",
        {**INTERVAL, "spread_seconds": 60},
        "spread_seconds",
        ERR_SPREAD_VS_INTERVAL.format(interval=60),
    ),
    (
        "spread-over-interval",
        {**INTERVAL, "spread_seconds": 61},
        "spread_seconds",
        ERR_SPREAD_VS_INTERVAL.format(interval=60),
    ),
    (
        "backoff-factor-half",
        {**CRON, "retry_backoff_factor": 0.5},
        "retry_backoff_factor",
        rng(1, MAX_BACKOFF_FACTOR),
    ),
    (
        "backoff-factor-huge",
        {**CRON, "retry_backoff_factor": 1000},
        "retry_backoff_factor",
        rng(1, MAX_BACKOFF_FACTOR),
    ),
    (
        "backoff-base-neg",
        {**CRON, "retry_backoff_base": -1},
        "retry_backoff_base",
        rng(0, MAX_BACKOFF_S),
    ),
    (
        "backoff-max-huge",
        {**CRON, "retry_backoff_max": 1e12},
        "retry_backoff_max",
        rng(0, MAX_BACKOFF_S),
    ),
    (
        "backoff-base-bool",
        {**CRON, "retry_backoff_base": True},
        "retry_backoff_base",
        ERR_NOT_NUMBER,
    ),
    (
        "backoff-max-string",
        {**CRON, "retry_backoff_max": "abc"},
        "retry_backoff_max",
        ERR_NOT_NUMBER,
    ),
    (
        "backoff-max-nan-string",
        {**CRON, "retry_backoff_max": "nan"},
        "retry_backoff_max",
        ERR_NOT_NUMBER,
    ),
    (
        "backoff-max-inf-string",
        {**CRON, "retry_backoff_max": "inf"},
        "retry_backoff_max",
        ERR_NOT_NUMBER,
    ),
    # --- booleans and choices ---
    ("enabled-string", {**CRON, "enabled": "yes"}, "enabled", ERR_NOT_BOOLEAN),
    ("enabled-number", {**CRON, "enabled": 1}, "enabled", ERR_NOT_BOOLEAN),
    ("jitter-null", {**CRON, "retry_jitter": None}, "retry_jitter", ERR_NOT_BOOLEAN),
    (
        "misfire-policy",
        {**CRON, "misfire_policy": "sometimes"},
        "misfire_policy",
        ERR_CHOICE.format(value="sometimes", choices="run_once, skip, run_all"),
    ),
    (
        "concurrency-policy",
        {**CRON, "concurrency_policy": "parallel"},
        "concurrency_policy",
        ERR_CHOICE.format(value="parallel", choices="forbid, buffer_one, replace, allow"),
    ),
    # --- names, description, queue, unknown fields ---
    ("name-empty", {**CRON, "name": ""}, "name", ERR_NAME_FORMAT),
    ("name-blank", {**CRON, "name": "   "}, "name", ERR_NAME_FORMAT),
    (
        "name-too-long",
        {**CRON, "name": "n" * (MAX_NAME_CHARS + 1)},
        "name",
        ERR_TOO_LONG.format(limit=MAX_NAME_CHARS),
    ),
    ("name-leading-space", {**CRON, "name": " lead"}, "name", ERR_NAME_FORMAT),
    ("name-trailing-space", {**CRON, "name": "trail "}, "name", ERR_NAME_FORMAT),
    ("name-newline", {**CRON, "name": "two\nlines"}, "name", ERR_NAME_FORMAT),
    # A regex "$" also matches before a final newline: the whole name must match.
    ("name-trailing-newline", {**CRON, "name": "trail\n"}, "name", ERR_NAME_FORMAT),
    ("queue-trailing-newline", {**CRON, "queue": "q\n"}, "queue", ERR_QUEUE_FORMAT),
    ("name-html", {**CRON, "name": "<script>"}, "name", ERR_NAME_FORMAT),
    ("name-missing", {k: v for k, v in CRON.items() if k != "name"}, "name", ERR_REQUIRED),
    ("name-number", {**CRON, "name": 7}, "name", ERR_NOT_STRING),
    (
        "description-too-long",
        {**CRON, "description": "d" * (MAX_DESCRIPTION_CHARS + 1)},
        "description",
        ERR_TOO_LONG.format(limit=MAX_DESCRIPTION_CHARS),
    ),
    ("description-number", {**CRON, "description": 5}, "description", ERR_NOT_STRING),
    ("queue-spaces", {**CRON, "queue": "Bad Queue"}, "queue", ERR_QUEUE_FORMAT),
    ("queue-upper", {**CRON, "queue": "HEAVY"}, "queue", ERR_QUEUE_FORMAT),
    ("queue-empty", {**CRON, "queue": ""}, "queue", ERR_QUEUE_FORMAT),
    ("queue-too-long", {**CRON, "queue": "q" * 65}, "queue", ANY),
    ("unknown-field", {**CRON, "colour": "red"}, "colour", ERR_UNKNOWN_FIELD),
    ("read-only-field", {**CRON, "next_fire_at": ahead(days=1)}, "next_fire_at", ANY),
    ("id-field", {**CRON, "id": 99}, "id", ANY),
]


@pytest.mark.parametrize(
    ("body", "field", "message"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_create_refuses_bad_input(admin_api, body, field, message):
    guard = NothingWritten()
    response = admin_api.post("/api/jobs/", body, format="json")
    assert_field_error(response, field, message)
    guard.check()


@pytest.mark.parametrize(
    ("body", "field", "message"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_update_refuses_bad_input(admin_api, body, field, message):
    """The same rules on PUT (body replaces the definition): 400, the job and version unchanged."""
    job = admin_api.post("/api/jobs/", {**CRON, "name": "existing"}, format="json").data
    guard = NothingWritten()
    body = {**body, "version": 1}
    response = admin_api.put(f"/api/jobs/{job['id']}/", body, format="json")
    assert_field_error(response, field, message)
    guard.check()


def test_update_errors_are_collected_per_field(admin_api):
    job = admin_api.post("/api/jobs/", CRON, format="json").data
    guard = NothingWritten()
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/",
        {"priority": 10**6, "cron_expression": "61 * * * *", "queue": "Q Q", "version": 1},
        format="json",
    )
    assert response.status_code == 400
    assert set(response.data) == {"priority", "cron_expression", "queue"}
    guard.check()


# --- accepted edge values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "check"),
    [
        pytest.param(CRON, {"timezone": "UTC"}, id="timezone-defaults-to-utc"),
        pytest.param(
            {**CRON, "timezone": "Europe/Berlin"}, {"timezone": "Europe/Berlin"}, id="timezone"
        ),
        pytest.param(cron("@daily"), {"cron_expression": "@daily"}, id="macro"),
        pytest.param(cron(" */5 * * * * "), {"cron_expression": "*/5 * * * *"}, id="stripped"),
        pytest.param(cron("30 */5 * * * *"), {"cron_expression": "30 */5 * * * *"}, id="seconds"),
        pytest.param(cron("0 0 29 2 *"), {"cron_expression": "0 0 29 2 *"}, id="leap-day"),
        # dom and dow both restricted: either matches (Vixie), so the 30th of February is no
        # obstacle when Mondays in February also fire.
        pytest.param(cron("0 0 30 2 1"), {"cron_expression": "0 0 30 2 1"}, id="dom-or-dow"),
        pytest.param(cron("0 0 * * 7"), {"cron_expression": "0 0 * * 7"}, id="sunday-as-7"),
        pytest.param(cron("0 0 * * mon-fri"), {}, id="weekday-names"),
        pytest.param({**CRON, "timezone": "UTC", "interval_seconds": None}, {}, id="null-other"),
        pytest.param({**INTERVAL, "interval_seconds": MAX_INTERVAL_S}, {}, id="interval-max"),
        pytest.param({**INTERVAL, "interval_seconds": "90"}, {"interval_seconds": 90}, id="numstr"),
        pytest.param({**INTERVAL, "spread_seconds": 59}, {"spread_seconds": 59}, id="spread<int"),
        pytest.param({**CRON, "timeout_seconds": None}, {"timeout_seconds": None}, id="no-timeout"),
        pytest.param({**CRON, "timeout_seconds": 30.0}, {"timeout_seconds": 30}, id="float-int"),
        pytest.param(
            {**CRON, "max_retries": MAX_RETRIES}, {"max_retries": MAX_RETRIES}, id="retries"
        ),
        pytest.param({**CRON, "priority": -MAX_PRIORITY}, {"priority": -MAX_PRIORITY}, id="prio"),
        pytest.param({**CRON, "retry_backoff_factor": 1}, {"retry_backoff_factor": 1.0}, id="f1"),
        pytest.param({**CRON, "name": "a.b:c@d/e+f-g_h 1"}, {}, id="name-charset"),
        pytest.param({**CRON, "name": "n" * MAX_NAME_CHARS}, {}, id="name-max"),
        pytest.param({**CRON, "queue": "q.heavy-1_x"}, {"queue": "q.heavy-1_x"}, id="queue"),
        pytest.param(
            {**CRON, "task": "sleep", "args": [0.5]}, {"args": [0.5]}, id="sleep-positional"
        ),
        pytest.param(
            {**CRON, "task": "log", "kwargs": {"message": "m", "level": "error"}}, {}, id="log"
        ),
    ],
)
def test_valid_edge_values_are_accepted(admin_api, body, check):
    response = admin_api.post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.data
    for field, value in check.items():
        assert response.data[field] == value


def test_once_in_the_past_is_refused(admin_api):
    guard = NothingWritten()
    run_at = ago(days=1)
    response = admin_api.post(
        "/api/jobs/",
        {"name": "late", "task": "noop", "schedule_type": "once", "run_at": run_at},
        format="json",
    )
    assert_field_error(
        response, "run_at", ERR_ONCE_IN_PAST.format(value=parse_datetime(run_at).isoformat())
    )
    guard.check()


@pytest.mark.parametrize("offset", [timedelta(0), timedelta(seconds=-30), timedelta(minutes=5)])
def test_once_due_now_is_accepted(admin_api, offset):
    run_at = timezone.now() + offset
    response = admin_api.post(
        "/api/jobs/",
        {"name": "now", "task": "noop", "schedule_type": "once", "run_at": run_at.isoformat()},
        format="json",
    )
    assert response.status_code == 201, response.data
    assert parse_datetime(response.data["next_fire_at"]) == run_at


def test_duplicate_name_is_400_on_name(admin_api):
    assert admin_api.post("/api/jobs/", CRON, format="json").status_code == 201
    guard = NothingWritten()
    response = admin_api.post("/api/jobs/", {**INTERVAL, "name": CRON["name"]}, format="json")
    assert_field_error(response, "name", ERR_NAME_TAKEN)
    guard.check()


def test_rename_to_a_taken_name_is_400_on_name(admin_api):
    admin_api.post("/api/jobs/", {**CRON, "name": "first"}, format="json")
    second = admin_api.post("/api/jobs/", {**CRON, "name": "second"}, format="json").data
    guard = NothingWritten()
    response = admin_api.patch(
        f"/api/jobs/{second['id']}/", {"name": "first", "version": 1}, format="json"
    )
    assert_field_error(response, "name", ERR_NAME_TAKEN)
    guard.check()


# --- request bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", ["[]", json.dumps([CRON]), '"a string"', "42", "null", "true"], ids=str
)
def test_body_not_an_object_is_400(admin_api, raw):
    guard = NothingWritten()
    response = admin_api.generic("POST", "/api/jobs/", raw, content_type="application/json")
    assert response.status_code == 400
    assert response.data["non_field_errors"] == [ERR_BODY_NOT_OBJECT]
    guard.check()


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "x", "priority": NaN}',
        '{"name": "x", "retry_backoff_max": Infinity}',
        '{"name": "x", "retry_backoff_base": -Infinity}',
        '{"name": "x", "args": [NaN]}',
        '{"name": "x",',
        "{'name': 'x'}",
        "\xff",
    ],
    ids=["nan", "infinity", "minus-infinity", "nan-in-args", "truncated", "single-quotes", "bytes"],
)
def test_non_standard_or_broken_json_is_a_parse_error(admin_api, raw):
    guard = NothingWritten()
    response = admin_api.generic("POST", "/api/jobs/", raw, content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in str(response.data["detail"])
    guard.check()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"priority": 1e400}', "priority"),
        ('{"retry_backoff_max": 1e400}', "retry_backoff_max"),
        ('{"timeout_seconds": -1e400}', "timeout_seconds"),
    ],
)
def test_overflowing_numbers_are_refused(admin_api, raw, field):
    body = json.loads(raw)  # json turns 1e400 into inf: the API must not store it
    guard = NothingWritten()
    text = json.dumps({**CRON, **body}).replace("Infinity", "1e400")
    response = admin_api.generic("POST", "/api/jobs/", text, content_type="application/json")
    assert_field_error(response, field, ANY)
    guard.check()


def test_deeply_nested_json_is_a_400_not_a_500(admin_api):
    guard = NothingWritten()
    depth = 20_000
    raw = json.dumps({**CRON, "kwargs": "HOLE"}).replace('"HOLE"', "[" * depth + "]" * depth)
    response = admin_api.generic("POST", "/api/jobs/", raw, content_type="application/json")
    assert response.status_code == 400
    guard.check()


def test_empty_body_is_400(admin_api):
    guard = NothingWritten()
    response = admin_api.generic("POST", "/api/jobs/", "", content_type="application/json")
    assert response.status_code == 400
    assert {"name", "task", "schedule_type"} <= set(response.data)
    guard.check()


def test_form_encoded_body_is_415(admin_api):
    guard = NothingWritten()
    response = admin_api.post("/api/jobs/", CRON, format="multipart")
    assert response.status_code == 415
    guard.check()


def test_body_over_request_limit_is_413(admin_api, settings):
    settings.SCHEDULER_MAX_REQUEST_BYTES = 1000
    guard = NothingWritten()
    response = admin_api.post("/api/jobs/", {**CRON, "description": "d" * 2000}, format="json")
    assert response.status_code == 413
    assert response.data["detail"] == ERR_TOO_LARGE.format(limit=1000)
    guard.check()
    # Just under the limit the same kind of body is fine.
    small = admin_api.post("/api/jobs/", {**CRON, "description": "d" * 500}, format="json")
    assert small.status_code == 201


def test_body_over_default_request_limit_is_413(admin_api, settings):
    guard = NothingWritten()
    size = settings.SCHEDULER_MAX_REQUEST_BYTES + 1
    response = admin_api.post("/api/jobs/", {**CRON, "description": "d" * size}, format="json")
    assert response.status_code == 413
    guard.check()


def test_update_body_over_limit_is_413(admin_api, settings):
    job = admin_api.post("/api/jobs/", CRON, format="json").data
    settings.SCHEDULER_MAX_REQUEST_BYTES = 500
    guard = NothingWritten()
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/", {"description": "d" * 1000, "version": 1}, format="json"
    )
    assert response.status_code == 413
    guard.check()


@pytest.mark.parametrize(
    ("body", "field", "size"),
    [
        ({"task": "log", "args": ["x" * 200]}, "args", len(json.dumps(["x" * 200]))),
        (
            {"task": "log", "kwargs": {"message": "x" * 200}},
            "kwargs",
            len(json.dumps({"message": "x" * 200}, separators=(",", ":"))),
        ),
    ],
)
def test_args_over_limit_are_400(admin_api, settings, body, field, size):
    settings.SCHEDULER_MAX_ARGS_BYTES = 100
    guard = NothingWritten()
    response = admin_api.post("/api/jobs/", {**CRON, **body}, format="json")
    assert_field_error(response, field, ERR_ARGS_TOO_LARGE.format(size=size, limit=100))
    guard.check()


# --- what tasks may reach (docs/security.md) -----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "status"),
    [
        ([], {"url": "https://allowed.example.com/ping"}, None, 201),
        ([], {"url": "https://ALLOWED.example.com/ping"}, None, 201),
        ([], {"url": "https://evil.example.com/"}, "kwargs", 400),
        (["https://evil.example.com/"], {}, "args", 400),
        ([], {"url": "https://allowed.example.com.evil.com/"}, "kwargs", 400),
        ([], {"url": "https://evil.com@allowed.example.com.evil.com/"}, "kwargs", 400),
        ([], {"url": "file:///etc/passwd"}, "kwargs", 400),
        ([], {"url": "http://127.0.0.1:6379/"}, "kwargs", 400),
        ([], {"url": "https://allowed.example.com/", "timeout": 10**6}, "kwargs", 400),
        ([], {"url": "https://allowed.example.com/", "method": "TRACE"}, "kwargs", 400),
        ([], {"url": "https://allowed.example.com/", "headers": {"X": "a\r\nB: c"}}, "kwargs", 400),
    ],
)
def test_http_request_only_reaches_allowlisted_hosts(
    admin_api, settings, args, kwargs, field, status
):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["allowed.example.com"]
    guard = NothingWritten()
    response = admin_api.post(
        "/api/jobs/",
        {**CRON, "task": "http_request", "args": args, "kwargs": kwargs},
        format="json",
    )
    assert response.status_code == status, response.data
    if field:
        assert_field_error(response, field, ANY)
        guard.check()


def test_http_request_refused_when_no_host_is_allowed(admin_api, settings):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = []
    guard = NothingWritten()
    response = admin_api.post(
        "/api/jobs/",
        {**CRON, "task": "http_request", "kwargs": {"url": "https://example.com/"}},
        format="json",
    )
    assert_field_error(response, "kwargs", ANY)
    guard.check()


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"command": "check"}, 201),
        ({"command": "flush"}, 400),
        ({"command": "shell"}, 400),
        ({"command": "check", "args": [1]}, 400),
        ({"command": "not-installed"}, 400),
    ],
)
def test_management_command_must_be_allowlisted(admin_api, settings, kwargs, status):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check", "not-installed"]
    guard = NothingWritten()
    response = admin_api.post(
        "/api/jobs/", {**CRON, "task": "management_command", "kwargs": kwargs}, format="json"
    )
    assert response.status_code == status, response.data
    if status == 400:
        assert_field_error(response, "kwargs", ANY)
        guard.check()


# --- clean_job directly --------------------------------------------------------------------------


def test_clean_job_returns_every_writable_field_with_defaults():
    now = timezone.now()
    values = clean_job(dict(CRON), now=now)
    assert set(values) == {"name", "task", *JOB_DEFAULTS, "schedule_type"}
    assert values["cron_expression"] == "* * * * *"
    assert values["timezone"] == "UTC"
    assert values["interval_seconds"] is None
    assert values["priority"] == 0 and values["enabled"] is True


def test_clean_job_collects_every_error():
    with pytest.raises(JobValidationError) as info:
        clean_job(
            {**INTERVAL, "interval_seconds": 0, "priority": "x", "queue": "Q", "bogus": 1},
            now=timezone.now(),
        )
    assert info.value.errors == {
        "bogus": [ERR_UNKNOWN_FIELD],
        "interval_seconds": [rng(1, MAX_INTERVAL_S)],
        "priority": [ERR_NOT_INTEGER],
        "queue": [ERR_QUEUE_FORMAT],
    }


def test_clean_job_merges_over_current_values():
    now = timezone.now()
    current = clean_job({**CRON, "timezone": "Europe/Berlin", "priority": 4}, now=now)
    values = clean_job({"description": "d"}, now=now, current=current)
    assert values["timezone"] == "Europe/Berlin"
    assert values["priority"] == 4
    assert values["description"] == "d"


def test_clean_job_resets_other_types_fields_when_the_type_changes():
    now = timezone.now()
    current = clean_job({**CRON, "timezone": "Europe/Berlin"}, now=now)
    values = clean_job(
        {"schedule_type": "interval", "interval_seconds": 30}, now=now, current=current
    )
    assert (values["cron_expression"], values["timezone"]) == ("", "UTC")


def test_clean_job_keeps_an_unchanged_past_run_at_of_an_existing_job():
    now = timezone.now()
    run_at = now + timedelta(minutes=1)
    current = clean_job(
        {"name": "o", "task": "noop", "schedule_type": "once", "run_at": run_at}, now=now
    )
    later = now + timedelta(days=2)  # the job fired long ago; editing its description is fine
    assert clean_job({"description": "x"}, now=later, current=current)["run_at"] == run_at
    with pytest.raises(JobValidationError) as info:
        clean_job({"run_at": run_at - timedelta(seconds=1)}, now=later, current=current)
    assert list(info.value.errors) == ["run_at"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5),
        (5.0, 5),
        (" 5 ", 5),
        ("5.5", ERR_NOT_INTEGER),
        (float("nan"), ERR_NOT_INTEGER),
        (float("inf"), ERR_NOT_INTEGER),
        ("1" * 5000, ERR_NOT_INTEGER),
    ],
)
def test_clean_job_integer_coercion(value, expected):
    body = {**CRON, "priority": value}
    if isinstance(expected, int):
        assert clean_job(body, now=timezone.now())["priority"] == expected
    else:
        with pytest.raises(JobValidationError) as info:
            clean_job(body, now=timezone.now())
        assert info.value.errors == {"priority": [expected]}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "-inf", True, None, [1.0]])
def test_clean_job_refuses_non_finite_numbers(value):
    with pytest.raises(JobValidationError) as info:
        clean_job({**CRON, "retry_backoff_base": value}, now=timezone.now())
    assert list(info.value.errors) == ["retry_backoff_base"]


def test_a_create_refuses_a_version(admin_api):
    """A create has no version to check: one sent is refused as the schema says (it was
    silently dropped)."""
    response = admin_api.post("/api/jobs/", {**CRON, "version": 99}, format="json")
    assert_field_error(response, "version", ERR_UNKNOWN_FIELD)
    assert not Job.objects.filter(name=CRON["name"]).exists()
