"""When a job fires (jobs/firing.py): the pure plan, table-driven. No database, no clock."""

from __future__ import annotations

import bisect
import math
from datetime import UTC, datetime, timedelta

import pytest

from jobs.firing import (
    MAX_FIRES_PER_PLAN,
    MAX_RECORDED_MISSES,
    REASON_BUFFER_FULL,
    REASON_MISFIRE_BEYOND_BOUND,
    REASON_MISFIRE_COALESCED,
    REASON_MISFIRE_SKIPPED,
    Fire,
    Policy,
    Schedule,
    fires_kept,
    first_fire,
    pace_catch_up,
    plan_fires,
)
from jobs.models import MisfirePolicy

T0 = datetime(2030, 1, 1, tzinfo=UTC)  # a whole minute
S = timedelta(seconds=1)
EVERY_MINUTE = Schedule("interval", interval_seconds=60)
EVERY_SECOND = Schedule("interval", interval_seconds=1)


def slots(plan_fires_result) -> list[tuple[datetime, str | None]]:
    return [(f.slot, f.skip_reason) for f in plan_fires_result.fires]


# --- on time -------------------------------------------------------------------------------------------


def test_a_due_slot_is_one_fire_and_the_next_slot_follows():
    plan = plan_fires(EVERY_MINUTE, Policy(), next_fire_at=T0, now=T0, horizon=T0 + S)
    assert plan.fires == [Fire(T0, T0)]
    assert (plan.next_fire_at, plan.last_fire_at, plan.unrecorded_misses) == (
        T0 + 60 * S,
        T0,
        0,
    )


def test_a_slot_beyond_the_horizon_is_not_planned():
    plan = plan_fires(EVERY_MINUTE, Policy(), next_fire_at=T0, now=T0 - 5 * S, horizon=T0 - S)
    assert plan.fires == [] and plan.next_fire_at == T0 and plan.last_fire_at is None


def test_every_slot_within_the_horizon_is_planned_up_to_a_bound():
    plan = plan_fires(EVERY_SECOND, Policy(), next_fire_at=T0, now=T0, horizon=T0 + 2 * S)
    assert [f.slot for f in plan.fires] == [T0, T0 + S, T0 + 2 * S]
    far = plan_fires(EVERY_SECOND, Policy(), next_fire_at=T0, now=T0, horizon=T0 + 600 * S)
    assert len(far.fires) == MAX_FIRES_PER_PLAN
    assert far.next_fire_at == T0 + MAX_FIRES_PER_PLAN * S


SPREAD = timedelta(seconds=12.5)


def test_a_spread_job_is_due_its_offset_after_each_slot():
    plan = plan_fires(
        EVERY_MINUTE, Policy(spread_s=12.5), next_fire_at=T0 + SPREAD, now=T0, horizon=T0 + SPREAD
    )
    assert plan.fires == [Fire(T0, T0 + SPREAD)]
    assert plan.next_fire_at == T0 + 60 * S + SPREAD


def test_a_spread_fire_is_planned_when_due_not_when_its_slot_comes_round():
    early = plan_fires(
        EVERY_MINUTE, Policy(spread_s=12.5), next_fire_at=T0 + SPREAD, now=T0, horizon=T0 + S
    )
    assert early.fires == [] and early.next_fire_at == T0 + SPREAD


def test_a_spread_fire_is_late_from_its_due_instant():
    """Grace 10 s: 20 s after the slot is 7.5 s after the due instant, a fire on time; 23 s after
    it is 10.5 s late, a misfire (skip: recorded skipped)."""
    policy = Policy(spread_s=12.5, misfire_grace_seconds=10, misfire_policy=MisfirePolicy.SKIP)
    on_time = plan_fires(
        EVERY_MINUTE, policy, next_fire_at=T0 + SPREAD, now=T0 + 20 * S, horizon=T0 + 20 * S
    )
    assert on_time.fires == [Fire(T0, T0 + SPREAD)]
    late = plan_fires(
        EVERY_MINUTE, policy, next_fire_at=T0 + SPREAD, now=T0 + 23 * S, horizon=T0 + 23 * S
    )
    assert late.fires == [Fire(T0, T0 + SPREAD, REASON_MISFIRE_SKIPPED)]
    assert late.next_fire_at == T0 + 60 * S + SPREAD


def test_a_one_off_job_fires_once():
    once = Schedule("once", run_at=T0)
    plan = plan_fires(once, Policy(), next_fire_at=T0, now=T0, horizon=T0 + S)
    assert plan.fires == [Fire(T0, T0)] and plan.next_fire_at is None


# --- misfires ------------------------------------------------------------------------------------------

# Six one-minute slots missed; the leader comes back 10 s after the last (grace 60 s).
MISSED = [T0 + k * 60 * S for k in range(6)]
LATE = MISSED[-1] + 10 * S


@pytest.mark.parametrize(
    ("policy", "run_all_max", "run", "skipped", "reason"),
    [
        ("run_once", 10, MISSED[-1:], MISSED[:-1], REASON_MISFIRE_COALESCED),
        ("skip", 10, [], MISSED, REASON_MISFIRE_SKIPPED),
        ("run_all", 10, MISSED, [], REASON_MISFIRE_BEYOND_BOUND),
        ("run_all", 2, MISSED[-2:], MISSED[:-2], REASON_MISFIRE_BEYOND_BOUND),
    ],
)
def test_missed_slots_follow_the_policy(policy, run_all_max, run, skipped, reason):
    plan = plan_fires(
        EVERY_MINUTE,
        Policy(misfire_policy=policy, run_all_max=run_all_max),
        next_fire_at=MISSED[0],
        now=LATE,
        horizon=LATE + S,
    )
    assert [f.slot for f in plan.fires if f.skip_reason is None] == run
    assert [f.slot for f in plan.fires if f.skip_reason is not None] == skipped
    assert all(f.skip_reason == reason for f in plan.fires if f.skip_reason is not None)
    # The schedule continues from now, not from the missed slots.
    assert plan.next_fire_at == MISSED[-1] + 60 * S
    assert plan.last_fire_at == (run[-1] if run else None)


def test_slots_within_the_grace_are_not_a_misfire():
    plan = plan_fires(
        EVERY_SECOND,
        Policy(misfire_grace_seconds=60),
        next_fire_at=T0,
        now=T0 + 30 * S,
        horizon=T0 + 30 * S,
    )
    assert len(plan.fires) == MAX_FIRES_PER_PLAN
    assert all(f.skip_reason is None for f in plan.fires)


@pytest.mark.parametrize(
    ("policy", "run_all_max", "ran"), [("run_once", 10, 1), ("skip", 10, 0), ("run_all", 7, 7)]
)
def test_a_day_of_missed_seconds_records_a_bounded_number(policy, run_all_max, ran):
    """A 1 s job down for a day: a bounded plan, every missed slot accounted for."""
    now = T0 + timedelta(days=1) + 0.5 * S
    plan = plan_fires(
        EVERY_SECOND,
        Policy(misfire_policy=policy, run_all_max=run_all_max, misfire_grace_seconds=1),
        next_fire_at=T0,
        now=now,
        horizon=now,
    )
    run = [f for f in plan.fires if f.skip_reason is None]
    recorded = [f for f in plan.fires if f.skip_reason is not None]
    assert len(run) == ran and len(recorded) == MAX_RECORDED_MISSES
    assert len(run) + len(recorded) + plan.unrecorded_misses == 86_401
    assert run == sorted(run, key=lambda f: f.slot) and (not run or run[-1].slot == T0 + 86_400 * S)


def test_missed_cron_slots_across_a_long_outage_are_estimated_not_walked():
    every_five = Schedule("cron", cron_expression="*/5 * * * * *")
    now = T0 + timedelta(days=2)
    plan = plan_fires(
        every_five,
        Policy(misfire_grace_seconds=1),
        next_fire_at=T0,
        now=now,
        horizon=now,
    )
    total = len(plan.fires) + plan.unrecorded_misses
    assert abs(total - (2 * 86_400 // 5 + 1)) <= 2
    assert [f.slot for f in plan.fires if f.skip_reason is None] == [now]


# --- concurrency at fire time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "waiting", "skipped"),
    [(False, False, False), (True, False, False), (True, True, True), (False, True, False)],
)
def test_buffer_one_skips_only_when_one_runs_and_one_waits(running, waiting, skipped):
    plan = plan_fires(
        EVERY_MINUTE,
        Policy(concurrency_policy="buffer_one"),
        next_fire_at=T0,
        now=T0,
        horizon=T0 + S,
        running=running,
        waiting=waiting,
    )
    assert plan.fires == [Fire(T0, T0, REASON_BUFFER_FULL if skipped else None)]


def test_buffer_one_keeps_one_of_several_look_ahead_slots_while_a_run_goes_on():
    plan = plan_fires(
        EVERY_SECOND,
        Policy(concurrency_policy="buffer_one"),
        next_fire_at=T0,
        now=T0,
        horizon=T0 + 2 * S,
        running=True,
    )
    assert slots(plan) == [
        (T0, None),
        (T0 + S, REASON_BUFFER_FULL),
        (T0 + 2 * S, REASON_BUFFER_FULL),
    ]
    assert plan.last_fire_at == T0


@pytest.mark.parametrize("policy", ["forbid", "allow", "replace"])
def test_other_policies_write_every_slot(policy):
    plan = plan_fires(
        EVERY_SECOND,
        Policy(concurrency_policy=policy),
        next_fire_at=T0,
        now=T0,
        horizon=T0 + S,
        running=True,
        waiting=True,
    )
    assert slots(plan) == [(T0, None), (T0 + S, None)]


# --- DST instants -------------------------------------------------------------------------------------

# Europe/Berlin: 2030-03-31 02:00 local does not exist (clocks jump to 03:00); 2030-10-27 02:00-03:00
# local happens twice.
SPRING = datetime(2030, 3, 31, 0, 30, tzinfo=UTC)  # 01:30 local (CET)
AUTUMN = datetime(2030, 10, 27, 0, 0, tzinfo=UTC)  # 02:00 local, first pass (CEST)


def test_a_slot_in_the_missing_hour_fires_at_the_jump_once():
    daily = Schedule("cron", cron_expression="30 2 * * *", timezone="Europe/Berlin")
    plan = plan_fires(
        daily,
        Policy(),
        next_fire_at=first_fire(daily, enabled=True, now=SPRING),
        now=SPRING,
        horizon=SPRING + timedelta(hours=3),
    )
    assert [f.slot for f in plan.fires] == [datetime(2030, 3, 31, 1, 0, tzinfo=UTC)]


def test_a_slot_in_the_repeated_hour_fires_once():
    daily = Schedule("cron", cron_expression="30 2 * * *", timezone="Europe/Berlin")
    plan = plan_fires(
        daily,
        Policy(),
        next_fire_at=first_fire(daily, enabled=True, now=AUTUMN - timedelta(hours=1)),
        now=AUTUMN - timedelta(hours=1),
        horizon=AUTUMN + timedelta(hours=3),
    )
    assert [f.slot for f in plan.fires] == [datetime(2030, 10, 27, 0, 30, tzinfo=UTC)]


# --- the first fire ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "enabled", "last_fire", "expected"),
    [
        (EVERY_MINUTE, True, None, T0 + 60 * S),
        (EVERY_MINUTE, False, None, None),
        # Resumed within the look-ahead: after the fire already written, not onto it.
        (EVERY_MINUTE, True, T0 + 60 * S, T0 + 120 * S),
        (Schedule("once", run_at=T0 - 5 * S), True, None, T0 - 5 * S),
        (Schedule("interval", interval_seconds=60, start_at=T0 + 30 * S), True, None, T0 + 30 * S),
    ],
)
def test_first_fire(schedule, enabled, last_fire, expected):
    assert first_fire(schedule, enabled=enabled, now=T0, last_fire=last_fire) == expected


def test_first_fire_of_a_spread_job_is_its_next_due_instant():
    # 5 s after the slot T0, its fire (due at T0 + 12.5 s) is still to come.
    assert first_fire(EVERY_MINUTE, enabled=True, now=T0 + 5 * S, spread_s=12.5) == T0 + SPREAD
    assert (
        first_fire(EVERY_MINUTE, enabled=True, now=T0 + 13 * S, spread_s=12.5)
        == T0 + 60 * S + SPREAD
    )
    # Resumed after the fire of T0 was written: the next slot's.
    assert (
        first_fire(EVERY_MINUTE, enabled=True, now=T0 + 5 * S, last_fire=T0, spread_s=12.5)
        == T0 + 60 * S + SPREAD
    )
    once = Schedule("once", run_at=T0)
    assert first_fire(once, enabled=True, now=T0, spread_s=12.5) == T0 + SPREAD


def test_first_fire_of_a_jobs_values_matches_the_service():
    values = {"schedule_type": "cron", "cron_expression": "*/10 * * * * *", "enabled": True}
    assert first_fire(Schedule.from_values(values), enabled=True, now=T0 + S) == T0 + 10 * S


# --- run-time misfires ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "run_all_max", "kept"),
    [("run_once", 10, 1), ("skip", 10, 1), ("run_all", 4, 4), ("run_all", 0, 1)],
)
def test_fires_kept_when_several_are_due_at_once(policy, run_all_max, kept):
    assert fires_kept(policy, run_all_max) == kept


# --- catch-up --------------------------------------------------------------------------------------------

MS = timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("policy", "catch_up"),
    [("run_all", [True] * 6), ("run_once", [False]), ("skip", [])],
)
def test_only_run_alls_runs_for_missed_slots_are_catch_up(policy, catch_up):
    plan = plan_fires(
        EVERY_MINUTE,
        Policy(misfire_policy=policy, run_all_max=10),
        next_fire_at=MISSED[0],
        now=LATE,
        horizon=LATE + 60 * S,
    )
    missed = [f for f in plan.fires if f.slot <= LATE and f.skip_reason is None]
    assert [f.catch_up for f in missed] == catch_up
    # The on-time fire after them is not.
    assert [f.catch_up for f in plan.fires if f.slot > LATE] == [False]
    assert not any(f.catch_up for f in plan.fires if f.skip_reason is not None)


NOW = T0 + 100 * S


@pytest.mark.parametrize(
    ("fires", "per_s", "after", "expected"),
    [
        # Oldest due first across jobs; a tie on the due instant goes by job id.
        (
            [(T0 + 2 * S, 1), (T0, 2), (T0 + S, 1), (T0, 1)],
            50,
            None,
            [NOW + 60 * MS, NOW + 20 * MS, NOW + 40 * MS, NOW],
        ),
        # Continuing one step after the last instant already paced, still ahead of now.
        ([(T0, 1), (T0 + S, 1)], 10, NOW + 3 * S, [NOW + 3100 * MS, NOW + 3200 * MS]),
        # A paced instant already past: from now.
        ([(T0, 1), (T0 + S, 1)], 10, NOW - 3 * S, [NOW, NOW + 100 * MS]),
        # No budget: each at its due instant.
        ([(T0, 1), (T0 + S, 2)], 0, NOW + 3 * S, [T0, T0 + S]),
        # Never before its own due instant (a fire not yet due).
        ([(NOW + S, 1)], 10, None, [NOW + S]),
        ([], 50, None, []),
    ],
)
def test_catch_up_fires_are_paced_oldest_first(fires, per_s, after, expected):
    assert pace_catch_up(fires, per_s=per_s, now=NOW, after=after) == expected


@pytest.mark.parametrize("per_s", [50, 7, 0.5, 1000])
def test_a_paced_backlog_releases_at_most_its_budget_in_any_second(per_s):
    """2,000 fires of 200 jobs: the instants are 1 / per_s apart, so any half-open window of one
    second holds at most ceil(per_s) of them."""
    fires = [(T0 + k * S, job) for job in range(200) for k in range(10)]
    paced = sorted(pace_catch_up(fires, per_s=per_s, now=NOW))
    assert paced[0] == NOW
    assert abs((paced[-1] - paced[0]).total_seconds() - (len(fires) - 1) / per_s) < 1e-5
    # Every window [a released instant, one second later) holds at most ceil(per_s) of them.
    for start, instant in enumerate(paced):
        assert bisect.bisect_left(paced, instant + S) - start <= math.ceil(per_s)
