"""The execution pages: list (filters, text search), detail with streamed output, the output as
a file, and cancel and retry (operator)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    QueryDict,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
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
from jobs import flow, services
from jobs.models import JobExecution
from jobs.roles import OPERATOR, VIEWER
from jobs.services import ActionNotAllowed
from jobs.states import RETRYABLE_STATES, TERMINAL_STATES

CANCELLABLE_STATUSES = (S.PENDING, S.RETRY_SCHEDULED, S.RUNNING)
JOB_CHOICES_LIMIT = 500
RETRY_SOURCE_STATUSES = (*RETRYABLE_STATES, S.CANCELLED)


def _filtered_rows(params: QueryDict) -> tuple[QuerySet[JobExecution], dict[str, Any]]:
    """The list's rows under the request's filters (the page and its CSV export share them), and
    the filters as read."""
    job_ref = params.get("job", "").strip()[:MAX_SEARCH_CHARS]
    job_id = int_or_none(job_ref) or (selectors.job_id_named(job_ref) if job_ref else None)
    zone = params.get("tz", "")
    read = {
        "job_ref": job_ref,
        "job": job_id,
        "status": params.get("status", ""),
        "node": params.get("node", ""),
        "tz": zone,
        "since": filter_datetime(params.get("since", ""), zone),
        "until": filter_datetime(params.get("until", ""), zone),
        "q": params.get("q", "").strip()[:MAX_SEARCH_CHARS],
    }
    executions = selectors.execution_rows(
        job=job_id,
        status=read["status"],
        node=read["node"],
        since=read["since"],
        until=read["until"],
        search=read["q"],
    )
    if job_ref and job_id is None:
        executions = executions.none()  # no such job: no runs (not every run)
    return executions, read


@role_required(VIEWER)
def execution_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    # The job filter: a list of names while there are few jobs, a name (or id) typed in beyond
    # JOB_CHOICES_LIMIT (a million options would be the page).
    job_choices = list(selectors.job_names()[: JOB_CHOICES_LIMIT + 1])
    executions, read = _filtered_rows(params)
    job_ref, job_id, status, node = read["job_ref"], read["job"], read["status"], read["node"]
    zone, since, until, search = read["tz"], read["since"], read["until"], read["q"]
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


# The runs' columns in a CSV export, and the most rows one export writes (newest first).
CSV_COLUMNS = (
    ("id", "pk"),
    ("job", "job__name"),
    ("scheduled_for", "scheduled_for"),
    ("attempt", "attempt"),
    ("trigger", "trigger"),
    ("status", "status"),
    ("node", "node"),
    ("queue", "queue"),
    ("priority", "priority"),
    ("run_after", "run_after"),
    ("claimed_at", "claimed_at"),
    ("started_at", "started_at"),
    ("finished_at", "finished_at"),
    ("duration_ms", "duration_ms"),
    ("reason", "reason"),
    ("error", "error"),
)
MAX_CSV_ROWS = 100_000
# A cell a spreadsheet would read as a formula is written as text (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        value = value.splitlines()[0] if value else value  # an error's first line
        if value.startswith(FORMULA_STARTS):
            return "'" + value
    return value


class _Echo:
    """A file whose write returns the line: csv.writer's rows streamed as they are made."""

    def write(self, value: str) -> str:
        return value


@role_required(VIEWER)
def execution_export(request: HttpRequest) -> StreamingHttpResponse:
    """The list's runs under its filters as CSV, newest first, at most MAX_CSV_ROWS (the response
    says so in ``X-Export-Truncated`` when there were more)."""
    executions, _ = _filtered_rows(request.GET)
    fields = [field for _, field in CSV_COLUMNS]
    rows = executions.values_list(*fields)[: MAX_CSV_ROWS + 1]
    truncated = executions.values_list("pk")[MAX_CSV_ROWS : MAX_CSV_ROWS + 1].exists()
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow([name for name, _ in CSV_COLUMNS])
        for count, row in enumerate(rows.iterator(chunk_size=2000)):
            if count == MAX_CSV_ROWS:
                break
            yield writer.writerow([_csv_cell(value) for value in row])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="executions-{stamp}.csv"'
    response["X-Export-Truncated"] = "true" if truncated else "false"
    return response


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
    execution = get_object_or_404(
        JobExecution.objects.select_related("job", "triggered_by", "parent__job"), pk=pk
    )
    chain = selectors.execution_chain(execution)
    chained_runs = selectors.execution_chained_runs(execution)
    latest_attempt = max(e.attempt for e in chain)
    node_map = selectors.node_pks()
    decorate_executions([execution, *chain], node_map)
    # A pending run held back by its queue's pause says so (its row need not: it is not claimed).
    # (A "waiting:" left on a run that has since started is history, not news.)
    waiting = flow.waiting_reason(execution)
    if waiting or execution.reason.startswith(flow.WAITING):
        execution.reason = waiting
    return render(
        request,
        "dashboard/executions/detail.html",
        page_context(
            request,
            execution=execution,
            chain=chain,
            chained_runs=chained_runs,
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
