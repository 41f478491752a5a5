"""Dashboard pages of the cluster: the node list, a node's detail, and the drain action.

Thin like every view: read through selectors and models, write through ``cluster.services``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from cluster import live, services
from cluster.api import NodeSerializer
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from jobs.roles import OPERATOR, VIEWER
from jobs.selectors import execution_list
from jobs.services import ActionNotAllowed
from jobs.views import (
    decorate_executions,
    node_pks,
    page_context,
    redirect_back,
    role_required,
    ui_actor,
)

# The cluster message of docs/live-protocol.md carries the newest 20 terms; the pages show the same.
TIMELINE_TERMS = 20
NODE_RECENT_EXECUTIONS = 25


def cluster_payload() -> dict[str, Any]:
    """The live ``cluster`` message itself, so the page renders first what the socket sends next."""
    return live.cluster_payload()


def liveness_thresholds() -> dict[str, float]:
    """Heartbeat ages (seconds) at which the page marks a node late, then presumed dead, for a
    node that has not recorded its own timing: this installation's settings (SCHEDULER)."""
    knobs = settings.SCHEDULER
    return {"late_s": knobs["HEARTBEAT_S"] * 2, "dead_s": knobs["DEAD_AFTER_S"]}


@role_required(VIEWER)
def node_list(request: HttpRequest) -> HttpResponse:
    cluster = cluster_payload()
    nodes = list(SchedulerNode.objects.order_by("node_id"))
    return render(
        request,
        "nodes/list.html",
        page_context(
            request,
            nodes=nodes,
            cluster=cluster,
            leader=cluster["leader"],
            term=cluster["term"],
            thresholds=liveness_thresholds(),
            active=NodeStatus.ACTIVE,
            nav="nodes",
        ),
    )


@role_required(VIEWER)
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(SchedulerNode, pk=pk)
    cluster = cluster_payload()
    node_map = node_pks()
    executions = decorate_executions(
        execution_list(node=node.node_id).order_by("-id")[:NODE_RECENT_EXECUTIONS], node_map
    )
    terms = LeadershipTerm.objects.filter(node_id=node.node_id)[:TIMELINE_TERMS]
    return render(
        request,
        "nodes/detail.html",
        page_context(
            request,
            node=node,
            node_data=NodeSerializer(node).data,
            is_leader=cluster["leader"] == node.node_id,
            term=cluster["term"],
            executions=executions,
            node_map=node_map,
            terms=terms,
            thresholds=liveness_thresholds(),
            active=NodeStatus.ACTIVE,
            nav="nodes",
        ),
    )


@role_required(OPERATOR)
@require_POST
def node_drain(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(SchedulerNode, pk=pk)
    try:
        node = services.node_request_drain(node_pk=node.pk, by=ui_actor(request))
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"Drain requested for {node.node_id}: it stops claiming work, hands over leadership "
            "and finishes what it runs.",
        )
    return redirect_back(request, f"/nodes/{node.pk}/")


@role_required(OPERATOR)
@require_POST
def node_forget(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(SchedulerNode, pk=pk)
    try:
        node_id = services.node_forget(node_pk=node.pk, by=ui_actor(request))
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
        return redirect_back(request, f"/nodes/{node.pk}/")
    messages.success(request, f"Removed {node_id} from the list.")
    return redirect("/nodes/")
