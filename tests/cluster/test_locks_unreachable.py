"""A node that cannot reach its job locks' quorum hands its forbid runs back and claims nothing for
a while, so a node that can lock them takes them (a chaos run saw a worker with a slowed path to
Redis sit on claims it could not start, a second at a time, for eight seconds)."""

from __future__ import annotations

import pytest

from cluster.coordination import CoordinationError
from cluster.executor.claimer import LOCKS_UNAVAILABLE
from cluster.executor.core import LOCKS_UNAVAILABLE_HOLD_S
from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus as S
from tests.cluster.stepped import stepped_executor

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_node_without_its_lock_quorum_steps_aside(monkeypatch) -> None:
    job = services.job_create(
        data={
            "name": "forbid-job",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
        },
        by=services.SYSTEM,
    )
    services.runs_enqueue(job_id=job.pk, items=[{}], by=services.SYSTEM)
    executor, runner, clock, backend = stepped_executor("cut-from-locks", capacity=4, ahead_s=1)

    def unreachable(names, ttl_ms):
        raise CoordinationError("only 0 of 3 Redlock masters answered")

    monkeypatch.setattr(backend, "acquire_locks", unreachable)
    assert executor.claim_once() == 1
    executor.starter_step()
    run = JobExecution.objects.get(job=job)
    assert run.status == S.PENDING and run.claim_token is None  # handed back
    assert not runner.runs
    # It claims nothing while its locks are out of reach, and says why.
    clock.advance(LOCKS_UNAVAILABLE_HOLD_S / 2)
    assert executor.claim_once() == 0
    assert executor.claimer.idle_reason == LOCKS_UNAVAILABLE
    clock.advance(LOCKS_UNAVAILABLE_HOLD_S)
    monkeypatch.undo()
    clock.advance(2)  # past the hand-back's own delay too
    assert executor.claim_once() == 1
