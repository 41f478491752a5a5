"""Schedule maths: cron parsing and search, DST rules, interval/once, previews, descriptions.

Pure unit tests: ``jobs.schedules`` touches neither the database nor the clock.
"""

from __future__ import annotations

import calendar
import random
import sys
from bisect import bisect_right
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from jobs.schedules import (
    ERR_CRON_BAD_TOKEN,
    ERR_CRON_EMPTY,
    ERR_CRON_FIELD_COUNT,
    ERR_CRON_NEVER_FIRES,
    ERR_CRON_NO_FIRE_IN_RANGE,
    ERR_CRON_OUT_OF_RANGE,
    ERR_CRON_QUESTION_MARK,
    ERR_CRON_REQUIRED,
    ERR_CRON_REVERSED_RANGE,
    ERR_CRON_STEP_ZERO,
    ERR_CRON_TOO_LONG,
    ERR_CRON_UNKNOWN_MACRO,
    ERR_INTERVAL_NOT_POSITIVE,
    ERR_INTERVAL_REQUIRED,
    ERR_NAIVE_DATETIME,
    ERR_RUN_AT_REQUIRED,
    ERR_SPREAD_NEGATIVE,
    ERR_TIMEZONE_REQUIRED,
    ERR_TIMEZONE_UNKNOWN,
    ERR_UNKNOWN_SCHEDULE_TYPE,
    MACROS,
    MAX_CRON_LENGTH,
    MAX_PREVIEW,
    ScheduleError,
    cron_next_after,
    describe_cron,
    describe_schedule,
    next_fire_after,
    next_fires,
    parse_cron,
    spread_offset,
    validate_timezone,
)

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"
ALL_MINUTES = tuple(range(60))
ALL_HOURS = tuple(range(24))
ALL_DAYS = tuple(range(1, 32))
ALL_MONTHS = tuple(range(1, 13))
ALL_WEEKDAYS = tuple(range(7))
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron_sequence(expression: str, tz: str, after: datetime, count: int) -> list[datetime]:
    """``count`` successive fires, each found by feeding the previous one back in."""
    fires = []
    for _ in range(count):
        after = cron_next_after(expression, tz, after)
        fires.append(after)
    return fires


# ------------------------------------------------------------------------------------------
# ScheduleError and time zones
# ------------------------------------------------------------------------------------------


def test_schedule_error_carries_field_and_message() -> None:
    exc = ScheduleError("timezone", "nope")
    assert isinstance(exc, ValueError)
    assert exc.field == "timezone"
    assert exc.message == "nope"
    assert str(exc) == "nope"


@pytest.mark.parametrize("name", ["UTC", BERLIN, NEW_YORK, "Asia/Kolkata", "Etc/GMT+5"])
def test_validate_timezone_accepts_iana_names(name: str) -> None:
    assert validate_timezone(name) == ZoneInfo(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", ERR_TIMEZONE_REQUIRED),
        ("Mars/Olympus", ERR_TIMEZONE_UNKNOWN.format(name="Mars/Olympus")),
        ("America", ERR_TIMEZONE_UNKNOWN.format(name="America")),  # a directory, not a zone
        ("../etc/passwd", ERR_TIMEZONE_UNKNOWN.format(name="../etc/passwd")),
        ("/etc/passwd", ERR_TIMEZONE_UNKNOWN.format(name="/etc/passwd")),
        ("UTC ", ERR_TIMEZONE_UNKNOWN.format(name="UTC ")),
        ("Europe/Berlin\x00", ERR_TIMEZONE_UNKNOWN.format(name="Europe/Berlin\x00")),
    ],
)
def test_validate_timezone_rejects_bad_names(name: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        validate_timezone(name)
    assert info.value.field == "timezone"
    assert info.value.message == message


# ------------------------------------------------------------------------------------------
# Cron parsing
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # 5 fields: the second is 0.
        ("* * * * *", {"seconds": (0,), "minutes": ALL_MINUTES, "hours": ALL_HOURS}),
        ("*/15 * * * *", {"minutes": (0, 15, 30, 45)}),
        ("5/20 * * * *", {"minutes": (5, 25, 45)}),
        ("0-59/30 * * * *", {"minutes": (0, 30)}),
        ("1,2,3,10-12 * * * *", {"minutes": (1, 2, 3, 10, 11, 12)}),
        ("0 9-17/2 * * *", {"hours": (9, 11, 13, 15, 17)}),
        ("0 0 1,15 * *", {"days_of_month": (1, 15)}),
        ("0 0 * JAN,mar,Dec *", {"months": (1, 3, 12)}),
        ("0 0 * jan-MAR *", {"months": (1, 2, 3)}),
        ("0 0 * */4 *", {"months": (1, 5, 9)}),
        ("0 0 * * MON-FRI", {"days_of_week": (1, 2, 3, 4, 5)}),
        ("0 0 * * sun,Sat", {"days_of_week": (0, 6)}),
        ("0 0 * * 7", {"days_of_week": (0,)}),
        ("0 0 * * 0,7", {"days_of_week": (0,)}),
        ("0 0 * * 5-7", {"days_of_week": (0, 5, 6)}),
        ("0 0 ? * *", {"days_of_month": ALL_DAYS, "dom_star": True}),
        ("0 0 * * ?", {"days_of_week": ALL_WEEKDAYS, "dow_star": True}),
        ("  0   0 *\t* *  ", {"minutes": (0,), "hours": (0,)}),
        # 6 fields: the seconds come first.
        ("30 15 10 * * *", {"seconds": (30,), "minutes": (15,), "hours": (10,)}),
        ("*/10 * * * * *", {"seconds": (0, 10, 20, 30, 40, 50), "has_seconds": True}),
        ("0 30 9 ? * MON-FRI", {"seconds": (0,), "days_of_week": (1, 2, 3, 4, 5)}),
        ("* * * * *", {"has_seconds": False}),
        # Vixie flags: "unrestricted" means "starts with *", as in Vixie cron.
        (
            "0 0 */2 * 1",
            {"dom_star": True, "dow_star": False, "days_of_month": tuple(range(1, 32, 2))},
        ),
        ("0 0 1-31 * *", {"dom_star": False, "days_of_month": ALL_DAYS}),
        ("0 */3 * * *", {"hour_star": True, "hours": (0, 3, 6, 9, 12, 15, 18, 21)}),
        ("0 0-23 * * *", {"hour_star": False, "hours": ALL_HOURS}),
        ("0 2 * * *", {"hour_star": False}),
    ],
)
def test_parse_cron_valid(expression: str, expected: dict[str, object]) -> None:
    spec = parse_cron(expression)
    for attribute, value in expected.items():
        assert getattr(spec, attribute) == value, attribute


@pytest.mark.parametrize(("macro", "expansion"), sorted(MACROS.items()))
def test_parse_cron_macros(macro: str, expansion: str) -> None:
    expanded = parse_cron(expansion)
    for text in (macro, macro.upper()):
        spec = parse_cron(text)
        for attribute in ("seconds", "minutes", "hours", "days_of_month", "months", "days_of_week"):
            assert getattr(spec, attribute) == getattr(expanded, attribute)


def test_parse_cron_is_memoised() -> None:
    assert parse_cron("7 7 * * *") is parse_cron("7 7 * * *")


def _range_error(field: str, value: int, low: int, high: int) -> str:
    return ERR_CRON_OUT_OF_RANGE.format(field=field, value=value, low=low, high=high)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", ERR_CRON_EMPTY),
        ("   ", ERR_CRON_EMPTY),
        ("* " * 101, ERR_CRON_TOO_LONG.format(limit=MAX_CRON_LENGTH)),
        ("* * * *", ERR_CRON_FIELD_COUNT.format(count=4)),
        ("1 2 3 4 5 6 7", ERR_CRON_FIELD_COUNT.format(count=7)),
        ("61 * * * * *", _range_error("second", 61, 0, 59)),
        ("60 * * * *", _range_error("minute", 60, 0, 59)),
        ("0 24 * * *", _range_error("hour", 24, 0, 23)),
        ("0 0 32 * *", _range_error("day-of-month", 32, 1, 31)),
        ("0 0 0 * *", _range_error("day-of-month", 0, 1, 31)),
        ("0 0 * 13 *", _range_error("month", 13, 1, 12)),
        ("0 0 * 0 *", _range_error("month", 0, 1, 12)),
        ("0 0 * * 8", _range_error("day-of-week", 8, 0, 7)),
        ("0 10-25 * * *", _range_error("hour", 25, 0, 23)),
        ("*/0 * * * *", ERR_CRON_STEP_ZERO.format(field="minute")),
        ("0 0 1-5/0 * *", ERR_CRON_STEP_ZERO.format(field="day-of-month")),
        ("30-10 * * * *", ERR_CRON_REVERSED_RANGE.format(field="minute", start=30, end=10)),
        ("0 0 * * FRI-MON", ERR_CRON_REVERSED_RANGE.format(field="day-of-week", start=5, end=1)),
        ("abc * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="abc")),
        ("1,,2 * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="")),
        ("*/x * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="*/x")),
        ("-5 * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="-5")),
        ("1-2-3 * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="1-2-3")),
        ("MON * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="MON")),
        ("0 0 * JAN *x", ERR_CRON_BAD_TOKEN.format(field="day-of-week", token="*x")),
        ("0 0 * * JAN", ERR_CRON_BAD_TOKEN.format(field="day-of-week", token="JAN")),
        ("\u0665 * * * *", ERR_CRON_BAD_TOKEN.format(field="minute", token="\u0665")),
        ("? * * * *", ERR_CRON_QUESTION_MARK.format(field="minute")),
        ("@reboot", ERR_CRON_UNKNOWN_MACRO.format(macro="@reboot", known=", ".join(MACROS))),
        ("0 0 30 2 *", ERR_CRON_NEVER_FIRES.format(expression="0 0 30 2 *")),
        ("0 0 31 4,6,9,11 *", ERR_CRON_NEVER_FIRES.format(expression="0 0 31 4,6,9,11 *")),
        ("0 0 0 30-31 FEB ?", ERR_CRON_NEVER_FIRES.format(expression="0 0 0 30-31 FEB ?")),
        ("0 0 31 2 */2", ERR_CRON_NEVER_FIRES.format(expression="0 0 31 2 */2")),
    ],
)
def test_parse_cron_invalid(expression: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        parse_cron(expression)
    assert info.value.field == "cron_expression"
    assert info.value.message == message


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 29 2 *",  # leap days exist
        "0 0 30 2 1",  # 30 February OR any Monday: the OR rule makes it fire
        "0 0 31 2,3 *",  # 31 March exists
    ],
)
def test_parse_cron_accepts_expressions_that_fire_somewhere(expression: str) -> None:
    parse_cron(expression)


# ------------------------------------------------------------------------------------------
# Cron search (UTC and plain time zones)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        (
            "*/15 * * * *",
            utc(2026, 5, 10, 10, 7, 30),
            [utc(2026, 5, 10, 10, 15), utc(2026, 5, 10, 10, 30), utc(2026, 5, 10, 10, 45)],
        ),
        # Strictly after: a fire exactly at ``after`` is not returned.
        (
            "0 * * * *",
            utc(2026, 5, 10, 10),
            [utc(2026, 5, 10, 11), utc(2026, 5, 10, 12), utc(2026, 5, 10, 13)],
        ),
        (
            "* * * * *",
            datetime(2026, 5, 10, 10, 0, 59, 999999, tzinfo=UTC),
            [utc(2026, 5, 10, 10, 1), utc(2026, 5, 10, 10, 2), utc(2026, 5, 10, 10, 3)],
        ),
        (
            "30 2 * * *",
            utc(2026, 5, 10, 2, 30),
            [utc(2026, 5, 11, 2, 30), utc(2026, 5, 12, 2, 30), utc(2026, 5, 13, 2, 30)],
        ),
        # 2026-05-15 is a Friday.
        (
            "0 9 * * MON-FRI",
            utc(2026, 5, 15, 10),
            [utc(2026, 5, 18, 9), utc(2026, 5, 19, 9), utc(2026, 5, 20, 9)],
        ),
        (
            "0 0 1 * *",
            utc(2026, 12, 15),
            [utc(2027, 1, 1), utc(2027, 2, 1), utc(2027, 3, 1)],
        ),
        ("@yearly", utc(2026, 6, 1), [utc(2027, 1, 1), utc(2028, 1, 1), utc(2029, 1, 1)]),
        (
            "@weekly",  # Sundays; 2026-06-01 is a Monday
            utc(2026, 6, 1),
            [utc(2026, 6, 7), utc(2026, 6, 14), utc(2026, 6, 21)],
        ),
        (
            "0 0 31 * *",
            utc(2026, 1, 31),
            [utc(2026, 3, 31), utc(2026, 5, 31), utc(2026, 7, 31)],
        ),
        (
            "59 23 31 12 *",
            utc(2026, 12, 31, 23, 59),
            [utc(2027, 12, 31, 23, 59), utc(2028, 12, 31, 23, 59), utc(2029, 12, 31, 23, 59)],
        ),
        (
            "*/10 * * * * *",
            utc(2026, 5, 10, 10, 0, 5),
            [utc(2026, 5, 10, 10, 0, 10), utc(2026, 5, 10, 10, 0, 20), utc(2026, 5, 10, 10, 0, 30)],
        ),
        (
            "15 30 2 * * *",
            utc(2026, 5, 10, 2, 30, 15),
            [utc(2026, 5, 11, 2, 30, 15), utc(2026, 5, 12, 2, 30, 15), utc(2026, 5, 13, 2, 30, 15)],
        ),
        (
            "* * * * * *",
            utc(2026, 12, 31, 23, 59, 58),
            [utc(2026, 12, 31, 23, 59, 59), utc(2027, 1, 1), utc(2027, 1, 1, 0, 0, 1)],
        ),
        (
            "0 0 12 * * ?",
            utc(2026, 2, 28, 12),
            [utc(2026, 3, 1, 12), utc(2026, 3, 2, 12), utc(2026, 3, 3, 12)],
        ),
    ],
)
def test_cron_next_in_utc(expression: str, after: datetime, expected: list[datetime]) -> None:
    fires = cron_sequence(expression, "UTC", after, len(expected))
    assert fires == expected
    assert all(fire.tzinfo is UTC for fire in fires)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # Both restricted: the 1st of the month OR a Monday. 2026-03-01 is a Sunday.
        (
            "0 0 1 * 1",
            utc(2026, 2, 28, 12),
            [
                utc(2026, 3, 1),
                utc(2026, 3, 2),
                utc(2026, 3, 9),
                utc(2026, 3, 16),
                utc(2026, 3, 23),
                utc(2026, 3, 30),
                utc(2026, 4, 1),
                utc(2026, 4, 6),
            ],
        ),
        # 13th OR Friday: 2026-02-13 is both and fires once.
        (
            "0 0 13 * FRI",
            utc(2026, 2, 1),
            [utc(2026, 2, 6), utc(2026, 2, 13), utc(2026, 2, 20), utc(2026, 2, 27)],
        ),
        # Day-of-week is *: only the day-of-month counts.
        ("0 0 1 * *", utc(2026, 2, 28, 12), [utc(2026, 3, 1), utc(2026, 4, 1)]),
        # Day-of-month is ?: only the day-of-week counts.
        ("0 0 ? * MON", utc(2026, 2, 28, 12), [utc(2026, 3, 2), utc(2026, 3, 9)]),
        # Vixie: "*/2" starts with *, so it is ANDed: odd days that are Mondays.
        (
            "0 0 */2 * 1",
            utc(2026, 2, 28, 12),
            [utc(2026, 3, 9), utc(2026, 3, 23), utc(2026, 4, 13)],
        ),
    ],
)
def test_cron_day_of_month_and_day_of_week_rule(
    expression: str, after: datetime, expected: list[datetime]
) -> None:
    assert cron_sequence(expression, "UTC", after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 0 29 2 *", utc(2026, 1, 1), [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)]),
        # 2100 is not a leap year.
        ("0 0 29 2 *", utc(2096, 3, 1), [utc(2104, 2, 29)]),
        # 29 February that is also a Sunday (AND rule): every 28 years here, beyond any 8-year
        # search window, yet it fires.
        ("0 0 29 2 */7", utc(2026, 1, 1), [utc(2032, 2, 29), utc(2060, 2, 29)]),
    ],
)
def test_cron_leap_day(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert cron_sequence(expression, "UTC", after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "tz", "after", "expected"),
    [
        # Berlin is UTC+1 in winter, UTC+2 in summer.
        ("0 9 * * *", BERLIN, utc(2026, 1, 10), [utc(2026, 1, 10, 8), utc(2026, 1, 11, 8)]),
        ("0 9 * * *", BERLIN, utc(2026, 7, 10), [utc(2026, 7, 10, 7), utc(2026, 7, 11, 7)]),
        # Local midnight on the 1st: still the previous day in UTC.
        ("@monthly", BERLIN, utc(2026, 6, 15), [utc(2026, 6, 30, 22), utc(2026, 7, 31, 22)]),
        # New York is UTC-5 in winter, UTC-4 in summer.
        ("0 9 * * *", NEW_YORK, utc(2026, 1, 10), [utc(2026, 1, 10, 14), utc(2026, 1, 11, 14)]),
        ("0 9 * * *", NEW_YORK, utc(2026, 7, 10), [utc(2026, 7, 10, 13), utc(2026, 7, 11, 13)]),
        # Weekday is judged in local time: Friday 22:00 New York is Saturday 02/03:00 UTC.
        (
            "0 22 * * FRI",
            NEW_YORK,
            utc(2026, 5, 15),
            [utc(2026, 5, 16, 2), utc(2026, 5, 23, 2)],
        ),
        ("*/20 * * * *", NEW_YORK, utc(2026, 7, 10, 12, 1), [utc(2026, 7, 10, 12, 20)]),
    ],
)
def test_cron_next_in_time_zones(
    expression: str, tz: str, after: datetime, expected: list[datetime]
) -> None:
    assert cron_sequence(expression, tz, after, len(expected)) == expected


def test_cron_accepts_after_in_any_time_zone() -> None:
    after_berlin = datetime(2026, 5, 10, 12, 7, tzinfo=ZoneInfo(BERLIN))
    assert cron_next_after("*/15 * * * *", "UTC", after_berlin) == utc(2026, 5, 10, 10, 15)


# ------------------------------------------------------------------------------------------
# DST
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "expression", "after", "expected"),
    [
        # ---- America/New_York, spring forward 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC).
        # Fixed hour inside the gap: fires once at the first instant after it (03:00 EDT).
        pytest.param(
            NEW_YORK,
            "30 2 * * *",
            utc(2026, 3, 6, 12),
            [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)],
            id="ny-gap-fixed",
        ),
        pytest.param(
            NEW_YORK,
            "0,30 2 * * *",
            utc(2026, 3, 8, 6),
            [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6), utc(2026, 3, 9, 6, 30)],
            id="ny-gap-fixed-two-times-in-gap-fire-once",
        ),
        pytest.param(
            NEW_YORK,
            "* 2 * * *",
            utc(2026, 3, 8, 6, 58),
            [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6), utc(2026, 3, 9, 6, 1)],
            id="ny-gap-fixed-hour-every-minute",
        ),
        pytest.param(
            NEW_YORK,
            "30 2 * * *",
            utc(2026, 3, 8, 7),
            [utc(2026, 3, 9, 6, 30)],
            id="ny-gap-fixed-after-the-compensating-fire",
        ),
        # Wildcard hour: nothing in the gap, nothing made up.
        pytest.param(
            NEW_YORK,
            "30 * * * *",
            utc(2026, 3, 8, 6),
            [utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 30), utc(2026, 3, 8, 8, 30)],
            id="ny-gap-wildcard",
        ),
        pytest.param(
            NEW_YORK,
            "*/30 * * * *",
            utc(2026, 3, 8, 6),
            [utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7), utc(2026, 3, 8, 7, 30)],
            id="ny-gap-wildcard-every-30",
        ),
        pytest.param(
            NEW_YORK,
            "0 */2 * * *",
            utc(2026, 3, 8, 5, 30),
            [utc(2026, 3, 8, 8), utc(2026, 3, 8, 10)],
            id="ny-gap-wildcard-step-hour",
        ),
        # ---- America/New_York, fall back 2026-11-01: 02:00 EDT -> 01:00 EST (06:00 UTC);
        # 01:00-01:59 local happens at 05:00-05:59 UTC and again at 06:00-06:59 UTC.
        pytest.param(
            NEW_YORK,
            "30 1 * * *",
            utc(2026, 10, 31, 12),
            [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
            id="ny-overlap-fixed-first-occurrence-only",
        ),
        pytest.param(
            NEW_YORK,
            "30 1 * * *",
            utc(2026, 11, 1, 5, 30),
            [utc(2026, 11, 2, 6, 30)],
            id="ny-overlap-fixed-not-again",
        ),
        pytest.param(
            NEW_YORK,
            "30 1 * * *",
            utc(2026, 11, 1, 6, 10),
            [utc(2026, 11, 2, 6, 30)],
            id="ny-overlap-fixed-from-second-pass",
        ),
        pytest.param(
            NEW_YORK,
            "*/30 * * * *",
            utc(2026, 11, 1, 4, 45),
            [
                utc(2026, 11, 1, 5),
                utc(2026, 11, 1, 5, 30),
                utc(2026, 11, 1, 6),
                utc(2026, 11, 1, 6, 30),
                utc(2026, 11, 1, 7),
            ],
            id="ny-overlap-wildcard-both-occurrences",
        ),
        pytest.param(
            NEW_YORK,
            "0 * * * *",
            utc(2026, 11, 1, 4, 30),
            [utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7)],
            id="ny-overlap-wildcard-hourly",
        ),
        # ``after`` in the first pass: the second pass of EARLIER wall times comes next.
        pytest.param(
            NEW_YORK,
            "*/30 * * * *",
            utc(2026, 11, 1, 5, 45),
            [utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7)],
            id="ny-overlap-wildcard-from-first-pass",
        ),
        pytest.param(
            NEW_YORK,
            "15 * * * *",
            utc(2026, 11, 1, 5, 45),
            [utc(2026, 11, 1, 6, 15), utc(2026, 11, 1, 7, 15)],
            id="ny-overlap-wildcard-earlier-minute-from-first-pass",
        ),
        pytest.param(
            NEW_YORK,
            "* * * * * *",
            utc(2026, 11, 1, 5, 59, 58),
            [utc(2026, 11, 1, 5, 59, 59), utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 0, 1)],
            id="ny-overlap-every-second-across-the-transition",
        ),
        # ---- Europe/Berlin, spring forward 2026-03-29: 02:00 CET -> 03:00 CEST (01:00 UTC).
        pytest.param(
            BERLIN,
            "30 2 * * *",
            utc(2026, 3, 27, 12),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)],
            id="berlin-gap-fixed",
        ),
        pytest.param(
            BERLIN,
            "*/30 * * * *",
            utc(2026, 3, 29, 0, 15),
            [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30)],
            id="berlin-gap-wildcard-every-30",
        ),
        pytest.param(
            BERLIN,
            "30 * * * *",
            utc(2026, 3, 29, 0, 45),
            [utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 2, 30)],
            id="berlin-gap-wildcard",
        ),
        # ---- Europe/Berlin, fall back 2026-10-25: 03:00 CEST -> 02:00 CET (01:00 UTC);
        # 02:00-02:59 local happens at 00:00-00:59 UTC and again at 01:00-01:59 UTC.
        pytest.param(
            BERLIN,
            "30 2 * * *",
            utc(2026, 10, 24, 12),
            [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
            id="berlin-overlap-fixed-first-occurrence-only",
        ),
        pytest.param(
            BERLIN,
            "*/30 * * * *",
            utc(2026, 10, 24, 23, 45),
            [
                utc(2026, 10, 25, 0),
                utc(2026, 10, 25, 0, 30),
                utc(2026, 10, 25, 1),
                utc(2026, 10, 25, 1, 30),
                utc(2026, 10, 25, 2),
            ],
            id="berlin-overlap-wildcard-both-occurrences",
        ),
        pytest.param(
            BERLIN,
            "0 * * * *",
            utc(2026, 10, 24, 23, 30),
            [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2)],
            id="berlin-overlap-wildcard-hourly",
        ),
        pytest.param(
            BERLIN,
            "*/20 * * * *",
            utc(2026, 10, 25, 0, 50),
            [utc(2026, 10, 25, 1), utc(2026, 10, 25, 1, 20)],
            id="berlin-overlap-wildcard-from-first-pass",
        ),
        # ---- A 30-minute DST jump: Lord Howe, 2026-10-04 02:00 -> 02:30 (+10:30 -> +11).
        pytest.param(
            "Australia/Lord_Howe",
            "15 2 * * *",
            utc(2026, 10, 2),
            [utc(2026, 10, 2, 15, 45), utc(2026, 10, 3, 15, 30), utc(2026, 10, 4, 15, 15)],
            id="lord-howe-half-hour-gap-fixed",
        ),
        pytest.param(
            "Australia/Lord_Howe",
            "45 2 * * *",
            utc(2026, 10, 3),
            [utc(2026, 10, 3, 15, 45)],
            id="lord-howe-after-half-hour-gap",
        ),
    ],
)
def test_cron_dst(tz: str, expression: str, after: datetime, expected: list[datetime]) -> None:
    assert cron_sequence(expression, tz, after, len(expected)) == expected


def _fires_between(expression: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    fires = []
    after = start
    while (after := cron_next_after(expression, tz, after)) < end:
        fires.append(after)
    return fires


@pytest.mark.parametrize(
    ("tz", "day_start", "expression", "expected_count"),
    [
        # Fall back: a wildcard-hour job keeps firing every real minute (25 h day).
        (NEW_YORK, utc(2026, 11, 1, 4), "* * * * *", 25 * 60),
        (BERLIN, utc(2026, 10, 24, 22), "* * * * *", 25 * 60),
        # ... a fixed-hour job covers its repeated hour only once.
        (NEW_YORK, utc(2026, 11, 1, 4), "* 1 * * *", 60),
        (BERLIN, utc(2026, 10, 24, 22), "* 2 * * *", 60),
        # Spring forward: a 23 h day; the missing hour's fixed-hour job fires once.
        (NEW_YORK, utc(2026, 3, 8, 5), "* * * * *", 23 * 60),
        (BERLIN, utc(2026, 3, 28, 23), "* * * * *", 23 * 60),
        (NEW_YORK, utc(2026, 3, 8, 5), "* 2 * * *", 1),
        (BERLIN, utc(2026, 3, 28, 23), "* 2 * * *", 1),
        (BERLIN, utc(2026, 3, 28, 23), "0 */1 * * *", 23),
        (BERLIN, utc(2026, 10, 24, 22), "0 */1 * * *", 25),
    ],
)
def test_cron_dst_day_totals(
    tz: str, day_start: datetime, expression: str, expected_count: int
) -> None:
    """Count the fires over the whole local day (local midnight to local midnight)."""
    local_midnight = day_start.astimezone(ZoneInfo(tz))
    assert (local_midnight.hour, local_midnight.minute) == (0, 0)
    next_midnight = datetime.combine(
        local_midnight.date() + timedelta(days=1), datetime.min.time(), ZoneInfo(tz)
    )
    fires = _fires_between(expression, tz, day_start - timedelta(microseconds=1), next_midnight)
    assert len(fires) == expected_count
    assert fires == sorted(set(fires))


# ------------------------------------------------------------------------------------------
# Brute-force cross-check (UTC, no DST): catches field-skipping bugs
# ------------------------------------------------------------------------------------------


def _random_field(
    rng: random.Random, low: int, high: int, names: tuple[str, ...] | None = None
) -> tuple[str, set[int]]:
    """A random cron field and the set of values it means, computed independently."""

    def value_text(value: int) -> str:
        if names is not None and rng.random() < 0.3 and value - low < len(names):
            name = names[value - low]
            return rng.choice([name, name.lower(), name.title()])
        return str(value)

    def item() -> tuple[str, set[int]]:
        kind = rng.choice(["number", "range", "step_star", "step_range", "step_from"])
        a, b = sorted(rng.sample(range(low, high + 1), 2))
        step = rng.randint(1, max(1, (high - low) // 2))
        if kind == "number":
            return value_text(a), {a}
        if kind == "range":
            return f"{value_text(a)}-{value_text(b)}", set(range(a, b + 1))
        if kind == "step_star":
            return f"*/{step}", set(range(low, high + 1, step))
        if kind == "step_range":
            return f"{a}-{b}/{step}", set(range(a, b + 1, step))
        return f"{a}/{step}", set(range(a, high + 1, step))

    if rng.random() < 0.35:
        return "*", set(range(low, high + 1))
    items = [item() for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return ",".join(text for text, _ in items), set().union(*(values for _, values in items))


def _random_expression(rng: random.Random, with_seconds: bool) -> tuple[str, dict]:
    fields = {
        "minute": _random_field(rng, 0, 59),
        "hour": _random_field(rng, 0, 23),
        "dom": _random_field(rng, 1, 31),
        "month": _random_field(rng, 1, 12, MONTH_NAMES),
        "dow": _random_field(rng, 0, 7, WEEKDAY_NAMES),
    }
    order = ["minute", "hour", "dom", "month", "dow"]
    if with_seconds:
        fields["second"] = _random_field(rng, 0, 59)
        order.insert(0, "second")
    expression = " ".join(fields[name][0] for name in order)
    sets = {name: values for name, (_, values) in fields.items()}
    sets["dow"] = {0 if day == 7 else day for day in sets["dow"]}
    sets["second"] = sets.get("second", {0})
    sets["dom_star"] = fields["dom"][0].startswith("*")
    sets["dow_star"] = fields["dow"][0].startswith("*")
    return expression, sets


def _reference_matches(sets: dict, moment: datetime) -> bool:
    """Straight from the rules, one moment at a time."""
    weekday = moment.isoweekday() % 7  # Sunday = 0
    dom_ok = moment.day in sets["dom"]
    dow_ok = weekday in sets["dow"]
    day_ok = (
        (dom_ok or dow_ok) if not sets["dom_star"] and not sets["dow_star"] else dom_ok and dow_ok
    )
    return (
        day_ok
        and moment.month in sets["month"]
        and moment.hour in sets["hour"]
        and moment.minute in sets["minute"]
        and moment.second in sets["second"]
    )


def _never_fires(sets: dict) -> bool:
    if not sets["dom_star"] and not sets["dow_star"]:
        return False
    # Longest each month can be: a leap year's lengths.
    lengths = {month: calendar.monthrange(2000, month)[1] for month in ALL_MONTHS}
    return not any(day <= lengths[month] for month in sets["month"] for day in sets["dom"])


def _check_random_starts(
    rng: random.Random, expression: str, expected: list[datetime], start: datetime, end: datetime
) -> None:
    """From arbitrary points (with microseconds) the next fire is the reference's next match."""
    span_us = (end - start) // timedelta(microseconds=1)
    for _ in range(RANDOM_STARTS_PER_EXPRESSION):
        after = start + timedelta(microseconds=rng.randrange(span_us))
        index = bisect_right(expected, after)
        fire = cron_next_after(expression, "UTC", after)
        if index < len(expected):
            assert fire == expected[index], (expression, after)
        else:
            assert fire >= end, (expression, after)


RANDOM_STARTS_PER_EXPRESSION = 10
# Window starts around month, year and leap-day boundaries.
BRUTE_FORCE_WINDOWS = [
    utc(2026, 1, 30),
    utc(2026, 2, 27),
    utc(2028, 2, 27),
    utc(2026, 4, 29, 12),
    utc(2026, 6, 14, 7),
    utc(2026, 12, 30),
    utc(2027, 8, 30, 20),
    utc(2030, 10, 1),
]
BRUTE_FORCE_DAYS = 3
BRUTE_FORCE_EXPRESSIONS_PER_WINDOW = 40


@pytest.mark.parametrize("window_start", BRUTE_FORCE_WINDOWS, ids=lambda d: d.date().isoformat())
def test_cron_matches_minute_by_minute_reference(window_start: datetime) -> None:
    rng = random.Random(window_start.toordinal())
    window_end = window_start + timedelta(days=BRUTE_FORCE_DAYS)
    minutes = []
    moment = window_start
    while moment < window_end:
        minutes.append(moment)
        moment += timedelta(minutes=1)
    checked = 0
    while checked < BRUTE_FORCE_EXPRESSIONS_PER_WINDOW:
        expression, sets = _random_expression(rng, with_seconds=False)
        # Bias the day fields towards the window so they are exercised, not just skipped.
        if rng.random() < 0.5:
            expression_parts = expression.split()
            expression_parts[3] = str(window_start.month)
            sets["month"] = {window_start.month}
            expression = " ".join(expression_parts)
        if _never_fires(sets):
            with pytest.raises(ScheduleError, match="never fires"):
                parse_cron(expression)
            continue
        expected = [m for m in minutes if _reference_matches(sets, m)]
        actual = _fires_between(expression, "UTC", window_start - timedelta(seconds=1), window_end)
        assert actual == expected, expression
        _check_random_starts(rng, expression, expected, window_start, window_end)
        checked += 1


@pytest.mark.parametrize("window_start", BRUTE_FORCE_WINDOWS[:4], ids=lambda d: d.isoformat())
def test_cron_six_fields_match_second_by_second_reference(window_start: datetime) -> None:
    rng = random.Random(window_start.toordinal() + 1)
    window_end = window_start + timedelta(hours=1)
    seconds = [window_start + timedelta(seconds=s) for s in range(3600)]
    checked = 0
    while checked < 15:
        expression, sets = _random_expression(rng, with_seconds=True)
        # Make the day/hour fields match the window so the seconds and minutes are what's tested.
        parts = expression.split()
        parts[2:6] = [str(window_start.hour), "*", "*", "*"]
        expression = " ".join(parts)
        sets.update(hour={window_start.hour}, dom=set(ALL_DAYS), month=set(ALL_MONTHS))
        sets.update(dow=set(ALL_WEEKDAYS), dom_star=True, dow_star=True)
        expected = [s for s in seconds if _reference_matches(sets, s)]
        actual = _fires_between(expression, "UTC", window_start - timedelta(seconds=1), window_end)
        assert actual == expected, expression
        _check_random_starts(rng, expression, expected, window_start, window_end)
        checked += 1


@pytest.mark.parametrize("tz", ["UTC", BERLIN, NEW_YORK, "Australia/Lord_Howe", "Asia/Kolkata"])
def test_cron_results_are_strictly_after_and_consistent(tz: str) -> None:
    rng = random.Random(tz)
    base = utc(2026, 1, 1)
    for _ in range(150):
        expression, sets = _random_expression(rng, with_seconds=rng.random() < 0.3)
        if _never_fires(sets):
            continue
        after = base + timedelta(
            seconds=rng.randrange(366 * 86400), microseconds=rng.randrange(10**6)
        )
        fire = cron_next_after(expression, tz, after)
        assert fire > after, expression
        assert fire.tzinfo is UTC
        # Nothing fires in between: asking from just before the fire finds the same fire.
        assert cron_next_after(expression, tz, fire - timedelta(microseconds=1)) == fire


def test_cron_with_no_fire_before_year_9999() -> None:
    after = utc(9999, 6, 1)
    with pytest.raises(ScheduleError) as info:
        cron_next_after("0 0 1 1 *", "UTC", after)
    assert info.value.field == "cron_expression"
    assert info.value.message == ERR_CRON_NO_FIRE_IN_RANGE.format(expression="0 0 1 1 *", year=9999)
    # next_fire_after reports "no further fire" instead, also where local time would overflow.
    assert next_fire_after(schedule_type="cron", after=after, cron_expression="0 0 1 1 *") is None
    assert (
        next_fire_after(
            schedule_type="cron",
            after=utc(9999, 12, 31, 23, 30),
            cron_expression="* * * * *",
            timezone=BERLIN,
        )
        is None
    )


# ------------------------------------------------------------------------------------------
# Speed
# ------------------------------------------------------------------------------------------


def _python_calls(func: Callable[[], object]) -> int:
    """How many Python function calls ``func`` makes: a measure of work that no machine's load
    changes (speed itself is the benchmark's: W4 times the leader's tick)."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        func()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize(
    ("expression", "most_calls"),
    [
        ("* * * * * *", 100),
        ("*/30 * * * *", 150),
        ("0 2 * * *", 200),  # 02:00 falls in New York's spring-forward gap once a year
        ("59 23 31 12 *", 300),  # once a year
        ("0 0 29 2 *", 600),  # once in four years
    ],
)
def test_cron_next_does_bounded_work_whatever_the_instant(expression: str, most_calls: int) -> None:
    """The next fire is found by jumping field by field, never by stepping through seconds or
    minutes: the work per computation stays small from any instant, across both of New York's
    daylight-saving transitions (the fall-back overlap is the costly path)."""
    cron_next_after(expression, NEW_YORK, utc(2026, 1, 1))  # parse once (memoised)
    instants = [
        utc(2026, 11, 1, 5, 30, 1) + timedelta(seconds=offset)
        for offset in range(0, 30 * 3600, 997)
    ] + [utc(2026, 3, 8, 6, 59, 59) + timedelta(seconds=offset) for offset in range(0, 7200, 601)]
    worst = max(
        _python_calls(lambda after=after: cron_next_after(expression, NEW_YORK, after))
        for after in instants
    )
    assert worst <= most_calls


# ------------------------------------------------------------------------------------------
# Interval and once
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "start_at", "after", "expected"),
    [
        # No start_at: slots aligned to the Unix epoch, so 60 s fires on whole minutes.
        (60, None, datetime(2026, 5, 10, 10, 0, 30, 500000, tzinfo=UTC), utc(2026, 5, 10, 10, 1)),
        (60, None, utc(2026, 5, 10, 10, 1), utc(2026, 5, 10, 10, 2)),  # strictly after
        (90, None, utc(1970, 1, 1), utc(1970, 1, 1, 0, 1, 30)),
        (3600, None, utc(2026, 5, 10, 10, 59, 59), utc(2026, 5, 10, 11)),
        # start_at in the past anchors the slots.
        (10, utc(2026, 1, 1, 0, 0, 7), utc(2026, 1, 1, 0, 0, 20), utc(2026, 1, 1, 0, 0, 27)),
        (10, utc(2026, 1, 1, 0, 0, 7), utc(2026, 1, 1, 0, 0, 27), utc(2026, 1, 1, 0, 0, 37)),
        # start_at in the future: the first fire is start_at itself ...
        (3600, utc(2026, 2, 1, 12), utc(2026, 1, 1), utc(2026, 2, 1, 12)),
        # ... and not again once ``after`` has reached it.
        (3600, utc(2026, 2, 1, 12), utc(2026, 2, 1, 12), utc(2026, 2, 1, 13)),
        # Microsecond anchors are kept exactly.
        (
            1,
            datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC),
            utc(2026, 1, 1, 5),
            datetime(2026, 1, 1, 5, 0, 0, 123456, tzinfo=UTC),
        ),
        (
            7,
            datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
            utc(2026, 1, 1),
            # 2000-01-01 to 2026-01-01 is 9497 days = 820540800 s = 7 * 117220114 + 2 s, so the
            # next slot is 5 s (and the anchor's 1 us) past midnight.
            datetime(2026, 1, 1, 0, 0, 5, 1, tzinfo=UTC),
        ),
        # start_at in another zone is the same instant.
        (
            60,
            datetime(2026, 1, 1, 1, 0, 15, tzinfo=ZoneInfo(BERLIN)),
            utc(2026, 1, 1, 0, 5),
            utc(2026, 1, 1, 0, 5, 15),
        ),
    ],
)
def test_interval_next(
    interval: int, start_at: datetime | None, after: datetime, expected: datetime
) -> None:
    fire = next_fire_after(
        schedule_type="interval", after=after, interval_seconds=interval, start_at=start_at
    )
    assert fire == expected
    assert fire.tzinfo is UTC


def test_interval_keeps_microseconds_without_drift() -> None:
    start_at = datetime(2026, 1, 1, 0, 0, 0, 123457, tzinfo=UTC)
    fires = next_fires(
        count=MAX_PREVIEW,
        after=utc(2026, 3, 1),
        schedule_type="interval",
        interval_seconds=3,
        start_at=start_at,
    )
    assert len(fires) == MAX_PREVIEW
    assert all(fire.microsecond == 123457 for fire in fires)
    assert all(b - a == timedelta(seconds=3) for a, b in pairwise(fires))


def test_interval_past_year_9999_has_no_fire() -> None:
    fire = next_fire_after(
        schedule_type="interval", after=utc(9999, 12, 31, 23, 59), interval_seconds=3600
    )
    assert fire is None


def test_interval_ignores_dst() -> None:
    """Hourly across New York's fall back: exactly one real hour apart, 25 fires that day."""
    fires = next_fires(
        count=5,
        after=utc(2026, 11, 1, 3, 30),
        schedule_type="interval",
        interval_seconds=3600,
        timezone=NEW_YORK,
    )
    assert fires == [utc(2026, 11, 1, hour) for hour in range(4, 9)]


@pytest.mark.parametrize(
    ("interval", "message"),
    [
        (None, ERR_INTERVAL_REQUIRED),
        (0, ERR_INTERVAL_NOT_POSITIVE.format(value=0)),
        (-5, ERR_INTERVAL_NOT_POSITIVE.format(value=-5)),
        (1.5, ERR_INTERVAL_NOT_POSITIVE.format(value=1.5)),
        (True, ERR_INTERVAL_NOT_POSITIVE.format(value=True)),
        ("60", ERR_INTERVAL_NOT_POSITIVE.format(value="60")),
    ],
)
def test_interval_rejects_bad_interval(interval: object, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        next_fire_after(schedule_type="interval", after=utc(2026, 1, 1), interval_seconds=interval)
    assert info.value.field == "interval_seconds"
    assert info.value.message == message


def test_interval_rejects_naive_start_at() -> None:
    with pytest.raises(ScheduleError) as info:
        next_fire_after(
            schedule_type="interval",
            after=utc(2026, 1, 1),
            interval_seconds=60,
            start_at=datetime(2026, 1, 1),
        )
    assert info.value.field == "start_at"
    assert info.value.message == ERR_NAIVE_DATETIME.format(name="start_at")


@pytest.mark.parametrize(
    ("run_at", "after", "expected"),
    [
        (utc(2026, 12, 1, 10), utc(2026, 1, 1), utc(2026, 12, 1, 10)),
        (utc(2026, 12, 1, 10), utc(2026, 12, 1, 10), None),  # not strictly after
        (utc(2026, 12, 1, 10), utc(2027, 1, 1), None),
        (datetime(2026, 12, 1, 11, tzinfo=ZoneInfo(BERLIN)), utc(2026, 1, 1), utc(2026, 12, 1, 10)),
    ],
)
def test_once(run_at: datetime, after: datetime, expected: datetime | None) -> None:
    fire = next_fire_after(schedule_type="once", after=after, run_at=run_at)
    assert fire == expected
    if fire is not None:
        assert fire.tzinfo is UTC


# ------------------------------------------------------------------------------------------
# next_fire_after: dispatch and errors
# ------------------------------------------------------------------------------------------


def test_next_fire_after_cron_uses_time_zone() -> None:
    fire = next_fire_after(
        schedule_type="cron",
        after=utc(2026, 7, 10),
        cron_expression="0 9 * * *",
        timezone=BERLIN,
    )
    assert fire == utc(2026, 7, 10, 7)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        (
            {"schedule_type": "weekly"},
            "schedule_type",
            ERR_UNKNOWN_SCHEDULE_TYPE.format(value="weekly"),
        ),
        ({"schedule_type": "cron"}, "cron_expression", ERR_CRON_REQUIRED),
        (
            {"schedule_type": "cron", "cron_expression": "* * *"},
            "cron_expression",
            ERR_CRON_FIELD_COUNT.format(count=3),
        ),
        (
            {"schedule_type": "cron", "cron_expression": "* * * * *", "timezone": "Mars/Olympus"},
            "timezone",
            ERR_TIMEZONE_UNKNOWN.format(name="Mars/Olympus"),
        ),
        (
            {"schedule_type": "cron", "cron_expression": "* * * * *", "timezone": ""},
            "timezone",
            ERR_TIMEZONE_REQUIRED,
        ),
        ({"schedule_type": "interval"}, "interval_seconds", ERR_INTERVAL_REQUIRED),
        ({"schedule_type": "once"}, "run_at", ERR_RUN_AT_REQUIRED),
        (
            {"schedule_type": "once", "run_at": datetime(2026, 1, 1)},
            "run_at",
            ERR_NAIVE_DATETIME.format(name="run_at"),
        ),
    ],
)
def test_next_fire_after_errors(kwargs: dict, field: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        next_fire_after(after=utc(2026, 1, 1), **kwargs)
    assert info.value.field == field
    assert info.value.message == message


NAIVE = datetime(2026, 1, 1, 12)


@pytest.mark.parametrize(
    "call",
    [
        lambda: cron_next_after("* * * * *", "UTC", NAIVE),
        lambda: next_fire_after(schedule_type="cron", after=NAIVE, cron_expression="* * * * *"),
        lambda: next_fire_after(schedule_type="interval", after=NAIVE, interval_seconds=60),
        lambda: next_fire_after(schedule_type="once", after=NAIVE, run_at=utc(2027, 1, 1)),
        lambda: next_fires(count=3, after=NAIVE, schedule_type="interval", interval_seconds=60),
    ],
    ids=["cron_next_after", "cron", "interval", "once", "next_fires"],
)
def test_naive_after_is_rejected(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="timezone-aware") as info:
        call()
    assert str(info.value) == ERR_NAIVE_DATETIME.format(name="after")


# ------------------------------------------------------------------------------------------
# next_fires (the preview)
# ------------------------------------------------------------------------------------------


def test_next_fires_cron() -> None:
    fires = next_fires(
        count=4, after=utc(2026, 5, 10, 10, 7), schedule_type="cron", cron_expression="*/15 * * * *"
    )
    assert fires == [
        utc(2026, 5, 10, 10, 15),
        utc(2026, 5, 10, 10, 30),
        utc(2026, 5, 10, 10, 45),
        utc(2026, 5, 10, 11),
    ]


@pytest.mark.parametrize(
    ("count", "expected_length"),
    [(0, 0), (-3, 0), (1, 1), (10, 10), (MAX_PREVIEW, MAX_PREVIEW), (1000, MAX_PREVIEW)],
)
def test_next_fires_count_is_capped(count: int, expected_length: int) -> None:
    fires = next_fires(
        count=count, after=utc(2026, 1, 1), schedule_type="interval", interval_seconds=60
    )
    assert len(fires) == expected_length
    assert fires == sorted(set(fires))
    assert all(fire > utc(2026, 1, 1) for fire in fires)


def test_next_fires_stops_when_the_schedule_ends() -> None:
    once = {"schedule_type": "once", "run_at": utc(2026, 6, 1)}
    assert next_fires(count=5, after=utc(2026, 1, 1), **once) == [utc(2026, 6, 1)]
    assert next_fires(count=5, after=utc(2026, 7, 1), **once) == []


# ------------------------------------------------------------------------------------------
# Descriptions
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "description"),
    [
        ("30 2 * * *", "At 02:30 AM"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("0 9 * * MON-FRI", "At 09:00 AM, Monday through Friday"),
        ("0 0 * * 7", "At 12:00 AM, only on Sunday"),
        ("0 0 1 1 *", "At 12:00 AM, on day 1 of the month, only in January"),
        ("@daily", "At 12:00 AM"),
        ("@hourly", "Every hour"),
        # 6 fields, seconds first
        ("*/10 * * * * *", "Every 10 seconds"),
        ("15 30 2 * * *", "At 02:30:15 AM"),
        ("0 30 9 ? * MON-FRI", "At 09:30 AM, Monday through Friday"),
        ("*/5 * * * * ?", "Every 5 seconds"),
    ],
)
def test_describe_cron(expression: str, description: str) -> None:
    assert describe_cron(expression) == description


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", ERR_CRON_EMPTY),
        ("0 24 * * *", _range_error("hour", 24, 0, 23)),
        ("0 0 30 2 *", ERR_CRON_NEVER_FIRES.format(expression="0 0 30 2 *")),
    ],
)
def test_describe_cron_rejects_invalid(expression: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        describe_cron(expression)
    assert info.value.field == "cron_expression"
    assert info.value.message == message


@pytest.mark.parametrize(
    ("kwargs", "description"),
    [
        ({"schedule_type": "interval", "interval_seconds": 90}, "Every 90 seconds"),
        ({"schedule_type": "interval", "interval_seconds": 1}, "Every second"),
        ({"schedule_type": "interval", "interval_seconds": 60}, "Every minute"),
        ({"schedule_type": "interval", "interval_seconds": 300}, "Every 5 minutes"),
        ({"schedule_type": "interval", "interval_seconds": 3600}, "Every hour"),
        ({"schedule_type": "interval", "interval_seconds": 5400}, "Every 90 minutes"),
        ({"schedule_type": "interval", "interval_seconds": 172800}, "Every 2 days"),
        ({"schedule_type": "once", "run_at": utc(2026, 12, 1, 10)}, "Once at 2026-12-01 10:00 UTC"),
        (
            {"schedule_type": "once", "run_at": utc(2026, 12, 1, 10, 0, 30)},
            "Once at 2026-12-01 10:00:30 UTC",
        ),
        (
            {"schedule_type": "once", "run_at": utc(2026, 12, 1, 10), "timezone": BERLIN},
            "Once at 2026-12-01 11:00 Europe/Berlin",
        ),
        (
            {"schedule_type": "cron", "cron_expression": "30 2 * * *", "timezone": BERLIN},
            "At 02:30 AM (Europe/Berlin)",
        ),
        ({"schedule_type": "cron", "cron_expression": "*/15 * * * *"}, "Every 15 minutes (UTC)"),
    ],
)
def test_describe_schedule(kwargs: dict, description: str) -> None:
    assert describe_schedule(**kwargs) == description


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        (
            {"schedule_type": "hourly"},
            "schedule_type",
            ERR_UNKNOWN_SCHEDULE_TYPE.format(value="hourly"),
        ),
        ({"schedule_type": "cron"}, "cron_expression", ERR_CRON_REQUIRED),
        (
            {"schedule_type": "cron", "cron_expression": "* * * * *", "timezone": "Mars/Olympus"},
            "timezone",
            ERR_TIMEZONE_UNKNOWN.format(name="Mars/Olympus"),
        ),
        (
            {"schedule_type": "interval", "interval_seconds": 0},
            "interval_seconds",
            ERR_INTERVAL_NOT_POSITIVE.format(value=0),
        ),
        ({"schedule_type": "once"}, "run_at", ERR_RUN_AT_REQUIRED),
    ],
)
def test_describe_schedule_errors(kwargs: dict, field: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        describe_schedule(**kwargs)
    assert info.value.field == field
    assert info.value.message == message


# ------------------------------------------------------------------------------------------
# spread_offset
# ------------------------------------------------------------------------------------------


def test_spread_offset_is_stable_across_processes() -> None:
    # A fixed value: Python's salted hash() would differ from run to run (and node to node).
    assert spread_offset("nightly-report", 3600) == 1558.059143
    assert spread_offset("nightly-report", 60) == 58.059143


@pytest.mark.parametrize("spread", [1, 7, 60, 3600, 86400])
def test_spread_offset_range_and_spread(spread: int) -> None:
    offsets = [spread_offset(f"job-{index}", spread) for index in range(2000)]
    assert all(0 <= offset < spread for offset in offsets)
    assert offsets == [spread_offset(f"job-{index}", spread) for index in range(2000)]
    # Roughly uniform: the mean sits near the middle and many distinct values occur.
    assert 0.4 * spread < sum(offsets) / len(offsets) < 0.6 * spread
    assert len(set(offsets)) > 1900


def test_spread_offset_zero_and_negative() -> None:
    assert spread_offset("anything", 0) == 0.0
    with pytest.raises(ValueError) as info:
        spread_offset("anything", -1)
    assert str(info.value) == ERR_SPREAD_NEGATIVE.format(value=-1)


def test_spread_offset_differs_between_jobs() -> None:
    assert spread_offset("a", 3600) != spread_offset("b", 3600)
