"""Flow control on the deterministic cluster: a job's and a queue's concurrency limits, rate
limits over every window, a paused queue, each held run saying why it waits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs import flow
from jobs.models import FlowPermit, JobExecution, Queue
from jobs.states import ExecutionStatus
from tests.cluster.sim import SimCluster

S = ExecutionStatus


@pytest.fixture
def sim(monkeypatch):
    flow.forget_config()
    monkeypatch.setattr(flow, "CONFIG_TTL_S", 0.0)
    return SimCluster(("n1", "n2", "n3"), queues=["default", "reports", "batch"]).patch_time(
        monkeypatch
    )


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of spans (start, end) open at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def run_spans(job_ids: list[int]) -> list[tuple[float, float]]:
    rows = JobExecution.objects.filter(job_id__in=job_ids, started_at__isnull=False)
    return [
        (row.started_at.timestamp(), (row.finished_at or row.started_at).timestamp())
        for row in rows
        if row.finished_at is not None
    ]


def busiest_window(instants: list[float], period: float) -> int:
    instants = sorted(instants)
    best = 0
    for index, start in enumerate(instants):
        best = max(best, sum(1 for t in instants[index:] if t < start + period))
    return best


@pytest.mark.django_db(transaction=True)
def test_a_job_limit_keeps_at_most_n_runs_going_and_the_rest_wait(sim) -> None:
    job = sim.create_job(
        name="limited",
        concurrency_policy="allow",
        max_concurrent=2,
        kwargs={"seconds": 3.5},
        misfire_policy="run_all",
        run_all_max=100,
        misfire_grace_seconds=600,
    )
    waiting_seen = set()
    for _ in range(40):
        sim.advance(0.5)
        waiting_seen |= set(
            JobExecution.objects.filter(job=job, status=S.PENDING)
            .exclude(reason="")
            .values_list("reason", flat=True)
        )
    spans = run_spans([job.pk])
    assert len(spans) >= 8
    assert most_at_once(spans) == 2
    assert waiting_seen == {"waiting: job limit 2 reached"}
    # None of the runs held back was refused: each waits, then runs or is still waiting.
    assert not JobExecution.objects.filter(job=job, status=S.SKIPPED).exists()


@pytest.mark.django_db(transaction=True)
def test_a_queue_limit_counts_every_job_of_the_queue(sim) -> None:
    Queue.objects.create(name="reports", max_concurrent=3)
    jobs = [
        sim.create_job(
            name=f"report-{i}",
            queue="reports",
            concurrency_policy="allow",
            kwargs={"seconds": 2.5},
        )
        for i in range(4)
    ]
    sim.advance(15)
    spans = run_spans([job.pk for job in jobs])
    assert len(spans) >= 10
    assert most_at_once(spans) == 3
    reasons = set(JobExecution.objects.values_list("reason", flat=True))
    assert "waiting: queue reports limit 3 reached" in reasons or any(
        "superseded" in reason for reason in reasons
    )


@pytest.mark.django_db(transaction=True)
def test_a_rate_limit_holds_every_window_and_releases_when_it_frees(sim) -> None:
    job = sim.create_manual_job(name="throttled", rate_limit=3, rate_period_seconds=2)
    from jobs.services import SYSTEM, job_trigger

    for _ in range(12):
        job_trigger(job_id=job.pk, by=SYSTEM)
        sim.clock.advance(0.001)
    sim.advance(10)
    rows = list(JobExecution.objects.filter(job=job))
    started = [row.started_at.timestamp() for row in rows if row.started_at is not None]
    assert len(started) == 12, [(row.status, row.reason) for row in rows]
    assert busiest_window(started, 2.0) == 3
    # The permits are the release instants: as many as runs, each window within the limit.
    permits = [p.released_at.timestamp() for p in FlowPermit.objects.filter(key=f"job:{job.pk}")]
    assert len(permits) == 12
    assert busiest_window(permits, 2.0) == 3
    # Every body started at or after its release.
    released = {p.execution_id: p.released_at for p in FlowPermit.objects.all()}
    assert all(row.started_at >= released[row.pk] for row in rows)
    # Released as the window freed, not a poll later: the 4th 2.1 s (the period and the margin)
    # after the 1st.
    permits.sort()
    assert permits[3] - permits[0] == pytest.approx(2.0 + flow.RATE_MARGIN_S, abs=0.01)


@pytest.mark.django_db(transaction=True)
def test_a_paused_queue_is_not_claimed_from_until_it_resumes(sim) -> None:
    Queue.objects.create(name="batch", paused=True)
    job = sim.create_manual_job(name="in-batch", queue="batch")
    from jobs.services import SYSTEM, job_trigger

    execution = job_trigger(job_id=job.pk, by=SYSTEM)
    sim.advance(3)
    execution.refresh_from_db()
    assert execution.status == S.PENDING
    assert execution.claim_token is None
    assert flow.waiting_reason(execution) == "waiting: queue batch paused"
    assert not sim.starts(job)
    Queue.objects.filter(name="batch").update(paused=False)
    sim.advance(2)
    execution.refresh_from_db()
    assert execution.status == S.SUCCEEDED
    assert flow.waiting_reason(execution) == ""


@pytest.mark.django_db(transaction=True)
def test_a_run_claimed_before_its_queue_paused_goes_back(sim) -> None:
    job = sim.create_job(name="late-pause", queue="batch", interval_seconds=10)
    for _ in range(400):
        sim.advance(0.05)
        ahead = JobExecution.objects.filter(
            job=job, status=S.PENDING, claim_token__isnull=False
        ).first()
        if ahead is not None:
            break
    assert ahead is not None, "never claimed ahead of its instant"
    Queue.objects.create(name="batch", paused=True)
    sim.advance(3)
    ahead.refresh_from_db()
    assert ahead.status == S.PENDING
    assert ahead.claim_token is None
    assert ahead.reason == "waiting: queue batch paused"
    assert not [e for e in sim.starts(job) if e.execution_id == ahead.pk]


@pytest.mark.django_db(transaction=True)
def test_a_hand_back_that_fails_after_the_gate_committed_strands_nothing(sim, monkeypatch) -> None:
    from django.db import OperationalError

    from jobs import executions
    from jobs.services import SYSTEM, job_trigger

    job = sim.create_manual_job(
        name="one-at-a-time", concurrency_policy="allow", max_concurrent=1, kwargs={"seconds": 1}
    )
    real = executions.hand_back
    failures = []

    def flaky(execution, **kwargs):
        if kwargs.get("reason") and not failures:
            failures.append(execution.pk)
            raise OperationalError(2013, "Lost connection to server during query")
        return real(execution, **kwargs)

    monkeypatch.setattr(executions, "hand_back", flaky)
    first = job_trigger(job_id=job.pk, by=SYSTEM)
    sim.clock.advance(0.001)
    second = job_trigger(job_id=job.pk, by=SYSTEM)
    sim.advance(40)
    assert failures, "no hand-back was refused: the test did not try what it means to"
    statuses = dict(
        JobExecution.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "status")
    )
    # The run let through ran (it was not sent back to admission after its commit), and the
    # one held back was given back by the self-audit and ran after it.
    assert statuses == {first.pk: S.SUCCEEDED, second.pk: S.SUCCEEDED}
    assert most_at_once(run_spans([job.pk])) == 1


@pytest.mark.django_db
def test_permits_are_kept_for_their_whole_period() -> None:
    from datetime import UTC, datetime

    from jobs.models import FlowPermit

    now = datetime(2026, 12, 6, 12, tzinfo=UTC)
    day = timedelta(days=1)
    FlowPermit.objects.create(key="job:1", released_at=now - timedelta(hours=5), execution_id=1)
    FlowPermit.objects.create(
        key="job:1", released_at=now - day - timedelta(hours=1), execution_id=2
    )
    gate = flow.Gate(allowed=[], permits={}, planned={}, now=now, periods={"job:1": day})

    class Run:
        pk = 3

    gate.allowed = [Run()]  # type: ignore[list-item]
    gate.permits = {3: ["job:1"]}
    gate.planned = {3: now}
    flow.record(gate, {3})
    kept = sorted(FlowPermit.objects.values_list("execution_id", flat=True))
    assert kept == [1, 3]  # 5 h old: inside the day's window; 25 h old: gone
