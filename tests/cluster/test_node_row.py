"""A node whose database answers again after an outage as long as the dead threshold, while the
leader is taking its work: its row is written before anything starts, and a run marked running
before the outage is read again before its body starts. A stepped executor (settable clock, the
test plays the runner and the leader's reaper), real rows."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from cluster.executor.noderow import NodeRow
from cluster.models import NodeStatus, SchedulerNode
from cluster.reaper import CutOff, reap_dead_nodes
from cluster.services import node_heartbeat
from jobs import executions
from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.stepped import enqueue, stepped_executor

S = ExecutionStatus
DEAD_AFTER = timedelta(seconds=5)
TERM = 1


# --- the debt itself ------------------------------------------------------------------------------


def test_an_outage_leaves_the_row_owed_until_a_write_begun_while_reachable():
    writes: list[str] = []
    reachable = [True]
    row = NodeRow(write=lambda: writes.append("w"), reachable=lambda: reachable[0])
    assert row.settle() == 0 and writes == []  # nothing owed: no write

    row.outage()
    reachable[0] = False
    row.write()  # the heartbeat's, during the outage: may carry an old instant
    assert row.owed
    reachable[0] = True

    assert row.settle() == 1
    assert writes == ["w", "w"] and not row.owed
    row.settle()
    assert writes == ["w", "w"]  # paid: no further write


def test_an_outage_that_begins_during_a_write_leaves_the_row_owed():
    rows: list[NodeRow] = []
    row = NodeRow(write=lambda: rows[0].outage())  # the outage is judged while the write waits
    rows.append(row)
    row.write()
    assert row.owed
    assert row.outage_since(0)


def test_a_failed_write_leaves_the_row_owed():
    def fails() -> None:
        raise ConnectionError("gone")

    row = NodeRow(write=fails)
    row.outage()
    with pytest.raises(ConnectionError):
        row.settle()
    assert row.owed


# --- with the leader's reaper, on real rows -------------------------------------------------------


def _cut_node(node_id: str):
    """A stepped executor for ``node_id`` whose row is written by its heartbeat's write, a row
    last written an hour ago, and a switch for its database's reachability."""
    executor, runner, clock, _ = stepped_executor(node_id, capacity=4, ahead_s=1)
    reachable = [True]
    executor.database_able = lambda: reachable[0]
    executor.row = NodeRow(
        write=lambda: node_heartbeat(
            node_id=node_id, now=executor.now(), running_count=0, draining=False
        ),
        reachable=lambda: reachable[0],
    )
    SchedulerNode.objects.create(
        node_id=node_id,
        hostname="host",
        pid=1,
        started_at=executor.now() - timedelta(hours=2),
        last_heartbeat=executor.now() - timedelta(hours=1),
        status=NodeStatus.ACTIVE,
    )
    return executor, runner, clock, reachable


def _outage(executor, clock, reachable) -> CutOff:
    """The database unreachable for the dead threshold and a second; returns what the node's
    presence said meanwhile (no body, nothing refused)."""
    since = executor.now() + timedelta(milliseconds=10)
    reachable[0] = False
    executor.row.outage()
    clock.advance((DEAD_AFTER + timedelta(seconds=1)).total_seconds())
    reachable[0] = True
    return CutOff(since)


def _leader_reaps(executor, node_id: str, said: CutOff):
    return reap_dead_nodes(
        term=TERM,
        now=executor.now(),
        dead_after=DEAD_AFTER,
        live={node_id},
        cut_off={node_id: said},
    )


@pytest.mark.django_db(transaction=True)
def test_a_run_the_leader_took_during_the_outage_does_not_start_when_the_database_answers():
    executor, runner, clock, reachable = _cut_node("back")
    enqueue(1)
    assert executor.claim_once() == 1  # admitted: its row says running, no body yet
    (run,) = runner.runs
    said = _outage(executor, clock, reachable)
    # The leader, reading the presence written during the outage, takes the node's work before
    # the node writes anything: the run is not among its bodies.
    assert _leader_reaps(executor, "back", said).lost == 1

    assert not executor.may_start(run)

    assert JobExecution.objects.get(pk=run.execution.pk).status == S.LOST
    assert executor.body_ids() == []


@pytest.mark.django_db(transaction=True)
def test_a_node_that_answers_again_writes_its_row_before_a_body_starts_so_nothing_is_taken():
    executor, runner, clock, reachable = _cut_node("back")
    enqueue(1)
    assert executor.claim_once() == 1
    (run,) = runner.runs
    said = _outage(executor, clock, reachable)

    assert executor.may_start(run)  # its row is written first, and the run is read again
    result = _leader_reaps(executor, "back", said)

    assert (result.lost, result.unclaimed, result.cut_off_nodes) == (0, 0, [])
    assert JobExecution.objects.get(pk=run.execution.pk).status == S.RUNNING
    assert executor.body_ids() == [run.execution.pk]


@pytest.mark.django_db(transaction=True)
def test_an_admission_after_the_outage_writes_the_row_before_it_marks_runs_running():
    executor, runner, clock, reachable = _cut_node("back")
    # Due 0.8 s ahead of the node's clock: claimed now (within the lookahead), admitted near it.
    enqueue(1, due_in_s=1.8)
    assert executor.claim_once() == 1
    assert runner.runs == []
    said = _outage(executor, clock, reachable)

    executor.starter_step()  # the admission marks it running
    (run,) = runner.runs
    result = _leader_reaps(executor, "back", said)

    assert (result.lost, result.unclaimed) == (0, 0)
    assert JobExecution.objects.get(pk=run.execution.pk).status == S.RUNNING
    assert executor.may_start(run)


def test_runs_due_together_after_an_outage_wait_for_one_write_of_the_row():
    writes: list[int] = []
    release = threading.Event()

    def slow_write() -> None:
        writes.append(1)
        release.wait(5)

    row = NodeRow(write=slow_write)
    row.outage()
    threads = [threading.Thread(target=row.settle) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # every thread is in ``settle`` by now: one writes, the rest wait for it
    release.set()
    for thread in threads:
        thread.join(5)
    assert writes == [1] and not row.owed


@pytest.mark.django_db(transaction=True)
def test_a_run_claimed_after_an_outage_starts_without_being_read_again(monkeypatch):
    """Only runs marked running before an outage are read again at their start: one claimed
    (and marked running by its claim) once the database answered again is not, however many
    outages the node has had before."""
    executor, runner, clock, reachable = _cut_node("again")
    _outage(executor, clock, reachable)
    reads: list[int] = []
    monkeypatch.setattr(
        executions, "still_running_here", lambda execution: reads.append(execution.pk) or True
    )
    enqueue(1)
    assert executor.claim_once() == 1
    (run,) = runner.runs

    assert executor.may_start(run)
    assert reads == []
    assert not executor.row.owed  # the claim wrote the row first
