"""Worker faults that need real ``runnode`` processes (docs/guarantees.md): Redlock at the job level with
real masters lost and restarted, an operator drain through the service (the node's own heartbeat
sees it and its process exits 0), and a process-isolated run killed at its timeout. Every process is
stopped in a ``finally`` or a fixture.

The logic of a worker SIGKILLed mid-run, a ``forbid`` job longer than its interval, misfires after
the whole cluster was down, run_all catch-up runs of a forbid job and a drain inside the prepare
window is tested at exact instants on the deterministic cluster (test_sim_faults.py)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import tests.cluster.tasks  # noqa: F401 - registers the test tasks in this process for validation
from cluster.admission import REASON_FORBID, SUPERSEDED_PREFIX
from cluster.models import NodeStatus, SchedulerNode
from cluster.services import node_request_drain
from jobs import services
from jobs.models import AuditEvent, JobExecution
from jobs.states import TERMINAL_STATES, ExecutionStatus
from tests.cluster.faults_helpers import (
    dump,
    make_interval_job,
    make_manual_job,
    pid_alive,
    record_count,
    rows,
    spawned_task_children,
)
from tests.cluster.harness import Cluster, current_leader, read_records, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

S = ExecutionStatus
GRACE_S = 10.0
DEAD_AFTER_S = 3.0
NODE_ARGS = [
    "--heartbeat-s",
    "0.3",
    "--dead-after-s",
    str(DEAD_AFTER_S),
    "--grace",
    str(GRACE_S),
]
# Generous bounds: a loaded 2-core machine shared with other test runs. Correctness is asserted,
# speed is bench/'s business.
WAIT_S = 30.0


@pytest.fixture(params=["database", "redis"])
def cluster(request, tmp_path):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    cluster = Cluster(
        tmp_path, coordination=request.param, redis_url=redis_url, default_args=NODE_ARGS
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def db_cluster(tmp_path):
    cluster = Cluster(tmp_path, coordination="database", default_args=NODE_ARGS)
    try:
        yield cluster
    finally:
        cluster.close()


def status_of(pk: int) -> str | None:
    return JobExecution.objects.filter(pk=pk).values_list("status", flat=True).first()


def node_active(node_id: str) -> bool:
    return SchedulerNode.objects.filter(node_id=node_id, status=NodeStatus.ACTIVE).exists()


def leader_is(node_id: str) -> bool:
    found = current_leader()
    return bool(found) and found[0] == node_id


def ts(value: datetime) -> float:
    return value.timestamp()


# --- Redlock with three real masters at the job level ------------------------------------------


def run_quorum_outage(redis_factory, tmp_path: Path) -> dict[str, Any]:
    """A forbid 1-second job on two Redis-coordinated nodes whose job lock is Redlock over three
    private masters (the lease lives on the first). One master lost: runs go on. Two lost: no run
    starts, nothing crashes. Both restarted: runs resume."""
    masters = [redis_factory() for _ in range(3)]
    lease_master, second, third = masters
    records = tmp_path / "records.txt"
    job = make_interval_job(
        "redlock-forbid", "test.record", {"path": str(records)}, concurrency_policy="forbid"
    )
    cluster = Cluster(
        tmp_path,
        coordination="redis",
        redis_url=lease_master.url,
        redlock_urls=[m.url for m in masters],
        default_args=NODE_ARGS,
    )
    try:
        cluster.start("r0")
        cluster.start("r1")
        wait_for(lambda: record_count(records) >= 3, WAIT_S)

        second.stop()  # 2 of 3 masters: still a quorum
        before = record_count(records)
        wait_for(lambda: record_count(records) >= before + 3, WAIT_S)

        third.stop()  # 1 of 3: no quorum, no job lock, no run
        time.sleep(2.5)  # a run that held the lock before the loss may still record
        frozen, outage_from = record_count(records), time.time()
        time.sleep(5)
        outage_to = time.time()
        assert record_count(records) == frozen, "a forbid run started without a lock quorum"
        assert all(node.alive() for node in cluster.nodes.values()), cluster.logs()
        assert leader_is("r0") or leader_is("r1")  # the lease lives on the REDIS_URL master
        in_outage = JobExecution.objects.filter(
            job=job,
            scheduled_for__gte=datetime.fromtimestamp(outage_from, tz=UTC),
            scheduled_for__lte=datetime.fromtimestamp(outage_to - 1, tz=UTC),
        )
        # The leader kept firing; those fires wait for the lock (deferred), unrun, and each one
        # overtaken by the next fire is superseded by it (run_once): never run a slot late.
        assert in_outage.count() >= 3
        outcomes = set(in_outage.values_list("status", "reason"))
        assert {status for status, _ in outcomes} <= {S.PENDING, S.SKIPPED}, dump(job)
        assert all(
            reason.startswith(SUPERSEDED_PREFIX)
            for status, reason in outcomes
            if status == S.SKIPPED
        ), dump(job)
        assert not JobExecution.objects.filter(
            job=job, started_at__gte=datetime.fromtimestamp(outage_from, tz=UTC)
        ).exists()

        second.start()
        third.start()
        resumed = record_count(records)
        wait_for(lambda: record_count(records) >= resumed + 3, WAIT_S)
        assert all(node.alive() for node in cluster.nodes.values()), cluster.logs()
        # Every fire deferred during the outage is settled (run, or skipped) before the stop.
        wait_for(lambda: not in_outage.filter(status=S.PENDING).exists(), WAIT_S)
    finally:
        cluster.close()
        for master in masters:
            master.stop()
    dump(job)
    return {
        "job": job,
        "records": records,
        "logs": "".join(n.log_path.read_text(errors="replace") for n in cluster.nodes.values()),
        "lost_quorum_at": outage_from - 2.5,
    }


def assert_forbid_skips_justified(job) -> None:
    """forbid skips a fire only when another run of the job was running at its due instant."""
    job_rows = rows(job)
    runs = [r for r in job_rows if r["started_at"] is not None]
    for row in job_rows:
        if row["status"] != S.SKIPPED or row["reason"] != REASON_FORBID:
            continue
        due = ts(row["scheduled_for"])
        covering = [
            r
            for r in runs
            if ts(r["started_at"]) <= due + 0.05
            and (r["finished_at"] is None or ts(r["finished_at"]) >= due)
        ]
        assert covering, f"skipped as forbid, but no run was active at its due instant: {row}"


def test_job_lock_needs_a_redlock_quorum_of_real_masters(redis_factory, tmp_path):
    outcome = run_quorum_outage(redis_factory, tmp_path)
    # Fires deferred while the quorum was lost are not skipped as "forbid" afterwards: no run was
    # active at their due instant (their run_after was moved by the deferral, their due was not).
    assert_forbid_skips_justified(outcome["job"])
    assert "crashed the worker thread" not in outcome["logs"]
    assert "loop failed" not in outcome["logs"]
    assert "executor step" not in outcome["logs"]
    assert not JobExecution.objects.filter(status=S.RUNNING).exists()
    ran = read_records(outcome["records"])
    assert all(count == 1 for count in Counter(r[0] for r in ran).values()), "a run ran twice"
    assert all(count == 1 for count in Counter((r[1], r[2]) for r in ran).values())
    for earlier, later in pairwise(
        sorted(
            JobExecution.objects.filter(job=outcome["job"], started_at__isnull=False).values_list(
                "started_at", "finished_at"
            )
        )
    ):
        assert later[0] >= earlier[1], "forbid runs overlapped"


# --- drain requested by an operator ------------------------------------------------------------


# The drain is seen by the node's heartbeat, whatever the coordination backend: one is enough.
@pytest.mark.parametrize("cluster", ["database"], indirect=True)
def test_drain_requested_through_the_service_stops_a_follower_cleanly(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_interval_job("drain-tick", "test.record", {"path": str(records)})
    cluster.start("d0")
    leader, term = wait_for(current_leader, WAIT_S)
    cluster.start("d1")
    cluster.start("d2")
    wait_for(lambda: node_active("d1") and node_active("d2"), WAIT_S)
    wait_for(lambda: record_count(records) >= 2, WAIT_S)
    victim_id = "d1" if leader != "d1" else "d2"
    victim = cluster.nodes[victim_id]

    row = SchedulerNode.objects.get(node_id=victim_id)
    requested_at = time.monotonic()
    node_request_drain(node_pk=row.pk, by=services.SYSTEM)
    assert victim.wait(GRACE_S + WAIT_S) == 0, cluster.logs()
    took = time.monotonic() - requested_at
    exited_at = time.time()
    assert took < GRACE_S + 5, f"drain took {took:.1f} s"
    assert "drain requested by an operator" in victim.log()
    assert AuditEvent.objects.filter(action="node.drain", object_id=victim_id).exists()

    before = record_count(records)
    wait_for(lambda: record_count(records) >= before + 3, WAIT_S)
    time.sleep(DEAD_AFTER_S + 1)  # past the dead threshold: a stopped node is not "dead"
    row.refresh_from_db()
    assert row.status == NodeStatus.STOPPED
    assert not row.drain_requested
    assert current_leader() == (leader, term), "the drain of a follower moved leadership"
    assert not JobExecution.objects.filter(
        node=victim_id, started_at__gte=datetime.fromtimestamp(exited_at, tz=UTC)
    ).exists()
    assert not JobExecution.objects.filter(
        node=victim_id, status__in=[S.PENDING, S.RUNNING]
    ).exists(), dump(job)


# --- timeout of a process-isolated run ---------------------------------------------------------


@pytest.mark.parametrize("timeout_s", [1, 3])
def test_process_isolated_run_is_killed_at_its_timeout(db_cluster, tmp_path, timeout_s):
    """The child's start-up counts against the timeout: with 1 s on a loaded machine the body may
    not have written its pid yet, so every spawned task child the node had is watched too; 3 s is
    long enough for the body to start, and its own pid must be dead afterwards."""
    pid_file = tmp_path / "hang.pid"
    job = make_manual_job(
        "hang-process",
        "test.hang",
        {"pid_file": str(pid_file)},
        timeout_seconds=timeout_s,
        isolation="process",
    )
    node = db_cluster.start("p0")
    wait_for(lambda: node_active("p0"), WAIT_S)
    execution = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    children: set[int] = set()

    def finished() -> str | None:
        children.update(spawned_task_children(node.pid))
        status = status_of(execution.pk)
        return status if status in TERMINAL_STATES else None

    try:
        wait_for(finished, WAIT_S, interval=0.02)
    finally:
        dump(job)
        print(db_cluster.logs())
    final = JobExecution.objects.get(pk=execution.pk)
    assert final.status == S.TIMED_OUT, (final.error, final.traceback)
    assert final.reason == f"exceeded timeout of {timeout_s} s"
    if timeout_s >= 3:
        assert pid_file.exists(), "the task body never started"
    if pid_file.exists():
        children.add(int(pid_file.read_text()))
    assert children, "no task process was ever seen"
    wait_for(lambda: not any(pid_alive(pid) for pid in children), 10)
    assert node.alive()
    assert not JobExecution.objects.filter(status=S.RUNNING).exists()
