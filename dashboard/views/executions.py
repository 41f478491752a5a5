"""The execution pages: list (filters, text search), detail with streamed output, the output as
a file, and cancel and retry (operator)."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import selectors
from dashboard.views.common import (
    MAX_SEARCH_CHARS,
    S,
    decorate_executions,
    filter_datetime,
    int_or_none,
    page_context,
    paginate,
    query_without_page,
    redirect_back,
    role_required,
    ui_actor,
)
from jobs import services
from jobs.models import JobExecution
from jobs.roles import OPERATOR, VIEWER
from jobs.services import ActionNotAllowed
from jobs.states import RETRYABLE_STATES, TERMINAL_STATES

CANCELLABLE_STATUSES = (S.PENDING, S.RETRY_SCHEDULED, S.RUNNING)
JOB_CHOICES_LIMIT = 500
RETRY_SOURCE_STATUSES = (*RETRYABLE_STATES, S.CANCELLED)


@role_required(VIEWER)
def execution_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    # The job filter: a list of names while there are few jobs, a name (or id) typed in beyond
    # JOB_CHOICES_LIMIT (a million options would be the page).
    job_choices = list(selectors.job_names()[: JOB_CHOICES_LIMIT + 1])
    job_ref = params.get("job", "").strip()[:MAX_SEARCH_CHARS]
    job_id = int_or_none(job_ref) or (selectors.job_id_named(job_ref) if job_ref else None)
    status = params.get("status", "")
    node = params.get("node", "")
    zone = params.get("tz", "")
    since = filter_datetime(params.get("since", ""), zone)
    until = filter_datetime(params.get("until", ""), zone)
    search = params.get("q", "").strip()[:MAX_SEARCH_CHARS]
    executions = selectors.execution_rows(
        job=job_id, status=status, node=node, since=since, until=until, search=search
    )
    if job_ref and job_id is None:
        executions = executions.none()  # no such job: no runs (not every run)
    page = paginate(request, executions, costly=bool(search))
    node_map = selectors.node_pks()
    nodes = sorted(set(node_map) | ({node} if node else set()))
    return render(
        request,
        "dashboard/executions/list.html",
        page_context(
            request,
            page=page,
            executions=decorate_executions(page.object_list, node_map),
            node_map=node_map,
            query=query_without_page(request),
            jobs=job_choices if len(job_choices) <= JOB_CHOICES_LIMIT else None,
            statuses=S.choices,
            nodes=nodes,
            filters={
                "job": job_id,
                "job_ref": job_ref,
                "status": status,
                "node": node,
                "since": params.get("since", ""),
                "until": params.get("until", ""),
                "tz": zone,
                "q": search,
            },
            live_filter={
                "job": job_id,
                "status": status or None,
                "node": node or None,
                "since": since.isoformat() if since else None,
                "until": until.isoformat() if until else None,
                # New runs are added at the top of the first page only, and not to a text search
                # (the feed cannot tell which match it).
                "prepend": page.number == 1 and not search,
            },
            filtered=bool(job_ref or status or node or since or until or search),
            nav="executions",
        ),
    )


@role_required(VIEWER)
def execution_output(request: HttpRequest, pk: int) -> HttpResponse:
    """A run's whole output as a text file (what it has written so far while it runs)."""
    output = get_object_or_404(JobExecution.objects.only("output"), pk=pk).output
    response = HttpResponse(output, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="execution-{pk}-output.txt"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@role_required(VIEWER)
def execution_detail(request: HttpRequest, pk: int) -> HttpResponse:
    execution = get_object_or_404(JobExecution.objects.select_related("job", "triggered_by"), pk=pk)
    chain = selectors.execution_chain(execution)
    latest_attempt = max(e.attempt for e in chain)
    node_map = selectors.node_pks()
    decorate_executions([execution, *chain], node_map)
    return render(
        request,
        "dashboard/executions/detail.html",
        page_context(
            request,
            execution=execution,
            chain=chain,
            node_map=node_map,
            result_json=json.dumps(execution.result, indent=2)
            if execution.result is not None
            else "",
            can_cancel=execution.status in CANCELLABLE_STATUSES and not execution.cancel_requested,
            can_retry=execution.status in RETRY_SOURCE_STATUSES
            and execution.attempt == latest_attempt,
            is_terminal=execution.status in TERMINAL_STATES,
            execution_data={
                "id": execution.pk,
                "job": execution.job_id,
                "scheduled_for": execution.scheduled_for.isoformat(),
                "attempt": execution.attempt,
                "status": execution.status,
                "started_at": execution.started_at.isoformat() if execution.started_at else None,
                "cancel_requested": execution.cancel_requested,
                "latest_attempt": latest_attempt,
                "terminal": sorted(TERMINAL_STATES),
                "cancellable": list(CANCELLABLE_STATUSES),
                "retryable": list(RETRY_SOURCE_STATUSES),
            },
            nav="executions",
        ),
    )


def _execution_action(
    request: HttpRequest,
    pk: int,
    action: Callable[..., JobExecution],
    done: Callable[[JobExecution], str],
) -> HttpResponseRedirect:
    execution = get_object_or_404(JobExecution, pk=pk)
    try:
        result = action(execution_id=execution.pk, by=ui_actor(request))
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
        return redirect_back(request, reverse("dashboard:execution-detail", args=[execution.pk]))
    messages.success(request, done(result))
    return redirect_back(request, reverse("dashboard:execution-detail", args=[result.pk]))


def _cancelled_message(execution: JobExecution) -> str:
    if execution.status == S.CANCELLED:
        return f"Execution #{execution.pk} cancelled."
    return f"Cancel requested: the node running execution #{execution.pk} stops it shortly."


@role_required(OPERATOR)
@require_POST
def execution_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    return _execution_action(request, pk, services.execution_cancel, _cancelled_message)


@role_required(OPERATOR)
@require_POST
def execution_retry(request: HttpRequest, pk: int) -> HttpResponse:
    return _execution_action(
        request,
        pk,
        services.execution_retry,
        lambda retry: f"Retry queued: attempt {retry.attempt} is execution #{retry.pk}.",
    )
