"""Writes on cluster objects requested by operators (the node loop has its own, in cluster/)."""

from __future__ import annotations

from django.db import transaction

from cluster.models import NodeStatus, SchedulerNode
from jobs.models import JobExecution
from jobs.retry import retry_on_conflict
from jobs.services import ActionNotAllowed, Actor, audit_record
from jobs.states import ExecutionStatus

ERR_NODE_NOT_RUNNING = "Node {node} is {status}; only an active node can be drained."
ERR_NODE_NOT_GONE = "Node {node} is {status}; only a dead or stopped node can be removed."
ERR_NODE_HOLDS_RUNS = (
    "Node {node} still holds {count} claimed or running executions; they are recovered first "
    "(by the reaper), then the node can be removed."
)


@retry_on_conflict
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


@retry_on_conflict
def node_forget(*, node_pk: int, by: Actor) -> str:
    """Remove a dead or stopped node from the list (its row; its executions and terms keep their
    history). Refused while it is active or draining, or while executions still name it as
    claimed or running. A node that comes back later registers again. Returns its node id."""
    with transaction.atomic():
        node = SchedulerNode.objects.select_for_update().get(pk=node_pk)
        if node.status not in (NodeStatus.DEAD, NodeStatus.STOPPED):
            raise ActionNotAllowed(ERR_NODE_NOT_GONE.format(node=node.node_id, status=node.status))
        held = JobExecution.objects.filter(
            node=node.node_id,
            status__in=[ExecutionStatus.PENDING, ExecutionStatus.RUNNING],
        ).count()
        if held:
            raise ActionNotAllowed(ERR_NODE_HOLDS_RUNS.format(node=node.node_id, count=held))
        node_id = node.node_id
        node.delete()
        audit_record(
            by=by,
            action="node.forget",
            object_type="node",
            object_id=node_id,
            object_repr=node_id,
            changes={"status": [node.status, None]},
        )
    return node_id
