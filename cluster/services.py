"""Writes on cluster objects requested by operators (the node loop has its own, in cluster/)."""

from __future__ import annotations

from django.db import transaction

from cluster.models import NodeStatus, SchedulerNode
from jobs.services import ActionNotAllowed, Actor, audit_record

ERR_NODE_NOT_RUNNING = "Node {node} is {status}; only an active node can be drained."


def node_request_drain(*, node_pk: int, by: Actor) -> SchedulerNode:
    """Ask a node to drain: it stops claiming, hands over leadership and finishes its work."""
    with transaction.atomic():
        node = SchedulerNode.objects.select_for_update().get(pk=node_pk)
        if node.status != NodeStatus.ACTIVE:
            raise ActionNotAllowed(
                ERR_NODE_NOT_RUNNING.format(node=node.node_id, status=node.status)
            )
        if not node.drain_requested:
            SchedulerNode.objects.filter(pk=node_pk).update(drain_requested=True)
            audit_record(
                by=by,
                action="node.drain",
                object_type="node",
                object_id=node.node_id,
                object_repr=node.node_id,
                changes={"drain_requested": [False, True]},
            )
    node.refresh_from_db()
    return node
