"""The leader's tick (cluster/scheduler.py), against real rows and explicit clocks.

Every tick gets an explicit ``now``: nothing here sleeps. Interval slots are aligned to the Unix epoch,
so a 60 s job created just before T0 (a whole minute) is first due at T0.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cluster import scheduler
from cluster.fencing import ERR_FENCED, Fenced, fence_raise, tenure
from cluster.node import LOOKAHEAD_S
from cluster.scheduler import REASON_REPLACED, earliest_next_fire, scheduler_tick
from jobs import schedules, services
from jobs.firing import (
    MAX_RECORDED_MISSES,
    REASON_BUFFER_FULL,
    REASON_MISFIRE_BEYOND_BOUND,
    REASON_MISFIRE_COALESCED,
    REASON_MISFIRE_SKIPPED,
)
from jobs.models import ConcurrencyPolicy, Job, JobExecution, MisfirePolicy, Trigger
from jobs.states import ExecutionStatus
from tests.cluster.leader_rows import (
    MINUTE,
    SECOND,
    T0,
    TERM,
    add_execution,
    bulk_jobs,
    make_job,
    rows,
    slots,
)

pytestmark = pytest.mark.django_db

S = ExecutionStatus

# --- firing -----------------------------------------------------------------------------------------


def test_a_due_interval_job_gets_exactly_one_pending_execution_and_advances():
    job = make_job()
    assert job.next_fire_at == T0

    result = scheduler_tick(term=7, now=T0 + SECOND)

    [execution] = rows(job)
    assert execution.status == S.PENDING
    assert execution.scheduled_for == T0
    assert execution.run_after == T0
    assert execution.attempt == 1
    assert execution.trigger == Trigger.SCHEDULE
    assert execution.term == 7
    assert execution.claim_token is None
    job.refresh_from_db()
    assert job.next_fire_at == T0 + MINUTE
    assert job.last_fire_at == T0
    assert (result.fired, result.skipped, result.jobs) == (1, 0, 1)
    assert result.fired_ids == [execution.pk]

    # The same instant again: the slot is not fired twice.
    again = scheduler_tick(term=7, now=T0 + SECOND)
    assert (again.fired, again.jobs) == (0, 0)
    assert len(rows(job)) == 1


def test_a_job_not_yet_due_gets_nothing():
    job = make_job()

    result = scheduler_tick(term=TERM, now=T0 - SECOND)

    assert rows(job) == []
    assert (result.fired, result.jobs) == (0, 0)
    job.refresh_from_db()
    assert job.next_fire_at == T0


def test_lookahead_writes_the_execution_ahead_with_run_after_at_the_slot():
    job = make_job()

    result = scheduler_tick(term=TERM, now=T0 - 0.5 * SECOND, lookahead=SECOND)

    [execution] = rows(job)
    assert execution.status == S.PENDING
    assert execution.scheduled_for == T0
    assert execution.run_after == T0  # not started before its slot
    assert result.fired == 1
    job.refresh_from_db()
    assert job.next_fire_at == T0 + MINUTE


def test_a_one_second_job_gets_every_slot_within_the_horizon():
    job = make_job(interval_seconds=1, now=T0 - 0.5 * SECOND)
    assert job.next_fire_at == T0

    result = scheduler_tick(term=TERM, now=T0, lookahead=2 * SECOND)

    assert slots(rows(job, S.PENDING)) == [T0, T0 + SECOND, T0 + 2 * SECOND]
    assert rows(job, S.SKIPPED) == []
    assert result.fired == 3
    job.refresh_from_db()
    assert job.next_fire_at == T0 + 3 * SECOND


def test_a_paused_job_never_fires():
    job = make_job()
    Job.objects.filter(pk=job.pk).update(enabled=False)  # next_fire_at left in the past

    for now in (T0, T0 + MINUTE, T0 + timedelta(days=1)):
        result = scheduler_tick(term=TERM, now=now, lookahead=MINUTE)
        assert result.fired == result.skipped == result.jobs == 0
    assert rows(job) == []


def test_a_once_job_fires_once_and_then_has_no_next_fire():
    job = make_job(schedule_type="once", run_at=T0.isoformat(), interval_seconds=None)
    assert job.next_fire_at == T0

    first = scheduler_tick(term=TERM, now=T0 + SECOND)
    second = scheduler_tick(term=TERM, now=T0 + timedelta(hours=1))

    [execution] = rows(job)
    assert (execution.status, execution.scheduled_for) == (S.PENDING, T0)
    assert (first.fired, second.fired) == (1, 0)
    job.refresh_from_db()
    assert job.next_fire_at is None


def test_a_spread_job_is_written_when_due_not_when_its_slot_comes_round():
    job = make_job("spread-me", spread_seconds=30)
    offset = timedelta(seconds=schedules.spread_offset("spread-me", 30))
    assert SECOND < offset < 30 * SECOND  # the name's offset: far enough from the slot to tell
    assert job.next_fire_at == T0 + offset  # when the fire is due, not its slot

    assert scheduler_tick(term=TERM, now=T0 + SECOND).fired == 0  # the slot is past, not the due
    scheduler_tick(term=TERM, now=T0 + offset)
    scheduler_tick(term=TERM, now=T0 + MINUTE + offset)

    executions = rows(job)
    assert slots(executions) == [T0, T0 + MINUTE]
    # The same offset on every slot (and on every node: it is derived from the name, not hash()).
    assert [e.run_after - e.scheduled_for for e in executions] == [offset, offset]
    job.refresh_from_db()
    assert job.next_fire_at == T0 + 2 * MINUTE + offset


def test_a_spread_fire_is_late_by_its_due_instant_not_its_slot():
    """Grace 10 s, spread offset well past it: the tick that writes the fire a second after it is
    due writes a run, not a misfire, though its slot is long past."""
    job = make_job("spread-me", spread_seconds=30, misfire_grace_seconds=10)
    offset = timedelta(seconds=schedules.spread_offset("spread-me", 30))
    assert offset > 11 * SECOND
    scheduler_tick(term=TERM, now=T0 + offset + SECOND)
    [execution] = rows(job)
    assert (execution.status, execution.scheduled_for) == (ExecutionStatus.PENDING, T0)


def test_renaming_a_spread_job_moves_its_next_fire_to_the_new_offset():
    job = make_job("spread-me", spread_seconds=30)
    renamed = services.job_update(
        job_id=job.pk,
        changes={"name": "spread-you"},
        expected_version=job.version,
        by=services.SYSTEM,
        now=T0 - 30 * SECOND,
    )
    offset = timedelta(seconds=schedules.spread_offset("spread-you", 30))
    assert renamed.next_fire_at == T0 + offset


def test_earliest_next_fire_is_the_earliest_enabled_job():
    assert earliest_next_fire() is None
    make_job("later", now=T0 + 30 * SECOND)  # due at T0 + 1 min
    early = make_job("early")  # due at T0
    assert earliest_next_fire() == T0
    Job.objects.filter(pk=early.pk).update(enabled=False)
    assert earliest_next_fire() == T0 + MINUTE


# --- misfires ---------------------------------------------------------------------------------------

# A 60 s job, grace 5 s, last scheduled before T0: at T0 + 5 min 10 s the six slots T0 .. T0 + 5 min
# are all late (the newest by 10 s > grace).
MISSED = [T0 + k * MINUTE for k in range(6)]
LATE_NOW = MISSED[-1] + 10 * SECOND


@pytest.mark.parametrize(
    ("policy", "run_all_max", "run", "skipped", "reason"),
    [
        (MisfirePolicy.RUN_ONCE, 10, MISSED[-1:], MISSED[:-1], REASON_MISFIRE_COALESCED),
        (MisfirePolicy.SKIP, 10, [], MISSED, REASON_MISFIRE_SKIPPED),
        (MisfirePolicy.RUN_ALL, 3, MISSED[-3:], MISSED[:-3], REASON_MISFIRE_BEYOND_BOUND),
        (MisfirePolicy.RUN_ALL, 10, MISSED, [], None),
    ],
    ids=["run_once", "skip", "run_all-bounded", "run_all-within-bound"],
)
def test_misfire_policy_after_missed_intervals(policy, run_all_max, run, skipped, reason):
    job = make_job(misfire_policy=policy, misfire_grace_seconds=5, run_all_max=run_all_max)

    result = scheduler_tick(term=TERM, now=LATE_NOW)

    assert slots(rows(job, S.PENDING)) == run
    skipped_rows = rows(job, S.SKIPPED)
    assert slots(skipped_rows) == skipped
    assert {e.reason for e in skipped_rows} <= {reason}
    assert all(e.finished_at == LATE_NOW for e in skipped_rows)
    assert (result.fired, result.skipped, result.unrecorded_misses) == (len(run), len(skipped), 0)
    job.refresh_from_db()
    assert job.next_fire_at == MISSED[-1] + MINUTE
    assert job.next_fire_at > LATE_NOW


def test_every_row_of_a_tick_carries_the_instant_the_tick_decided_at():
    """A fire is stamped with the tick's "now" (the reference time its misfire decision used), not
    the machine's clock when the insert ran: a slow leader's rows must show when it decided."""
    job = make_job(misfire_policy=MisfirePolicy.RUN_ONCE, misfire_grace_seconds=5)

    scheduler_tick(term=TERM, now=LATE_NOW)

    made = rows(job)
    assert len(made) > 1
    assert {e.created_at for e in made} == {LATE_NOW}


def test_slots_within_the_grace_period_are_not_a_misfire():
    job = make_job(
        interval_seconds=10,
        misfire_grace_seconds=60,
        misfire_policy=MisfirePolicy.SKIP,
        now=T0 - 5 * SECOND,
    )
    assert job.next_fire_at == T0

    result = scheduler_tick(term=TERM, now=T0 + 25 * SECOND)

    assert slots(rows(job, S.PENDING)) == [T0, T0 + 10 * SECOND, T0 + 20 * SECOND]
    assert rows(job, S.SKIPPED) == []
    assert (result.fired, result.skipped) == (3, 0)


# --- catch-up on a budget ----------------------------------------------------------------------------

MS = timedelta(milliseconds=1)


def run_all_job(name: str, **fields: object) -> Job:
    return make_job(
        name,
        misfire_policy=MisfirePolicy.RUN_ALL,
        misfire_grace_seconds=5,
        run_all_max=3,
        **fields,
    )


def test_catch_up_runs_are_paced_oldest_slot_first_across_jobs():
    a, b = run_all_job("a"), run_all_job("b")

    result = scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=10)

    paced = sorted(
        JobExecution.objects.filter(status=S.PENDING), key=lambda e: (e.run_after, e.job_id)
    )
    # Slot by slot, each slot's runs by job: a job's backlog never goes before the others' older.
    assert [(e.job_id, e.scheduled_for) for e in paced] == [
        (job.pk, slot) for slot in MISSED[-3:] for job in (a, b)
    ]
    assert [e.run_after for e in paced] == [LATE_NOW + k * 100 * MS for k in range(6)]
    assert all(e.catch_up for e in paced)
    assert not any(e.catch_up for e in JobExecution.objects.filter(status=S.SKIPPED))
    assert (result.fired, result.caught_up) == (6, 6)
    assert result.catch_up_until == LATE_NOW + 500 * MS


def test_a_later_tick_paces_after_the_runs_already_paced():
    """A second tick (another batch, or a new leader) continues the stream: it reads the latest
    instant from the pending catch-up rows, so two backlogs never go side by side."""
    run_all_job("a")
    scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=10)
    late_job = run_all_job("late", now=LATE_NOW)
    Job.objects.filter(pk=late_job.pk).update(next_fire_at=MISSED[0])

    scheduler_tick(term=TERM + 1, now=LATE_NOW + 50 * MS, catch_up_per_s=10)

    assert [e.run_after for e in rows(late_job, S.PENDING)] == [
        LATE_NOW + k * 100 * MS for k in (3, 4, 5)
    ]


def test_each_partition_paces_its_own_jobs_from_its_own_rows():
    """Partition 1's leader does not continue after partition 0's stream: each paces its share."""
    run_all_job("a")
    scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=10)
    other = run_all_job("b")
    Job.objects.filter(pk=other.pk).update(partition=1)

    scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=10, partition=1)

    assert [e.run_after for e in rows(other, S.PENDING)] == [
        LATE_NOW + k * 100 * MS for k in range(3)
    ]


def test_without_a_budget_catch_up_runs_are_ordinary_late_fires():
    job = run_all_job("a")

    scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=0)

    pending = rows(job, S.PENDING)
    assert [e.run_after for e in pending] == MISSED[-3:]
    assert not any(e.catch_up for e in pending)


@pytest.mark.parametrize("policy", [MisfirePolicy.RUN_ONCE, MisfirePolicy.SKIP])
def test_other_policies_have_no_catch_up_to_pace(policy):
    job = make_job(misfire_policy=policy, misfire_grace_seconds=5)

    result = scheduler_tick(term=TERM, now=LATE_NOW, catch_up_per_s=10)

    assert result.caught_up == 0
    assert all(e.run_after == e.scheduled_for and not e.catch_up for e in rows(job))


# A 1 s job not scheduled for a day: 86,401 late slots T0 .. T0 + 1 day.
DAY = timedelta(days=1)
HUGE_GAP_NOW = T0 + DAY + 0.5 * SECOND
HUGE_GAP_MISSED = 86_401


def huge_gap_job(policy: str = MisfirePolicy.RUN_ONCE, run_all_max: int = 10) -> Job:
    return make_job(
        interval_seconds=1,
        misfire_grace_seconds=1,
        misfire_policy=policy,
        run_all_max=run_all_max,
        now=T0 - 0.5 * SECOND,
    )


def test_a_huge_gap_records_at_most_max_recorded_misses_and_reports_the_rest():
    job = huge_gap_job()

    with CaptureQueriesContext(connection) as queries:
        result = scheduler_tick(term=TERM, now=HUGE_GAP_NOW)

    assert len(rows(job, S.SKIPPED)) == MAX_RECORDED_MISSES
    assert result.skipped == MAX_RECORDED_MISSES
    assert result.unrecorded_misses > 0
    assert len(rows(job, S.PENDING)) == 1
    # Bounded work: the skipped rows go in one batch insert, not one query per missed slot.
    assert len(queries) < 20
    job.refresh_from_db()
    assert HUGE_GAP_NOW < job.next_fire_at <= HUGE_GAP_NOW + SECOND


@pytest.mark.parametrize(
    ("policy", "run_all_max", "expected_run"),
    [
        (MisfirePolicy.RUN_ONCE, 10, [T0 + DAY]),
        (MisfirePolicy.RUN_ALL, 3, [T0 + DAY - 2 * SECOND, T0 + DAY - SECOND, T0 + DAY]),
    ],
    ids=["run_once", "run_all"],
)
def test_a_huge_gap_runs_the_most_recent_missed_slots(policy, run_all_max, expected_run):
    job = huge_gap_job(policy, run_all_max)

    scheduler_tick(term=TERM, now=HUGE_GAP_NOW)

    assert slots(rows(job, S.PENDING)) == expected_run
    # The recorded skips are the newest ones, just before the runs.
    assert max(slots(rows(job, S.SKIPPED))) == expected_run[0] - SECOND


def test_a_huge_gap_accounts_for_every_missed_slot():
    huge_gap_job()

    result = scheduler_tick(term=TERM, now=HUGE_GAP_NOW)

    assert result.fired + result.skipped + result.unrecorded_misses == HUGE_GAP_MISSED


# --- concurrency policy at fire time ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "existing", "new_status", "new_reason", "cancel_requested"),
    [
        (ConcurrencyPolicy.REPLACE, [S.RUNNING], S.PENDING, "", True),
        # One run goes on and one waits behind it: the buffer is full, the slot is skipped.
        (
            ConcurrencyPolicy.BUFFER_ONE,
            [S.RUNNING, S.PENDING],
            S.SKIPPED,
            REASON_BUFFER_FULL,
            False,
        ),
        (ConcurrencyPolicy.BUFFER_ONE, [S.RUNNING], S.PENDING, "", False),
        # Nothing runs: the waiting run is about to be the current one; the new one may wait.
        (ConcurrencyPolicy.BUFFER_ONE, [S.PENDING], S.PENDING, "", False),
        (ConcurrencyPolicy.FORBID, [S.RUNNING], S.PENDING, "", False),  # enforced at start
        (ConcurrencyPolicy.ALLOW, [S.RUNNING, S.PENDING], S.PENDING, "", False),
    ],
    ids=[
        "replace",
        "buffer_one-full",
        "buffer_one-running",
        "buffer_one-waiting-only",
        "forbid",
        "allow",
    ],
)
def test_concurrency_policy_at_fire_time(
    policy, existing, new_status, new_reason, cancel_requested
):
    job = make_job(concurrency_policy=policy)
    previous = [
        add_execution(job, slot=T0 - (len(existing) - i) * MINUTE, status=status)
        for i, status in enumerate(existing)
    ]

    scheduler_tick(term=TERM, now=T0 + SECOND)

    [new] = [e for e in rows(job) if e.scheduled_for == T0]
    assert (new.status, new.reason) == (new_status, new_reason)
    for execution, status in zip(previous, existing, strict=True):
        execution.refresh_from_db()
        assert execution.status == status  # the scheduler only asks; the executor cancels
        asked = cancel_requested and status == S.RUNNING
        assert execution.cancel_requested == asked
        assert execution.reason == (REASON_REPLACED if asked else "")


def test_buffer_one_with_nothing_running_does_not_skip_a_look_ahead_slot():
    job = make_job(
        interval_seconds=1, concurrency_policy=ConcurrencyPolicy.BUFFER_ONE, now=T0 - 0.5 * SECOND
    )

    scheduler_tick(term=TERM, now=T0, lookahead=timedelta(seconds=LOOKAHEAD_S))

    # Nothing runs: T0 is the current run and T0 + 1 s the one buffered behind it.
    assert slots(rows(job, S.PENDING)) == [T0, T0 + SECOND]
    assert rows(job, S.SKIPPED) == []


# --- fencing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("term", "fenced"), [(4, True), (5, False), (6, False)])
def test_scheduler_tick_of_a_stale_term_writes_nothing(term, fenced):
    job = make_job()
    retry = add_execution(
        job, slot=T0 - MINUTE, status=S.RETRY_SCHEDULED, attempt=2, run_after=T0 - SECOND
    )
    assert fence_raise(5, "leader-a")

    if fenced:
        with pytest.raises(Fenced) as info:
            scheduler_tick(term=term, now=T0 + SECOND)
        assert (info.value.term, info.value.current) == (term, 5)
        assert str(info.value) == ERR_FENCED.format(term=term, current=5)
        assert rows(job) == [retry]
        retry.refresh_from_db()
        assert retry.status == S.RETRY_SCHEDULED
        job.refresh_from_db()
        assert job.next_fire_at == T0
        assert job.last_fire_at is None
    else:
        result = scheduler_tick(term=term, now=T0 + SECOND)
        assert (result.fired, result.promoted) == (1, 1)
        assert [e.term for e in rows(job, S.PENDING) if e.attempt == 1] == [term]


def test_a_term_is_never_taken_twice():
    """The same term claimed by another holder (a coordination store that restarted without its
    counter and minted it again) is refused; the holder itself may record it again (a retry of
    the same tenure)."""
    assert fence_raise(5, "leader-a")
    assert fence_raise(5, "leader-a")
    assert not fence_raise(5, "leader-b")
    assert not fence_raise(4, "leader-b")
    assert fence_raise(6, "leader-b")
    assert not fence_raise(6, "leader-a")


def test_the_same_node_winning_a_restarted_counter_again_is_refused_its_old_term():
    """A tenure is one acquisition of the lease: the node that led in term 6 loses the lease when
    the coordination store restarts empty, wins the restarted counter's term 6 again (a new
    lease token) and must be refused, so that it raises the floor and takes a new term."""
    assert fence_raise(6, tenure("leader-a", "token-1"))
    assert fence_raise(6, tenure("leader-a", "token-1"))  # the same tenure, recorded again
    assert not fence_raise(6, tenure("leader-a", "token-2"))
    assert fence_raise(7, tenure("leader-a", "token-2"))


def test_a_tenure_fits_the_fence_column_and_stays_unique():
    long_node = "n" * 200
    first, second = tenure(long_node, "a" * 32), tenure(long_node, "b" * 32)
    assert len(first) == 128
    assert first != second


# --- batching and cost ---------------------------------------------------------------------------------


def test_a_full_batch_reports_more_and_handles_batch_size_jobs():
    bulk_jobs(25, next_fire_at=T0)

    first = scheduler_tick(term=TERM, now=T0, batch_size=10)

    assert (first.jobs, first.fired, first.more) == (10, 10, True)
    assert Job.objects.filter(next_fire_at=T0 + MINUTE).count() == 10
    assert Job.objects.filter(next_fire_at=T0).count() == 15
    second = scheduler_tick(term=TERM, now=T0, batch_size=10)
    third = scheduler_tick(term=TERM, now=T0, batch_size=10)
    assert (second.jobs, second.more) == (10, True)
    assert (third.jobs, third.more) == (5, False)
    assert JobExecution.objects.filter(status=S.PENDING, scheduled_for=T0).count() == 25


def queries_of_one_tick(*, defined: int, due: int) -> int:
    Job.objects.all().delete()
    bulk_jobs(defined, next_fire_at=T0 + timedelta(days=1), prefix="idle")
    bulk_jobs(due, next_fire_at=T0, prefix="due")
    with CaptureQueriesContext(connection) as queries:
        result = scheduler_tick(term=TERM, now=T0)
    assert (result.jobs, result.fired) == (due, due)
    return len(queries)


def test_the_cost_of_a_tick_follows_what_is_due_not_what_is_defined():
    few = queries_of_one_tick(defined=20, due=3)
    many = queries_of_one_tick(defined=2_000, due=3)

    assert many == few
    assert few <= 12


def test_an_idle_tick_does_at_most_two_queries_and_no_write_transaction(monkeypatch):
    bulk_jobs(50, next_fire_at=T0 + MINUTE)
    entered: list[int] = []
    real = scheduler.fenced_transaction

    def spy(term: int):
        entered.append(term)
        return real(term)

    monkeypatch.setattr(scheduler, "fenced_transaction", spy)

    with CaptureQueriesContext(connection) as queries:
        result = scheduler_tick(term=TERM, now=T0)

    assert result.jobs == result.fired == 0
    assert len(queries) <= 2
    assert entered == []
    statements = " ".join(q["sql"].upper() for q in queries.captured_queries)
    for write in ("BEGIN", "SAVEPOINT", "FOR UPDATE", "UPDATE ", "INSERT"):
        assert write not in statements


# --- retries -------------------------------------------------------------------------------------------


def test_retry_scheduled_rows_due_before_the_horizon_become_pending():
    job = make_job(now=T0 + timedelta(days=1))  # the job itself is not due
    due = add_execution(job, slot=T0 - 3 * MINUTE, status=S.RETRY_SCHEDULED, attempt=2)
    within = add_execution(
        job, slot=T0 - 2 * MINUTE, status=S.RETRY_SCHEDULED, attempt=2, run_after=T0 + 0.5 * SECOND
    )
    later = add_execution(
        job, slot=T0 - MINUTE, status=S.RETRY_SCHEDULED, attempt=2, run_after=T0 + 10 * SECOND
    )

    result = scheduler_tick(term=TERM, now=T0, lookahead=SECOND)

    assert result.promoted == 2
    for execution, status in ((due, S.PENDING), (within, S.PENDING), (later, S.RETRY_SCHEDULED)):
        execution.refresh_from_db()
        assert execution.status == status


def test_a_fire_that_already_has_its_row_does_not_fail_the_tick_for_every_job():
    """A job's next fire set back onto a slot it had already fired (a pause and resume within the
    lookahead, before the fix to resume) made the unique constraint fail the whole tick, every
    tick: no job of the cluster fired again. The existing row is kept, the slot not inserted
    twice, the job moves on, and the other jobs fire."""
    stuck = make_job("stuck")
    other = make_job("other")
    existing = add_execution(stuck, slot=T0, status=S.SUCCEEDED)
    assert Job.objects.get(pk=stuck.pk).next_fire_at == T0  # set back onto a fired slot

    result = scheduler_tick(term=TERM, now=T0 + SECOND)

    assert [e.pk for e in rows(stuck)] == [existing.pk]
    assert Job.objects.get(pk=stuck.pk).next_fire_at == T0 + MINUTE
    assert slots(rows(other)) == [T0]
    assert result.fired == 1


def test_resume_within_the_lookahead_fires_after_the_last_fire_not_onto_it():
    from jobs import services

    job = make_job("resumed", interval_seconds=1, now=T0 - 10 * SECOND)
    ahead = T0 + SECOND  # the leader created this fire ahead of its slot
    add_execution(job, slot=ahead, status=S.PENDING)
    Job.objects.filter(pk=job.pk).update(last_fire_at=ahead, next_fire_at=ahead + SECOND)

    services.job_pause(job_id=job.pk, by=services.SYSTEM, now=T0 + 0.4 * SECOND)
    resumed = services.job_resume(job_id=job.pk, by=services.SYSTEM, now=T0 + 0.6 * SECOND)

    assert resumed.next_fire_at == ahead + SECOND
