"""Schedule maths: when does a job fire next? (cron, interval, once)

Longer than most modules on purpose: one algorithm (a cron engine that gets DST right, and the
interval and one-off rules beside it), read top to bottom; split, it would scatter one reasoning.

Pure functions only: no database access and no clock of their own. Every function takes the
reference time as an argument, so the scheduler, the API preview and the tests all compute the
same answer for the same input. All datetimes going in must be timezone-aware; all datetimes
coming out are in UTC. Every "next after" result is strictly later than the reference time, so a
caller that feeds a result back in always makes progress.

Cron
----
A small cron engine of our own, because croniter gets DST wrong: with croniter 7.0.0,
``30 1 * * *`` in America/New_York fires twice on 2026-11-01 (01:30 EDT and again 01:30 EST, when
the clocks fall back); here it fires once, at the first 01:30 (tests/jobs/test_schedules.py covers
the fall-back and spring-forward cases). Expressions have 5 fields
``minute hour day-of-month month day-of-week`` (the second is then 0) or 6 fields with the
seconds first (``second minute hour dom month dow``, Quartz/Spring style). Each field accepts
``*``, numbers, ranges ``a-b``, steps ``*/n``, ``a-b/n`` and ``a/n`` (``a`` up to the field's
maximum), and lists ``a,b,c``; months take JAN-DEC and days of week SUN-SAT (case-insensitive);
day-of-week 0 and 7 are both Sunday; ``?`` means ``*`` in the two day fields. The macros
``@yearly @annually @monthly @weekly @daily @midnight @hourly`` are accepted.

Day matching follows Vixie cron: when both day-of-month and day-of-week are restricted, a day
matches if EITHER matches; otherwise both must match. As in Vixie cron, a field counts as
unrestricted when it starts with ``*`` (or ``?``), so ``*/2`` is "unrestricted" for this rule.

The search skips field by field (month, day, hour, minute, second jump straight to their next
allowed value), so even ``* * * * * *`` or ``0 0 29 2 *`` take microseconds.

An expression that can never fire (``0 0 30 2 *``, 30 February) is rejected when parsed. The
check is exact rather than a bounded search: every (month, day) pair, 29 February included,
falls on every weekday within the 400-year Gregorian cycle, so an expression fires iff some
allowed month has an allowed day-of-month that exists in it (or day-of-week alone decides).
A plain "search 8 years ahead" would wrongly reject e.g. ``0 0 29 2 */7`` (29 February AND a
Sunday: 2032, then 2060), so the search horizon for a next fire is one whole 400-year cycle.

Time zones and DST (the same as cronie / Vixie cron)
-----------------------------------------------------
Cron fields are matched against LOCAL wall-clock time in the job's IANA time zone (``zoneinfo``).
A job is "fixed-hour" when its hour field does not start with ``*`` (``2``, ``1-3``, ``9,17``),
and "wildcard-hour" when it does (``*``, ``*/2``); this is Vixie cron's HR_STAR flag.

* Spring forward (a gap: local times that do not exist). A fixed-hour job whose time falls in
  the gap fires ONCE at the first instant after the gap (America/New_York 2026-03-08:
  ``30 2 * * *`` fires at 03:00 EDT = 07:00 UTC). A wildcard-hour job has no fire inside the
  gap; its next wall-clock match after the gap fires normally and nothing is made up.
* Fall back (an overlap: local times that happen twice). A fixed-hour job fires ONCE, at the
  first occurrence (fold=0) (``30 1 * * *`` in America/New_York on 2026-11-01 fires at
  05:30 UTC only). A wildcard-hour job fires at BOTH occurrences, i.e. it keeps firing every real
  interval (``*/30 * * * *`` fires at 05:00, 05:30, 06:00 and 06:30 UTC).

Those are the defaults (``DST_CRON``). A job may choose its own rule for each case instead:
``dst_repeated`` = ``first`` / ``last`` / ``both`` occurrences of a repeated wall time, and
``dst_missing`` = ``shift`` (fire once at the first instant after the gap) / ``skip`` (do not
fire) for a wall time that does not exist.

Interval and once
-----------------
Interval schedules are pure elapsed time in UTC; DST never affects them. The slots are
``anchor + k * interval_seconds`` with anchor = ``start_at`` or, when that is unset, the Unix
epoch (so a 60 s interval fires on whole minutes). The next fire after t is the smallest slot
> t and >= start_at. The maths is done in integer microseconds so nothing drifts.
``start_at`` only anchors interval schedules; cron and once schedules ignore it.

A once schedule fires at ``run_at`` if that is after the reference time, and never again.
"""

from __future__ import annotations

import calendar
import hashlib
from bisect import bisect_left
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import ExpressionDescriptor, Options

# Schedule types (the values of jobs.models.ScheduleType, repeated here so this module stays free
# of Django imports).
SCHEDULE_CRON = "cron"
SCHEDULE_INTERVAL = "interval"
SCHEDULE_ONCE = "once"
SCHEDULE_TYPES = (SCHEDULE_CRON, SCHEDULE_INTERVAL, SCHEDULE_ONCE)

# Job field names a ScheduleError can concern.
FIELD_CRON = "cron_expression"
FIELD_TIMEZONE = "timezone"
FIELD_INTERVAL = "interval_seconds"
FIELD_RUN_AT = "run_at"
FIELD_START_AT = "start_at"
FIELD_SCHEDULE_TYPE = "schedule_type"

# Same limit as Job.cron_expression's max_length; also bounds the parsing work per expression.
MAX_CRON_LENGTH = 200
# The most fire times next_fires() will compute (the API preview).
MAX_PREVIEW = 50
# How far ahead a cron search looks: the Gregorian calendar repeats every 400 years, so any
# expression that fires at all fires within this horizon.
CRON_SEARCH_HORIZON_YEARS = 400
# Parsed expressions memoised by parse_cron; far more than the number of distinct jobs we expect.
CRON_CACHE_SIZE = 1024

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MICROSECOND = timedelta(microseconds=1)
ONE_SECOND = timedelta(seconds=1)
MICROSECONDS_PER_SECOND = 1_000_000
SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
FIVE_FIELDS = 5
SIX_FIELDS = 6
DAYS_PER_WEEK = 7
# Longest each month can be (February in a leap year), for the "never fires" check.
LEAP_YEAR = 2000
MAX_DAYS_IN_MONTH = {month: calendar.monthrange(LEAP_YEAR, month)[1] for month in range(1, 13)}
# Bytes of the SHA-256 digest used for spread_offset: 64 bits make the modulo bias negligible.
SPREAD_HASH_BYTES = 8

# Error messages (tests assert on these; format them with the named placeholders).
ERR_TIMEZONE_REQUIRED = "timezone is required"
ERR_TIMEZONE_UNKNOWN = "unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin')"
ERR_CRON_EMPTY = "cron expression is empty"
ERR_CRON_TOO_LONG = "cron expression is longer than {limit} characters"
ERR_CRON_FIELD_COUNT = "expected 5 or 6 fields, got {count}"
ERR_CRON_UNKNOWN_MACRO = "unknown macro {macro!r}; expected one of {known}"
ERR_CRON_OUT_OF_RANGE = "{field} field: {value} is out of range {low}-{high}"
ERR_CRON_STEP_ZERO = "{field} field: step must be at least 1, got 0"
ERR_CRON_REVERSED_RANGE = "{field} field: range {start}-{end} is reversed (start is after end)"
ERR_CRON_BAD_TOKEN = "{field} field: {token!r} is not a valid value"
ERR_CRON_QUESTION_MARK = (
    "{field} field: '?' is only allowed in the day-of-month and day-of-week fields"
)
ERR_CRON_NEVER_FIRES = (
    "cron expression {expression!r} never fires: no allowed month has that day of the month"
)
ERR_CRON_NO_FIRE_IN_RANGE = "cron expression {expression!r} has no fire before year {year}"
ERR_CRON_REQUIRED = "cron_expression is required for a cron schedule"
ERR_INTERVAL_REQUIRED = "interval_seconds is required for an interval schedule"
ERR_INTERVAL_NOT_POSITIVE = "interval_seconds must be a positive whole number, got {value!r}"
ERR_RUN_AT_REQUIRED = "run_at is required for a once schedule"
ERR_UNKNOWN_SCHEDULE_TYPE = "unknown schedule type {value!r}; expected one of cron, interval, once"
ERR_NAIVE_DATETIME = "{name} must be timezone-aware, got a naive datetime"
ERR_SPREAD_NEGATIVE = "spread_seconds must not be negative, got {value!r}"
ERR_DST_POLICY = "{field} must be one of {allowed}, got {value!r}"

# DST rules a cron job may choose (``DST_CRON``: cronie's, by the hour field, as described above).
DST_CRON = "cron"
DST_FIRST, DST_LAST, DST_BOTH = "first", "last", "both"
DST_SHIFT, DST_SKIP = "shift", "skip"
DST_REPEATED = (DST_CRON, DST_FIRST, DST_LAST, DST_BOTH)
DST_MISSING = (DST_CRON, DST_SHIFT, DST_SKIP)
DST_REPEATED_WORDS = {
    DST_FIRST: "once, the first time",
    DST_LAST: "once, the second time",
    DST_BOTH: "both times",
}
DST_MISSING_WORDS = {DST_SHIFT: "fires just after the change", DST_SKIP: "does not fire"}
FIELD_DST_REPEATED = "dst_repeated"
FIELD_DST_MISSING = "dst_missing"

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Spelled out rather than taken from calendar.month_abbr, which follows the process locale.
_MONTH_ABBREVIATIONS = (
    "JAN",
    "FEB",
    "MAR",
    "APR",
    "MAY",
    "JUN",
    "JUL",
    "AUG",
    "SEP",
    "OCT",
    "NOV",
    "DEC",
)
_WEEKDAY_ABBREVIATIONS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
MONTH_NAMES = {name: number for number, name in enumerate(_MONTH_ABBREVIATIONS, start=1)}
WEEKDAY_NAMES = {name: number for number, name in enumerate(_WEEKDAY_ABBREVIATIONS)}
# Day-of-week 7 is an alias of 0 (Sunday).
SUNDAY_ALIAS = 7


class ScheduleError(ValueError):
    """Bad schedule input.

    ``field`` is the Job field it concerns ("cron_expression", "timezone", "interval_seconds",
    "run_at", "start_at", "schedule_type"); ``message`` (also ``str(exc)``) says what is wrong.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class _FieldDef:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None
    allows_question_mark: bool = False


SECOND_FIELD = _FieldDef("second", 0, 59)
MINUTE_FIELD = _FieldDef("minute", 0, 59)
HOUR_FIELD = _FieldDef("hour", 0, 23)
DOM_FIELD = _FieldDef("day-of-month", 1, 31, allows_question_mark=True)
MONTH_FIELD = _FieldDef("month", 1, 12, names=MONTH_NAMES)
DOW_FIELD = _FieldDef("day-of-week", 0, 7, names=WEEKDAY_NAMES, allows_question_mark=True)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field, sorted ascending.

    ``days_of_week`` uses 0 = Sunday .. 6 = Saturday (7 is folded into 0). The ``*_star`` flags
    record whether the field started with ``*``/``?``, which drives the Vixie day rule (dom/dow)
    and the DST rule (hour).
    """

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: tuple[int, ...]
    days_of_week: tuple[int, ...]
    dom_star: bool
    dow_star: bool
    hour_star: bool
    has_seconds: bool


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def validate_timezone(name: str) -> ZoneInfo:
    """Return the ZoneInfo for an IANA name, or raise ScheduleError(field="timezone")."""
    if not name:
        raise ScheduleError(FIELD_TIMEZONE, ERR_TIMEZONE_REQUIRED)
    try:
        return ZoneInfo(name)
    # ZoneInfo signals a bad key in several ways: not found (KeyError subclass), a malformed or
    # path-escaping key (ValueError), or a directory such as "America" (OSError).
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError) as exc:
        raise ScheduleError(FIELD_TIMEZONE, ERR_TIMEZONE_UNKNOWN.format(name=name)) from exc


def _require_aware(value: datetime, name: str, field: str | None = None) -> datetime:
    """Refuse a naive datetime: guessing its zone would silently shift fires by hours."""
    if value.tzinfo is None or value.utcoffset() is None:
        message = ERR_NAIVE_DATETIME.format(name=name)
        if field is None:
            raise ValueError(message)
        raise ScheduleError(field, message)
    return value


# --------------------------------------------------------------------------------------------
# Cron parsing
# --------------------------------------------------------------------------------------------


def _parse_value(token: str, fdef: _FieldDef) -> int:
    """One number or name, range-checked against the field."""
    upper = token.upper()
    if fdef.names is not None and upper in fdef.names:
        return fdef.names[upper]
    # isdecimal() rather than int(): int() would also accept "+5", " 5" and "5_0".
    if not token.isascii() or not token.isdecimal():
        raise ScheduleError(FIELD_CRON, ERR_CRON_BAD_TOKEN.format(field=fdef.name, token=token))
    value = int(token)
    if not fdef.low <= value <= fdef.high:
        raise ScheduleError(
            FIELD_CRON,
            ERR_CRON_OUT_OF_RANGE.format(
                field=fdef.name, value=value, low=fdef.low, high=fdef.high
            ),
        )
    return value


def _parse_item(item: str, fdef: _FieldDef) -> set[int]:
    """One comma-separated item: ``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n`` or ``a/n``."""
    if not item:
        raise ScheduleError(FIELD_CRON, ERR_CRON_BAD_TOKEN.format(field=fdef.name, token=item))
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isascii() or not step_text.isdecimal():
            raise ScheduleError(FIELD_CRON, ERR_CRON_BAD_TOKEN.format(field=fdef.name, token=item))
        step = int(step_text)
        if step == 0:
            raise ScheduleError(FIELD_CRON, ERR_CRON_STEP_ZERO.format(field=fdef.name))
    if base in ("*", "?"):
        if base == "?" and not fdef.allows_question_mark:
            raise ScheduleError(FIELD_CRON, ERR_CRON_QUESTION_MARK.format(field=fdef.name))
        start, end = fdef.low, fdef.high
    elif "-" in base:
        start_text, _, end_text = base.partition("-")
        if not start_text or not end_text or "-" in end_text:
            # "-5", "5-", "1-2-3": name the whole item, not an empty or partial piece of it.
            raise ScheduleError(FIELD_CRON, ERR_CRON_BAD_TOKEN.format(field=fdef.name, token=item))
        start, end = _parse_value(start_text, fdef), _parse_value(end_text, fdef)
        if start > end:
            raise ScheduleError(
                FIELD_CRON,
                ERR_CRON_REVERSED_RANGE.format(field=fdef.name, start=start, end=end),
            )
    else:
        start = _parse_value(base, fdef)
        # "a/n" means "from a to the field's maximum, every n" (Vixie/Quartz); a bare "a" is itself.
        end = fdef.high if slash else start
    return set(range(start, end + 1, step))


def _parse_field(text: str, fdef: _FieldDef) -> tuple[tuple[int, ...], bool]:
    """A whole field: returns (sorted allowed values, whether the field starts with * or ?)."""
    values: set[int] = set()
    for item in text.split(","):
        values |= _parse_item(item, fdef)
    # Vixie cron decides "unrestricted" by the field's first character (its DOM_STAR/DOW_STAR/
    # HR_STAR flags), not by whether every value is allowed.
    star = text[:1] in ("*", "?")
    return tuple(sorted(values)), star


def _fires_at_all(spec: CronSpec) -> bool:
    """Exact test of whether the day/month fields can ever match (see the module docstring)."""
    if not spec.dow_star and not spec.dom_star:
        # OR rule: every month contains every weekday, so the day-of-week side always matches.
        return True
    # AND rule (the day-of-week side is satisfiable in some year for any existing date), so only
    # the existence of an allowed day in an allowed month matters.
    return any(
        day <= MAX_DAYS_IN_MONTH[month] for month in spec.months for day in spec.days_of_month
    )


def _split_expression(expression: str) -> list[str]:
    if not expression or not expression.strip():
        raise ScheduleError(FIELD_CRON, ERR_CRON_EMPTY)
    if len(expression) > MAX_CRON_LENGTH:
        raise ScheduleError(FIELD_CRON, ERR_CRON_TOO_LONG.format(limit=MAX_CRON_LENGTH))
    text = expression.strip()
    if text.startswith("@"):
        macro = text.lower()
        if macro not in MACROS:
            raise ScheduleError(
                FIELD_CRON,
                ERR_CRON_UNKNOWN_MACRO.format(macro=text, known=", ".join(MACROS)),
            )
        text = MACROS[macro]
    parts = text.split()
    if len(parts) not in (FIVE_FIELDS, SIX_FIELDS):
        raise ScheduleError(FIELD_CRON, ERR_CRON_FIELD_COUNT.format(count=len(parts)))
    return parts


@lru_cache(maxsize=CRON_CACHE_SIZE)
def parse_cron(expression: str) -> CronSpec:
    """Parse and validate a cron expression; raise ScheduleError(field="cron_expression")."""
    parts = _split_expression(expression)
    has_seconds = len(parts) == SIX_FIELDS
    if not has_seconds:
        parts = ["0", *parts]
    second_text, minute_text, hour_text, dom_text, month_text, dow_text = parts
    seconds, _ = _parse_field(second_text, SECOND_FIELD)
    minutes, _ = _parse_field(minute_text, MINUTE_FIELD)
    hours, hour_star = _parse_field(hour_text, HOUR_FIELD)
    doms, dom_star = _parse_field(dom_text, DOM_FIELD)
    months, _ = _parse_field(month_text, MONTH_FIELD)
    dows, dow_star = _parse_field(dow_text, DOW_FIELD)
    spec = CronSpec(
        expression=expression.strip(),
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days_of_month=doms,
        months=months,
        days_of_week=tuple(sorted({0 if d == SUNDAY_ALIAS else d for d in dows})),
        dom_star=dom_star,
        dow_star=dow_star,
        hour_star=hour_star,
        has_seconds=has_seconds,
    )
    if not _fires_at_all(spec):
        raise ScheduleError(FIELD_CRON, ERR_CRON_NEVER_FIRES.format(expression=spec.expression))
    return spec


# --------------------------------------------------------------------------------------------
# Cron search in naive local wall-clock time
# --------------------------------------------------------------------------------------------


def _next_in(values: tuple[int, ...], start: int) -> int | None:
    """Smallest allowed value >= start, or None when the field must roll over."""
    index = bisect_left(values, start)
    return values[index] if index < len(values) else None


def _day_matches(spec: CronSpec, day: int, weekday: int) -> bool:
    dom_ok = day in spec.days_of_month
    dow_ok = weekday in spec.days_of_week
    if not spec.dom_star and not spec.dow_star:
        return dom_ok or dow_ok  # Vixie: both restricted -> either may match
    return dom_ok and dow_ok


def _next_day(spec: CronSpec, year: int, month: int, start_day: int) -> int | None:
    """First matching day >= start_day in this month, or None."""
    first_weekday, days_in_month = calendar.monthrange(year, month)
    # calendar counts Monday = 0; cron counts Sunday = 0.
    first_weekday = (first_weekday + 1) % DAYS_PER_WEEK
    for day in range(start_day, days_in_month + 1):
        if _day_matches(spec, day, (first_weekday + day - 1) % DAYS_PER_WEEK):
            return day
    return None


def _next_wall_match(spec: CronSpec, cursor: datetime) -> datetime | None:
    """Smallest naive wall-clock time (whole seconds) strictly after ``cursor`` that matches.

    Skips field by field: when a field has no allowed value left, the next larger unit is bumped
    and every smaller unit restarts at its minimum, so the loop runs a handful of times per
    month or year examined, never once per second.
    """
    try:
        start = cursor.replace(microsecond=0) + ONE_SECOND
    except OverflowError:
        return None
    year, month, day = start.year, start.month, start.day
    hour, minute, second = start.hour, start.minute, start.second
    last_year = min(MAXYEAR, year + CRON_SEARCH_HORIZON_YEARS)
    while year <= last_year:
        allowed_month = _next_in(spec.months, month)
        if allowed_month is None:
            year, month, day, hour, minute, second = year + 1, 1, 1, 0, 0, 0
            continue
        if allowed_month != month:
            month, day, hour, minute, second = allowed_month, 1, 0, 0, 0
        allowed_day = _next_day(spec, year, month, day)
        if allowed_day is None:
            month, day, hour, minute, second = month + 1, 1, 0, 0, 0
            continue
        if allowed_day != day:
            day, hour, minute, second = allowed_day, 0, 0, 0
        allowed_hour = _next_in(spec.hours, hour)
        if allowed_hour is None:
            day, hour, minute, second = day + 1, 0, 0, 0
            continue
        if allowed_hour != hour:
            hour, minute, second = allowed_hour, 0, 0
        allowed_minute = _next_in(spec.minutes, minute)
        if allowed_minute is None:
            hour, minute, second = hour + 1, 0, 0
            continue
        if allowed_minute != minute:
            minute, second = allowed_minute, 0
        allowed_second = _next_in(spec.seconds, second)
        if allowed_second is None:
            minute, second = minute + 1, 0
            continue
        return datetime(year, month, day, hour, minute, allowed_second)
    return None


# --------------------------------------------------------------------------------------------
# Mapping wall-clock times to instants (DST)
# --------------------------------------------------------------------------------------------

_NORMAL, _AMBIGUOUS, _GAP = "normal", "ambiguous", "gap"


def _transition_between(tz: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The UTC instant in (before, after] at which the offset changes to after's offset.

    Binary search in whole seconds: tzdata transitions are at whole seconds, and the range is at
    most the size of one DST jump, so this is ~12 steps for an hour.
    """
    target = after.astimezone(tz).utcoffset()
    low, high = 0, int((after - before).total_seconds())  # offset(before + high) == target
    while high - low > 1:
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(tz).utcoffset() == target:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


def _resolve(wall: datetime, tz: ZoneInfo) -> tuple[str, datetime, datetime]:
    """Classify a naive local time and return (kind, first, second) UTC instants.

    normal: first == second. ambiguous: first (fold=0) < second (fold=1). gap: first == second ==
    the transition instant, i.e. the first real instant after the missing wall-clock times.
    PEP 495: in a gap, fold=0 maps with the pre-transition offset and so lands LATER than fold=1.
    """
    fold0 = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    fold1 = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if fold0 == fold1:
        return _NORMAL, fold0, fold1
    if fold0 < fold1:
        return _AMBIGUOUS, fold0, fold1
    transition = _transition_between(tz, fold1, fold0)
    return _GAP, transition, transition


def _dst_rules(spec: CronSpec, repeated: str, missing: str) -> tuple[str, str]:
    """The job's DST rules, cronie's (by the hour field) where it chose ``DST_CRON``."""
    if repeated not in DST_REPEATED:
        raise ScheduleError(
            FIELD_DST_REPEATED,
            ERR_DST_POLICY.format(
                field=FIELD_DST_REPEATED, allowed=", ".join(DST_REPEATED), value=repeated
            ),
        )
    if missing not in DST_MISSING:
        raise ScheduleError(
            FIELD_DST_MISSING,
            ERR_DST_POLICY.format(
                field=FIELD_DST_MISSING, allowed=", ".join(DST_MISSING), value=missing
            ),
        )
    if repeated == DST_CRON:
        repeated = DST_BOTH if spec.hour_star else DST_FIRST
    if missing == DST_CRON:
        missing = DST_SKIP if spec.hour_star else DST_SHIFT
    return repeated, missing


def _cron_next(
    spec: CronSpec,
    tz: ZoneInfo,
    after: datetime,
    repeated: str = DST_CRON,
    missing: str = DST_CRON,
) -> datetime | None:
    """Earliest UTC fire instant strictly after ``after`` (aware, UTC); None if none exists."""
    repeated, missing = _dst_rules(spec, repeated, missing)
    try:
        return _cron_search(spec, tz, after, repeated, missing)
    except OverflowError:
        # Local or UTC arithmetic ran past datetime's year 9999 limit: no representable fire.
        return None


def _cron_search(
    spec: CronSpec, tz: ZoneInfo, after: datetime, repeated: str, missing: str
) -> datetime | None:
    """The search behind _cron_next, per the DST rules in the module docstring (``repeated`` and
    ``missing`` resolved: never DST_CRON here)."""
    local = after.astimezone(tz)
    wall = local.replace(tzinfo=None)
    best: datetime | None = None

    # Phase A. A job that fires at the second pass of an overlap (``last`` or ``both``): when
    # ``after`` lies in the first pass, wall times slightly BEFORE its own wall time still have a
    # second-pass instant that is later than ``after``; the first such match is the earliest.
    if repeated != DST_FIRST and local.fold == 0:
        kind, first, second = _resolve(wall, tz)
        if kind == _AMBIGUOUS:
            overlap = second - first  # size of the fall-back jump
            # The transition's local wall time is where the repeated wall-clock range starts.
            transition = _transition_between(tz, first, second)
            overlap_start = transition.astimezone(tz).replace(tzinfo=None)
            # A wall time w has a second-pass instant later than ``after`` iff w > wall - overlap.
            cursor = max(wall - overlap, overlap_start - ONE_MICROSECOND)
            candidate = _next_wall_match(spec, cursor)
            if candidate is not None and candidate <= wall:
                kind_c, _, second_c = _resolve(candidate, tz)
                if kind_c == _AMBIGUOUS and second_c > after:
                    best = second_c

    # Phase B. Walk matching wall times forward from ``after``'s wall time. ``earliest`` is the
    # smallest instant > after that a wall time can map to; it never decreases along this walk,
    # so once it reaches ``best`` no later wall time can do better.
    cursor = wall
    while True:
        candidate = _next_wall_match(spec, cursor)
        if candidate is None:
            return best
        kind, first, second = _resolve(candidate, tz)
        earliest = first if first > after else second
        if best is not None and earliest >= best:
            return best
        if kind == _GAP:
            fires = [] if missing == DST_SKIP else [first]
        elif kind == _AMBIGUOUS:
            fires = {DST_FIRST: [first], DST_LAST: [second], DST_BOTH: [first, second]}[repeated]
        else:
            fires = [first]
        for fire in fires:
            if fire > after and (best is None or fire < best):
                best = fire
        cursor = candidate
        if kind == _GAP and missing == DST_SKIP:
            # Nothing in the gap fires: resume at the gap's end.
            gap_end = first.astimezone(tz).replace(tzinfo=None)
            cursor = max(cursor, gap_end - ONE_MICROSECOND)
        elif kind == _AMBIGUOUS and repeated == DST_FIRST and first <= after:
            # ``after`` is in the second pass and the job only fires in the first one: no other
            # wall time of this overlap can fire, so resume at the overlap's end.
            transition = _transition_between(tz, first, second)
            overlap_end = transition.astimezone(tz).replace(tzinfo=None) + (second - first)
            cursor = max(cursor, overlap_end - ONE_MICROSECOND)


def cron_next_after(
    expression: str,
    tz_name: str,
    after: datetime,
    *,
    dst_repeated: str = DST_CRON,
    dst_missing: str = DST_CRON,
) -> datetime:
    """Next fire (UTC) of a cron expression in time zone ``tz_name``, strictly after ``after``."""
    _require_aware(after, "after")
    spec = parse_cron(expression)
    tz = validate_timezone(tz_name)
    result = _cron_next(spec, tz, after.astimezone(UTC), dst_repeated, dst_missing)
    if result is None:
        # Only reachable near datetime's year 9999 limit: parse_cron guarantees a fire otherwise.
        # (next_fire_after returns None here instead: "no further fire".)
        raise ScheduleError(
            FIELD_CRON, ERR_CRON_NO_FIRE_IN_RANGE.format(expression=spec.expression, year=MAXYEAR)
        )
    return result


# --------------------------------------------------------------------------------------------
# All schedule types
# --------------------------------------------------------------------------------------------


def _to_microseconds(value: datetime) -> int:
    # Integer microseconds since the epoch: exact, unlike float seconds.
    return (value - EPOCH) // ONE_MICROSECOND


def _check_interval(interval_seconds: int | None) -> int:
    if interval_seconds is None:
        raise ScheduleError(FIELD_INTERVAL, ERR_INTERVAL_REQUIRED)
    # bool is an int subclass; True is not a meaningful interval.
    if (
        isinstance(interval_seconds, bool)
        or not isinstance(interval_seconds, int)
        or interval_seconds <= 0
    ):
        raise ScheduleError(
            FIELD_INTERVAL, ERR_INTERVAL_NOT_POSITIVE.format(value=interval_seconds)
        )
    return interval_seconds


def _interval_next(after: datetime, interval_seconds: int, start_at: datetime | None) -> datetime:
    anchor = start_at if start_at is not None else EPOCH
    anchor_us = _to_microseconds(anchor)
    after_us = _to_microseconds(after)
    interval_us = interval_seconds * MICROSECONDS_PER_SECOND
    if after_us < anchor_us:
        next_us = anchor_us  # the first slot is start_at itself
    else:
        next_us = anchor_us + ((after_us - anchor_us) // interval_us + 1) * interval_us
    return EPOCH + timedelta(microseconds=next_us)


def next_fire_after(
    *,
    schedule_type: str,
    after: datetime,
    cron_expression: str = "",
    timezone: str = "UTC",
    interval_seconds: int | None = None,
    start_at: datetime | None = None,
    run_at: datetime | None = None,
    dst_repeated: str = DST_CRON,
    dst_missing: str = DST_CRON,
) -> datetime | None:
    """The job's next nominal fire time (UTC) strictly after ``after``; None if it has none.

    Raises ValueError for a naive ``after`` and ScheduleError for bad schedule fields.
    """
    _require_aware(after, "after")
    after = after.astimezone(UTC)
    if schedule_type == SCHEDULE_CRON:
        if not cron_expression:
            raise ScheduleError(FIELD_CRON, ERR_CRON_REQUIRED)
        spec = parse_cron(cron_expression)
        tz = validate_timezone(timezone)
        return _cron_next(spec, tz, after, dst_repeated, dst_missing)
    if schedule_type == SCHEDULE_INTERVAL:
        interval = _check_interval(interval_seconds)
        if start_at is not None:
            start_at = _require_aware(start_at, FIELD_START_AT, FIELD_START_AT).astimezone(UTC)
        try:
            return _interval_next(after, interval, start_at)
        except OverflowError:
            return None  # past datetime's year 9999 limit: no representable next fire
    if schedule_type == SCHEDULE_ONCE:
        if run_at is None:
            raise ScheduleError(FIELD_RUN_AT, ERR_RUN_AT_REQUIRED)
        run_at = _require_aware(run_at, FIELD_RUN_AT, FIELD_RUN_AT).astimezone(UTC)
        return run_at if run_at > after else None
    raise ScheduleError(FIELD_SCHEDULE_TYPE, ERR_UNKNOWN_SCHEDULE_TYPE.format(value=schedule_type))


def next_fires(*, count: int, after: datetime, **schedule_kwargs: Any) -> list[datetime]:
    """Up to ``count`` (capped at MAX_PREVIEW) successive fire times after ``after``.

    ``schedule_kwargs`` are next_fire_after's schedule arguments. A negative count is treated as
    0 so a preview endpoint never fails on it.
    """
    fires: list[datetime] = []
    reference = after
    for _ in range(max(0, min(count, MAX_PREVIEW))):
        fire = next_fire_after(after=reference, **schedule_kwargs)
        if fire is None:
            break
        fires.append(fire)
        reference = fire
    return fires


# How far ahead, and how many, DST changes a preview shows (a zone changes twice a year at most).
DST_LOOKAHEAD_DAYS = 800
DST_PREVIEW_CHANGES = 2
# Fires shown per DST day at most (a job every second would fire 86,400 times).
DST_PREVIEW_FIRES = 30


@dataclass(frozen=True)
class DstDay:
    """A day the job's time zone changes its offset, and the job's fires that local day."""

    change: datetime  # the UTC instant of the change
    direction: str  # "forward" (a gap: spring) or "back" (an overlap: autumn)
    fires: list[datetime]
    more: bool  # more fires that day than DST_PREVIEW_FIRES


def dst_changes(
    tz_name: str, after: datetime, *, count: int = DST_PREVIEW_CHANGES
) -> list[datetime]:
    """The next ``count`` instants (UTC) after ``after`` at which the zone's offset changes,
    within DST_LOOKAHEAD_DAYS (none for a zone without DST)."""
    tz = validate_timezone(tz_name)
    found: list[datetime] = []
    # Whole seconds: the search below finds a change to the second, and tzdata's are on one.
    cursor = _require_aware(after, "after").astimezone(UTC).replace(microsecond=0)
    step = timedelta(hours=12)
    offset = cursor.astimezone(tz).utcoffset()
    for _ in range(DST_LOOKAHEAD_DAYS * 2):
        following = cursor + step
        next_offset = following.astimezone(tz).utcoffset()
        if next_offset != offset:
            found.append(_transition_between(tz, cursor, following))
            if len(found) >= count:
                break
        cursor, offset = following, next_offset
    return found


def dst_days(
    *,
    after: datetime,
    cron_expression: str,
    timezone: str = "UTC",
    dst_repeated: str = DST_CRON,
    dst_missing: str = DST_CRON,
    count: int = DST_PREVIEW_CHANGES,
) -> list[DstDay]:
    """A cron job's fires on each of the next ``count`` local days its zone changes offset, under
    its DST rules: what a preview shows so the choice can be seen."""
    spec = parse_cron(cron_expression)
    tz = validate_timezone(timezone)
    days = []
    for change in dst_changes(timezone, after, count=count):
        before = (change - ONE_MICROSECOND).astimezone(tz).utcoffset() or timedelta(0)
        direction = (
            "forward" if (change.astimezone(tz).utcoffset() or timedelta(0)) > before else "back"
        )
        local_day = (change - ONE_MICROSECOND).astimezone(tz).date()
        start = datetime.combine(local_day, datetime.min.time(), tzinfo=tz).astimezone(UTC)
        end = datetime.combine(
            local_day + timedelta(days=1), datetime.min.time(), tzinfo=tz
        ).astimezone(UTC)
        fires: list[datetime] = []
        cursor = start - ONE_MICROSECOND
        more = False
        while True:
            fire = _cron_next(spec, tz, cursor, dst_repeated, dst_missing)
            if fire is None or fire >= end:
                break
            if len(fires) == DST_PREVIEW_FIRES:
                more = True
                break
            fires.append(fire)
            cursor = fire
        days.append(DstDay(change, direction, fires, more))
    return days


# --------------------------------------------------------------------------------------------
# Descriptions
# --------------------------------------------------------------------------------------------


def describe_cron(expression: str) -> str:
    """Human description of a cron expression, e.g. "At 02:30 AM"; ScheduleError if invalid."""
    parse_cron(expression)  # validates with our own rules and messages
    parts = _split_expression(expression)  # also expands macros
    if len(parts) == FIVE_FIELDS:
        parts = ["0", *parts]
    # cron_descriptor guesses whether a 6-part expression starts with seconds or ends with a
    # year; giving it all 7 parts (seconds first, year "*") removes the guess.
    seven_parts = " ".join([*parts, "*"])
    options = Options()
    options.day_of_week_start_index_zero = True
    try:
        return ExpressionDescriptor(seven_parts, options).get_description()
    except Exception:
        # The expression is valid for our engine; a wording failure in the third-party library
        # must not break a page or an API response, so fall back to the expression itself.
        return f"Cron: {expression.strip()}"


_INTERVAL_UNITS: tuple[tuple[int, str], ...] = (
    (SECONDS_PER_DAY, "day"),
    (SECONDS_PER_HOUR, "hour"),
    (SECONDS_PER_MINUTE, "minute"),
    (1, "second"),
)


def _describe_interval(interval_seconds: int) -> str:
    # The largest unit that divides the interval exactly, so 90 s stays "90 seconds".
    for size, unit in _INTERVAL_UNITS:
        if interval_seconds % size == 0:
            amount = interval_seconds // size
            return f"Every {unit}" if amount == 1 else f"Every {amount} {unit}s"
    raise AssertionError("unreachable: every interval is a whole number of seconds")


def describe_schedule(
    *,
    schedule_type: str,
    cron_expression: str = "",
    interval_seconds: int | None = None,
    run_at: datetime | None = None,
    timezone: str = "UTC",
    dst_repeated: str = DST_CRON,
    dst_missing: str = DST_CRON,
) -> str:
    """One line for humans: "Every 90 seconds", "Once at 2026-12-01 10:00 UTC",
    "At 02:30 AM (Europe/Berlin)", and a cron job's DST rules when it chose its own."""
    if schedule_type == SCHEDULE_CRON:
        if not cron_expression:
            raise ScheduleError(FIELD_CRON, ERR_CRON_REQUIRED)
        validate_timezone(timezone)
        rules = []
        if dst_repeated != DST_CRON:
            rules.append(
                f"a repeated hour fires {DST_REPEATED_WORDS.get(dst_repeated, dst_repeated)}"
            )
        if dst_missing != DST_CRON:
            rules.append(f"a skipped hour {DST_MISSING_WORDS.get(dst_missing, dst_missing)}")
        tail = f"; DST: {', '.join(rules)}" if rules else ""
        return f"{describe_cron(cron_expression)} ({timezone}){tail}"
    if schedule_type == SCHEDULE_INTERVAL:
        return _describe_interval(_check_interval(interval_seconds))
    if schedule_type == SCHEDULE_ONCE:
        if run_at is None:
            raise ScheduleError(FIELD_RUN_AT, ERR_RUN_AT_REQUIRED)
        _require_aware(run_at, FIELD_RUN_AT, FIELD_RUN_AT)
        local = run_at.astimezone(validate_timezone(timezone))
        pattern = "%Y-%m-%d %H:%M:%S" if local.second or local.microsecond else "%Y-%m-%d %H:%M"
        return f"Once at {local.strftime(pattern)} {timezone}"
    raise ScheduleError(FIELD_SCHEDULE_TYPE, ERR_UNKNOWN_SCHEDULE_TYPE.format(value=schedule_type))


# --------------------------------------------------------------------------------------------
# Spreading load
# --------------------------------------------------------------------------------------------


def spread_offset(job_name: str, spread_seconds: int) -> float:
    """A stable per-job delay in [0, spread_seconds), so jobs sharing a slot don't stampede.

    Derived from SHA-256 of the name: Python's hash() is salted per process and would give each
    node of the cluster a different offset. The modulo is taken in integer microseconds so the
    result can never round up to spread_seconds itself.
    """
    if spread_seconds < 0:
        raise ValueError(ERR_SPREAD_NEGATIVE.format(value=spread_seconds))
    if spread_seconds == 0:
        return 0.0
    return _spread_offset(job_name, spread_seconds)


# A run's due instant is asked for three or four times between its claim and its start (each
# admission look, the misfire check), a hash each time: the recent jobs' offsets are kept.
@lru_cache(maxsize=1 << 16)
def _spread_offset(job_name: str, spread_seconds: int) -> float:
    digest = hashlib.sha256(job_name.encode("utf-8")).digest()
    number = int.from_bytes(digest[:SPREAD_HASH_BYTES], "big")
    return (number % (spread_seconds * MICROSECONDS_PER_SECOND)) / MICROSECONDS_PER_SECOND


__all__: list[str] = [
    "MAX_PREVIEW",
    "CronSpec",
    "ScheduleError",
    "cron_next_after",
    "describe_cron",
    "describe_schedule",
    "next_fire_after",
    "next_fires",
    "parse_cron",
    "spread_offset",
    "validate_timezone",
]
