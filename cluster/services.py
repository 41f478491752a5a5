"""Every write of the cluster's own rows: ``SchedulerNode`` and ``LeadershipTerm``.

This module is their only writer (the fence row's is ``cluster.fencing``, the database backend's
lease rows' is ``cluster.coordination.database``). Each function is keyword-only, conditional where
a stale writer must change nothing, and announced after commit (``cluster.events.cluster_changed``)
as runs and jobs are, so the live feed's doorbell rings from one place (``cluster.announce``).

Nodes: a node registers, beats, rejoins after it was declared dead, marks itself stopped after a
drain; the leader's reaper declares silent nodes dead; an operator asks a node to drain or forgets a
gone one. Terms: a new leader begins its term and closes any older one still open with the reason
its holder's presence shows; a leader ends its own; the reaper relabels "lease lost" as "node died"
once the node is known dead.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from datetime import datetime

from django.db import transaction

from cluster.events import cluster_changed
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode, TermEndReason
from jobs.events import send_after_commit
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

LIVE_STATUSES = (NodeStatus.ACTIVE, NodeStatus.DRAINING)


def _announce(kind: str, key: str | int, change: str) -> None:
    send_after_commit(cluster_changed, kind=kind, key=str(key), change=change)


# --- nodes ---------------------------------------------------------------------------------------------


def node_register(
    *,
    node_id: str,
    hostname: str,
    pid: int,
    version: str,
    queues: list[str],
    capacity: int,
    heartbeat_interval_s: float,
    dead_after_s: float,
    now: datetime,
) -> SchedulerNode:
    """The node's row, active from ``now`` (a node restarted with the same id takes its row over)."""
    with transaction.atomic():
        node, _ = SchedulerNode.objects.update_or_create(
            node_id=node_id,
            defaults={
                "hostname": hostname,
                "pid": pid,
                "version": version,
                "queues": queues,
                "started_at": now,
                "last_heartbeat": now,
                "status": NodeStatus.ACTIVE,
                "capacity": capacity,
                "running_count": 0,
                "drain_requested": False,
                "heartbeat_interval_s": heartbeat_interval_s,
                "dead_after_s": dead_after_s,
            },
        )
        _announce("node", node_id, "registered")
    return node


class Beat(enum.Enum):
    BEAT = "beat"  # the row says the node is alive as of now
    REJOINED = "rejoined"  # it had been declared dead (paused, cut off): alive again
    GONE = "gone"  # no row: an operator removed it while the node was dead or stopped
    STOPPED = "stopped"  # the row says stopped: this node's own shutdown, never undone here


def node_heartbeat(
    *, node_id: str, now: datetime, running_count: int, draining: bool, rejoin: bool = True
) -> Beat:
    """The node's row says it is alive as of ``now``. A row marked stopped is never brought back
    (a heartbeat in flight while the node's own shutdown wrote it must not revive it); a row
    marked dead is, unless ``rejoin`` is False (the node is stopping): the node was paused or cut
    off, its work was taken (its writes on it are fenced by their claim tokens), and it rejoins."""
    status = NodeStatus.DRAINING if draining else NodeStatus.ACTIVE
    rows = SchedulerNode.objects.filter(node_id=node_id)
    if rows.filter(status__in=LIVE_STATUSES).update(
        last_heartbeat=now, running_count=running_count, status=status
    ):
        return Beat.BEAT
    if not rejoin:
        return Beat.STOPPED if rows.exists() else Beat.GONE
    with transaction.atomic():
        if rows.filter(status=NodeStatus.DEAD).update(
            last_heartbeat=now, running_count=running_count, status=status
        ):
            _announce("node", node_id, "rejoined")
            return Beat.REJOINED
    return Beat.STOPPED if rows.exists() else Beat.GONE


def node_mark_stopped(*, node_id: str) -> None:
    """The end of a drain: the node left nothing running and exits."""
    with transaction.atomic():
        SchedulerNode.objects.filter(node_id=node_id).update(
            status=NodeStatus.STOPPED, running_count=0, drain_requested=False
        )
        _announce("node", node_id, "stopped")


def nodes_declare_dead(*, node_ids: Collection[str], silent_before: datetime) -> list[str]:
    """(The reaper, inside its fenced transaction.) The nodes among ``node_ids`` whose row has not
    beaten since ``silent_before`` are dead; a term of theirs that ended "lease lost" since then
    ended because the node died. Returns the nodes declared dead."""
    if not node_ids:
        return []
    dead = list(
        SchedulerNode.objects.filter(
            node_id__in=list(node_ids),
            status__in=LIVE_STATUSES,
            last_heartbeat__lt=silent_before,
        ).values_list("node_id", flat=True)
    )
    if not dead:
        return []
    SchedulerNode.objects.filter(node_id__in=dead, last_heartbeat__lt=silent_before).update(
        status=NodeStatus.DEAD, running_count=0
    )
    for node_id in dead:
        _announce("node", node_id, "dead")
    _terms_end_with_node(node_ids=dead, since=silent_before)
    return dead


def nodes_lock_silent(*, node_ids: Collection[str], silent_before: datetime) -> set[str]:
    """(The reaper, inside its fenced transaction.) Lock the rows of the live nodes among
    ``node_ids`` that have not beaten since ``silent_before``, and return them: a node whose
    heartbeat now waits on the lock finds, once it writes, that its stale work was taken."""
    return set(
        SchedulerNode.objects.select_for_update()
        .filter(
            node_id__in=list(node_ids), status__in=LIVE_STATUSES, last_heartbeat__lt=silent_before
        )
        .values_list("node_id", flat=True)
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
            _announce("node", node.node_id, "drain_requested")
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
        _announce("node", node_id, "forgotten")
    return node_id


# --- terms ---------------------------------------------------------------------------------------------


def term_begin(
    *,
    term: int,
    node_id: str,
    now: datetime,
    end_reason_of: Callable[[str], TermEndReason],
    partition: int = 0,
) -> None:
    """The term's row, from ``now``. Older terms of the partition still open end now, each with
    the reason its holder's state gives (``end_reason_of(node_id)``: its presence gone, cut off
    from the database, or lease lost): their holders could not close them themselves. Call after
    the partition's fence was raised to ``term`` (``cluster.fencing.fence_raise``)."""
    with transaction.atomic():
        for old in LeadershipTerm.objects.filter(
            partition=partition, ended_at__isnull=True, term__lt=term
        ).order_by("term"):
            if LeadershipTerm.objects.filter(pk=old.pk, ended_at__isnull=True).update(
                ended_at=now, end_reason=end_reason_of(old.node_id)
            ):
                _announce("term", old.term, "ended")
        _, created = LeadershipTerm.objects.get_or_create(
            partition=partition, term=term, defaults={"node_id": node_id, "acquired_at": now}
        )
        if created:
            _announce("term", term, "began")


def term_end(*, term: int, reason: TermEndReason, now: datetime, partition: int = 0) -> bool:
    """The leader's own term ended, and why. Only an open term is closed (the next leader may
    have closed it first). True if this call closed it."""
    with transaction.atomic():
        closed = LeadershipTerm.objects.filter(
            partition=partition, term=term, ended_at__isnull=True
        ).update(ended_at=now, end_reason=reason)
        if closed:
            _announce("term", term, "ended")
    return bool(closed)


def _terms_end_with_node(*, node_ids: Collection[str], since: datetime) -> None:
    """A leader that died lost its lease by expiry, and the next leader closed its term "lease
    lost": now that the node is known dead, say so."""
    relabelled = LeadershipTerm.objects.filter(
        node_id__in=list(node_ids), end_reason=TermEndReason.LEASE_LOST, ended_at__gte=since
    )
    for term in relabelled.values_list("term", flat=True):
        _announce("term", term, "relabelled")
    relabelled.update(end_reason=TermEndReason.NODE_DIED)
