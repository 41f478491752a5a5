"""Reads of cluster state: the current leader and term, node liveness."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from cluster.models import LeadershipTerm, SchedulerNode


def current_term() -> LeadershipTerm | None:
    """The newest term that has not ended, if any."""
    return LeadershipTerm.objects.filter(ended_at__isnull=True).order_by("-term").first()


def cluster_state(*, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    term = current_term()
    by_status = dict(SchedulerNode.objects.values_list("status").annotate(n=Count("id")).order_by())
    return {
        "leader": term.node_id if term else None,
        "term": term.term if term else None,
        "leader_since": term.acquired_at if term else None,
        "coordination": settings.SCHEDULER_COORDINATION,
        "nodes": by_status,
        "time": now,
    }
