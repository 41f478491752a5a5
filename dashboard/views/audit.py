"""The audit log page: who changed what, when, from where; filtered and searchable."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboard import selectors
from dashboard.views.common import (
    filter_datetime,
    page_context,
    paginate,
    query_without_page,
    role_required,
)
from jobs.models import AuditEvent, AuditSource
from jobs.roles import VIEWER

# How an execution was labelled in the audit log before: "<job id>@<scheduled_for>#<attempt>".
OLD_EXECUTION_LABEL = re.compile(r"^\d+@\S+#\d+$")
FILTER_FIELDS = ("actor_name", "action", "object_type", "object_id", "source")


def _audit_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _decorate(events: list[AuditEvent], node_map: dict[str, int]) -> None:
    """What a row shows besides the event's fields: the changes as (field, before, after) and a
    link to the object while it exists."""
    job_ids = selectors.existing_job_ids(
        [int(e.object_id) for e in events if e.object_type == "job" and e.object_id.isdigit()]
    )
    for event in events:
        event.rows = [
            (field, _audit_value(pair[0]), _audit_value(pair[1]))
            for field, pair in sorted(event.changes.items())
            if isinstance(pair, list) and len(pair) == 2
        ]
        event.link = None
        if event.object_type == "job" and event.object_id.isdigit():
            if int(event.object_id) in job_ids:
                event.link = reverse("dashboard:job-detail", args=[int(event.object_id)])
        elif event.object_type == "execution" and event.object_id.isdigit():
            event.link = reverse("dashboard:execution-detail", args=[int(event.object_id)])
            if OLD_EXECUTION_LABEL.match(event.object_repr):
                # Recorded before runs had readable labels ("1@2026-...#1").
                event.object_repr = f"run #{event.object_id}"
        elif event.object_type == "node" and event.object_id in node_map:
            event.link = reverse("dashboard:node-detail", args=[node_map[event.object_id]])


@role_required(VIEWER)
def audit_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    search = params.get("q", "").strip()
    fields = {name: params.get(name, "") for name in FILTER_FIELDS}
    zone = params.get("tz", "")
    since = filter_datetime(params.get("since", ""), zone)
    until = filter_datetime(params.get("until", ""), zone)
    events = selectors.audit_events(search=search, fields=fields, since=since, until=until)
    page = paginate(request, events, costly=bool(search))
    node_map = selectors.node_pks()
    _decorate(page.object_list, node_map)
    return render(
        request,
        "dashboard/audit/list.html",
        page_context(
            request,
            page=page,
            events=page.object_list,
            query=query_without_page(request),
            node_map=node_map,
            search=search,
            filters=fields
            | {"since": params.get("since", ""), "until": params.get("until", ""), "tz": zone},
            sources=AuditSource.choices,
            filtered=bool(search or since or until) or any(fields.values()),
            nav="audit",
            **selectors.audit_choices(),
        ),
    )
