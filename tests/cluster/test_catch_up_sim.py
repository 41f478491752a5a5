"""The catch-up budget on the deterministic cluster (``tests/cluster/sim.py``): a whole-cluster
outage leaves 200 one-second ``run_all`` jobs with a backlog each; when the cluster comes back the
backlog drains as a steady stream at the budget, oldest slot first, none of it superseded, while
the on-time fires start on time."""

from __future__ import annotations

import bisect
from collections import Counter

import pytest

from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.sim import STEP_S, SimCluster

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus
JOBS = 200
RUN_ALL_MAX = 10
OUTAGE_S = 60.0
BUDGET_PER_S = 100.0
# An on-time body starts at the end of the step its instant falls in, or the next.
PRECISION_S = 2 * STEP_S


def busiest_second(instants: list[float]) -> int:
    """The most of the sorted ``instants`` in any window [t, t + 1 s)."""
    return max(bisect.bisect_left(instants, at + 1.0) - k for k, at in enumerate(instants))


@pytest.fixture
def sim(monkeypatch):
    # Room for every job's run of a whole second at once: what is measured is the budget, not
    # the capacity.
    cluster = SimCluster(("a1", "a2", "a3"), capacity=100, catch_up_per_s=BUDGET_PER_S).patch_time(
        monkeypatch
    )
    for k in range(JOBS):
        cluster.create_job(
            name=f"catch-up-{k:03d}",
            misfire_policy="run_all",
            run_all_max=RUN_ALL_MAX,
            misfire_grace_seconds=2,
            kwargs={"seconds": 0.0},
        )
    return cluster


def test_a_whole_cluster_outage_drains_at_the_budget_while_on_time_fires_keep_time(sim):
    sim.advance(2.5)
    for node_id in ("a1", "a2", "a3"):
        sim.drain(node_id)
    sim.advance(OUTAGE_S)
    back = sim.clock.now()
    for node_id in ("b1", "b2", "b3"):
        sim.add(node_id)
    backlog = JOBS * RUN_ALL_MAX
    drain_s = backlog / BUDGET_PER_S
    sim.advance(drain_s + 4)

    catch_up = list(JobExecution.objects.filter(catch_up=True))
    assert len(catch_up) == backlog
    # Every one ran: none superseded by the on-time fires that fell due while it waited.
    assert Counter(r.status for r in catch_up) == {S.SUCCEEDED: backlog}
    ids = {r.pk for r in catch_up}
    started = {e.execution_id: e.at for e in sim.effects if e.execution_id in ids}
    assert len(started) == backlog
    # Released no faster than the budget in any second, and each started at its instant (the
    # clock moves a step at a time: a body starts at the end of the step its instant is in).
    released = sorted(r.run_after.timestamp() for r in catch_up)
    assert busiest_second(released) <= BUDGET_PER_S
    for r in catch_up:
        assert 0 <= started[r.pk] - r.run_after.timestamp() <= STEP_S + 1e-3
    starts = sorted(started.values())
    assert busiest_second(starts) <= BUDGET_PER_S * (1 + STEP_S)
    # A steady stream: it begins as the cluster is back and ends when the budget says.
    assert starts[0] - back < 5.0
    assert starts[-1] - starts[0] == pytest.approx(drain_s, abs=1.0)
    # Oldest slot first across the jobs.
    by_start = sorted(catch_up, key=lambda r: r.started_at)
    slots = [r.scheduled_for for r in by_start]
    assert slots == sorted(slots)

    # The on-time fires during the drain started on time, and every one of them ran.
    on_time = [
        e
        for e in sim.effects
        if e.execution_id not in ids and starts[0] + 1 <= e.scheduled_for.timestamp() <= starts[-1]
    ]
    assert len(on_time) >= JOBS * int(drain_s - 1)
    lateness = sorted(e.at - e.scheduled_for.timestamp() for e in on_time)
    assert lateness[-1] <= PRECISION_S, lateness[-10:]
    during = JobExecution.objects.filter(
        catch_up=False,
        scheduled_for__gte=by_start[0].started_at,
        scheduled_for__lte=by_start[-1].started_at,
    )
    assert set(during.values_list("status", flat=True)) == {S.SUCCEEDED}
