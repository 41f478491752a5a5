"""Leader faults with real ``runnode`` processes: SIGKILL, SIGTERM and SIGSTOP of the leader, on the
database backend and on Redis. Every fire slot of a 1-second job in the window runs exactly once
(rows and a side-effect file written by the task), and a stale leader changes nothing."""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tests.cluster.tasks  # noqa: F401 - registers test.record in this process for validation
from cluster.admission import SUPERSEDED_PREFIX
from cluster.models import LeadershipTerm, TermEndReason
from jobs import services
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.harness import Cluster, current_leader, read_records, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NODE_ARGS = ["--heartbeat-s", "0.3", "--dead-after-s", "3"]
# Generous bounds for a loaded 2-core machine; bench/ measures the real figures.
SIGKILL_TAKEOVER_BOUND_S = 6.0
SIGTERM_HANDOVER_BOUND_S = 1.5


@pytest.fixture(params=["database", "redis"])
def cluster(request, tmp_path):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    cluster = Cluster(
        tmp_path, coordination=request.param, redis_url=redis_url, default_args=NODE_ARGS
    )
    yield cluster
    cluster.close()


def make_ticking_job(path: Path) -> Job:
    return services.job_create(
        data={
            "name": "tick",
            "task": "test.record",
            "kwargs": {"path": str(path)},
            "schedule_type": "interval",
            "interval_seconds": 1,
        },
        by=services.SYSTEM,
    )


def assert_every_slot_once(
    job: Job,
    records_path: Path,
    *,
    until: float,
    frozen: tuple[str, float, float] | None = None,
) -> int:
    """Each whole-second slot from the first fire to ``until`` has exactly one attempt-1 row and its
    body ran once. A run lost with its killed node had started (its record exists) or was retried
    as a new attempt (jobs here have max_retries=0: the record must exist)."""
    rows = list(
        JobExecution.objects.filter(job=job).values_list("scheduled_for", "attempt", "status")
    )
    # forbid (the default) skips a slot that is due while the previous run is RUNNING. A run on a
    # killed node stays RUNNING until the reaper declares the node dead: slots due in that window
    # are rightly skipped (the run may still be going on, for all anyone knows).
    lost_windows = [
        (started.timestamp(), finished.timestamp())
        for started, finished in JobExecution.objects.filter(
            job=job, status=ExecutionStatus.LOST
        ).values_list("started_at", "finished_at")
    ]
    if frozen is not None:
        # (node, stopped at, resumed at): a run on the frozen node may have finished before the
        # freeze while its outcome was committed only after the resume (SIGSTOP between the
        # finisher's UPDATE and COMMIT); to every other node it was RUNNING meanwhile.
        node, stopped_at, resumed_at = frozen
        lost_windows += [
            (started.timestamp(), resumed_at)
            for (started,) in JobExecution.objects.filter(
                job=job, node=node, started_at__lte=datetime.fromtimestamp(stopped_at, tz=UTC)
            ).values_list("started_at")
        ]
    # A fire still unstarted when the next one fell due (a cluster starting up, a takeover) is
    # superseded by it (run_once, the default): rightly skipped once that next slot was due.
    superseded = {
        slot.timestamp(): finished.timestamp()
        for slot, finished in JobExecution.objects.filter(
            job=job, status=ExecutionStatus.SKIPPED, reason__startswith=SUPERSEDED_PREFIX
        ).values_list("scheduled_for", "finished_at")
    }
    first = min(r[0].timestamp() for r in rows)
    slots = [first + k for k in range(int(until - first))]
    by_slot: dict[float, list[tuple[int, str]]] = {}
    for scheduled_for, attempt, status in rows:
        by_slot.setdefault(scheduled_for.timestamp(), []).append((attempt, status))
    for row in (
        JobExecution.objects.filter(job=job)
        .order_by("scheduled_for", "attempt")
        .values_list(
            "scheduled_for",
            "attempt",
            "status",
            "node",
            "reason",
            "claimed_at",
            "started_at",
            "finished_at",
        )
    ):
        print(*row)  # shown by pytest when an assertion below fails
    records = read_records(records_path)
    executions_run = Counter(r[0] for r in records)
    assert all(count == 1 for count in executions_run.values()), "an execution ran twice"
    ran_slots = Counter((r[1], r[2]) for r in records)
    assert all(count == 1 for count in ran_slots.values()), "a (slot, attempt) ran twice"
    missing = [s for s in slots if s not in by_slot]
    assert not missing, f"slots never fired: {missing}"
    for slot in slots:
        attempts = sorted(by_slot[slot])
        assert [a for a, _ in attempts] == list(range(1, len(attempts) + 1))
        succeeded = [a for a, status in attempts if status == ExecutionStatus.SUCCEEDED]
        assert len(succeeded) <= 1, f"slot {slot} succeeded twice: {attempts}"
        if attempts[0][1] == ExecutionStatus.SKIPPED and slot in superseded:
            assert superseded[slot] >= slot + 1, f"slot {slot} superseded before the next was due"
        elif attempts[0][1] == ExecutionStatus.SKIPPED:
            assert any(start <= slot <= end for start, end in lost_windows), (
                f"slot {slot} skipped outside a lost run's window: {attempts}"
            )
        if attempts[0][1] == ExecutionStatus.LOST:
            # Its node died mid-run: the body had started (the record says so), or it is retried.
            assert len(attempts) == 2 or (slot, 1) in ran_slots, f"lost slot {slot}: {attempts}"
    return len(slots)


# On Redis only: test_fault_windows kills the leader at a slot instant on both backends, and the
# deterministic cluster (test_sim_faults) at and around slot instants.
@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_sigkill_leader_is_replaced_and_no_slot_is_lost_or_doubled(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_ticking_job(records)
    for index in range(3):
        cluster.start(f"n{index}")
    leader, term = wait_for(current_leader, 30)
    wait_for(lambda: len(read_records(records)) >= 4, 20)

    killed_at = time.time()
    cluster.nodes[leader].signal(signal.SIGKILL)
    cluster.nodes[leader].wait(5)
    new_leader, new_term = wait_for(
        lambda: (found := current_leader()) and found[1] > term and found, 20
    )
    takeover = LeadershipTerm.objects.get(term=new_term).acquired_at.timestamp() - killed_at
    assert new_leader != leader
    assert takeover < SIGKILL_TAKEOVER_BOUND_S, cluster.logs()
    time.sleep(5)  # past the dead threshold: the reaper has seen the dead node
    checked_until = time.time() - 2
    cluster.close()

    assert assert_every_slot_once(job, records, until=checked_until) >= 5
    old = LeadershipTerm.objects.get(term=term)
    assert old.ended_at is not None
    assert old.end_reason == TermEndReason.NODE_DIED
    assert not JobExecution.objects.filter(status=ExecutionStatus.RUNNING).exists()


def test_sigterm_leader_hands_over_at_once_and_exits_zero(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_ticking_job(records)
    for index in range(3):
        cluster.start(f"n{index}")
    leader, term = wait_for(current_leader, 30)
    wait_for(lambda: len(read_records(records)) >= 3, 20)

    stopped_at = time.time()
    cluster.nodes[leader].signal(signal.SIGTERM)
    _, new_term = wait_for(lambda: (found := current_leader()) and found[1] > term and found, 10)
    handover = LeadershipTerm.objects.get(term=new_term).acquired_at.timestamp() - stopped_at
    assert cluster.nodes[leader].wait(30) == 0, cluster.logs()
    # Faster than the 2 s lease could expire: the lease was released, not left to lapse.
    assert handover < SIGTERM_HANDOVER_BOUND_S, cluster.logs()
    assert LeadershipTerm.objects.get(term=term).end_reason == TermEndReason.STEPPED_DOWN
    time.sleep(3)
    checked_until = time.time() - 2
    cluster.close()
    assert assert_every_slot_once(job, records, until=checked_until) >= 3


@pytest.mark.skipif(
    "sqlite" in __import__("django.conf").conf.settings.DATABASES["default"]["ENGINE"],
    reason="SQLite has one database-wide write lock: a process frozen mid-write blocks every other "
    "writer until it resumes. Production runs MariaDB, which kills a connection idle inside a "
    "transaction (SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S); CI runs this test there. The fencing "
    "itself is unit-tested on SQLite in test_scheduler.py.",
)
def test_sigstopped_leader_is_fenced_when_it_resumes(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_ticking_job(records)
    for index in range(3):
        cluster.start(f"n{index}")
    leader, term = wait_for(current_leader, 30)
    wait_for(lambda: len(read_records(records)) >= 3, 20)

    frozen = cluster.nodes[leader]
    stopped_at = time.time()
    frozen.signal(signal.SIGSTOP)
    try:
        _, new_term = wait_for(
            lambda: (found := current_leader()) and found[1] > term and found, 20
        )
        new_since = LeadershipTerm.objects.get(term=new_term).acquired_at
    finally:
        frozen.signal(signal.SIGCONT)
        resumed_at = time.time()
    time.sleep(4)
    checked_until = time.time() - 2

    # The resumed process noticed it had lost the lease and wrote nothing as leader afterwards.
    assert frozen.alive()
    assert "stopped leading" in frozen.log()
    assert not JobExecution.objects.filter(term=term, created_at__gt=new_since).exists()
    assert current_leader()[1] == new_term
    cluster.close()
    frozen_window = (leader, stopped_at, resumed_at + 1)
    assert assert_every_slot_once(job, records, until=checked_until, frozen=frozen_window) >= 5
