"""When a job fires: a pure plan, decided on the job, the instant and what is running.

Nothing here reads the clock, the database or the cluster: the leader (``cluster.scheduler``) calls
``plan_fires`` for each due job and writes the plan in its fenced batch; ``first_fire`` gives a new,
edited or resumed job its first slot (``jobs.services``); ``fires_kept`` is the misfire rule a
node applies when it admits a fire late (``cluster.admission``). Table-tested in
``tests/jobs/test_firing.py``.

A job's ``next_fire_at`` is when its next fire is *due*: the slot plus the job's stable spread
offset (``spread_seconds``; none by default). The leader writes a fire when it is due, so a thousand
jobs on one slot with a minute's spread are written over that minute, not all at its instant.

Misfires. A slot is *late* when its due instant is more than the job's ``misfire_grace_seconds`` in
the past (typically because no leader was alive). Then:

  run_once  one run for the most recent missed slot; the earlier ones are recorded as skipped;
  skip      every missed slot is recorded as skipped; the schedule continues from now;
  run_all   a run for each of the most recent ``run_all_max`` missed slots (oldest first); older
            ones are recorded as skipped.

At most ``MAX_RECORDED_MISSES`` skipped fires are planned per job and plan; further missed slots
are only counted (a 1-second job down for a day would otherwise write 86,400 rows).

Catch-up. The runs ``run_all`` plans for missed slots are *catch-up* fires (``Fire.catch_up``).
After a whole-cluster outage every ``run_all`` job has up to ``run_all_max`` of them, all due at
once; ``pace_catch_up`` gives them instants a budget apart instead (``per_s`` a second, oldest slot
first across the jobs, continuing after the last instant already paced), so the backlog drains as
a steady stream beside the on-time fires. ``run_once``'s one late run is not paced: a job has at
most one, as it has one on-time fire.

Concurrency at fire time: ``buffer_one`` records a slot skipped when a run is going and another
already waits; ``replace`` (the leader asks the running run to cancel), ``forbid`` (decided when the
run starts, on the job lock) and ``allow`` write every slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobs import schedules
from jobs.models import ConcurrencyPolicy, Job, MisfirePolicy, ScheduleType

# Fires one job may get in a single plan within the horizon (a 1 s job with a 2 s look-ahead: 2-3).
MAX_FIRES_PER_PLAN = 20
MAX_RECORDED_MISSES = 100
# Cron slots walked one by one when counting a long outage before estimating the rest.
MAX_MISSED_SCAN = 2000

REASON_MISFIRE_COALESCED = "misfire: coalesced into one run (run_once)"
REASON_MISFIRE_SKIPPED = "misfire: skipped by policy (skip)"
REASON_MISFIRE_BEYOND_BOUND = "misfire: beyond run_all_max (run_all)"
REASON_BUFFER_FULL = "buffer_one: a run is already waiting"


@dataclass(frozen=True)
class Schedule:
    """What decides a job's slots."""

    schedule_type: str
    cron_expression: str = ""
    timezone: str = "UTC"
    interval_seconds: int | None = None
    start_at: datetime | None = None
    run_at: datetime | None = None
    # A cron job's DST rules (jobs.schedules: "cron" is cronie's).
    dst_repeated: str = "cron"
    dst_missing: str = "cron"

    @classmethod
    def of(cls, job: Job) -> Schedule:
        return cls(
            schedule_type=job.schedule_type,
            cron_expression=job.cron_expression,
            timezone=job.timezone,
            interval_seconds=job.interval_seconds,
            start_at=job.start_at,
            run_at=job.run_at,
            dst_repeated=job.dst_repeated,
            dst_missing=job.dst_missing,
        )

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Schedule:
        """From a job's validated values (a job being created or edited)."""
        return cls(
            schedule_type=values["schedule_type"],
            cron_expression=values.get("cron_expression", "") or "",
            timezone=values.get("timezone", "UTC") or "UTC",
            interval_seconds=values.get("interval_seconds"),
            start_at=values.get("start_at"),
            run_at=values.get("run_at"),
            dst_repeated=values.get("dst_repeated") or "cron",
            dst_missing=values.get("dst_missing") or "cron",
        )


def next_slot(schedule: Schedule, after: datetime) -> datetime | None:
    """The first slot strictly after ``after`` (None for a one-off job: it has one slot)."""
    if schedule.schedule_type == ScheduleType.ONCE:
        return None
    return schedules.next_fire_after(
        schedule_type=schedule.schedule_type,
        after=after,
        cron_expression=schedule.cron_expression,
        timezone=schedule.timezone,
        interval_seconds=schedule.interval_seconds,
        start_at=schedule.start_at,
        dst_repeated=schedule.dst_repeated,
        dst_missing=schedule.dst_missing,
    )


def first_fire(
    schedule: Schedule,
    *,
    enabled: bool,
    now: datetime,
    last_fire: datetime | None = None,
    spread_s: float = 0.0,
) -> datetime | None:
    """When the first fire of a new, edited or resumed job is due (its slot plus the job's
    ``spread_s``: the job's ``next_fire_at``), or None when paused or exhausted. A one-off job is
    due at ``run_at`` even when that is a moment ago (the misfire policy decides what a late fire
    means); a recurring one's next fire is the first due after now whose slot is after
    ``last_fire`` too (fires are written ahead of their slot: the next one may already have its
    row)."""
    if not enabled:
        return None
    spread = timedelta(seconds=spread_s)
    if schedule.schedule_type == ScheduleType.ONCE:
        return schedule.run_at + spread if schedule.run_at is not None else None
    after = now - spread
    slot = next_slot(schedule, max(after, last_fire) if last_fire is not None else after)
    return slot + spread if slot is not None else None


@dataclass(frozen=True)
class Fire:
    slot: datetime
    # When it is due: the slot plus the job's spread (its run_after).
    due: datetime
    # None: a run to write pending; otherwise the slot is recorded skipped with this reason.
    skip_reason: str | None = None
    # A run_all run for a slot missed past the grace: released on the catch-up budget.
    catch_up: bool = False


@dataclass(frozen=True)
class FirePlan:
    fires: list[Fire] = field(default_factory=list)
    # When the job's next fire is due (its slot plus its spread), or None: no fire left.
    next_fire_at: datetime | None = None
    # The newest slot planned to run (None: none; the job's last fire stays as it was).
    last_fire_at: datetime | None = None
    # Missed slots neither run nor recorded (beyond MAX_RECORDED_MISSES).
    unrecorded_misses: int = 0


@dataclass(frozen=True)
class Policy:
    """What a plan follows besides the schedule."""

    misfire_policy: str = MisfirePolicy.RUN_ONCE
    misfire_grace_seconds: int = 60
    run_all_max: int = 10
    concurrency_policy: str = ConcurrencyPolicy.FORBID
    # The job's stable offset from each slot (``spread_seconds``: a thousand jobs on one cron
    # pattern do not all start on its instant).
    spread_s: float = 0.0

    @classmethod
    def of(cls, job: Job) -> Policy:
        return cls(
            misfire_policy=job.misfire_policy,
            misfire_grace_seconds=job.misfire_grace_seconds,
            run_all_max=job.run_all_max,
            concurrency_policy=job.concurrency_policy,
            spread_s=schedules.spread_offset(job.name, job.spread_seconds)
            if job.spread_seconds
            else 0.0,
        )


def plan_fires(
    schedule: Schedule,
    policy: Policy,
    *,
    next_fire_at: datetime | None,
    now: datetime,
    horizon: datetime,
    running: bool = False,
    waiting: bool = False,
) -> FirePlan:
    """The fires of a job due by ``horizon``, as of ``now``: the runs to write, the slots to record
    skipped (misfires, buffer_one) and when the job's next fire is due. ``running``: a run of the job is
    running; ``waiting``: one is already pending behind it (a buffer_one slot is skipped only when
    both hold: one run goes on, one waits, no more)."""
    spread = timedelta(seconds=policy.spread_s)
    # ``next_fire_at`` is when the job's next fire is due: its slot plus the spread. The plan works
    # on slots, so the instants move back by the spread too: a fire is written when it is due
    # (not when its slot comes round, which for a thousand jobs spread over a minute would write
    # them all at once), and it is late when it is more than the grace past its due instant.
    now -= spread
    horizon -= spread
    fires: list[Fire] = []
    last_fire_at: datetime | None = None
    unrecorded = 0
    slot = next_fire_at - spread if next_fire_at is not None else None
    grace = timedelta(seconds=policy.misfire_grace_seconds)
    if slot is not None and now - slot > grace:
        keep = max(policy.run_all_max, 1) + MAX_RECORDED_MISSES
        missed, total = _missed_slots(schedule, slot, now, keep)
        slot = next_slot(schedule, now)
        if policy.misfire_policy == MisfirePolicy.RUN_ONCE:
            run, skip, reason = missed[-1:], missed[:-1], REASON_MISFIRE_COALESCED
        elif policy.misfire_policy == MisfirePolicy.SKIP:
            run, skip, reason = [], missed, REASON_MISFIRE_SKIPPED
        else:
            run, skip = missed[-policy.run_all_max :], missed[: -policy.run_all_max]
            reason = REASON_MISFIRE_BEYOND_BOUND
        recorded = skip[-MAX_RECORDED_MISSES:]
        unrecorded = total - len(run) - len(recorded)
        fires += [Fire(s, s + spread, reason) for s in recorded]
        catch_up = policy.misfire_policy == MisfirePolicy.RUN_ALL
        fires += [Fire(s, s + spread, catch_up=catch_up) for s in run]
        if run:
            last_fire_at = run[-1]
    count = 0
    while slot is not None and slot <= horizon and count < MAX_FIRES_PER_PLAN:
        if policy.concurrency_policy == ConcurrencyPolicy.BUFFER_ONE and running and waiting:
            fires.append(Fire(slot, slot + spread, REASON_BUFFER_FULL))
        else:
            fires.append(Fire(slot, slot + spread))
            waiting = waiting or running
            last_fire_at = slot
        count += 1
        slot = next_slot(schedule, slot)
    return FirePlan(
        fires=fires,
        next_fire_at=slot + spread if slot is not None else None,
        last_fire_at=last_fire_at,
        unrecorded_misses=unrecorded,
    )


def _missed_slots(
    schedule: Schedule, first: datetime, now: datetime, keep: int
) -> tuple[list[datetime], int]:
    """The most recent ``keep`` slots in [first, now], oldest first, and how many there are in all.

    Interval slots are counted by arithmetic. Cron slots are walked one by one up to
    MAX_MISSED_SCAN; past that, the walk restarts close to ``now`` (from the average spacing seen so
    far) and the total is an estimate, good enough for a log line."""
    if schedule.schedule_type == ScheduleType.INTERVAL:
        step = timedelta(seconds=schedule.interval_seconds or 1)
        total = int((now - first) / step) + 1
        last = first + (total - 1) * step
        return [last - k * step for k in reversed(range(min(keep, total)))], total
    recent: deque[datetime] = deque(maxlen=keep)
    slot: datetime | None = first
    walked = 0
    while slot is not None and slot <= now and walked < MAX_MISSED_SCAN:
        recent.append(slot)
        walked += 1
        slot = next_slot(schedule, slot)
    if slot is None or slot > now:
        return list(recent), walked
    spacing = (slot - first) / walked
    restart = now - spacing * (keep + 2)
    skipped_over = max(0, int((restart - slot) / spacing))
    recent.clear()
    slot = next_slot(schedule, max(restart, slot))
    tail = 0
    while slot is not None and slot <= now:
        recent.append(slot)
        tail += 1
        slot = next_slot(schedule, slot)
    return list(recent), walked + skipped_over + tail


def pace_catch_up(
    fires: Sequence[tuple[datetime, int]],
    *,
    per_s: float,
    now: datetime,
    after: datetime | None = None,
) -> list[datetime]:
    """When each catch-up fire is released, given as (its due instant, its job's id), in the
    order given: ``per_s`` a second, one every ``1 / per_s`` seconds, the oldest due first
    (across jobs: the job's id breaks ties, so a job with many missed slots does not go before
    the others' older ones), from ``now`` or one step after ``after`` (the last instant already
    paced, still ahead), whichever is later; never before a fire's own due instant. A budget
    ``per_s`` of 0 paces nothing: each is released at its due instant."""
    if per_s <= 0:
        return [due for due, _ in fires]
    step_s = 1.0 / per_s
    start = now if after is None else max(now, after + timedelta(seconds=step_s))
    order = sorted(range(len(fires)), key=lambda k: fires[k])
    paced: list[datetime] = [now] * len(fires)
    for rank, k in enumerate(order):
        # From the start each time (not step by step): no rounding drifts over a long backlog.
        paced[k] = max(fires[k][0], start + timedelta(seconds=rank * step_s))
    return paced


def fires_kept(misfire_policy: str, run_all_max: int) -> int:
    """How many of a job's due, unstarted fires its misfire policy runs when a node finds several
    at once (the leader wrote them on time, no node could start them): the newest one for
    ``run_once`` and ``skip`` (the fire of the current slot, itself subject to the grace), the
    newest ``run_all_max`` for ``run_all``. The older ones are skipped as superseded."""
    return max(1, run_all_max) if misfire_policy == MisfirePolicy.RUN_ALL else 1
