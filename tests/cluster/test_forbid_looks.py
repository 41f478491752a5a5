"""A forbid run claimed late finds the job lock taken and, as the latest running row, an older run
whose outcome is not written yet (a database outage): the lock is a newer run's that has not
marked its row running yet. The run is not skipped at that first look; the next look finds the
newer run, which started after this run's instant, and waits for it (a chaos run under a CPU hog,
seed 1204, found two such skips). Stepped on a settable clock, real rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.admission import REASON_FORBID, WAIT_POLL_S
from cluster.clock import SettableClock
from cluster.coordination import LockWatchdog
from cluster.executor.core import Executor
from jobs import executions, services
from jobs.models import ConcurrencyPolicy, Job, JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.stepped import stepped_executor

pytestmark = pytest.mark.django_db

S = ExecutionStatus
TTL_MS = 3_600_000


def forbid_job(name: str) -> Job:
    """A forbid job that never fires by itself: its runs come from the test."""
    return services.job_create(
        data={
            "name": name,
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
            "concurrency_policy": ConcurrencyPolicy.FORBID,
        },
        by=services.SYSTEM,
    )


def running_row(job: Job, *, slot_ago_s: float, started_ago_s: float, token: str) -> JobExecution:
    now = timezone.now()
    return JobExecution.objects.create(
        job=job,
        scheduled_for=now - timedelta(seconds=slot_ago_s),
        run_after=now - timedelta(seconds=slot_ago_s),
        status=S.RUNNING,
        started_at=now - timedelta(seconds=started_ago_s),
        node="other-node",
        claim_token=token,
    )


def listing(*runs: JobExecution) -> dict[str, object]:
    """A node's presence that lists these runs' bodies as running now."""
    return {"bodies": [r.pk for r in runs], "bodies_at_ms": int(timezone.now().timestamp() * 1000)}


def late_run_behind_a_taken_lock(
    name: str,
) -> tuple[Executor, SettableClock, Job, JobExecution]:
    """A forbid job whose lock another live node holds, beside that node's run started 3 s ago
    and still marked running, and a run of the job due 1 s ago, claimed and looked at once."""
    executor, _, clock, backend = stepped_executor(name, capacity=8)
    job = forbid_job(name)
    assert backend.acquire_lock(f"job:{job.pk}", TTL_MS) is not None
    older = running_row(job, slot_ago_s=3, started_ago_s=3, token="older")
    # The other runs' node is alive and lists the older run's body as running now.
    backend.heartbeat("other-node", TTL_MS, listing(older))
    late = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    JobExecution.objects.filter(pk=late.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    assert executor.claim_once() == 1
    executor.starter_step()  # first look: lock taken, latest running row from before the instant
    assert JobExecution.objects.get(pk=late.pk).status == S.PENDING  # waits, not skipped
    return executor, clock, job, late


def test_a_late_run_looks_twice_before_it_skips_behind_a_row_the_lock_may_not_be():
    """The lock is a newer run's that has not marked its row running yet; the older row's body
    ended long ago, its outcome not written (the database was away)."""
    executor, clock, job, late = late_run_behind_a_taken_lock("late-forbid")
    running_row(job, slot_ago_s=2, started_ago_s=0, token="newer")  # the newer run, now marked
    clock.advance(WAIT_POLL_S)
    executor.starter_step()  # second look: the blocker started after this run's instant
    row = JobExecution.objects.get(pk=late.pk)
    assert (row.status, row.reason) == (S.PENDING, "")


def test_the_same_blocker_at_two_looks_is_skipped_behind():
    """The rule still skips: the run found active at this run's instant, at two looks."""
    executor, clock, _, late = late_run_behind_a_taken_lock("late-forbid-2")
    clock.advance(WAIT_POLL_S)
    executor.starter_step()
    row = JobExecution.objects.get(pk=late.pk)
    assert (row.status, row.reason) == (S.SKIPPED, REASON_FORBID)


def test_a_blocker_its_node_does_not_list_as_running_since_the_instant_is_waited_for():
    """The lock is taken and the same run found blocking at two looks, but its node's newest
    presence does not list its body (it ended; the lock's release and the row's outcome are late
    over a slow path of that node): not skipped. Once the node lists it, it is (a chaos run found
    five skips behind bodies that had ended)."""
    executor, clock, job, late = late_run_behind_a_taken_lock("late-forbid-3")
    older = JobExecution.objects.get(job=job, claim_token="older")
    backend = executor.backend
    backend.heartbeat("other-node", TTL_MS, {})  # lists no body
    for _ in range(3):
        clock.advance(WAIT_POLL_S)
        executor.starter_step()
        assert JobExecution.objects.get(pk=late.pk).status == S.PENDING
    stale = listing(older)
    due = JobExecution.objects.get(pk=late.pk).run_after
    stale["bodies_at_ms"] = int((due - timedelta(seconds=0.1)).timestamp() * 1000)
    backend.heartbeat("other-node", TTL_MS, stale)  # listed, but before the run's instant
    clock.advance(WAIT_POLL_S)
    executor.starter_step()
    assert JobExecution.objects.get(pk=late.pk).status == S.PENDING
    backend.heartbeat("other-node", TTL_MS, listing(older))
    clock.advance(WAIT_POLL_S)
    executor.starter_step()
    row = JobExecution.objects.get(pk=late.pk)
    assert (row.status, row.reason) == (S.SKIPPED, REASON_FORBID)


def test_a_late_run_holding_the_lock_is_waited_for_not_an_older_row_still_marked_running():
    """Two rows of a forbid job say running: an old one whose body ended long ago (its node froze
    before writing the outcome) and a late catch-up run that took the job lock after this run was
    due. The lock holder is the late run: this run waits for it, look after look well past the
    forbid settle time, and starts once it is done; it is not skipped as if the old row's body
    still ran (a chaos run found that skip)."""
    executor, runner, clock, backend = stepped_executor("late-holder", capacity=8)
    job = forbid_job("late-holder")
    backend.heartbeat("other-node", TTL_MS, {})
    held = backend.acquire_lock(f"job:{job.pk}", TTL_MS)
    running_row(job, slot_ago_s=60, started_ago_s=60, token="old")
    running_row(job, slot_ago_s=5, started_ago_s=0.5, token="late")
    late = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    JobExecution.objects.filter(pk=late.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    assert executor.claim_once() == 1
    for _ in range(10):  # a second of looks: four times the forbid settle time
        executor.starter_step()
        clock.advance(WAIT_POLL_S)
    assert JobExecution.objects.get(pk=late.pk).status == S.PENDING
    assert runner.runs == []
    backend.release_lock(held)  # the late run's body ended
    executor.starter_step()
    assert [run.execution.pk for run in runner.runs] == [late.pk]
    assert JobExecution.objects.get(pk=late.pk).status == S.RUNNING


def test_a_job_lock_held_for_no_run_of_the_node_is_released_by_its_keeper():
    """Only the locks a node holds for a reason are kept alive: an active run's (here a forbid run
    admitted and waiting for its instant) is extended; one nothing of the node owns (a path that
    forgot to release it) is given up at the keeper's next pass and released, so its job is not
    blocked on every node for as long as the node lives (a chaos run saw a job's runs wait for
    its lock past their 60 s grace)."""
    executor, runner, _, backend = stepped_executor("keeper-node", capacity=8)
    job = forbid_job("owned-lock")
    run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    assert executor.claim_once() == 1
    executor.starter_step()  # admitted: the run holds its job lock, its body waits for the test
    (active,) = runner.runs
    assert active.execution.pk == run.pk and active.lock is not None

    stray_handle = backend.acquire_lock("job:stray", TTL_MS)
    stray = executor.keeper.keep(LockWatchdog(backend, stray_handle, TTL_MS))

    executor.extend_locks()
    assert stray.lost.is_set() and stray.stopped
    assert backend.acquire_lock("job:stray", TTL_MS) is not None  # released: free for anyone
    assert not active.lock.lost.is_set() and not active.lock.stopped


@pytest.mark.parametrize(
    ("presence", "waits"),
    [
        ({"released": "its"}, True),  # its node gave the lock up while the body ran
        ({"database": "unreachable", "bodies": "its"}, True),  # cut off, the body running
        ({"database": "unreachable", "bodies": []}, False),  # cut off, that body had ended
        ({}, False),  # a live node whose body ended and released the lock: start at once
    ],
)
def test_a_run_whose_node_cannot_do_its_work_is_waited_for_until_the_cluster_ends_it(
    presence, waits
):
    """The job lock is free and the previous run's row still says running on a node alive in the
    coordination store. If that node says it cannot do the run's work (it gave the run's lock up
    while the body ran, or it is cut off from its database while the body runs), the body may
    still be inside the task: this run waits, look after look, until the cluster has ended that
    run (lost), then starts. Otherwise the free lock is the truth and it starts at once."""
    executor, runner, clock, backend = stepped_executor("cannot-do", capacity=8)
    job = forbid_job("cannot-do")
    running_row(job, slot_ago_s=3, started_ago_s=3, token="given-up")
    previous = JobExecution.objects.get(job=job, claim_token="given-up")
    payload = {k: [previous.pk] if v == "its" else v for k, v in presence.items()}
    backend.heartbeat("other-node", TTL_MS, payload)
    run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    assert executor.claim_once() == 1
    for _ in range(10):
        executor.starter_step()
        clock.advance(WAIT_POLL_S)
    started = [r.execution.pk for r in runner.runs]
    if not waits:
        assert started == [run.pk]
        return
    assert started == []
    assert JobExecution.objects.get(pk=run.pk).status == S.PENDING
    executions.declare_lost(previous, reason="its node gave its job lock up", now=timezone.now())
    executor.starter_step()
    assert [r.execution.pk for r in runner.runs] == [run.pk]
    assert JobExecution.objects.get(pk=run.pk).status == S.RUNNING
