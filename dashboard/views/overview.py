"""The overview page and its data (fetched again by the page after a WebSocket reconnect)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard import selectors
from dashboard.views.common import decorate_executions, page_context, role_required
from jobs.roles import VIEWER

RECENT_EXECUTIONS = 10


@role_required(VIEWER)
def overview(request: HttpRequest) -> HttpResponse:
    stats = selectors.dashboard_stats()
    node_map = selectors.node_pks()
    recent = decorate_executions(selectors.recent_executions(RECENT_EXECUTIONS), node_map)
    return render(
        request,
        "dashboard/overview.html",
        page_context(
            request,
            stats=stats,
            counts=stats["counts"],
            cluster=stats["cluster"],
            thresholds=selectors.liveness_thresholds(),
            recent=recent,
            node_map=node_map,
            nav="overview",
        ),
    )


@role_required(VIEWER)
def stats_json(request: HttpRequest) -> JsonResponse:
    """The overview's data, fetched again by the page after a WebSocket reconnect."""
    return JsonResponse(selectors.dashboard_stats())
