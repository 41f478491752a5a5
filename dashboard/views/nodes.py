"""The cluster pages: the node list, a node's detail, drain and forget (operator). Writes go
through ``cluster.services``."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from cluster import services
from cluster.api import NodeSerializer
from cluster.models import NodeStatus, SchedulerNode
from dashboard import selectors
from dashboard.views.common import (
    decorate_executions,
    page_context,
    redirect_back,
    role_required,
    ui_actor,
)
from jobs.roles import OPERATOR, VIEWER
from jobs.services import ActionNotAllowed

NODE_RECENT_EXECUTIONS = 25


@role_required(VIEWER)
def node_list(request: HttpRequest) -> HttpResponse:
    cluster = selectors.cluster_payload()
    nodes = selectors.nodes()
    return render(
        request,
        "dashboard/nodes/list.html",
        page_context(
            request,
            nodes=nodes,
            cluster=cluster,
            leader=cluster["leader"],
            term=cluster["term"],
            thresholds=selectors.liveness_thresholds(),
            active=NodeStatus.ACTIVE,
            nav="nodes",
        ),
    )


@role_required(VIEWER)
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(SchedulerNode, pk=pk)
    cluster = selectors.cluster_payload()
    node_map = selectors.node_pks()
    executions = decorate_executions(
        selectors.node_recent_executions(node, NODE_RECENT_EXECUTIONS), node_map
    )
    terms = selectors.node_terms(node)
    return render(
        request,
        "dashboard/nodes/detail.html",
        page_context(
            request,
            node=node,
            node_data=NodeSerializer(node).data,
            is_leader=cluster["leader"] == node.node_id,
            term=cluster["term"],
            executions=executions,
            node_map=node_map,
            terms=terms,
            thresholds=selectors.liveness_thresholds(),
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
    return redirect_back(request, reverse("dashboard:node-detail", args=[node.pk]))


@role_required(OPERATOR)
@require_POST
def node_forget(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(SchedulerNode, pk=pk)
    try:
        node_id = services.node_forget(node_pk=node.pk, by=ui_actor(request))
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
        return redirect_back(request, reverse("dashboard:node-detail", args=[node.pk]))
    messages.success(request, f"Removed {node_id} from the list.")
    return redirect("dashboard:node-list")
