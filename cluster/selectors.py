"""Reads of cluster state: the current leader and term, node liveness, degraded nodes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Count
from django.utils import timezone

from cluster.coordination import CoordinationError, get_backend
from cluster.dbhealth import UNREACHABLE
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from jobs import partitioning
from jobs.conf import app_setting

logger = logging.getLogger(__name__)

# A web process reads the nodes' presence at most this often (only while some node's row is quiet).
PRESENCE_CACHE_S = 1.0
DEGRADED = "degraded"
_presence_lock = threading.Lock()
_presence: tuple[float, dict[str, dict[str, Any]]] = (-PRESENCE_CACHE_S, {})
_backend: Any = None


def _live_presence() -> dict[str, dict[str, Any]]:
    """Every live node's presence payload (cached PRESENCE_CACHE_S; empty when the coordination
    backend cannot be read, which is logged)."""
    global _presence, _backend
    with _presence_lock:
        read_at, nodes = _presence
        if time.monotonic() - read_at < PRESENCE_CACHE_S:
            return nodes
        try:
            if _backend is None:
                _backend = get_backend()
            nodes = _backend.live_nodes()
        except CoordinationError as exc:
            logger.warning("cannot read the nodes' presence: %s", exc)
            nodes = {}
        _presence = (time.monotonic(), nodes)
        return nodes


def degraded_nodes(nodes: Iterable[SchedulerNode], *, now: datetime) -> dict[str, str]:
    """The nodes alive in the coordination backend that cannot reach the database: their row has
    gone quiet (no heartbeat for two of their intervals) while their presence says why. Node id ->
    the reason they give. Reads the presence only when some row is quiet."""
    quiet = [
        node
        for node in nodes
        if node.status in (NodeStatus.ACTIVE, NodeStatus.DRAINING)
        and (now - node.last_heartbeat).total_seconds() > 2 * (node.heartbeat_interval_s or 0.5)
    ]
    if not quiet:
        return {}
    presence = _live_presence()
    found = {}
    for node in quiet:
        payload = presence.get(node.node_id)
        if payload and payload.get("database") == UNREACHABLE:
            found[node.node_id] = str(payload.get("database_reason") or "database unreachable")
    return found


def current_term() -> LeadershipTerm | None:
    """The cluster leader's (partition 0's) newest term that has not ended, if any."""
    return (
        LeadershipTerm.objects.filter(partition=0, ended_at__isnull=True).order_by("-term").first()
    )


def partition_leaders(*, sizes: bool = True) -> list[dict[str, Any]]:
    """Each scheduling partition's leader as its open term says (node None: nobody leads it
    now), and (``sizes``) how many jobs it fires; one row with one partition."""
    total = partitioning.count()
    open_terms: dict[int, LeadershipTerm] = {}
    for term in LeadershipTerm.objects.filter(ended_at__isnull=True, partition__lt=total).order_by(
        "term"
    ):
        open_terms[term.partition] = term  # the newest open term of each partition
    jobs = partitioning.sizes(total) if sizes else {}
    return [
        {
            "partition": p,
            "node": open_terms[p].node_id if p in open_terms else None,
            "term": open_terms[p].term if p in open_terms else None,
            "since": open_terms[p].acquired_at if p in open_terms else None,
            "jobs": jobs.get(p),
        }
        for p in range(total)
    ]


def cluster_state(*, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    term = current_term()
    by_status = dict(SchedulerNode.objects.values_list("status").annotate(n=Count("id")).order_by())
    return {
        "leader": term.node_id if term else None,
        "term": term.term if term else None,
        "leader_since": term.acquired_at if term else None,
        "behind": leader_behind(term.node_id if term else None),
        "coordination": app_setting("SCHEDULER_COORDINATION"),
        "nodes": by_status,
        "time": now,
    }


# The liveliest first: a queue one active node serves is served, whatever the others' state.
_LIVELINESS = (NodeStatus.ACTIVE, NodeStatus.DRAINING, NodeStatus.DEAD)


def served_queues() -> dict[str, str]:
    """Each queue some node that has not stopped serves, and the liveliest status among those
    nodes (active, draining or dead; read when the leader says why it is behind)."""
    served: dict[str, str] = {}
    for status, queues in SchedulerNode.objects.filter(status__in=_LIVELINESS).values_list(
        "status", "queues"
    ):
        for queue in queues or []:
            known = served.get(queue)
            if known is None or _LIVELINESS.index(status) < _LIVELINESS.index(known):
                served[queue] = status
    return served


def leader_behind(leader: str | None) -> dict[str, Any] | None:
    """What the leader says of the schedule while it is behind (its presence; None while the
    cluster keeps up, or with no leader). Cached as the presence is (PRESENCE_CACHE_S)."""
    if leader is None:
        return None
    payload = _live_presence().get(leader) or {}
    behind = payload.get("behind")
    return behind if isinstance(behind, dict) else None


def partition_lag_said(leaders: dict[int, str]) -> dict[int, int]:
    """How far behind each partition is (whole seconds), as its leader's presence says
    (``leaders``: partition -> the node its open term names). Cached as the presence is."""
    presence = _live_presence()
    found: dict[int, int] = {}
    for partition, node_id in leaders.items():
        said = (presence.get(node_id) or {}).get("partition_lag")
        if isinstance(said, dict) and isinstance(said.get(str(partition)), int | float):
            found[partition] = int(said[str(partition)])
    return found


def node_drain_requested(node_id: str) -> bool:
    """Whether an operator asked this node to drain (it sees it on its next heartbeat)."""
    return SchedulerNode.objects.filter(node_id=node_id, drain_requested=True).exists()
