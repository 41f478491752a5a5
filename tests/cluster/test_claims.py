"""Claiming and finishing executions (cluster/executor.py storage operations), on real rows.

The concurrent claim test runs real threads, each with its own database connection, against the
committed test database (SQLite: the write lock serialises claimers; MariaDB: SKIP LOCKED).
"""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.executions import (
    backoff_delay,
    claim_batch,
    finish,
    finish_batch,
    hand_back,
    start_batch,
)
from jobs.executions import claims as claims_module
from jobs.executions import transitions as transitions_module
from jobs.models import Job, JobExecution, Trigger
from jobs.services import SYSTEM, job_create, job_pause, job_update
from jobs.states import ExecutionStatus

S = ExecutionStatus
SECOND = timedelta(seconds=1)
MICROSECOND = timedelta(microseconds=1)
CLAIMERS = 50
THREAD_JOIN_TIMEOUT_S = 60
NODE = "node-a"

# Transactional only where threads need committed rows (the concurrent claim test marks itself).
pytestmark = pytest.mark.django_db


def make_job(name: str = "job", **fields: object) -> Job:
    data = {
        "name": name,
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 3600,
        **fields,
    }
    return job_create(data=data, by=SYSTEM)


def add_execution(
    job: Job,
    *,
    slot: datetime,
    status: str = S.PENDING,
    **fields: object,
) -> JobExecution:
    defaults: dict[str, object] = {"run_after": slot, "queue": job.queue}
    return JobExecution.objects.create(
        job=job, scheduled_for=slot, status=status, **{**defaults, **fields}
    )


def finish_execution(execution: JobExecution, **outcome: object) -> bool:
    """An outcome written in a transaction of its own, as the finisher does."""
    with transaction.atomic():
        return finish(execution, **outcome)


def claim(*, queues: tuple[str, ...] = ("default",), limit: int = 10, horizon=None):
    return claim_batch(
        node_id=NODE,
        queues=list(queues),
        limit=limit,
        horizon=horizon or timezone.now() + SECOND,
        now=timezone.now(),
    )


# --- concurrent claims ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_claimers_of_one_execution_exactly_one_wins():
    job = make_job()
    execution = add_execution(job, slot=timezone.now() - SECOND)
    barrier = threading.Barrier(CLAIMERS)
    claimed: dict[int, list[JobExecution]] = {}
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait(timeout=THREAD_JOIN_TIMEOUT_S)
            claimed[index] = claim_batch(
                node_id=f"claimer-{index}",
                queues=["default"],
                limit=1,
                horizon=timezone.now() + SECOND,
                now=timezone.now(),
            )
        except BaseException as exc:  # reported below; a thread's exception is otherwise lost
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_JOIN_TIMEOUT_S)

    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert len(claimed) == CLAIMERS
    winners = {index: got for index, got in claimed.items() if got}
    assert len(winners) == 1
    [(index, [won])] = winners.items()
    assert won.pk == execution.pk
    row = JobExecution.objects.get(pk=execution.pk)
    assert row.status == S.PENDING
    assert row.node == f"claimer-{index}"
    assert row.claim_token == won.claim_token
    assert row.claim_token
    assert row.claimed_at is not None


# --- batch claims -----------------------------------------------------------------------------------


def test_a_claim_takes_at_most_limit_rows_each_with_its_own_token():
    job = make_job()
    now = timezone.now()
    for i in range(5):
        add_execution(job, slot=now - i * SECOND)

    got = claim(limit=3)

    assert len(got) == 3
    assert len({e.claim_token for e in got}) == 3
    rows = JobExecution.objects.filter(claim_token__isnull=False)
    assert rows.count() == 3
    assert {(r.node, r.status) for r in rows} == {(NODE, S.PENDING)}
    assert all(r.claimed_at is not None for r in rows)
    assert JobExecution.objects.filter(claim_token__isnull=True).count() == 2


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        (("default",), {"default"}),
        (("heavy",), {"heavy"}),
        (("heavy", "default"), {"heavy", "default"}),
    ],
)
def test_a_claim_takes_only_the_nodes_queues(queues, expected):
    job = make_job()
    now = timezone.now()
    add_execution(job, slot=now - 2 * SECOND, queue="default")
    add_execution(job, slot=now - SECOND, queue="heavy")
    add_execution(job, slot=now, queue="gpu")

    got = claim(queues=queues)

    assert {e.queue for e in got} == expected
    assert len(got) == len(expected)


def test_a_claim_takes_higher_priority_first():
    job = make_job()
    now = timezone.now()
    # The older, lower-priority rows must not win over the newer, higher-priority ones.
    for i, priority in enumerate([0, -1, 10, 5, 3]):
        add_execution(job, slot=now - (10 - i) * SECOND, priority=priority)

    got = claim(limit=2)

    assert sorted(e.priority for e in got) == [5, 10]


def test_a_claim_takes_only_executions_due_before_the_horizon():
    job = make_job()
    now = timezone.now()
    past = add_execution(job, slot=now - SECOND)
    soon = add_execution(job, slot=now + 0.5 * SECOND)
    later = add_execution(job, slot=now + 10 * SECOND)

    got = claim(horizon=now + SECOND)

    assert {e.pk for e in got} == {past.pk, soon.pk}
    later.refresh_from_db()
    assert later.claim_token is None


def test_a_claim_never_takes_a_claimed_or_non_pending_execution():
    job = make_job()
    now = timezone.now()
    taken = add_execution(job, slot=now - 5 * SECOND, claim_token="someone-else", node="node-b")
    for i, status in enumerate([S.RUNNING, S.RETRY_SCHEDULED, S.SKIPPED, S.SUCCEEDED]):
        add_execution(job, slot=now - i * SECOND, status=status)

    assert claim() == []
    taken.refresh_from_db()
    assert (taken.claim_token, taken.node) == ("someone-else", "node-b")


def test_claimed_rows_are_not_claimed_again_until_unclaimed():
    job = make_job()
    now = timezone.now()
    first = add_execution(job, slot=now - SECOND)
    add_execution(job, slot=now)

    got = claim()
    assert len(got) == 2
    assert claim() == []

    assert hand_back(next(e for e in got if e.pk == first.pk)) is True
    first.refresh_from_db()
    assert (first.claim_token, first.node, first.claimed_at) == (None, "", None)
    [again] = claim()
    assert again.pk == first.pk
    # The old claim is void: unclaiming with it changes nothing.
    stale = next(e for e in got if e.pk == first.pk)
    assert hand_back(stale) is False
    first.refresh_from_db()
    assert first.claim_token == again.claim_token


def test_unclaim_of_a_started_execution_changes_nothing():
    job = make_job()
    [execution] = [add_execution(job, slot=timezone.now() - SECOND)]
    [claimed] = claim()
    JobExecution.objects.filter(pk=execution.pk).update(status=S.RUNNING)

    assert hand_back(claimed) is False
    execution.refresh_from_db()
    assert (execution.status, execution.claim_token) == (S.RUNNING, claimed.claim_token)


# --- finishing --------------------------------------------------------------------------------------

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
STARTED = NOW - 2.5 * SECOND


def running_execution(job: Job, *, attempt: int = 1, token: str = "token-a") -> JobExecution:
    execution = add_execution(
        job,
        slot=NOW - 5 * SECOND,
        status=S.RUNNING,
        attempt=attempt,
        node=NODE,
        claim_token=token,
        started_at=STARTED,
        term=3,
    )
    return JobExecution.objects.select_related("job").get(pk=execution.pk)


def test_finish_with_a_stale_claim_token_changes_nothing():
    job = make_job(max_retries=3)
    execution = running_execution(job)
    before = list(JobExecution.objects.values())
    stale = JobExecution.objects.select_related("job").get(pk=execution.pk)
    stale.claim_token = "token-of-a-previous-claim"

    for status in (S.SUCCEEDED, S.FAILED, S.TIMED_OUT):
        assert finish_execution(stale, status=status, now=NOW, error="late") is False

    assert list(JobExecution.objects.values()) == before


def test_finish_with_the_right_token_records_the_outcome():
    job = make_job(max_retries=2)
    execution = running_execution(job)

    won = finish_execution(
        execution, status=S.SUCCEEDED, now=NOW, result={"rows": 3}, output="hello\n"
    )

    assert won is True
    execution.refresh_from_db()
    assert execution.status == S.SUCCEEDED
    assert execution.started_at == STARTED
    assert execution.finished_at == NOW
    assert execution.duration_ms == pytest.approx(2500.0)
    assert execution.result == {"rows": 3}
    assert execution.output == "hello\n"
    assert JobExecution.objects.count() == 1  # no retry after a success
    # A second finish (a duplicate delivery) is refused: the row left RUNNING.
    assert finish_execution(execution, status=S.FAILED, now=NOW) is False


def test_finish_batch_writes_the_runs_still_ours_and_fences_the_rest(django_assert_max_num_queries):
    job = make_job(max_retries=1, retry_jitter=False)
    ours = [
        JobExecution.objects.select_related("job").get(
            pk=add_execution(
                job,
                slot=NOW - (5 + k) * SECOND,
                status=S.RUNNING,
                node=NODE,
                claim_token=f"token-{k}",
                started_at=STARTED,
            ).pk
        )
        for k in range(3)
    ]
    stale = ours[2]
    stale.claim_token = "token-of-a-previous-claim"
    before_stale = JobExecution.objects.filter(pk=stale.pk).values().get()
    actual = NOW - SECOND

    with django_assert_max_num_queries(8), transaction.atomic():
        won = finish_batch(
            [
                (
                    ours[0],
                    {"status": S.SUCCEEDED, "result": {"n": 1}, "started": actual.timestamp()},
                ),
                (ours[1], {"status": S.FAILED, "error": "boom", "output": "line\n"}),
                (stale, {"status": S.SUCCEEDED}),
            ],
            now=NOW,
        )

    assert won == {ours[0].pk, ours[1].pk}
    first, second = (JobExecution.objects.get(pk=e.pk) for e in ours[:2])
    assert (first.status, first.result, first.started_at) == (S.SUCCEEDED, {"n": 1}, actual)
    assert first.duration_ms == pytest.approx(1000.0)
    assert (second.status, second.error, second.output) == (S.FAILED, "boom", "line\n")
    assert second.started_at == STARTED and second.finished_at == NOW
    # The failure's next attempt, as finish() schedules it; none for the success.
    retries = JobExecution.objects.filter(job=job, attempt=2)
    assert [r.scheduled_for for r in retries] == [second.scheduled_for]
    assert JobExecution.objects.filter(pk=stale.pk).values().get() == before_stale


def test_an_outcome_records_when_its_body_ended_not_when_it_was_written():
    """Outcomes are written in batches, after the body ended; the next run of a forbid job may
    start in between. finished_at is the body's end, so the two never seem to overlap."""
    job = make_job()
    run = running_execution(job)
    began, ended = NOW - 2 * SECOND, NOW - SECOND
    with transaction.atomic():
        finish_batch(
            [
                (
                    run,
                    {
                        "status": S.SUCCEEDED,
                        "started": began.timestamp(),
                        "ended": ended.timestamp(),
                    },
                )
            ],
            now=NOW,
        )
    run.refresh_from_db()
    assert (run.started_at, run.finished_at) == (began, ended)
    assert run.duration_ms == pytest.approx(1000.0)


def test_finish_batch_of_runs_all_ours_reads_nothing_back(django_assert_num_queries):
    job = make_job()
    run = running_execution(job)
    with django_assert_num_queries(1):
        assert finish_batch([(run, {"status": S.SUCCEEDED})], now=NOW) == {run.pk}


def test_finish_batch_writes_many_different_outcomes_in_one_statement(
    django_assert_num_queries, monkeypatch
):
    """Each row gets its own values (a CASE per column that differs); text beyond
    FINISH_STATEMENT_CHARS splits the batch into several statements, each row still written."""
    job = make_job(concurrency_policy="allow", max_retries=0)
    runs = [running_execution(job, attempt=k + 1, token=f"token-{k}") for k in range(40)]
    outcomes = [
        (
            run,
            {
                "status": S.SUCCEEDED if k % 3 else S.FAILED,
                "result": {"k": k} if k % 3 else None,
                "error": "" if k % 3 else f"error {k}",
                "output": f"out {k}\n" * (k % 5),
                "started": (STARTED + k * SECOND).timestamp(),
                "ended": (STARTED + (k + 1) * SECOND + k * 1000 * MICROSECOND).timestamp(),
            },
        )
        for k, run in enumerate(runs)
    ]
    with transaction.atomic(), django_assert_num_queries(1):
        assert finish_batch(outcomes[:20], now=NOW) == {run.pk for run in runs[:20]}
    monkeypatch.setattr(transitions_module, "FINISH_STATEMENT_CHARS", 30)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert finish_batch(outcomes[20:], now=NOW) == {run.pk for run in runs[20:]}
    assert len(queries) > 1
    assert all(query["sql"].startswith("UPDATE") for query in queries)
    for k, run in enumerate(runs):
        row = JobExecution.objects.get(pk=run.pk)
        expected = outcomes[k][1]
        assert row.status == expected["status"]
        assert row.result == expected["result"]
        assert (row.error, row.output) == (expected["error"], expected["output"])
        assert row.started_at == STARTED + k * SECOND
        assert row.finished_at == STARTED + (k + 1) * SECOND + k * 1000 * MICROSECOND
        assert row.duration_ms == pytest.approx(1000.0 + k)


def test_batch_writes_announce_each_execution_once_after_commit(
    django_capture_on_commit_callbacks,
):
    from jobs import events

    job = make_job(concurrency_policy="allow")
    for k in range(3):
        add_execution(job, slot=timezone.now() - (k + 1) * SECOND)
    claimed = claim()
    heard: list[tuple[int, str]] = []

    signals: list[int] = []

    def receiver(sender, changes, **kwargs):
        signals.append(len(changes))
        heard.extend((change.execution_id, change.status) for change in changes)

    events.executions_changed.connect(receiver, weak=False)
    try:
        with django_capture_on_commit_callbacks(execute=False) as hooks:
            start_batch(claimed, planned=timezone.now())
        assert heard == []  # nothing before the commit
        for hook in hooks:
            hook()
        assert sorted(heard) == sorted((e.pk, S.RUNNING) for e in claimed)
        heard.clear()
        with django_capture_on_commit_callbacks(execute=True):
            finish_batch([(e, {"status": S.SUCCEEDED}) for e in claimed], now=timezone.now())
        assert sorted(heard) == sorted((e.pk, S.SUCCEEDED) for e in claimed)
        assert signals == [3, 3]  # one signal per batch, not one per execution
    finally:
        events.executions_changed.disconnect(receiver)


def test_start_batch_starts_the_claimed_rows_and_not_one_cancelled_meanwhile():
    job = make_job(concurrency_policy="allow")
    for k in range(3):
        add_execution(job, slot=timezone.now() - (k + 1) * SECOND)
    claimed = claim()
    cancelled = claimed[1]
    JobExecution.objects.filter(pk=cancelled.pk).update(status=S.CANCELLED)
    planned = timezone.now()

    won = start_batch(claimed, planned=planned)

    assert won == {claimed[0].pk, claimed[2].pk}
    rows = {row.pk: row for row in JobExecution.objects.all()}
    assert rows[claimed[0].pk].status == rows[claimed[2].pk].status == S.RUNNING
    assert rows[claimed[0].pk].started_at == planned
    assert rows[cancelled.pk].status == S.CANCELLED
    # A token of another claim does not start a row either.
    JobExecution.objects.filter(pk=claimed[0].pk).update(status=S.PENDING)
    claimed[0].claim_token = "someone-else"
    assert start_batch([claimed[0]], planned=planned) == set()


def test_start_batch_gives_each_run_its_own_instant_in_one_statement():
    """Runs of spread jobs are due microseconds apart: one UPDATE starts them all, each with its
    own started_at."""
    job = make_job(concurrency_policy="allow")
    for k in range(3):
        add_execution(job, slot=timezone.now() - (k + 1) * SECOND)
    claimed = claim()
    base = timezone.now().replace(microsecond=0)
    planned = {e.pk: base + k * timedelta(microseconds=137) for k, e in enumerate(claimed)}

    with CaptureQueriesContext(connection) as queries:
        won = start_batch(claimed, planned=planned)

    assert won == set(planned)
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["UPDATE"]
    stored = dict(JobExecution.objects.values_list("pk", "started_at"))
    assert stored == planned
    assert {e.pk: e.started_at for e in claimed} == planned


def test_finish_uses_the_actual_start_time_when_given():
    job = make_job()
    execution = running_execution(job)
    actual = NOW - 1.5 * SECOND

    assert finish_execution(execution, status=S.SUCCEEDED, now=NOW, started=actual.timestamp())

    execution.refresh_from_db()
    assert execution.started_at == actual
    assert execution.duration_ms == pytest.approx(1500.0)


@pytest.mark.parametrize(
    ("status", "attempt", "max_retries", "retry_delay_s"),
    [
        (S.FAILED, 1, 2, 4.0),  # base 4
        (S.FAILED, 2, 2, 8.0),  # base 4 * factor 2
        (S.FAILED, 3, 2, None),  # retries used up
        (S.FAILED, 1, 0, None),
        (S.TIMED_OUT, 1, 1, 4.0),
        (S.CANCELLED, 1, 2, None),  # an operator's cancel is not retried
        (S.SUCCEEDED, 1, 2, None),
    ],
)
def test_finish_schedules_a_retry_per_policy(status, attempt, max_retries, retry_delay_s):
    job = make_job(
        max_retries=max_retries,
        retry_backoff_base=4,
        retry_backoff_factor=2,
        retry_jitter=False,
    )
    execution = running_execution(job, attempt=attempt)

    assert finish_execution(execution, status=status, now=NOW, error="RuntimeError: boom")

    execution.refresh_from_db()
    assert execution.status == status
    retries = list(JobExecution.objects.filter(job=job, attempt=attempt + 1))
    if retry_delay_s is None:
        assert retries == []
        return
    [retry] = retries
    assert retry.status == S.RETRY_SCHEDULED
    assert retry.trigger == Trigger.RETRY
    assert retry.scheduled_for == execution.scheduled_for
    assert retry.run_after == NOW + timedelta(seconds=retry_delay_s)
    assert retry.term == execution.term
    assert retry.claim_token is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"ratio": float("-inf")}])
def test_finish_records_a_result_that_json_cannot_represent(value):
    # json.dumps() writes NaN/Infinity by default, but they are not JSON and the column refuses them.
    job = make_job()
    execution = running_execution(job)

    assert finish_execution(execution, status=S.SUCCEEDED, now=NOW, result=value) is True

    execution.refresh_from_db()
    assert execution.status == S.SUCCEEDED
    assert execution.result == {"repr": repr(value)}


# --- backoff ---------------------------------------------------------------------------------------


class FixedRandom:
    """A stand-in for random.Random whose random() always returns ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def backoff_job(base: float, factor: float, cap: float, jitter: bool = False) -> Job:
    return Job(
        retry_backoff_base=base,
        retry_backoff_factor=factor,
        retry_backoff_max=cap,
        retry_jitter=jitter,
    )


@pytest.mark.parametrize(
    ("base", "factor", "cap", "attempt", "expected"),
    [
        (1, 2, 300, 1, 1),
        (1, 2, 300, 2, 2),
        (1, 2, 300, 5, 16),
        (1, 2, 10, 5, 10),  # capped
        (1, 2, 300, 60, 300),  # a huge exponent is still capped
        (2, 3, 1000, 3, 18),
        (3, 1, 300, 7, 3),  # factor 1: constant
        (0, 2, 300, 4, 0),  # no delay
        (5, 2, 0, 1, 0),  # cap 0
    ],
)
def test_backoff_delay_without_jitter(base, factor, cap, attempt, expected):
    assert backoff_delay(backoff_job(base, factor, cap), attempt) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("draw", "fraction"),
    [(0.0, 0.5), (0.5, 0.75), (0.999999, 0.9999995)],
)
def test_backoff_jitter_scales_between_half_and_all_of_the_delay(draw, fraction):
    job = backoff_job(2, 2, 300, jitter=True)  # attempt 3: 8 s before jitter

    assert backoff_delay(job, 3, FixedRandom(draw)) == pytest.approx(8 * fraction)


def test_backoff_jitter_stays_within_fifty_to_a_hundred_percent():
    job = backoff_job(1, 2, 60, jitter=True)
    rng = random.Random(1234)

    for attempt in range(1, 12):
        full = min(60, 2 ** (attempt - 1))
        delays = [backoff_delay(job, attempt, rng) for _ in range(200)]
        assert all(0.5 * full <= d <= full for d in delays)
        assert max(delays) - min(delays) > 0.25 * full  # it does jitter


def test_a_claim_that_finds_nothing_is_one_read_and_no_transaction():
    """Most polls find nothing: they cost one read, and on SQLite take no write lock."""
    make_job(concurrency_policy="allow")
    with CaptureQueriesContext(connection) as queries:
        assert claim() == []
    assert [q["sql"].split()[0] for q in queries] == ["SELECT"]


def test_a_claim_costs_the_same_statements_whatever_its_size():
    """The claim's cost is per batch, not per row: the statements of a claim of 1 and of 40 are
    the same (the candidates, the rows, their jobs' versions, one UPDATE per kind of claim)."""
    job = make_job(concurrency_policy="allow")
    now = timezone.now()

    def statements(count: int, offset: int) -> list[str]:
        for index in range(count):
            add_execution(job, slot=now - SECOND - (offset + index) * MICROSECOND)
        with CaptureQueriesContext(connection) as queries:
            rows = claim_batch(
                node_id=NODE,
                queues=["default"],
                limit=count,
                horizon=timezone.now() + SECOND,
                now=timezone.now(),
                start_now=lambda claimed: claimed[: len(claimed) // 2],
            )
        assert len(rows) == count
        return [q["sql"].split()[0] for q in queries]

    statements(1, 200)  # the job read once, then cached
    assert statements(2, 0) == statements(40, 100)


def test_claimed_rows_are_the_rows_the_orm_reads():
    """The claim loads its rows with the engine's and the fields' own converters: every field of a
    claimed execution equals what the ORM reads back (dates aware, JSON decoded, booleans)."""
    job = make_job(concurrency_policy="allow")
    slot = timezone.now() - SECOND
    add_execution(
        job,
        slot=slot,
        trigger=Trigger.ENQUEUE,
        args=[1, "two", {"three": [3.5]}],
        kwargs={"name": "ü", "flag": True, "none": None},
        priority=7,
        term=12,
        reason="why",
    )
    add_execution(job, slot=slot - SECOND)

    claimed = claim_batch(
        node_id=NODE,
        queues=["default"],
        limit=5,
        horizon=timezone.now() + SECOND,
        now=timezone.now(),
        start_now=lambda rows: rows[:1],
    )

    assert len(claimed) == 2
    for execution in claimed:
        stored = JobExecution.objects.get(pk=execution.pk)
        for field in JobExecution._meta.concrete_fields:
            if field.name == "updated_at":
                continue  # stamped by the claim's statement, not read back
            assert getattr(execution, field.attname) == getattr(stored, field.attname), field.name
        assert execution.job == job
        assert execution.job.concurrency_policy == "allow"
    assert [e.status for e in claimed] == [S.RUNNING, S.PENDING]


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_rows_another_claimer_holds_and_takes_the_next_ones():
    """MariaDB: a claimer holding the first rows (its claim not committed yet) does not stop
    another: that one takes the next rows in claim order, and nothing twice."""
    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("SQLite serialises claimers on its write lock")
    job = make_job(concurrency_policy="allow")
    now = timezone.now()
    rows = [add_execution(job, slot=now - (10 - i) * SECOND) for i in range(6)]
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                # By primary key: in the model's default order (newest slot first) MariaDB may
                # read through the slot index, and a locking read locks every row it steps on.
                list(
                    JobExecution.objects.select_for_update()
                    .filter(pk__in=[rows[0].pk, rows[1].pk])
                    .order_by("pk")
                    .values_list("pk", flat=True)
                )
                held.set()
                release.wait(THREAD_JOIN_TIMEOUT_S)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(THREAD_JOIN_TIMEOUT_S)
        got = claim(limit=3)
    finally:
        release.set()
        thread.join(THREAD_JOIN_TIMEOUT_S)

    assert [e.pk for e in got] == [rows[2].pk, rows[3].pk, rows[4].pk]
    rest = claim(limit=10)
    assert sorted(e.pk for e in rest) == [rows[0].pk, rows[1].pk, rows[5].pk]


def test_claims_read_a_job_again_only_when_its_row_changed():
    """A claim takes its jobs from the process's cache while their rows are unchanged (one small
    query), and reads a job again after any write of its row: an edit, a pause."""
    job = make_job(concurrency_policy="allow", kwargs={})
    now = timezone.now()

    def claim_one(offset: int) -> tuple[JobExecution, list[str]]:
        add_execution(job, slot=now - SECOND - offset * MICROSECOND)
        with CaptureQueriesContext(connection) as queries:
            [execution] = claim(limit=1)
        return execution, [q["sql"] for q in queries]

    first, _ = claim_one(0)
    second, queries = claim_one(1)
    assert second.job is first.job
    assert not any("jobs_job" in q and "`name`" in q.replace('"', "`") for q in queries)

    job_update(
        job_id=job.pk,
        expected_version=job.version,
        changes={"timeout_seconds": 7, "concurrency_policy": "replace"},
        by=SYSTEM,
    )
    third, _ = claim_one(2)
    assert third.job is not first.job
    assert (third.job.timeout_seconds, third.job.concurrency_policy) == (7, "replace")

    job_pause(job_id=job.pk, by=SYSTEM)
    fourth, _ = claim_one(3)
    assert fourth.job.enabled is False


def test_a_claim_that_matched_fewer_rows_than_it_locked_keeps_those_that_carry_its_token(
    monkeypatch,
):
    """The claim's UPDATE is committed with it: should it match fewer rows than were locked, the
    claim is what the rows say (never a row that is not marked as claimed by it)."""
    job = make_job(concurrency_policy="allow")
    now = timezone.now()
    rows = [add_execution(job, slot=now - (3 - i) * SECOND) for i in range(3)]
    real = claims_module._claim_statement

    def skipping_the_first(sql, claimed, picked_ids, *args):
        return real(sql, claimed[1:], picked_ids - {claimed[0].pk}, *args)

    monkeypatch.setattr(claims_module, "_claim_statement", skipping_the_first)
    got = claim_batch(
        node_id=NODE,
        queues=["default"],
        limit=3,
        horizon=timezone.now() + SECOND,
        now=timezone.now(),
        start_now=lambda claimed: claimed,
    )
    assert [e.pk for e in got] == [rows[1].pk, rows[2].pk]
    assert all(e.status == S.RUNNING for e in got)
    first = JobExecution.objects.get(pk=rows[0].pk)
    assert (first.status, first.claim_token, first.node) == (S.PENDING, None, "")
