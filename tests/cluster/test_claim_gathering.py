"""Claim gathering: a node behind a backlog of runs already due claims again once half its capacity
is free, or CLAIM_GATHER_S after the first slot freed, not at every freed slot; a node that is not
behind claims at once. On a settable clock, real rows, bodies completed by hand."""

from __future__ import annotations

import time

import pytest

from cluster.clock import SettableClock
from cluster.executor import ledger, starter
from cluster.executor.claimer import CLAIM_GATHER_S
from cluster.executor.core import Executor
from cluster.executor.runs import Outcome
from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.stepped import Collected, enqueue, stepped_executor

pytestmark = pytest.mark.django_db

S = ExecutionStatus
CAPACITY = 8


@pytest.fixture
def node(monkeypatch) -> tuple[Executor, Collected, SettableClock, list[int]]:
    # Gathering on its own: no runs claimed beyond capacity (test_overflow.py has those).
    monkeypatch.setattr(ledger, "OVERFLOW_SHARE", 0.0)
    executor, runner, clock, _ = stepped_executor("gatherer", capacity=CAPACITY, ahead_s=1)
    woken: list[int] = []
    executor.on_room = lambda: woken.append(1)
    return executor, runner, clock, woken


def finish(executor: Executor, runner: Collected, count: int) -> None:
    for run in runner.runs[:count]:
        started = executor.clock.now()
        executor.complete(
            Outcome(run, S.SUCCEEDED, started=started, ended=started), body_ended=True
        )
    del runner.runs[:count]


def test_a_node_behind_waits_for_half_its_capacity_before_it_claims_again(node):
    executor, runner, clock, woken = node
    enqueue(30)
    assert executor.claim_once() == CAPACITY  # every slot filled with runs due: behind

    finish(executor, runner, 1)
    assert woken == [1]  # the first freed slot wakes the claim loop: it starts to gather
    assert executor.claim_once() == 0
    assert executor.next_claim_in == pytest.approx(CLAIM_GATHER_S)
    finish(executor, runner, 2)
    assert woken == [1]  # gathering: slots freed below half the capacity wake nobody
    clock.advance(CLAIM_GATHER_S / 2)
    assert executor.claim_once() == 0
    assert executor.next_claim_in == pytest.approx(CLAIM_GATHER_S / 2)

    finish(executor, runner, 1)  # half the capacity free: a claim is worth it now
    assert woken == [1, 1]
    assert executor.claim_once() == CAPACITY // 2
    assert executor.next_claim_in is None
    executor.finisher.flush()
    assert JobExecution.objects.filter(status=S.SUCCEEDED).count() == 4


def test_a_node_behind_claims_what_is_free_once_the_gathering_time_is_up(node):
    """Long runs free slots slowly: a freed slot waits at most CLAIM_GATHER_S for company."""
    executor, runner, clock, _ = node
    enqueue(30)
    assert executor.claim_once() == CAPACITY
    finish(executor, runner, 1)
    assert executor.claim_once() == 0
    clock.advance(CLAIM_GATHER_S)
    assert executor.claim_once() == 1


def test_a_node_that_took_all_that_was_due_claims_at_the_first_free_slot(node):
    executor, runner, _, woken = node
    enqueue(5)
    assert executor.claim_once() == 5  # fewer than it asked for: nothing left behind it
    enqueue(5)
    finish(executor, runner, 1)
    assert woken == [1]
    assert executor.claim_once() == 4  # the 3 free and the 1 just freed, at once


def test_runs_claimed_ahead_of_their_instant_do_not_make_a_node_behind(node, monkeypatch):
    """At a whole second a node full of runs claimed ahead starts them together; the runs beyond
    the cluster's slots are claimed at the first slot that frees, not after a gathering wait."""
    executor, runner, clock, _ = node
    monkeypatch.setattr(starter, "PREPARE_AHEAD_S", 0.0)
    enqueue(CAPACITY, due_in_s=1.5)  # half a second or more ahead of the node's clock
    executor.lookahead_s = 30.0
    assert executor.claim_once() == CAPACITY  # all slots, but none due yet
    clock.set(time.time() + 2.0)  # all of them due now
    enqueue(3)
    executor.starter_step()  # admitted and started at their instant
    finish(executor, runner, 1)
    assert executor.claim_once() == 1


def test_a_gathering_wait_does_not_outlive_the_pass_that_chose_it(node):
    """A node that stops claiming (a drain, its membership unconfirmed) right after a gathering
    pass polls at its usual pace, not every few milliseconds."""
    executor, runner, _, _ = node
    enqueue(30)
    assert executor.claim_once() == CAPACITY
    finish(executor, runner, 1)
    assert executor.claim_once() == 0
    assert executor.next_claim_in is not None
    executor.claiming = False
    assert executor.claim_once() == 0
    assert executor.next_claim_in is None
