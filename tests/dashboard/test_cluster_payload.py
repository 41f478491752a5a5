"""The live feed's cluster frame never names a leader it does not list among the nodes, even when
a node registers and wins a term between the frame's two reads (each read sees its own snapshot);
a node alive in its presence that cannot reach the database is shown degraded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from cluster import selectors
from cluster.coordination import get_backend
from cluster.models import LeadershipTerm, SchedulerNode
from dashboard.live.payloads import cluster_payload

pytestmark = pytest.mark.django_db


def register_and_win(node_id: str, term: int) -> None:
    """What a node does: its row first, then the term it wins."""
    now = timezone.now()
    SchedulerNode.objects.create(
        node_id=node_id, hostname="h", pid=1, started_at=now, last_heartbeat=now
    )
    LeadershipTerm.objects.create(term=term, node_id=node_id, acquired_at=now)


def test_a_leader_elected_between_the_frames_reads_is_among_its_nodes():
    register_and_win("node-a", 7)
    reads = 0

    def between_reads(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal reads
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("SELECT"):
            reads += 1
            if reads == 1:
                register_and_win("node-b", 8)  # right after the frame's first read
        return result

    with connection.execute_wrapper(between_reads):
        frame = cluster_payload()

    assert reads >= 2
    assert frame["leader"] in [node["node_id"] for node in frame["nodes"]]


@pytest.fixture
def redis_presence(monkeypatch: pytest.MonkeyPatch, settings, redis_url: str) -> None:
    """Redis coordination (the database backend keeps no presence payload: a node cut off from
    the database loses its presence with it, and is simply dead)."""
    settings.SCHEDULER_COORDINATION = "redis"
    settings.REDIS_URL = redis_url
    settings.REDLOCK_URLS = []
    settings.SCHEDULER_REDIS_PREFIX = "payload-degraded:"
    monkeypatch.setattr(selectors, "_presence", (-selectors.PRESENCE_CACHE_S - 1, {}))
    monkeypatch.setattr(selectors, "_backend", None)


def test_a_node_alive_in_its_presence_but_cut_off_from_the_database_is_degraded(redis_presence):
    """The cut node cannot write its row (its heartbeat goes quiet) but renews its presence, which
    says why: it is shown degraded with that reason; a quiet row with no such presence is not."""
    now = timezone.now()
    for node_id, age in (("cut", 5), ("fine", 0), ("quiet", 5)):
        SchedulerNode.objects.create(
            node_id=node_id,
            hostname="h",
            pid=1,
            started_at=now,
            last_heartbeat=now - timedelta(seconds=age),
        )
    backend = get_backend()
    reason = "a statement of heartbeat failed after 1.3 s: (2013, 'Lost connection')"
    backend.heartbeat("cut", 60_000, {"database": "unreachable", "database_reason": reason})
    backend.heartbeat("fine", 60_000, {})
    backend.heartbeat("quiet", 60_000, {})
    try:
        nodes = {node["node_id"]: node for node in cluster_payload()["nodes"]}
    finally:
        for node_id in ("cut", "fine", "quiet"):
            backend.heartbeat(node_id, 1, {})  # expire them
    assert (nodes["cut"]["status"], nodes["cut"]["degraded_reason"]) == ("degraded", reason)
    assert (nodes["fine"]["status"], nodes["fine"]["degraded_reason"]) == ("active", "")
    assert (nodes["quiet"]["status"], nodes["quiet"]["degraded_reason"]) == ("active", "")
