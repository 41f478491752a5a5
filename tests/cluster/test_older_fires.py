"""Which earlier fires of a forbid job a run waits for at admission (cluster/executor/facts.py),
against real rows: an earlier on-time fire goes first, except one another node holds that this
run, due itself, has already superseded under a misfire policy that keeps one fire."""

from __future__ import annotations

import pytest

from cluster.executor import facts as gather
from jobs.models import Trigger
from jobs.states import ExecutionStatus
from tests.cluster.leader_rows import SECOND, T0, add_execution, make_job, scheduled

pytestmark = pytest.mark.django_db

S = ExecutionStatus
SLOT = T0 + 100 * SECOND


def fires(*, policy: str = "run_once", held: bool = True, trigger: str = Trigger.SCHEDULE):
    """A 1 s forbid job's fire of SLOT, still pending (held by a node whose database path is
    slow, or by none), and its next fire, claimed by a healthy node."""
    job = make_job(interval_seconds=1, misfire_policy=policy, run_all_max=3)
    claim = {"node": "slow", "claim_token": "slow-1", "claimed_at": SLOT} if held else {}
    older = add_execution(job, slot=SLOT, status=S.PENDING, trigger=trigger, **claim)
    later = add_execution(
        job, slot=SLOT + SECOND, status=S.PENDING, node="quick", claim_token="quick-1"
    )
    return older, later


def test_a_due_fire_does_not_wait_for_an_older_fire_held_elsewhere_that_it_supersedes():
    _, later = fires()
    assert gather.older_waiting([scheduled(later)], now=SLOT + 1.1 * SECOND) == {}


def test_a_fire_admitted_ahead_of_its_instant_still_waits_for_the_older_one():
    _, later = fires()
    now = SLOT + 0.8 * SECOND  # not due yet: the older fire is not superseded
    assert gather.older_waiting([scheduled(later)], now=now) == {later.pk: False}


def test_an_older_fire_held_by_no_node_is_still_waited_for_and_said_so():
    _, later = fires(held=False)
    assert gather.older_waiting([scheduled(later)], now=SLOT + 1.1 * SECOND) == {later.pk: True}


@pytest.mark.parametrize(
    ("policy", "trigger"),
    [
        ("run_all", Trigger.SCHEDULE),  # every late fire runs, in order
        ("run_once", Trigger.MANUAL),  # a triggered run is never superseded
    ],
)
def test_an_older_run_that_is_not_superseded_is_waited_for(policy, trigger):
    _, later = fires(policy=policy, trigger=trigger)
    assert gather.older_waiting([scheduled(later)], now=SLOT + 1.1 * SECOND) == {later.pk: False}
