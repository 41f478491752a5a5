"""A cron job's DST rules: for a wall time that happens twice (first, last, both) and for one
that does not happen (shift, skip), cronie's rules by default; in the engine, in the preview's
DST days, through the API, and in the fires the leader writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cluster.fencing import fence_raise
from cluster.scheduler import scheduler_tick
from jobs import schedules, services
from jobs.models import Job, JobExecution

NEW_YORK, BERLIN = "America/New_York", "Europe/Berlin"
# The next changes after the session's date: America/New_York goes forward on 2027-03-14 (02:00
# EST -> 03:00 EDT) and back on 2027-11-07 (02:00 EDT -> 01:00 EST); Europe/Berlin forward on
# 2027-03-28 (02:00 CET -> 03:00 CEST) and back on 2027-10-31 (03:00 CEST -> 02:00 CET).
AFTER = datetime(2026, 12, 6, tzinfo=UTC)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def fires_between(expression, zone, start, end, repeated="cron", missing="cron"):
    found, cursor = [], start
    while True:
        fire = schedules.cron_next_after(
            expression, zone, cursor, dst_repeated=repeated, dst_missing=missing
        )
        if fire >= end:
            return found
        found.append(fire)
        cursor = fire


# (zone, expression, the change's UTC day span, policy, expected UTC fires that day)
REPEATED = [
    (NEW_YORK, "30 1 * * *", (2027, 11, 7), "cron", [utc(2027, 11, 7, 5, 30)]),
    (NEW_YORK, "30 1 * * *", (2027, 11, 7), "first", [utc(2027, 11, 7, 5, 30)]),
    (NEW_YORK, "30 1 * * *", (2027, 11, 7), "last", [utc(2027, 11, 7, 6, 30)]),
    (
        NEW_YORK,
        "30 1 * * *",
        (2027, 11, 7),
        "both",
        [utc(2027, 11, 7, 5, 30), utc(2027, 11, 7, 6, 30)],
    ),
    (BERLIN, "30 2 * * *", (2027, 10, 31), "cron", [utc(2027, 10, 31, 0, 30)]),
    (BERLIN, "30 2 * * *", (2027, 10, 31), "first", [utc(2027, 10, 31, 0, 30)]),
    (BERLIN, "30 2 * * *", (2027, 10, 31), "last", [utc(2027, 10, 31, 1, 30)]),
    (
        BERLIN,
        "30 2 * * *",
        (2027, 10, 31),
        "both",
        [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)],
    ),
]
MISSING = [
    (NEW_YORK, "30 2 * * *", (2027, 3, 14), "cron", [utc(2027, 3, 14, 7, 0)]),
    (NEW_YORK, "30 2 * * *", (2027, 3, 14), "shift", [utc(2027, 3, 14, 7, 0)]),
    (NEW_YORK, "30 2 * * *", (2027, 3, 14), "skip", []),
    (BERLIN, "30 2 * * *", (2027, 3, 28), "cron", [utc(2027, 3, 28, 1, 0)]),
    (BERLIN, "30 2 * * *", (2027, 3, 28), "shift", [utc(2027, 3, 28, 1, 0)]),
    (BERLIN, "30 2 * * *", (2027, 3, 28), "skip", []),
]


@pytest.mark.parametrize(("zone", "expression", "day", "policy", "expected"), REPEATED)
def test_a_repeated_wall_time_fires_as_the_job_chose(zone, expression, day, policy, expected):
    start = utc(*day) - timedelta(hours=1)
    assert (
        fires_between(expression, zone, start, start + timedelta(hours=23), repeated=policy)
        == expected
    )


@pytest.mark.parametrize(("zone", "expression", "day", "policy", "expected"), MISSING)
def test_a_missing_wall_time_fires_as_the_job_chose(zone, expression, day, policy, expected):
    start = utc(*day) - timedelta(hours=1)
    assert (
        fires_between(expression, zone, start, start + timedelta(hours=23), missing=policy)
        == expected
    )


def test_a_wildcard_hour_job_fires_every_pass_by_default_and_only_the_chosen_one_otherwise():
    start, end = utc(2027, 11, 7, 4, 59), utc(2027, 11, 7, 7, 1)
    every = [
        utc(2027, 11, 7, 5),
        utc(2027, 11, 7, 5, 30),
        utc(2027, 11, 7, 6),
        utc(2027, 11, 7, 6, 30),
        utc(2027, 11, 7, 7),
    ]
    assert fires_between("*/30 * * * *", NEW_YORK, start, end) == every
    assert fires_between("*/30 * * * *", NEW_YORK, start, end, repeated="both") == every
    assert fires_between("*/30 * * * *", NEW_YORK, start, end, repeated="first") == [
        utc(2027, 11, 7, 5),
        utc(2027, 11, 7, 5, 30),
        utc(2027, 11, 7, 7),
    ]
    assert fires_between("*/30 * * * *", NEW_YORK, start, end, repeated="last") == [
        utc(2027, 11, 7, 6),
        utc(2027, 11, 7, 6, 30),
        utc(2027, 11, 7, 7),
    ]
    # From inside the first pass, "last" still finds the second pass of earlier wall times.
    assert schedules.cron_next_after(
        "*/30 * * * *", NEW_YORK, utc(2027, 11, 7, 5, 40), dst_repeated="last"
    ) == utc(2027, 11, 7, 6)
    # A wildcard-hour job skips the missing hour by default; "shift" fires once after the change.
    spring_start, spring_end = utc(2027, 3, 14, 6, 29), utc(2027, 3, 14, 7, 31)
    assert fires_between("30 * * * *", NEW_YORK, spring_start, spring_end) == [
        utc(2027, 3, 14, 6, 30),
        utc(2027, 3, 14, 7, 30),
    ]
    assert fires_between("30 * * * *", NEW_YORK, spring_start, spring_end, missing="shift") == [
        utc(2027, 3, 14, 6, 30),
        utc(2027, 3, 14, 7),
        utc(2027, 3, 14, 7, 30),
    ]


def test_an_unknown_rule_is_a_schedule_error_naming_the_field():
    with pytest.raises(schedules.ScheduleError) as caught:
        schedules.cron_next_after("0 3 * * *", BERLIN, AFTER, dst_repeated="twice")
    assert caught.value.field == "dst_repeated"
    with pytest.raises(schedules.ScheduleError) as caught:
        schedules.cron_next_after("0 3 * * *", BERLIN, AFTER, dst_missing="never")
    assert caught.value.field == "dst_missing"


def test_the_preview_lists_the_next_dst_days_under_the_chosen_rules():
    days = schedules.dst_days(
        after=AFTER,
        cron_expression="30 2 * * *",
        timezone=BERLIN,
        dst_repeated="both",
        dst_missing="skip",
    )
    assert [(d.direction, d.change) for d in days] == [
        ("forward", utc(2027, 3, 28, 1)),
        ("back", utc(2027, 10, 31, 1)),
    ]
    assert days[0].fires == []
    assert days[1].fires == [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)]
    assert (
        schedules.dst_days(after=AFTER, cron_expression="30 2 * * *", timezone="Asia/Tokyo") == []
    )
    # Whatever fraction of a second "after" has, the change is found to the second.
    odd = AFTER + timedelta(microseconds=811_227)
    found = schedules.dst_days(after=odd, cron_expression="0 3 * * *", timezone=BERLIN)
    assert [(d.direction, d.change) for d in found] == [
        ("forward", utc(2027, 3, 28, 1)),
        ("back", utc(2027, 10, 31, 1)),
    ]
    busy = schedules.dst_days(after=AFTER, cron_expression="* * * * *", timezone=NEW_YORK, count=1)
    assert len(busy[0].fires) == schedules.DST_PREVIEW_FIRES and busy[0].more


@pytest.mark.django_db
def test_the_api_takes_the_rules_refuses_a_bad_one_and_previews_them(admin_api):
    client = admin_api
    body = {
        "name": "berlin-230",
        "task": "noop",
        "schedule_type": "cron",
        "cron_expression": "30 2 * * *",
        "timezone": BERLIN,
        "dst_repeated": "last",
        "dst_missing": "skip",
    }
    created = client.post("/api/jobs/", body, format="json")
    assert created.status_code == 201, created.content
    assert (created.data["dst_repeated"], created.data["dst_missing"]) == ("last", "skip")
    bad = client.post("/api/jobs/", {**body, "name": "bad", "dst_repeated": "twice"}, format="json")
    assert bad.status_code == 400 and "dst_repeated" in bad.data
    assert not Job.objects.filter(name="bad").exists()
    preview = client.get(
        "/api/schedule-preview/",
        {
            "schedule_type": "cron",
            "cron_expression": "30 2 * * *",
            "timezone": BERLIN,
            "dst_repeated": "both",
        },
    )
    assert preview.status_code == 200
    assert "DST: a repeated hour fires both times" in preview.data["description"]
    back = next(d for d in preview.data["dst_days"] if d["direction"] == "back")
    assert len(back["fires"]) == 2
    interval = client.get(
        "/api/schedule-preview/", {"schedule_type": "interval", "interval_seconds": 60}
    )
    assert interval.status_code == 200 and interval.data["dst_days"] == []


@pytest.mark.django_db
def test_the_leader_writes_the_fires_the_rules_say(db):
    """Jobs defined the day before Berlin's clocks go back; the leader's ticks across the change
    write one fire for "first" and "last" (at different instants) and two for "both"."""
    created = utc(2027, 10, 30, 12)
    jobs = {
        policy: services.job_create(
            data={
                "name": f"b-{policy}",
                "task": "noop",
                "schedule_type": "cron",
                "cron_expression": "30 2 * * *",
                "timezone": BERLIN,
                "dst_repeated": policy,
                "misfire_grace_seconds": 3600,
            },
            by=services.SYSTEM,
            now=created,
        )
        for policy in ("first", "last", "both")
    }
    fence_raise(5, "test")
    tick = utc(2027, 10, 31, 0)
    while tick < utc(2027, 10, 31, 3):
        scheduler_tick(term=5, now=tick, lookahead=timedelta(seconds=1))
        tick += timedelta(minutes=15)
    written = {
        policy: sorted(JobExecution.objects.filter(job=job).values_list("scheduled_for", flat=True))
        for policy, job in jobs.items()
    }
    assert written == {
        "first": [utc(2027, 10, 31, 0, 30)],
        "last": [utc(2027, 10, 31, 1, 30)],
        "both": [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)],
    }


@pytest.mark.django_db
def test_export_and_apply_carry_the_rules():
    from jobs import selectors

    services.job_create(
        data={
            "name": "nightly",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "30 1 * * *",
            "timezone": NEW_YORK,
            "dst_repeated": "both",
            "dst_missing": "skip",
        },
        by=services.SYSTEM,
    )
    services.job_create(
        data={"name": "tick", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=services.SYSTEM,
    )
    exported = selectors.job_definitions_export()
    assert [(d["dst_repeated"], d["dst_missing"]) for d in exported] == [
        ("both", "skip"),
        ("cron", "cron"),
    ]
    Job.objects.all().delete()
    services.job_apply_definitions(definitions=exported, by=services.SYSTEM)
    stored = dict(
        (name, (repeated, missing))
        for name, repeated, missing in Job.objects.values_list(
            "name", "dst_repeated", "dst_missing"
        )
    )
    assert stored == {"nightly": ("both", "skip"), "tick": ("cron", "cron")}
    # An interval job given a DST rule is refused: it has no wall-clock time.
    with pytest.raises(services.JobValidationError) as caught:
        services.job_create(
            data={
                "name": "bad-interval",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 60,
                "dst_repeated": "last",
            },
            by=services.SYSTEM,
        )
    assert "dst_repeated" in caught.value.errors
