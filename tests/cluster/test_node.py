"""The node's own heartbeat row: it rejoins after being declared dead, and never brings back a row
its own shutdown marked stopped (a heartbeat in flight during a drain made a stopped node look
alive again)."""

from __future__ import annotations

import pytest

from cluster.coordination.memory import MemoryBackend
from cluster.models import NodeStatus, SchedulerNode
from cluster.node import NodeConfig, NodeRunner

pytestmark = pytest.mark.django_db


def make_runner(node_id: str) -> NodeRunner:
    runner = NodeRunner(NodeConfig(node_id=node_id), backend=MemoryBackend())
    runner.register()
    return runner


def status_of(node_id: str) -> str:
    return SchedulerNode.objects.get(node_id=node_id).status


def test_a_heartbeat_keeps_an_active_node_active() -> None:
    runner = make_runner("beat-a")
    runner.heartbeat_once()
    assert status_of("beat-a") == NodeStatus.ACTIVE


def test_a_node_declared_dead_rejoins_on_its_next_heartbeat() -> None:
    runner = make_runner("beat-b")
    SchedulerNode.objects.filter(node_id="beat-b").update(status=NodeStatus.DEAD)
    runner.heartbeat_once()
    assert status_of("beat-b") == NodeStatus.ACTIVE


def test_a_heartbeat_never_revives_a_row_marked_stopped() -> None:
    runner = make_runner("beat-c")
    # The drain wrote "stopped" while this heartbeat was on its way.
    SchedulerNode.objects.filter(node_id="beat-c").update(status=NodeStatus.STOPPED)
    runner.heartbeat_once()
    assert status_of("beat-c") == NodeStatus.STOPPED
