"""An executor whose node cannot reach its database: no body starts, the runs refused and the bodies
still running are what its presence names, and only the running bodies' locks are kept. A stepped
executor (settable clock, the test plays the runner), real rows."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cluster.executor.audit import RECONCILE_AFTER_S
from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.stepped import enqueue, stepped_executor

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus


def test_no_body_starts_while_the_database_is_unreachable_and_the_refused_run_is_named():
    executor, runner, _, _ = stepped_executor("cut", capacity=4, ahead_s=1)
    reachable = [True]
    executor.database_able = lambda: reachable[0]
    enqueue(2)
    assert executor.claim_once() == 2
    body, refused = runner.runs
    assert executor.may_start(body)
    reachable[0] = False

    assert not executor.may_start(refused)

    assert executor.body_ids() == [body.execution.pk]
    assert executor.refused_ids() == [refused.execution.pk]
    # Nothing written for it (the database does not answer): the leader hands it back.
    assert JobExecution.objects.get(pk=refused.execution.pk).status == S.RUNNING
    reachable[0] = True
    executor.forget_refused()
    assert executor.refused_ids() == []
    # Answering again, the self-audit gives it back to the queue: it never ran (not "lost").
    later = executor.now() + timedelta(seconds=RECONCILE_AFTER_S + 1)
    assert executor.reconcile(now=later) == (1, 0)
    assert JobExecution.objects.get(pk=refused.execution.pk).status == S.PENDING
    assert JobExecution.objects.get(pk=body.execution.pk).status == S.RUNNING


def _forbid_runs(count: int) -> None:
    for k in range(count):
        job = services.job_create(
            data={
                "name": f"cut-forbid-{k}",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 86_400,
                "enabled": False,
                "concurrency_policy": "forbid",
            },
            by=services.SYSTEM,
        )
        services.runs_enqueue(job_id=job.pk, items=[{}], by=services.SYSTEM)


def test_only_the_locks_of_running_bodies_are_kept_while_the_database_is_unreachable():
    executor, runner, _, backend = stepped_executor("cut", capacity=4, ahead_s=1)
    reachable = [True]
    executor.database_able = lambda: reachable[0]
    _forbid_runs(2)
    assert executor.claim_once() == 2
    executor.starter_step()  # admission: each forbid run takes its job's lock
    body, waiting = runner.runs
    assert body.lock is not None and waiting.lock is not None
    assert executor.may_start(body)
    executor.extend_locks()
    assert not waiting.lock.lost.is_set()  # reachable: every lock is kept

    reachable[0] = False
    executor.extend_locks()

    assert waiting.lock.lost.is_set() and not body.lock.lost.is_set()
    assert backend.acquire_lock(waiting.lock.handle.name, 1000) is not None  # released
    assert backend.acquire_lock(body.lock.handle.name, 1000) is None  # still the body's
    assert not executor.may_start(waiting)
