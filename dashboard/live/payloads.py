"""What the live messages carry, read from the database: the cluster, the counters, execution and
job rows (the API's serializers, trimmed to the protocol's fields)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone
from rest_framework import serializers

from cluster.api import NodeSerializer, TermSerializer
from cluster.models import LeadershipTerm, SchedulerNode
from cluster.selectors import (
    DEGRADED,
    current_term,
    degraded_nodes,
    leader_behind,
    partition_lag_said,
    partition_leaders,
)
from dashboard.live.protocol import LATE_AFTER_S, OUTPUT_FIELDS, frame
from jobs import partitioning
from jobs.api.serializers import ExecutionSerializer, JobSerializer
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

NODES_LIMIT = 200  # the most recently seen nodes; dead nodes of old deployments fall off
TERMS_LIMIT = 20
# A led partition is shown behind on its node's card from this lag on (seconds).
LAG_SHOWN_S = 1
FAILED_WINDOW = timedelta(hours=1)
FAILED_STATES = (ExecutionStatus.FAILED, ExecutionStatus.TIMED_OUT, ExecutionStatus.LOST)


class LiveExecutionSerializer(ExecutionSerializer):
    """The API's execution fields minus the bulky result, error, traceback and output."""

    class Meta(ExecutionSerializer.Meta):
        fields = [f for f in ExecutionSerializer.Meta.fields if f not in OUTPUT_FIELDS]
        read_only_fields = fields


class LiveJobSerializer(JobSerializer):
    created_by = None
    updated_by = None

    class Meta(JobSerializer.Meta):
        # updated_at beyond the protocol's list: lets a client drop a frame older than what it shows.
        fields = [
            "id",
            "name",
            "task",
            "schedule_type",
            "enabled",
            "next_fire_at",
            "last_fire_at",
            "version",
            "schedule_description",
            "updated_at",
        ]
        read_only_fields = fields


def cluster_payload() -> dict[str, Any]:
    # Terms first, then nodes: a node's row is written before any term it wins, so the nodes read
    # after the terms include every leader those terms name. The other way round (each statement
    # sees its own snapshot) a frame could name a new leader and list no node for it: a test of
    # the feed caught one such frame on a loaded machine.
    terms = list(LeadershipTerm.objects.filter(partition=0).order_by("-term")[:TERMS_LIMIT])
    nodes = sorted(
        SchedulerNode.objects.order_by("-last_heartbeat")[:NODES_LIMIT], key=lambda n: n.node_id
    )
    # The current term is the newest open one (cluster.selectors.current_term); it is almost always
    # among the newest few, which saves a query per poll.
    term = next((t for t in terms if t.ended_at is None), None)
    if term is None and len(terms) == TERMS_LIMIT:
        term = current_term()
    # A node alive in the coordination backend whose database is unreachable is degraded: shown
    # as such, not as active (its row, which it cannot write, still says active).
    degraded = degraded_nodes(nodes, now=timezone.now())
    node_data = NodeSerializer(nodes, many=True, context={"degraded": degraded}).data
    # With several scheduling partitions: who leads which (an empty list with one).
    # One query more per frame only with several partitions (the count is cached per process).
    partitions = partition_leaders(sizes=False) if partitioning.count() > 1 else []
    # How far behind each led partition is, as its leader says (read with the presence).
    lag = (
        partition_lag_said({p["partition"]: p["node"] for p in partitions if p["node"]})
        if partitions
        else {}
    )
    for data in node_data:
        if data["degraded_reason"]:
            data["status"] = DEGRADED
        data["leads"] = [p["partition"] for p in partitions if p["node"] == data["node_id"]]
        # The partitions it leads that are a second or more behind: partition -> seconds.
        data["leads_behind"] = {
            str(p): lag[p] for p in data["leads"] if lag.get(p, 0) >= LAG_SHOWN_S
        }
    return {
        "leader": term.node_id if term else None,
        "term": term.term if term else None,
        "leader_since": serializers.DateTimeField().to_representation(term.acquired_at)
        if term
        else None,
        "nodes": node_data,
        "terms": TermSerializer(terms, many=True).data,
        "partitions": [
            {
                "partition": p["partition"],
                "node_id": p["node"],
                "term": p["term"],
                "behind_s": lag.get(p["partition"]),
            }
            for p in partitions
        ],
        # The leader's word while the schedule is behind (None while it keeps up).
        "behind": leader_behind(term.node_id if term else None),
    }


def counts_payload(*, now: datetime) -> dict[str, int]:
    """The overview counters, in three statements, none of which scans the table.

    ``queued``, ``catch_up`` and ``late`` come from one statement over the pending rows, so they
    agree: ``late`` and ``catch_up`` never exceed ``queued``, even while runs are triggered and
    claimed between statements. ``catch_up``: the missed runs still waiting for their turn on the
    catch-up budget (a backlog draining)."""
    executions = JobExecution.objects
    pending = executions.filter(status=ExecutionStatus.PENDING).aggregate(
        queued=Count("pk"),
        catch_up=Count("pk", filter=Q(catch_up=True)),
        late=Count("pk", filter=Q(run_after__lt=now - timedelta(seconds=LATE_AFTER_S))),
    )
    return {
        "running": executions.filter(status=ExecutionStatus.RUNNING).count(),
        "queued": pending["queued"],
        "catch_up": pending["catch_up"],
        "late": pending["late"],
        "failed_last_hour": executions.filter(
            status__in=FAILED_STATES, finished_at__gte=now - FAILED_WINDOW
        ).count(),
    }


def snapshot_frames() -> list[str]:
    """What a dashboard gets right after ``hello``: the cluster and the counts."""
    return [
        frame("cluster", cluster_payload()),
        frame("counts", counts_payload(now=timezone.now())),
    ]
