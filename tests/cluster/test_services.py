"""The one writer of the cluster's rows (cluster/services.py): each write conditional where a stale
writer must change nothing, and announced after its commit (cluster.events.cluster_changed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from cluster import services
from cluster.events import cluster_changed
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode, TermEndReason
from cluster.services import Beat

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def heard():
    """What was announced, in order: (kind, key, change)."""
    seen: list[tuple[str, str, str]] = []

    def receiver(**payload):
        seen.append((payload["kind"], payload["key"], payload["change"]))

    cluster_changed.connect(receiver, dispatch_uid="test-services")
    yield seen
    cluster_changed.disconnect(dispatch_uid="test-services")


def register(node_id: str, *, at: datetime = T0) -> SchedulerNode:
    return services.node_register(
        node_id=node_id,
        hostname="host",
        pid=1,
        version="test",
        queues=["default"],
        capacity=4,
        heartbeat_interval_s=0.5,
        dead_after_s=2.0,
        now=at,
    )


def test_a_registered_node_beats_and_is_announced(heard):
    node = register("n1")
    assert (node.status, node.last_heartbeat) == (NodeStatus.ACTIVE, T0)
    assert heard == [("node", "n1", "registered")]
    beat = services.node_heartbeat(
        node_id="n1", now=T0 + timedelta(seconds=1), running_count=2, draining=True
    )
    row = SchedulerNode.objects.get(node_id="n1")
    assert (beat, row.status, row.running_count) == (Beat.BEAT, NodeStatus.DRAINING, 2)
    assert heard == [("node", "n1", "registered")]  # a plain beat is not news


@pytest.mark.parametrize(
    ("status", "rejoin", "beat", "after"),
    [
        (NodeStatus.DEAD, True, Beat.REJOINED, NodeStatus.ACTIVE),
        (NodeStatus.DEAD, False, Beat.STOPPED, NodeStatus.DEAD),  # stopping: stays dead
        (NodeStatus.STOPPED, True, Beat.STOPPED, NodeStatus.STOPPED),  # never revived
    ],
)
def test_a_heartbeat_after_the_row_moved_on(status, rejoin, beat, after):
    register("n1")
    SchedulerNode.objects.filter(node_id="n1").update(status=status)
    assert (
        services.node_heartbeat(
            node_id="n1", now=T0, running_count=0, draining=False, rejoin=rejoin
        )
        == beat
    )
    assert SchedulerNode.objects.get(node_id="n1").status == after


def test_a_heartbeat_of_a_removed_row_says_so():
    assert (
        services.node_heartbeat(node_id="gone", now=T0, running_count=0, draining=False)
        == Beat.GONE
    )


def test_only_nodes_silent_since_the_cutoff_are_declared_dead_and_their_lost_terms_relabelled(
    heard,
):
    register("silent", at=T0 - timedelta(seconds=10))
    register("fresh", at=T0)
    LeadershipTerm.objects.create(
        term=7,
        node_id="silent",
        acquired_at=T0 - timedelta(seconds=20),
        ended_at=T0 - timedelta(seconds=3),
        end_reason=TermEndReason.LEASE_LOST,
    )
    heard.clear()
    dead = services.nodes_declare_dead(
        node_ids=["silent", "fresh"], silent_before=T0 - timedelta(seconds=5)
    )
    assert dead == ["silent"]
    assert SchedulerNode.objects.get(node_id="silent").status == NodeStatus.DEAD
    assert SchedulerNode.objects.get(node_id="fresh").status == NodeStatus.ACTIVE
    assert LeadershipTerm.objects.get(term=7).end_reason == TermEndReason.NODE_DIED
    assert heard == [("node", "silent", "dead"), ("term", "7", "relabelled")]


def test_a_term_begins_closing_the_older_open_ones_with_their_holders_reasons(heard):
    for term, node in ((3, "a"), (4, "b")):
        LeadershipTerm.objects.create(term=term, node_id=node, acquired_at=T0)
    reasons = {"a": TermEndReason.NODE_DIED, "b": TermEndReason.UNABLE}
    services.term_begin(term=5, node_id="c", now=T0, end_reason_of=reasons.__getitem__)
    ended = dict(LeadershipTerm.objects.filter(term__lt=5).values_list("term", "end_reason"))
    assert ended == {3: TermEndReason.NODE_DIED, 4: TermEndReason.UNABLE}
    assert LeadershipTerm.objects.get(term=5).ended_at is None
    assert heard == [("term", "3", "ended"), ("term", "4", "ended"), ("term", "5", "began")]


def test_a_term_ends_once():
    LeadershipTerm.objects.create(term=9, node_id="a", acquired_at=T0)
    assert services.term_end(term=9, reason=TermEndReason.STEPPED_DOWN, now=T0)
    # The next leader closed it first (or this is a repeat): nothing changes.
    assert not services.term_end(term=9, reason=TermEndReason.LEASE_LOST, now=T0)
    assert LeadershipTerm.objects.get(term=9).end_reason == TermEndReason.STEPPED_DOWN


def test_nothing_is_announced_for_a_write_rolled_back(heard):
    with pytest.raises(RuntimeError), transaction.atomic():
        register("ghost")
        raise RuntimeError("rolled back")
    assert heard == []
    assert not SchedulerNode.objects.filter(node_id="ghost").exists()
