"""Fencing that reaches the task: every run's token grows with the job's runs, its idempotency key
names one attempt of one fire, ``still_owner()`` turns false once the claim may be gone, and a
body frozen past its lease and resumed beside its successor has its fenced write refused."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from jobs import fencing
from jobs.models import SchedulerSetting
from jobs.registry import TaskContext
from tests.cluster.sim import SimCluster

ROW = "shop-report-row"


# --- the helper on its own ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_fenced_update_takes_newer_or_equal_tokens_and_refuses_older_ones() -> None:
    row = SchedulerSetting.objects.create(name=ROW, value=0)
    rows = SchedulerSetting.objects.filter(name=ROW)
    assert fencing.fenced_update(rows, token=5, field="value") == 1
    assert fencing.fenced_update(rows, token=5, field="value") == 1  # the same run again
    assert fencing.fenced_update(row, token=9, field="value") == 1  # a model instance too
    with pytest.raises(fencing.StaleToken, match="older than the one SchedulerSetting"):
        fencing.fenced_update(rows, token=7, field="value")
    assert SchedulerSetting.objects.get(name=ROW).value == 9
    # No row at all is not a stale token: nothing to write.
    assert (
        fencing.fenced_update(
            SchedulerSetting.objects.filter(name="absent"), token=1, field="value"
        )
        == 0
    )
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="non-negative integer"):
            fencing.fenced_update(rows, token=bad, field="value")


def test_the_idempotency_key_names_one_attempt_of_one_fire() -> None:
    slot = datetime(2026, 12, 6, 12, tzinfo=UTC)
    key = fencing.idempotency_key(job_id=7, scheduled_for=slot, attempt=1)
    assert key == "7:2026-12-06T12:00:00+00:00:1"
    assert fencing.idempotency_key(job_id=7, scheduled_for=slot, attempt=2) != key
    assert (
        fencing.idempotency_key(job_id=7, scheduled_for=slot, attempt=1, enqueue_key="ord-42")
        == "ord-42:1"
    )


def test_still_owner_follows_the_cancel_flag_and_the_executors_check() -> None:
    owner = [True]
    context = TaskContext(
        execution_id=1, job_name="j", attempt=1, scheduled_for=None, owner_check=lambda: owner[0]
    )
    assert context.still_owner()
    owner[0] = False
    assert not context.still_owner()
    bare = TaskContext(
        execution_id=1, job_name="j", attempt=1, scheduled_for=None, cancel_event=threading.Event()
    )
    assert bare.still_owner()
    bare.cancel_event.set()
    assert not bare.still_owner()


# --- on the deterministic cluster --------------------------------------------------------------------


@pytest.fixture
def sim(monkeypatch):
    cluster = SimCluster(("n1", "n2", "n3")).patch_time(monkeypatch)
    SchedulerSetting.objects.create(name=ROW, value=0)
    return cluster


@pytest.mark.django_db(transaction=True)
def test_tokens_grow_with_every_run_of_a_job(sim) -> None:
    job = sim.create_job(name="tokens", kwargs={"seconds": 0.2, "fenced": ROW})
    sim.advance(6)
    writes = [w for w in sim.fenced if w.job == "tokens"]
    assert len(writes) >= 4
    tokens = [w.token for w in writes]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert all(w.accepted and w.still_owner for w in writes)
    assert SchedulerSetting.objects.get(name=ROW).value == max(tokens)
    del job


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("into_body", [0.1, 0.5, 0.9])
def test_a_body_frozen_past_its_lease_has_its_fenced_write_refused(sim, into_body) -> None:
    """A 1 s job whose body lasts 1.5 s (allow: its runs overlap as they would); the node running
    one is frozen (SIGSTOP) ``into_body`` seconds into it, for 6 s: the cluster declares the run
    lost and later fires run on the other nodes, each ending with a fenced write. Thawed, the
    frozen body finishes and writes last, with the oldest token: refused, and it knew
    (``still_owner()`` false)."""
    sim.create_job(
        name="report", concurrency_policy="allow", kwargs={"seconds": 1.5, "fenced": ROW}
    )
    sim.advance(4)
    victim_run = next(e for e in reversed(sim.effects) if e.job == "report")
    sim.advance(into_body - (sim.clock.now() - victim_run.at))
    victim = victim_run.node
    sim.freeze(victim)
    sim.advance(6)
    sim.thaw(victim)
    sim.advance(3)
    frozen = [w for w in sim.fenced if w.execution_id == victim_run.execution_id]
    assert len(frozen) == 1, sim.fenced
    assert not frozen[0].accepted, "a superseded body's write went through"
    assert not frozen[0].still_owner
    later = [w for w in sim.fenced if w.token > frozen[0].token and w.at < frozen[0].at]
    assert later and all(w.accepted for w in later)
    assert SchedulerSetting.objects.get(name=ROW).value > frozen[0].token
