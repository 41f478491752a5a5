"""Worker faults with real ``runnode`` processes (DESIGN §4, §6): a worker SIGKILLed mid-run, a
``forbid`` job longer than its interval, misfires after the whole cluster was down, Redlock at the
job level with real masters lost and restarted, an operator drain, and a process-isolated run killed
at its timeout. Every process is stopped in a ``finally`` or a fixture."""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import tests.cluster.tasks  # noqa: F401 - registers the test tasks in this process for validation
from cluster.admission import REASON_FORBID, REASON_MISFIRE_STALE
from cluster.executor import PREPARE_AHEAD_S
from cluster.models import NodeStatus, SchedulerNode
from cluster.scheduler import (
    REASON_MISFIRE_BEYOND_BOUND,
    REASON_MISFIRE_COALESCED,
    REASON_MISFIRE_SKIPPED,
)
from cluster.services import node_request_drain
from jobs import services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.states import TERMINAL_STATES, ExecutionStatus
from tests.cluster.faults_helpers import (
    dump,
    make_interval_job,
    make_job,
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


# --- 1. SIGKILL of a worker mid-execution ---------------------------------------------------------


def test_sigkilled_worker_run_is_lost_and_retried_on_another_worker(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_manual_job(
        "slow-once",
        "test.record_and_sleep",
        {"path": str(records), "seconds": 30},
        queue="slow",
        max_retries=1,
        retry_backoff_base=0,
        retry_jitter=False,
    )
    cluster.start("lead")  # serves "default" only: it never runs the job
    wait_for(lambda: leader_is("lead"), WAIT_S)
    doomed = cluster.start("w1", "--queues", "slow")
    wait_for(lambda: node_active("w1"), WAIT_S)

    first = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    wait_for(
        lambda: (
            JobExecution.objects.filter(pk=first.pk, status=S.RUNNING, node="w1").exists()
            and record_count(records) == 1
        ),
        WAIT_S,
    )
    doomed.signal(signal.SIGKILL)
    doomed.wait(5)
    cluster.start("w2", "--queues", "slow")

    try:
        lost = wait_for(
            lambda: JobExecution.objects.filter(pk=first.pk, status=S.LOST).first(), WAIT_S
        )
        assert "w1" in lost.reason
        retry = wait_for(
            lambda: JobExecution.objects.filter(job=job, attempt=2, status=S.RUNNING).first(),
            WAIT_S,
        )
        assert retry.node == "w2"
        assert retry.scheduled_for == first.scheduled_for
        assert retry.trigger == "retry"
        wait_for(lambda: record_count(records) == 2, WAIT_S)

        services.execution_cancel(execution_id=retry.pk, by=services.SYSTEM)
        wait_for(lambda: status_of(retry.pk) == S.CANCELLED, WAIT_S)
    except AssertionError:
        dump(job)
        print(cluster.logs())
        raise

    assert SchedulerNode.objects.get(node_id="w1").status == NodeStatus.DEAD
    assert not JobExecution.objects.filter(status=S.RUNNING).exists()
    # max_retries=1: the cancelled attempt 2 is the last one.
    assert [(r["attempt"], r["status"]) for r in rows(job)] == [(1, S.LOST), (2, S.CANCELLED)]
    ran = read_records(records)
    assert [(r[0], r[2]) for r in ran] == [(first.pk, 1), (retry.pk, 2)]
    assert ran[0][4] != ran[1][4], "attempt 2 ran in the killed worker's process"
    assert ran[0][1] == ran[1][1] == first.scheduled_for.timestamp()


# --- 2. forbid job longer than its interval -------------------------------------------------------


def test_forbid_job_longer_than_its_interval_never_overlaps(cluster, tmp_path):
    records = tmp_path / "records.txt"
    job = make_interval_job(
        "long-forbid",
        "test.record_and_sleep",
        {"path": str(records), "seconds": 2.5},
        concurrency_policy="forbid",
    )
    for index in range(3):
        cluster.start(f"n{index}")
    wait_for(lambda: record_count(records) >= 1, WAIT_S)
    time.sleep(8)
    cluster.close()  # drains: the run in progress finishes within the grace period

    dump(job)
    assert not JobExecution.objects.filter(job=job, status=S.RUNNING).exists()
    started = list(
        JobExecution.objects.filter(job=job, started_at__isnull=False)
        .order_by("started_at")
        .values("pk", "status", "node", "started_at", "finished_at")
    )
    assert len(started) >= 3
    for earlier, later in pairwise(started):
        assert later["started_at"] >= earlier["finished_at"], f"overlap: {earlier} / {later}"
    skipped = JobExecution.objects.filter(job=job, status=S.SKIPPED)
    assert skipped.filter(reason=REASON_FORBID).count() >= 2
    assert not skipped.exclude(reason=REASON_FORBID).exists()
    assert_forbid_skips_justified(job)

    # The side effects agree: each body ran once and started only after the previous one's
    # 2.5 s body was over.
    ran = sorted(read_records(records), key=lambda r: r[3])
    assert len(ran) == len(started)
    assert all(count == 1 for count in Counter(r[0] for r in ran).values())
    assert {r[0] for r in ran} == {row["pk"] for row in started}
    for earlier, later in pairwise(ran):
        assert later[3] - earlier[3] >= 2.5 - 0.01, f"bodies overlapped: {earlier} / {later}"


# --- 3. misfires after every node was down for several intervals ----------------------------------

MISFIRE_POLICIES = {
    "run_once": REASON_MISFIRE_COALESCED,
    "skip": REASON_MISFIRE_SKIPPED,
    "run_all": REASON_MISFIRE_BEYOND_BOUND,
}
RUN_ALL_MAX = 2
OUTAGE_S = 5.0


def run_outage_scenario(tmp_path: Path) -> dict[str, Any]:
    """Three 1-second jobs (one per misfire policy, misfire grace 1 s). One node runs them, is
    stopped with SIGTERM right after the leader created an execution ahead of time (look-ahead),
    the cluster stays down for OUTAGE_S, then a new node runs ~3 s. Returns what the checks need."""
    paths = {policy: tmp_path / f"{policy}.txt" for policy in MISFIRE_POLICIES}
    jobs = {
        policy: make_interval_job(
            f"misfire-{policy}",
            "test.record",
            {"path": str(paths[policy])},
            misfire_policy=policy,
            misfire_grace_seconds=1,
            run_all_max=RUN_ALL_MAX,
            # Not forbid: the catch-up runs of run_all must not wait on each other's lock here
            # (forbid with catch-up runs is the next test).
            concurrency_policy="allow",
        )
        for policy in MISFIRE_POLICIES
    }
    cluster = Cluster(tmp_path, coordination="database", default_args=NODE_ARGS)
    try:
        first = cluster.start("m1")
        _, first_term = wait_for(current_leader, WAIT_S)
        wait_for(lambda: all(record_count(p) >= 2 for p in paths.values()), WAIT_S)
        # Stop while every job has a fire created ahead of time and due well after the signal.
        wait_for(
            lambda: all(
                JobExecution.objects.filter(
                    job=job,
                    status=S.PENDING,
                    scheduled_for__gt=datetime.fromtimestamp(time.time() + 0.6, tz=UTC),
                ).exists()
                for job in jobs.values()
            ),
            WAIT_S,
            interval=0.01,
        )
        sigterm_at = time.time()
        first.signal(signal.SIGTERM)
        assert first.wait(WAIT_S) == 0, cluster.logs()
        time.sleep(OUTAGE_S)
        cluster.start("m2")
        _, second_term = wait_for(
            lambda: (found := current_leader()) and found[0] == "m2" and found, WAIT_S
        )
        time.sleep(3)
        checked_until = time.time() - 1.5
    finally:
        cluster.close()
    for job in jobs.values():
        dump(job)
    # The new leader's first tick wrote the misfire rows; a skipped row's finished_at is the
    # tick's "now": every slot at or before it was missed, every later one is on time. (The first
    # leader may have had misfires of its own: the jobs were created before it started.)
    misfire_reasons = list(MISFIRE_POLICIES.values())
    tick_now = min(
        JobExecution.objects.filter(reason__in=misfire_reasons, term=second_term).values_list(
            "finished_at", flat=True
        )
    )
    return {
        "jobs": jobs,
        "paths": paths,
        "sigterm_at": sigterm_at,
        "first_term": first_term,
        "second_term": second_term,
        "tick_now": ts(tick_now),
        "checked_until": checked_until,
    }


def assert_no_slot_lost_or_doubled(job, path: Path, checked_until: float) -> None:
    job_rows = rows(job)
    assert not [r for r in job_rows if r["status"] == S.RUNNING]
    slots = Counter((ts(r["scheduled_for"]), r["attempt"]) for r in job_rows)
    assert all(count == 1 for count in slots.values())  # the unique constraint says so, too
    first = min(ts(r["scheduled_for"]) for r in job_rows)
    expected = [first + k for k in range(int(checked_until - first))]
    assert not [s for s in expected if (s, 1) not in slots], "slots never fired"
    ran = read_records(path)
    assert all(count == 1 for count in Counter(r[0] for r in ran).values()), "a run ran twice"
    assert all(count == 1 for count in Counter((r[1], r[2]) for r in ran).values())
    ran_ids = {r[0] for r in ran}
    succeeded = {r["pk"] for r in job_rows if r["status"] == S.SUCCEEDED}
    assert succeeded <= ran_ids
    skipped = {r["pk"] for r in job_rows if r["status"] == S.SKIPPED}
    assert not skipped & ran_ids, "a skipped execution ran"


def expected_runs(policy: str, missed: int) -> int:
    return {"run_once": 1, "skip": 0, "run_all": min(RUN_ALL_MAX, missed)}[policy]


def test_misfire_policies_after_the_whole_cluster_was_down(tmp_path):
    outcome = run_outage_scenario(tmp_path)
    sigterm_at, tick_now = outcome["sigterm_at"], outcome["tick_now"]
    first_term, second_term = outcome["first_term"], outcome["second_term"]
    assert second_term > first_term
    stale_seen = False
    for policy, reason in MISFIRE_POLICIES.items():
        job, path = outcome["jobs"][policy], outcome["paths"][policy]
        assert_no_slot_lost_or_doubled(job, path, outcome["checked_until"])
        ran_slots = Counter(r[1] for r in read_records(path))

        # What the new leader planned for the slots it found missed (slot <= its first tick).
        planned = [
            r for r in rows(job) if r["term"] == second_term and ts(r["scheduled_for"]) <= tick_now
        ]
        assert len(planned) >= 3, f"{policy}: expected several missed slots, got {planned}"
        count = expected_runs(policy, len(planned))
        run = [r for r in planned if r["status"] != S.SKIPPED]
        # The runs are the most recent missed slots; they ran (late), once each.
        assert run == planned[len(planned) - count :], f"{policy}: ran {run}"
        assert all(r["status"] == S.SUCCEEDED for r in run), run
        assert all(r["reason"] == reason for r in planned if r not in run)
        for r in planned:
            assert ran_slots[ts(r["scheduled_for"])] == (1 if r in run else 0)

        # A fire the stopped leader had created ahead of time (look-ahead) and its draining node
        # handed back unstarted was missed too: the policy covers it as well (it is the oldest
        # missed slot, so it never runs).
        stale = [
            r
            for r in rows(job)
            if r["term"] == first_term
            and ts(r["scheduled_for"]) > sigterm_at
            # Not started on time by the draining node.
            and r["node"] != "m1"
        ]
        stale_seen |= bool(stale)
        for r in stale:
            assert r["status"] == S.SKIPPED, f"{policy}: a fire missed in the outage ran late: {r}"
            assert r["reason"] == REASON_MISFIRE_STALE.format(grace=1)
            assert ran_slots[ts(r["scheduled_for"])] == 0

        # After the catch-up the schedule continues on time.
        on_time = [
            r for r in rows(job) if tick_now < ts(r["scheduled_for"]) <= outcome["checked_until"]
        ]
        assert on_time and all(r["status"] == S.SUCCEEDED for r in on_time), on_time
        assert all(r["reason"] == "" for r in on_time)
    # The scenario stops the node right after the fires ahead were created: at least one is left.
    assert stale_seen


def test_run_all_catch_up_runs_of_a_forbid_job_run_one_after_the_other(db_cluster, tmp_path):
    """A leader outage simulated on a live leader: next_fire_at is moved into the past (what a
    stopped cluster leaves behind) at a chosen phase, so the most recent missed slot is 1.1-1.7 s
    late when the catch-up runs are created; each run holds the forbid lock 0.2 s. The second
    catch-up run must start within the 1 s grace counted from its creation, after the first ended
    and released the lock: 0.2 s of work leaves room for a loaded machine."""
    records = tmp_path / "records.txt"
    job = make_job(
        "run-all-forbid",
        "test.record_and_sleep",
        {"path": str(records), "seconds": 0.2},
        schedule_type="interval",
        interval_seconds=2,  # slots: even seconds since the epoch
        misfire_policy="run_all",
        run_all_max=RUN_ALL_MAX,
        misfire_grace_seconds=1,
        concurrency_policy="forbid",
        enabled=False,
    )
    db_cluster.start("a0")
    wait_for(lambda: leader_is("a0"), WAIT_S)
    now = time.time()
    odd = int(now) + (2 if int(now) % 2 else 1)  # the next odd second
    time.sleep(odd + 0.15 - time.time())
    Job.objects.filter(pk=job.pk).update(
        enabled=True, next_fire_at=datetime.fromtimestamp(odd - 9, tz=UTC)
    )
    beyond = JobExecution.objects.filter(job=job, reason=REASON_MISFIRE_BEYOND_BOUND)
    tick_now = wait_for(lambda: beyond.values_list("finished_at", flat=True).first(), WAIT_S)
    catch_up = JobExecution.objects.filter(job=job, scheduled_for__lte=tick_now).exclude(
        reason=REASON_MISFIRE_BEYOND_BOUND
    )
    wait_for(lambda: not catch_up.exclude(status__in=TERMINAL_STATES).exists(), WAIT_S)
    dump(job)
    assert beyond.count() >= 2
    assert [r.scheduled_for.timestamp() for r in catch_up.order_by("scheduled_for")] == [
        odd - 3,
        odd - 1,
    ]
    assert_forbid_skips_justified(job)
    assert set(catch_up.values_list("status", flat=True)) == {S.SUCCEEDED}


# --- 4. Redlock with three real masters at the job level ------------------------------------------


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
        # The leader kept firing; those fires wait for the lock (deferred), unrun.
        assert in_outage.count() >= 3
        assert set(in_outage.values_list("status", flat=True)) == {S.PENDING}, dump(job)
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


# --- 5. drain requested by an operator ------------------------------------------------------------


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


def test_drain_does_not_orphan_a_fire_about_to_start(tmp_path):
    """buffer_one fires always take the executor's slow path: a thread that waits for the due
    instant. SIGTERM lands inside that window (up to three tries, one node each)."""
    records = tmp_path / "records.txt"
    job = make_job(
        "buffer-drain",
        "test.record_and_sleep",
        {"path": str(records), "seconds": 0.5},
        schedule_type="interval",
        interval_seconds=2,
        concurrency_policy="buffer_one",
    )
    cluster = Cluster(tmp_path, coordination="database", default_args=NODE_ARGS)
    try:
        for attempt in range(3):
            node_id = f"b{attempt}"
            node = cluster.start(node_id)
            wait_for(lambda node_id=node_id: leader_is(node_id), WAIT_S)
            ran = record_count(records)
            wait_for(lambda ran=ran: record_count(records) > ran, WAIT_S)
            now = time.time()
            slot = (int(now) // 2 + 1) * 2  # interval slots are epoch-aligned even seconds
            if slot - now < 0.8:
                slot += 2
            time.sleep(slot - PREPARE_AHEAD_S / 2 - time.time())
            node.signal(signal.SIGTERM)
            assert node.wait(WAIT_S) == 0
            assert SchedulerNode.objects.get(node_id=node_id).status == NodeStatus.STOPPED
            orphans = JobExecution.objects.filter(
                job=job, node=node_id, status__in=[S.PENDING, S.RUNNING]
            )
            assert not orphans.exists(), dump(job)
    finally:
        cluster.close()


# --- 6. timeout of a process-isolated run ---------------------------------------------------------


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
