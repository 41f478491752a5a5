"""An executor stepped by the test: a settable clock, an in-memory coordination backend, admission
in the caller's thread, and a runner that starts nothing (the test plays the bodies)."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

from django.utils import timezone

from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend
from cluster.executor.core import Executor
from cluster.executor.runs import ActiveRun
from cluster.membership import Membership
from jobs import services


class Collected:
    """A runner that starts nothing: the runs it is given wait for the test."""

    def __init__(self) -> None:
        self.runs: list[ActiveRun] = []

    def launch(self, host: object, runs: list[ActiveRun]) -> None:
        self.runs += runs


def stepped_executor(
    node_id: str, *, capacity: int, ahead_s: float = 0.0
) -> tuple[Executor, Collected, SettableClock, MemoryBackend]:
    """A member node's executor whose clock starts ``ahead_s`` past real time."""
    clock = SettableClock(time.time() + ahead_s)
    backend = MemoryBackend(clock=clock)
    membership = Membership(backend, node_id, ttl_s=3600, clock=clock)
    membership.renew({})
    runner = Collected()
    executor = Executor(
        node_id=node_id,
        queues=["default"],
        capacity=capacity,
        backend=backend,
        membership=membership,
        heartbeat_s=1.0,
        clock=clock,
        runner=runner,
        inline=True,
    )
    return executor, runner, clock, backend


_jobs = itertools.count(1)


def enqueue(count: int, *, due_in_s: float = 0.0) -> None:
    """``count`` runs of a job of their own (``allow``), due now or ``due_in_s`` of real time
    from now."""
    job = services.job_create(
        data={
            "name": f"stepped-{next(_jobs)}",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
            "concurrency_policy": "allow",
        },
        by=services.SYSTEM,
    )
    run_at = (timezone.now() + timedelta(seconds=due_in_s)).isoformat() if due_in_s else None
    services.runs_enqueue(
        job_id=job.pk, items=[{"run_at": run_at} for _ in range(count)], by=services.SYSTEM
    )
