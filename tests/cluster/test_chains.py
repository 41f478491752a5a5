"""Job chains on the deterministic cluster (``tests/cluster/sim.py``): real nodes, one settable
clock. A chained run is made with its parent's final outcome and then claimed, admitted and run as
any run is."""

from __future__ import annotations

import pytest

from jobs import services
from jobs.models import JobExecution, Trigger
from jobs.states import ExecutionStatus
from tests.cluster.sim import SimCluster

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus


@pytest.fixture
def make_sim(monkeypatch):
    def make(node_ids=("n1",), **config):
        return SimCluster(node_ids, **config).patch_time(monkeypatch)

    return make


def trigger(sim: SimCluster, job) -> JobExecution:
    return services.job_trigger(job_id=job.pk, by=services.SYSTEM, now=sim.now())


def test_a_success_runs_the_chained_job_once_linked_to_its_parent(make_sim):
    sim = make_sim()
    sim.advance(1.0)
    b = sim.create_manual_job(name="b")
    failed = sim.create_manual_job(name="on-fail")
    a = sim.create_manual_job(name="a", on_success=["b"], on_failure=["on-fail"])
    parent = trigger(sim, a)
    sim.advance(3.0)
    parent.refresh_from_db()
    assert parent.status == S.SUCCEEDED
    (child,) = JobExecution.objects.filter(job=b)
    assert (child.trigger, child.status, child.parent_id) == (Trigger.CHAIN, S.SUCCEEDED, parent.pk)
    assert [run.pk for run in parent.chained_runs.all()] == [child.pk]
    assert len(sim.starts(b)) == 1
    assert sim.starts(failed) == []
    sim.advance(3.0)
    assert len(sim.starts(b)) == 1  # nothing more: one outcome, one chained run


def test_a_failure_chains_once_on_its_last_attempt(make_sim):
    sim = make_sim()
    sim.advance(1.0)
    cleanup = sim.create_manual_job(name="cleanup")
    a = sim.create_manual_job(
        name="a",
        kwargs={"fail": True},
        max_retries=2,
        retry_backoff_base=0.2,
        retry_jitter=False,
        on_failure=["cleanup"],
    )
    trigger(sim, a)
    sim.advance(6.0)
    attempts = list(JobExecution.objects.filter(job=a).order_by("attempt"))
    assert [(e.attempt, e.status) for e in attempts] == [
        (1, S.FAILED),
        (2, S.FAILED),
        (3, S.FAILED),
    ]
    (child,) = JobExecution.objects.filter(job=cleanup)
    assert child.parent_id == attempts[-1].pk
    assert child.status == S.SUCCEEDED
    assert len(sim.starts(cleanup)) == 1


def test_a_run_lost_with_its_node_fires_on_failure_once(make_sim):
    """The node running A is killed mid-body: the survivor reaps A as lost (its final outcome, no
    retries) and runs the chained job once."""
    sim = make_sim(("n1", "n2"))
    sim.advance(1.0)
    alert = sim.create_manual_job(name="alert")
    a = sim.create_manual_job(name="a", kwargs={"seconds": 30}, on_failure=["alert"])
    parent = trigger(sim, a)
    sim.advance_until(lambda: JobExecution.objects.get(pk=parent.pk).status == S.RUNNING, limit=5.0)
    parent.refresh_from_db()
    sim.kill(parent.node)
    sim.advance(10.0)
    parent.refresh_from_db()
    assert parent.status == S.LOST
    (child,) = JobExecution.objects.filter(job=alert)
    assert (child.parent_id, child.status) == (parent.pk, S.SUCCEEDED)
    assert len(sim.starts(alert)) == 1
