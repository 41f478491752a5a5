"""Faults at the worst instants, with real ``runnode`` processes and default policies (forbid,
run_once): just before a slot, when the dead node has already marked its next runs running; a
freeze past the lease with retries on; the coordination Redis restarted without its data.

What must hold: no fire runs twice, no fire is lost but the runs in flight at the fault (recorded
``lost`` with a reason), no body starts after its run was declared lost, and a term is never held
twice."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from django.conf import settings

import tests.cluster.tasks  # noqa: F401 - registers test.record in this process for validation
from cluster.admission import SUPERSEDED_PREFIX
from cluster.models import LeadershipTerm
from jobs import services
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.harness import Cluster, current_leader, read_records, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

S = ExecutionStatus
JOBS = 4
# The node defaults (presence TTL 2 s, heartbeat 0.5 s), as an operator runs them.
NODE_ARGS: list[str] = []
# A loaded 2-core machine's bound on a job's longest pause around a SIGKILL of the leader; the
# design's p99 target (3 s) is measured by bench/ (W3). Before presence expiry and the truth rule
# for forbid, the gap was 6-7 s.
GAP_BOUND_S = 4.5
# Just before a whole second: the next runs are already marked running (write-ahead), not started.
BEFORE_SLOT_S = 0.1
ON_SQLITE = "sqlite" in settings.DATABASES["default"]["ENGINE"]


def make_jobs(tmp_path: Path, **fields: object) -> dict[int, Path]:
    paths = {}
    for index in range(JOBS):
        path = tmp_path / f"records-{index}.txt"
        job = services.job_create(
            data={
                "name": f"tick-{index}",
                "task": "test.record",
                "kwargs": {"path": str(path)},
                "schedule_type": "interval",
                "interval_seconds": 1,
                **fields,
            },
            by=services.SYSTEM,
        )
        paths[job.pk] = path
    return paths


def sleep_until_before_slot(offset_s: float = BEFORE_SLOT_S) -> float:
    """Sleep until ``offset_s`` before the next whole second (at least 0.3 s from now)."""
    now = time.time()
    target = int(now) + 1 - offset_s
    if target - now < 0.3:
        target += 1
    time.sleep(target - now)
    return time.time()


def dump(job_id: int) -> None:
    for row in (
        JobExecution.objects.filter(job_id=job_id)
        .order_by("scheduled_for", "attempt")
        .values_list("pk", "scheduled_for", "attempt", "status", "node", "reason", "finished_at")
    ):
        print(*row)  # shown by pytest when an assertion fails


def check_slots(
    paths: dict[int, Path], *, since: float, until: float, fault_at: float, faulted_node: str
) -> dict[str, int]:
    """Every 1 s slot in [since, until) of every job ran exactly once, or was in flight on the
    faulted node at the fault (lost, with its reason). Nothing was skipped. Returns counts."""
    counts: Counter[str] = Counter()
    for job_id, path in paths.items():
        dump(job_id)
        records = read_records(path)
        starts = Counter(r[0] for r in records)
        assert all(n == 1 for n in starts.values()), f"an execution's body ran twice: {starts}"
        by_slot: dict[int, list[JobExecution]] = defaultdict(list)
        for row in JobExecution.objects.filter(job_id=job_id):
            by_slot[round(row.scheduled_for.timestamp())].append(row)
        for slot in range(int(since) + 1, int(until)):
            rows = sorted(by_slot.get(slot, []), key=lambda r: r.attempt)
            assert rows, f"job {job_id}: slot {slot} never fired"
            first = rows[0]
            if first.status == S.LOST:
                # In flight on the faulted node: indeterminate, with its reason, near the fault.
                assert first.node == faulted_node, f"slot {slot} lost elsewhere: {first.reason}"
                assert first.reason, f"slot {slot} lost without a reason"
                assert abs(slot - fault_at) <= 2.5, f"slot {slot} lost far from the fault"
                counts["lost"] += 1
            else:
                assert first.status == S.SUCCEEDED, (
                    f"job {job_id}: slot {slot} {first.status}: {first.reason}"
                )
                counts["succeeded"] += 1
        # The longest pause between two body starts of the job around the fault (from the last
        # start before it).
        started = sorted(r[3] for r in records if fault_at - 1.5 <= r[3] <= until)
        gap = max(b - a for a, b in itertools.pairwise(started))
        counts["max_gap_ms"] = max(counts["max_gap_ms"], int(gap * 1000))
    return dict(counts)


@pytest.fixture(params=["database", "redis"])
def cluster(request, tmp_path):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    cluster = Cluster(
        tmp_path, coordination=request.param, redis_url=redis_url, default_args=NODE_ARGS
    )
    yield cluster
    cluster.close()


def test_sigkill_of_the_leader_just_before_a_slot_loses_only_its_runs_in_flight(cluster, tmp_path):
    paths = make_jobs(tmp_path)
    for index in range(3):
        cluster.start(f"n{index}")
    leader, term = wait_for(current_leader, 30)
    wait_for(lambda: all(len(read_records(p)) >= 3 for p in paths.values()), 20)
    since = time.time()

    killed_at = sleep_until_before_slot()
    cluster.nodes[leader].signal(signal.SIGKILL)
    cluster.nodes[leader].wait(5)
    wait_for(lambda: (found := current_leader()) and found[1] > term, 20)
    time.sleep(7)
    until = time.time() - 1.5
    cluster.close()

    counts = check_slots(paths, since=since, until=until, fault_at=killed_at, faulted_node=leader)
    print(counts)
    assert counts["succeeded"] >= JOBS * 4
    assert counts["max_gap_ms"] <= GAP_BOUND_S * 1000, counts
    assert not JobExecution.objects.filter(status=S.RUNNING).exists()
    # Nothing skipped around the kill. While the cluster started, a fire not yet started when the
    # next one fell due was superseded by it (run_once): those are before the window checked.
    skipped = JobExecution.objects.filter(status=S.SKIPPED)
    assert not skipped.exclude(reason__startswith=SUPERSEDED_PREFIX).exists()
    assert not skipped.filter(scheduled_for__gte=datetime.fromtimestamp(since, tz=UTC)).exists()


@pytest.mark.skipif(
    ON_SQLITE,
    reason="SQLite has one database-wide write lock: a process frozen mid-write blocks every other "
    "writer until it resumes (production runs MariaDB, whose idle-transaction timeout frees it).",
)
def test_a_node_frozen_past_its_lease_starts_no_body_the_cluster_took(cluster, tmp_path):
    """SIGSTOP, just before a slot, the node that has already marked that slot's runs running, for
    longer than the presence TTL, with retries on: the cluster declares its prepared runs lost and
    retries them elsewhere; on SIGCONT the frozen node must not start those bodies (it did: only the
    outcome writes were fenced)."""
    paths = make_jobs(tmp_path, max_retries=1, retry_backoff_base=0.1, retry_jitter=False)
    for index in range(3):
        cluster.start(f"n{index}")
    wait_for(current_leader, 30)
    wait_for(lambda: all(len(read_records(p)) >= 3 for p in paths.values()), 20)

    # Any node may claim a slot's runs ahead of it: freeze the one that did (the leader need not).
    frozen_name = None
    for _ in range(10):
        now = sleep_until_before_slot(offset_s=0.15)
        slot = datetime.fromtimestamp(int(now) + 1, tz=UTC)
        holders = Counter(
            JobExecution.objects.filter(status=S.RUNNING, scheduled_for=slot).values_list(
                "node", flat=True
            )
        )
        if holders:
            frozen_name = holders.most_common(1)[0][0]
            break
    assert frozen_name, "no node marked a slot's runs running ahead of it in 10 slots"
    frozen = cluster.nodes[frozen_name]
    frozen.signal(signal.SIGSTOP)
    try:
        # Past the presence TTL: the frozen node's runs are declared lost (and retried elsewhere).
        wait_for(lambda: JobExecution.objects.filter(status=S.LOST, node=frozen_name).exists(), 20)
        time.sleep(1)
    finally:
        frozen.signal(signal.SIGCONT)
    time.sleep(4)
    frozen_log = frozen.log()
    cluster.close()

    declared_lost = {
        row.pk: row.finished_at.timestamp()
        for row in JobExecution.objects.filter(status=S.LOST, node=frozen_name)
    }
    late_starts = []
    for job_id, path in paths.items():
        dump(job_id)
        for execution_id, _slot, _attempt, started, _pid in read_records(path):
            if execution_id in declared_lost and started > declared_lost[execution_id]:
                late_starts.append((execution_id, started - declared_lost[execution_id]))
        records = read_records(path)
        assert all(n == 1 for n in Counter(r[0] for r in records).values())
    assert declared_lost, "the freeze was meant to make the cluster take the frozen node's runs"
    assert late_starts == [], f"bodies started after their run was declared lost: {late_starts}"
    assert "handed back" in frozen_log or "already taken by the cluster" in frozen_log


def test_a_redis_restart_without_its_data_never_mints_a_term_twice(redis_factory, tmp_path):
    """The coordination Redis restarts empty: its term counter starts again from 1. The new leader
    must end above every term the cluster has recorded, one row per term, and the row of the open
    term names the node that really holds the lease."""
    server = redis_factory()  # its own: restarted empty below
    cluster = Cluster(tmp_path, coordination="redis", redis_url=server.url)
    try:
        paths = make_jobs(tmp_path)
        for index in range(2):
            cluster.start(f"n{index}")
        # The restarted counter mints 1, 2, ... again: the one term recorded so far is the one it
        # would hand out twice.
        _, before = wait_for(current_leader, 30)
        assert before == 1
        wait_for(lambda: all(len(read_records(p)) >= 2 for p in paths.values()), 20)

        server.stop()
        time.sleep(1)
        server.start()  # empty: --save "" --appendonly no
        wait_for(lambda: (found := current_leader()) and found[1] > before, 30)
        prefix = cluster.env["SCHEDULER_REDIS_PREFIX"]
        client = redis.Redis.from_url(server.url, decode_responses=True)

        def settled() -> tuple[str, int] | None:
            # The open term in the database is the lease Redis holds now (once elections settle).
            raw = client.get(f"{prefix}:lease:scheduler-leader")
            found = current_leader()
            if raw is None or found is None:
                return None
            lease = json.loads(raw)
            return found if (lease["holder"], lease["term"]) == found else None

        holder, open_term = wait_for(settled, 15)
        client.close()
        terms = list(LeadershipTerm.objects.values_list("term", "node_id"))
    finally:
        cluster.close()

    assert open_term > before
    assert len({t for t, _ in terms}) == len(terms)
    lease_rows = LeadershipTerm.objects.filter(ended_at__isnull=True)
    assert lease_rows.count() <= 1
    assert holder in cluster.nodes
    assert all(len(read_records(p)) > 0 for p in paths.values())
    assert not Job.objects.filter(enabled=True, next_fire_at__isnull=True).exists()
