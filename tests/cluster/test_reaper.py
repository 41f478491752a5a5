"""The leader's reaper (cluster/reaper.py), against real rows and explicit clocks: dead nodes' work
lost or handed back, stuck runs timed out, the work of nodes cut off from the database taken."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from cluster.fencing import Fenced, fence_raise
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode, TermEndReason
from cluster.reaper import (
    REASON_NODE_CUT_OFF,
    REASON_NODE_DIED,
    REASON_STUCK,
    CutOff,
    read_cut_off,
    reap_dead_nodes,
)
from jobs.models import JobExecution, Trigger
from jobs.states import ExecutionStatus
from tests.cluster.leader_rows import (
    DEAD_AFTER,
    MINUTE,
    SECOND,
    T0,
    TERM,
    add_execution,
    make_job,
    make_node,
    rows,
)

pytestmark = pytest.mark.django_db

S = ExecutionStatus


@pytest.mark.parametrize(("term", "fenced"), [(4, True), (5, False)])
def test_reap_dead_nodes_of_a_stale_term_writes_nothing(term, fenced):
    now = T0
    make_node("dead-node", heartbeat=now - 2 * DEAD_AFTER)
    job = make_job(max_retries=3)
    running = add_execution(job, slot=now - MINUTE, status=S.RUNNING, node="dead-node")
    assert fence_raise(5, "leader-a")

    if fenced:
        with pytest.raises(Fenced):
            reap_dead_nodes(term=term, now=now, dead_after=DEAD_AFTER, live=set())
        assert SchedulerNode.objects.get(node_id="dead-node").status == NodeStatus.ACTIVE
        running.refresh_from_db()
        assert running.status == S.RUNNING
        assert rows(job) == [running]
    else:
        result = reap_dead_nodes(term=term, now=now, dead_after=DEAD_AFTER, live=set())
        assert (result.dead_nodes, result.lost) == (["dead-node"], 1)
        assert JobExecution.objects.filter(job=job, attempt=2).count() == 1


# --- reaping dead nodes --------------------------------------------------------------------------------

NOW = T0 + timedelta(hours=1)
# The coordination backend's answer: whose presence has not expired.
LIVE = {"live-node"}


@pytest.mark.parametrize(
    ("present", "row_age_s", "dead"),
    [
        (False, 6, True),  # presence expired, row as old: dead
        (True, 6, False),  # presence renewed (the row write lags, e.g. a slow database): alive
        (False, 1, False),  # row fresh, presence gone (the store lost its keys): not yet dead
        (True, 1, False),
    ],
)
def test_a_node_is_dead_when_its_presence_expired_and_its_row_is_as_old(present, row_age_s, dead):
    make_node("node-x", heartbeat=NOW - row_age_s * SECOND)
    job = make_job()
    running = add_execution(job, slot=NOW - MINUTE, status=S.RUNNING, node="node-x")

    result = reap_dead_nodes(
        term=TERM, now=NOW, dead_after=DEAD_AFTER, live={"node-x"} if present else set()
    )

    assert result.dead_nodes == (["node-x"] if dead else [])
    running.refresh_from_db()
    assert running.status == (S.LOST if dead else S.RUNNING)


@pytest.mark.parametrize(("max_retries", "expect_retry"), [(0, False), (1, True), (3, True)])
def test_a_silent_node_is_marked_dead_and_its_running_work_is_lost(max_retries, expect_retry):
    make_node("dead-node", heartbeat=NOW - DEAD_AFTER - SECOND)
    make_node("live-node", heartbeat=NOW - SECOND)
    job = make_job(max_retries=max_retries, retry_jitter=False, retry_backoff_base=4)
    lost = add_execution(job, slot=NOW - 2 * MINUTE, status=S.RUNNING, node="dead-node")
    alive = add_execution(
        job, slot=NOW - MINUTE, status=S.RUNNING, node="live-node", claim_token="token-b"
    )

    result = reap_dead_nodes(term=TERM, now=NOW, dead_after=DEAD_AFTER, live=LIVE)

    assert result.dead_nodes == ["dead-node"]
    assert result.lost == 1
    assert SchedulerNode.objects.get(node_id="dead-node").status == NodeStatus.DEAD
    assert SchedulerNode.objects.get(node_id="live-node").status == NodeStatus.ACTIVE
    lost.refresh_from_db()
    assert lost.status == S.LOST
    assert lost.reason == REASON_NODE_DIED.format(node="dead-node")
    assert lost.finished_at == NOW
    alive.refresh_from_db()
    assert alive.status == S.RUNNING
    retries = list(JobExecution.objects.filter(job=job, attempt=2))
    assert len(retries) == int(expect_retry)
    if expect_retry:
        [retry] = retries
        assert retry.status == S.RETRY_SCHEDULED
        assert retry.scheduled_for == lost.scheduled_for
        assert retry.trigger == Trigger.RETRY
        assert retry.run_after == NOW + 4 * SECOND


def test_a_dead_nodes_claimed_but_unstarted_work_goes_back_to_the_queue():
    make_node("dead-node", heartbeat=NOW - DEAD_AFTER - SECOND)
    make_node("live-node", heartbeat=NOW)
    job = make_job()
    orphan = add_execution(
        job, slot=NOW, status=S.PENDING, node="dead-node", claim_token="t-1", claimed_at=NOW
    )
    kept = add_execution(
        job, slot=NOW + MINUTE, status=S.PENDING, node="live-node", claim_token="t-2"
    )

    result = reap_dead_nodes(term=TERM, now=NOW, dead_after=DEAD_AFTER, live=LIVE)

    assert result.unclaimed == 1
    orphan.refresh_from_db()
    assert (orphan.status, orphan.claim_token, orphan.node, orphan.claimed_at) == (
        S.PENDING,
        None,
        "",
        None,
    )
    kept.refresh_from_db()
    assert (kept.claim_token, kept.node) == ("t-2", "live-node")


@pytest.mark.parametrize(("running_for", "status"), [(16, S.TIMED_OUT), (14, S.RUNNING)])
def test_a_run_past_timeout_plus_dead_threshold_on_a_live_node_times_out(running_for, status):
    make_node("live-node", heartbeat=NOW)
    job = make_job(timeout_seconds=10)  # limit: 10 s + DEAD_AFTER (5 s)
    execution = add_execution(
        job,
        slot=NOW - MINUTE,
        status=S.RUNNING,
        node="live-node",
        started_at=NOW - running_for * SECOND,
    )

    result = reap_dead_nodes(term=TERM, now=NOW, dead_after=DEAD_AFTER, live=LIVE)

    execution.refresh_from_db()
    assert execution.status == status
    assert result.dead_nodes == []
    if status == S.TIMED_OUT:
        assert (result.stuck, execution.reason, execution.finished_at) == (1, REASON_STUCK, NOW)
    else:
        assert result.stuck == 0


def test_the_dead_nodes_last_term_ends_as_node_died():
    make_node("dead-node", heartbeat=NOW - DEAD_AFTER - SECOND)
    make_node("live-node", heartbeat=NOW)
    old = LeadershipTerm.objects.create(
        term=3,
        node_id="dead-node",
        acquired_at=NOW - timedelta(hours=2),
        ended_at=NOW - timedelta(hours=1),
        end_reason=TermEndReason.LEASE_LOST,
    )
    last = LeadershipTerm.objects.create(
        term=7,
        node_id="dead-node",
        acquired_at=NOW - MINUTE,
        ended_at=NOW - SECOND,
        end_reason=TermEndReason.LEASE_LOST,
    )
    other = LeadershipTerm.objects.create(
        term=5,
        node_id="live-node",
        acquired_at=NOW - 2 * MINUTE,
        ended_at=NOW - MINUTE,
        end_reason=TermEndReason.LEASE_LOST,
    )

    reap_dead_nodes(term=8, now=NOW, dead_after=DEAD_AFTER, live=LIVE)

    for term, reason in (
        (last, TermEndReason.NODE_DIED),
        (old, TermEndReason.LEASE_LOST),  # it lived on after losing that lease
        (other, TermEndReason.LEASE_LOST),
    ):
        term.refresh_from_db()
        assert term.end_reason == reason


# --- a node alive in the coordination store, cut off from the database -------------------------


def _cut_off_rows(node: str, since: datetime) -> dict[str, JobExecution]:
    job = make_job()
    before = since - 3 * SECOND
    claim = {"node": node, "claimed_at": before}
    return {
        "claimed": add_execution(
            job, slot=NOW + MINUTE, status=S.PENDING, claim_token="t-1", **claim
        ),
        "body": add_execution(job, slot=NOW - MINUTE, status=S.RUNNING, claim_token="t-2", **claim),
        "refused": add_execution(
            job, slot=NOW - 2 * MINUTE, status=S.RUNNING, claim_token="t-3", **claim
        ),
        "ended": add_execution(
            job, slot=NOW - 3 * MINUTE, status=S.RUNNING, claim_token="t-4", **claim
        ),
        # Claimed after the outage began: the node answered again meanwhile; not its old work.
        "new": add_execution(
            job,
            slot=NOW + 2 * MINUTE,
            status=S.PENDING,
            claim_token="t-5",
            node=node,
            claimed_at=since + SECOND,
        ),
    }


def test_a_cut_off_nodes_work_is_taken_except_the_bodies_it_still_runs():
    since = NOW - DEAD_AFTER - SECOND
    make_node("cut", heartbeat=since)
    rows_ = _cut_off_rows("cut", since)
    said = CutOff(
        since, bodies=frozenset({rows_["body"].pk}), unstarted=frozenset({rows_["refused"].pk})
    )

    result = reap_dead_nodes(
        term=TERM, now=NOW, dead_after=DEAD_AFTER, live={"cut"}, cut_off={"cut": said}
    )

    for row in rows_.values():
        row.refresh_from_db()
    assert (result.cut_off_nodes, result.dead_nodes) == (["cut"], [])
    assert (result.unclaimed, result.lost) == (2, 1)
    assert (rows_["claimed"].status, rows_["claimed"].claim_token) == (S.PENDING, None)
    assert (rows_["body"].status, rows_["body"].claim_token) == (S.RUNNING, "t-2")
    assert (rows_["refused"].status, rows_["refused"].node) == (S.PENDING, "")
    assert rows_["ended"].status == S.LOST
    assert rows_["ended"].reason == REASON_NODE_CUT_OFF.format(node="cut", seconds=6)
    assert (rows_["new"].claim_token, rows_["new"].node) == ("t-5", "cut")
    assert SchedulerNode.objects.get(node_id="cut").status == NodeStatus.ACTIVE  # alive


def test_a_cut_off_node_that_heartbeats_again_keeps_its_work():
    since = NOW - DEAD_AFTER - SECOND
    make_node("cut", heartbeat=NOW)  # its row was written again: it answers
    rows_ = _cut_off_rows("cut", since)

    result = reap_dead_nodes(
        term=TERM, now=NOW, dead_after=DEAD_AFTER, live={"cut"}, cut_off={"cut": CutOff(since)}
    )

    assert (result.cut_off_nodes, result.unclaimed, result.lost) == ([], 0, 0)
    for row in rows_.values():
        before = row.status
        row.refresh_from_db()
        assert row.status == before


def test_read_cut_off_takes_nodes_unreachable_for_long_enough_from_their_presence():
    ms = NOW.timestamp() * 1000
    presences: dict[str, dict[str, object]] = {
        "long": {"database": "unreachable", "database_since_ms": ms - 6000, "bodies": [4]},
        "short": {"database": "unreachable", "database_since_ms": ms - 1000},
        "fine": {"running": 2},
        "garbled": {"database": "unreachable", "database_since_ms": "soon"},
    }

    found = read_cut_off(presences, now=NOW, after=DEAD_AFTER)

    assert list(found) == ["long"]
    assert found["long"].bodies == frozenset({4})
    assert found["long"].since == NOW - 6 * SECOND


def test_the_reading_node_never_takes_itself_for_cut_off():
    """A leader reaching its database now (it is reaping) whose presence, written before the
    database came back, still says it could not."""
    ms = NOW.timestamp() * 1000
    presences: dict[str, dict[str, object]] = {
        "me": {"database": "unreachable", "database_since_ms": ms - 6000},
        "other": {"database": "unreachable", "database_since_ms": ms - 6000},
    }

    assert list(read_cut_off(presences, now=NOW, after=DEAD_AFTER, itself="me")) == ["other"]
