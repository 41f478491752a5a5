"""A forbid run claimed late finds the job lock taken and, as the latest running row, an older run
whose outcome is not written yet (a database outage): the lock is a newer run's that has not
marked its row running yet. The run is not skipped at that first look; the next look finds the
newer run, which started after this run's instant, and waits for it (a chaos run under a CPU hog,
seed 1204, found two such skips). Stepped on a settable clock, real rows."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.admission import REASON_FORBID, WAIT_POLL_S
from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend
from cluster.executor.core import Executor
from cluster.membership import Membership
from jobs import services
from jobs.models import ConcurrencyPolicy, Job, JobExecution
from jobs.states import ExecutionStatus

pytestmark = pytest.mark.django_db

S = ExecutionStatus
TTL_MS = 3_600_000


class Collected:
    def __init__(self) -> None:
        self.runs: list = []

    def launch(self, host: object, runs: list) -> None:
        self.runs += runs


def running_row(job: Job, *, slot_ago_s: float, started_ago_s: float, token: str) -> None:
    now = timezone.now()
    JobExecution.objects.create(
        job=job,
        scheduled_for=now - timedelta(seconds=slot_ago_s),
        run_after=now - timedelta(seconds=slot_ago_s),
        status=S.RUNNING,
        started_at=now - timedelta(seconds=started_ago_s),
        node="other-node",
        claim_token=token,
    )


def test_a_late_run_looks_twice_before_it_skips_behind_a_row_the_lock_may_not_be():
    clock = SettableClock(time.time())
    backend = MemoryBackend(clock=clock)
    membership = Membership(backend, "looker", ttl_s=3600, clock=clock)
    membership.renew({})
    runner = Collected()
    executor = Executor(
        node_id="looker",
        queues=["default"],
        capacity=8,
        backend=backend,
        membership=membership,
        heartbeat_s=1.0,
        clock=clock,
        runner=runner,
        inline=True,
    )
    job = services.job_create(
        data={
            "name": "late-forbid",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
            "concurrency_policy": ConcurrencyPolicy.FORBID,
        },
        by=services.SYSTEM,
    )
    backend.heartbeat("other-node", TTL_MS, {})  # the other runs' node is alive
    # The newer run's node took the job lock and has not marked its row running yet.
    assert backend.acquire_lock(f"job:{job.pk}", TTL_MS) is not None
    # An older run, its body over long ago, its outcome not written (the database was away).
    running_row(job, slot_ago_s=3, started_ago_s=3, token="older")
    due = timezone.now() - timedelta(seconds=1)
    late = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    JobExecution.objects.filter(pk=late.pk).update(run_after=due)

    assert executor.claim_once() == 1
    executor.starter_step()  # first look: lock taken, latest running row from before the instant
    assert JobExecution.objects.get(pk=late.pk).status == S.PENDING  # waits, not skipped

    running_row(job, slot_ago_s=2, started_ago_s=0, token="newer")  # the newer run, now marked
    clock.advance(WAIT_POLL_S)
    executor.starter_step()  # second look: the blocker started after this run's instant
    row = JobExecution.objects.get(pk=late.pk)
    assert (row.status, row.reason) == (S.PENDING, "")


def test_the_same_blocker_at_two_looks_is_skipped_behind():
    """The rule still skips: a run found active at this run's instant, at two looks."""
    clock = SettableClock(time.time())
    backend = MemoryBackend(clock=clock)
    membership = Membership(backend, "looker2", ttl_s=3600, clock=clock)
    membership.renew({})
    executor = Executor(
        node_id="looker2",
        queues=["default"],
        capacity=8,
        backend=backend,
        membership=membership,
        heartbeat_s=1.0,
        clock=clock,
        runner=Collected(),
        inline=True,
    )
    job = services.job_create(
        data={
            "name": "late-forbid-2",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
            "concurrency_policy": ConcurrencyPolicy.FORBID,
        },
        by=services.SYSTEM,
    )
    backend.heartbeat("other-node", TTL_MS, {})
    assert backend.acquire_lock(f"job:{job.pk}", TTL_MS) is not None
    running_row(job, slot_ago_s=3, started_ago_s=3, token="holder")  # really still running
    late = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    JobExecution.objects.filter(pk=late.pk).update(run_after=timezone.now() - timedelta(seconds=1))

    assert executor.claim_once() == 1
    executor.starter_step()
    assert JobExecution.objects.get(pk=late.pk).status == S.PENDING
    clock.advance(WAIT_POLL_S)
    executor.starter_step()
    row = JobExecution.objects.get(pk=late.pk)
    assert (row.status, row.reason) == (S.SKIPPED, REASON_FORBID)
