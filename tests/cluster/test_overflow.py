"""Runs beyond capacity: a node with no body running claims a share of its capacity more (runs due
at one instant beyond the cluster's capacity are then claimed and admitted ahead like the others);
no more than ``capacity`` bodies ever run at once; a run beyond them starts when a body ends, or
goes back to the queue if none ends within OVERFLOW_WAIT_S. On a settable clock, real rows, the
runner's side (``may_start``, ``complete``) played by the test."""

from __future__ import annotations

import threading
import time

import pytest

from cluster.clock import SettableClock
from cluster.executor import ledger, starter
from cluster.executor.core import Executor
from cluster.executor.ledger import OVERFLOW_WAIT_S
from cluster.executor.runs import ActiveRun, Outcome
from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.stepped import Collected, enqueue, stepped_executor

# Bodies start in threads of their own (their writes need a connection of their own).
pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus
CAPACITY = 8
OVERFLOW = int(CAPACITY * ledger.OVERFLOW_SHARE)


@pytest.fixture
def node() -> tuple[Executor, Collected, SettableClock]:
    executor, runner, clock, _ = stepped_executor("overflow", capacity=CAPACITY, ahead_s=1)
    return executor, runner, clock


def end(executor: Executor, run: ActiveRun) -> None:
    now = executor.clock.now()
    executor.complete(Outcome(run, S.SUCCEEDED, started=now, ended=now), body_ended=True)


def fill(executor: Executor, runner: Collected) -> ActiveRun:
    """Claim a full node's runs and one beyond, start capacity bodies; the run beyond is returned."""
    enqueue(CAPACITY + OVERFLOW)
    assert executor.claim_once() == CAPACITY + OVERFLOW
    assert all(executor.may_start(run) for run in runner.runs[:CAPACITY])
    return runner.runs[CAPACITY]


def start_in_thread(executor: Executor, run: ActiveRun) -> tuple[threading.Thread, list[bool]]:
    said: list[bool] = []
    thread = threading.Thread(target=lambda: said.append(executor.may_start(run)), daemon=True)
    thread.start()
    return thread, said


def test_the_share_is_eight_runs_for_a_node_of_sixty_four():
    """W1's arithmetic: 3 nodes of 64 hold 216 runs ahead of a whole second, 200 are due."""
    assert int(64 * ledger.OVERFLOW_SHARE) == 8
    assert int(4 * ledger.OVERFLOW_SHARE) == 0  # a small node never claims beyond its capacity


def test_a_node_with_no_body_running_claims_beyond_its_capacity(node):
    executor, _, _ = node
    enqueue(30, due_in_s=1.5)
    executor.lookahead_s = 30.0
    assert executor.claim_once() == CAPACITY + OVERFLOW
    assert executor.claim_once() == 0  # and no further


def test_no_more_than_capacity_bodies_run_and_the_run_beyond_starts_when_one_ends(node):
    executor, runner, _ = node
    beyond = fill(executor, runner)
    first = runner.runs[:CAPACITY]
    assert executor.snapshot()["bodies"] == CAPACITY

    thread, said = start_in_thread(executor, beyond)
    thread.join(0.3)
    assert thread.is_alive() and said == []  # waiting for a body to end, not started
    assert executor.snapshot()["bodies"] == CAPACITY

    end(executor, first[0])
    thread.join(2)
    assert said == [True]  # started the moment a body ended
    assert executor.snapshot()["bodies"] == CAPACITY


def test_a_node_with_a_body_running_claims_no_more_than_its_capacity(node, monkeypatch):
    """A node busy with (maybe long) bodies leaves what it cannot start to nodes with room."""
    executor, runner, clock = node
    monkeypatch.setattr(starter, "PREPARE_AHEAD_S", 0.0)
    executor.lookahead_s = 30.0
    enqueue(CAPACITY, due_in_s=1.5)  # claimed ahead of their instant: the node is not behind
    assert executor.claim_once() == CAPACITY
    clock.set(time.time() + 2.0)
    executor.starter_step()  # admitted and launched at their instant
    assert all(executor.may_start(run) for run in runner.runs)
    end(executor, runner.runs[0])
    enqueue(10, due_in_s=30)
    # One slot free, and not one run beyond it while seven bodies run.
    assert executor.claim_once() == 1
    assert executor.claim_once() == 0
    for run in runner.runs[1:]:
        end(executor, run)
    # No body left: the share beyond capacity again.
    assert executor.claim_once() == CAPACITY + OVERFLOW - 1


def test_a_run_beyond_capacity_goes_back_to_the_queue_when_no_body_ends_in_time(node):
    executor, runner, clock = node
    beyond = fill(executor, runner)
    thread, said = start_in_thread(executor, beyond)
    thread.join(0.2)
    assert thread.is_alive()
    clock.advance(OVERFLOW_WAIT_S + 0.01)
    thread.join(2)
    assert said == [False]
    row = JobExecution.objects.get(pk=beyond.execution.pk)
    # Given back unstarted: any node with room claims it again.
    assert (row.status, row.claim_token, row.node) == (S.PENDING, None, "")
    assert executor.snapshot()["bodies"] == CAPACITY
    assert executor.snapshot()["running"] == CAPACITY


def test_a_run_cancelled_while_it_waits_for_a_body_never_starts(node):
    executor, runner, _ = node
    beyond = fill(executor, runner)
    thread, said = start_in_thread(executor, beyond)
    thread.join(0.1)
    assert thread.is_alive()
    executor.complete(Outcome(beyond, S.CANCELLED, reason="cancelled by a test"))
    thread.join(2)
    assert said == [False]
    # It took no slot: the eight bodies still hold all of them, and the next to end frees one.
    assert executor.snapshot()["bodies"] == CAPACITY
    end(executor, runner.runs[0])
    assert executor.snapshot()["bodies"] == CAPACITY - 1


def test_every_slot_comes_back_once_the_bodies_end(node):
    executor, runner, _ = node
    enqueue(CAPACITY + OVERFLOW)
    assert executor.claim_once() == CAPACITY + OVERFLOW
    runs = list(runner.runs)
    threads = [start_in_thread(executor, run) for run in runs]
    for run in runs:
        # Each body ends as soon as it started; every run gets its turn.
        deadline = time.monotonic() + 5
        while not run.body_slot and not run.completed and time.monotonic() < deadline:
            time.sleep(0.005)
        end(executor, run)
    for thread, said in threads:
        thread.join(2)
        assert said == [True]
    assert executor.snapshot()["bodies"] == 0
    executor.finisher.flush()
    assert JobExecution.objects.filter(status=S.SUCCEEDED).count() == CAPACITY + OVERFLOW
