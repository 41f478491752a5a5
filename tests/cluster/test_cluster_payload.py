"""The live feed's cluster frame never names a leader it does not list among the nodes, even when
a node registers and wins a term between the frame's two reads (each read sees its own snapshot)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

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
