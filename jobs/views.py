"""Dashboard pages of jobs, executions and the audit log (server-rendered; live updates come from the
WebSocket of docs/live-protocol.md, applied by the page scripts in static/dashboard/).

Views stay thin: parse the request, call one service or selector, render. Every write goes through
``jobs.services`` with an ``Actor`` whose source is "ui"; every action checks the role on the server
(viewer reads, operator operates, admin also defines jobs), whatever buttons the page shows.
"""

from __future__ import annotations

import json
import re
import zoneinfo
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from jobs import registry, selectors, services
from jobs.definition import timezone_names
from jobs.forms import JobForm, JobVersionForm
from jobs.models import AuditEvent, AuditSource, Job, JobExecution, ScheduleType
from jobs.roles import ADMIN, OPERATOR, VIEWER, has_role, user_role
from jobs.services import ActionNotAllowed, Actor, VersionConflict
from jobs.states import ACTIVE_STATES, RETRYABLE_STATES, TERMINAL_STATES, ExecutionStatus
from jobs.validation import JobValidationError, in_datetime_range

S = ExecutionStatus
PAGE_SIZE = 50
JOB_RECENT_EXECUTIONS = 25
# Success rate and the duration chart of a job look at its latest finished executions.
JOB_STATS_EXECUTIONS = 100
JOB_DURATION_CHART_POINTS = 50
# The overview charts: one bucket per minute over the last hour.
CHART_WINDOW_MINUTES = 60
# "Late" as docs/live-protocol.md defines it: pending with run_after more than this long ago.
LATE_AFTER_S = 5
OUTCOME_STATUSES = (S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.LOST, S.CANCELLED, S.SKIPPED)
FAILED_STATUSES = (S.FAILED, S.TIMED_OUT, S.LOST)
CANCELLABLE_STATUSES = (S.PENDING, S.RETRY_SCHEDULED, S.RUNNING)
RETRY_SOURCE_STATUSES = (*RETRYABLE_STATES, S.CANCELLED)

MSG_NOT_A_JOB = "This job no longer exists."
MSG_CONFLICT_HINT = "Nothing was saved."


# --- request helpers --------------------------------------------------------------------------


def role_required(
    role: str,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Login required (redirect to LOGIN_URL?next=...), then at least ``role`` (else 403)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not has_role(request.user, role):
                raise PermissionDenied(f"This needs the {role} role.")
            return view(request, *args, **kwargs)

        return login_required(wrapped)

    return decorator


def ui_actor(request: HttpRequest) -> Actor:
    return Actor(
        user=request.user, source=AuditSource.UI, remote_addr=request.META.get("REMOTE_ADDR")
    )


def node_pks() -> dict[str, int]:
    """node_id -> primary key, for links to node pages (executions name their node by node_id)."""
    from cluster.models import SchedulerNode

    return dict(SchedulerNode.objects.values_list("node_id", "pk"))


def page_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    """What every dashboard page needs besides its own data: the role and what it may do."""
    context = {
        "role": user_role(request.user),
        "can_operate": has_role(request.user, OPERATOR),
        "can_admin": has_role(request.user, ADMIN),
        "server_now": timezone.now(),
        **extra,
    }
    context.setdefault("node_map", node_pks())
    return context


def decorate_executions(executions: Any, node_map: dict[str, int]) -> list[JobExecution]:
    """Executions with what their table rows show besides model fields: lag and node link."""
    rows = list(executions)
    for execution in rows:
        execution.lag_ms = (
            (execution.started_at - execution.run_after).total_seconds() * 1000
            if execution.started_at
            else None
        )
        execution.node_pk = node_map.get(execution.node)
    return rows


def redirect_back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """Back to the page the action was posted from (its ``next`` field), if it is on this site."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = default
    return HttpResponseRedirect(target)


def _paginate(request: HttpRequest, items: QuerySet, per_page: int = PAGE_SIZE) -> Page:
    return Paginator(items, per_page).get_page(request.GET.get("page"))


def _query_without_page(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


def _parse_filter_datetime(raw: str, zone_name: str) -> datetime | None:
    """A filter bound from a ``datetime-local`` input: wall-clock time in the viewer's zone."""
    if not raw:
        return None
    try:
        parsed = parse_datetime(raw)
    except ValueError:
        return None
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        try:
            zone: Any = zoneinfo.ZoneInfo(zone_name) if zone_name else UTC
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            zone = UTC
        parsed = parsed.replace(tzinfo=zone)
    # Out of the storable range (or overflowing once converted to UTC): ignored, as an
    # unparsable value is.
    return parsed if in_datetime_range(parsed) else None


def _int_or_none(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() else None


# --- overview ---------------------------------------------------------------------------------
# These reads belong with jobs.selectors; they live here while that module has another owner, and
# only the dashboard uses them.


def dashboard_counts(*, now: datetime) -> dict[str, int]:
    """The overview counters: the live ``counts`` message itself."""
    from cluster.live import counts_payload

    return counts_payload(now=now)


def _epoch_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _ms(value: timedelta | float | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        return value.total_seconds() * 1000
    return float(value)


def execution_minutes(*, now: datetime) -> dict[str, Any]:
    """Per-minute buckets of the last hour: outcomes and duration by finish minute, due-to-start lag
    by start minute. Sums and counts (not averages) so the page can add live executions to them."""
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_WINDOW_MINUTES - 1)
    buckets: dict[int, dict[str, Any]] = {}

    def bucket(minute: datetime) -> dict[str, Any]:
        key = _epoch_ms(minute)
        return buckets.setdefault(
            key,
            {
                "t": key,
                "outcomes": {},
                "dur_sum": 0.0,
                "dur_n": 0,
                "dur_max": 0.0,
                "lag_sum": 0.0,
                "lag_n": 0,
                "lag_max": 0.0,
            },
        )

    finished = (
        JobExecution.objects.filter(finished_at__gte=first, status__in=OUTCOME_STATUSES)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute", "status")
        .annotate(
            n=Count("id"),
            dur_sum=Sum("duration_ms"),
            dur_n=Count("duration_ms"),
            dur_max=Max("duration_ms"),
        )
        .order_by()
    )
    for row in finished:
        entry = bucket(row["minute"])
        entry["outcomes"][row["status"]] = entry["outcomes"].get(row["status"], 0) + row["n"]
        entry["dur_sum"] += _ms(row["dur_sum"])
        entry["dur_n"] += row["dur_n"]
        entry["dur_max"] = max(entry["dur_max"], _ms(row["dur_max"]))

    lag = ExpressionWrapper(F("started_at") - F("run_after"), output_field=DurationField())
    started = (
        # Rows are found through indexed columns (finished_at, status) rather than started_at.
        JobExecution.objects.filter(Q(finished_at__gte=first) | Q(status=S.RUNNING))
        .filter(started_at__gte=first)
        .annotate(minute=TruncMinute("started_at"))
        .values("minute")
        .annotate(lag_sum=Sum(lag), lag_n=Count("id"), lag_max=Max(lag))
        .order_by()
    )
    for row in started:
        entry = bucket(row["minute"])
        entry["lag_sum"] += _ms(row["lag_sum"])
        entry["lag_n"] += row["lag_n"]
        entry["lag_max"] = max(entry["lag_max"], _ms(row["lag_max"]))

    return {
        "first": _epoch_ms(first),
        "window_minutes": CHART_WINDOW_MINUTES,
        "buckets": sorted(buckets.values(), key=lambda b: b["t"]),
    }


def dashboard_stats(*, now: datetime | None = None) -> dict[str, Any]:
    from cluster.views import cluster_payload

    now = now or timezone.now()
    return {
        "as_of": now.isoformat(),
        "counts": dashboard_counts(now=now),
        "minutes": execution_minutes(now=now),
        "cluster": cluster_payload(),
    }


@role_required(VIEWER)
def overview(request: HttpRequest) -> HttpResponse:
    from cluster.views import liveness_thresholds

    stats = dashboard_stats()
    node_map = node_pks()
    recent = decorate_executions(
        JobExecution.objects.select_related("job").order_by("-id")[:10], node_map
    )
    return render(
        request,
        "dashboard/overview.html",
        page_context(
            request,
            stats=stats,
            counts=stats["counts"],
            cluster=stats["cluster"],
            thresholds=liveness_thresholds(),
            recent=recent,
            node_map=node_map,
            nav="overview",
        ),
    )


@role_required(VIEWER)
def stats_json(request: HttpRequest) -> JsonResponse:
    """The overview's data, fetched again by the page after a WebSocket reconnect."""
    return JsonResponse(dashboard_stats())


# --- jobs -------------------------------------------------------------------------------------

JOB_SORTS = {
    "name": ("name",),
    "-name": ("-name",),
    "next": (F("next_fire_at").asc(nulls_last=True), "name"),
    "-next": (F("next_fire_at").desc(nulls_last=True), "name"),
    "last": (F("last_fire_at").asc(nulls_last=True), "name"),
    "-last": (F("last_fire_at").desc(nulls_last=True), "name"),
    "task": ("task", "name"),
    "-task": ("-task", "name"),
    "priority": ("priority", "name"),
    "-priority": ("-priority", "name"),
    "outcome": (F("last_outcome").asc(nulls_last=True), "name"),
    "-outcome": (F("last_outcome").desc(nulls_last=True), "name"),
}
NEVER_RUN = "never"


def _with_last_outcome(jobs: QuerySet[Job]) -> QuerySet[Job]:
    latest_finished = JobExecution.objects.filter(
        job=OuterRef("pk"), status__in=TERMINAL_STATES
    ).order_by("-id")
    return jobs.annotate(
        last_outcome=Subquery(latest_finished.values("status")[:1]),
        last_execution_id=Subquery(latest_finished.values("id")[:1]),
        running=Count("executions", filter=Q(executions__status=S.RUNNING)),
    )


@role_required(VIEWER)
def job_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    search = params.get("q", "").strip()
    enabled = {"yes": True, "no": False}.get(params.get("enabled", ""))
    jobs = selectors.job_list(enabled=enabled)
    if search:
        jobs = jobs.filter(
            Q(name__icontains=search) | Q(description__icontains=search) | Q(task__icontains=search)
        )
    if params.get("task"):
        jobs = jobs.filter(task=params["task"])
    if params.get("schedule_type") in ScheduleType.values:
        jobs = jobs.filter(schedule_type=params["schedule_type"])
    jobs = _with_last_outcome(jobs)
    outcome = params.get("outcome", "")
    if outcome == NEVER_RUN:
        jobs = jobs.filter(last_outcome__isnull=True)
    elif outcome in TERMINAL_STATES:
        jobs = jobs.filter(last_outcome=outcome)
    sort = params.get("sort", "name")
    if sort not in JOB_SORTS:
        sort = "name"
    page = _paginate(request, jobs.order_by(*JOB_SORTS[sort]))
    for job in page.object_list:
        job.schedule_description = selectors.job_schedule_description(job)
        job.last_outcome_label = S(job.last_outcome).label if job.last_outcome else ""
    tasks = sorted(set(registry.task_names()) | set(Job.objects.values_list("task", flat=True)))
    filtered = bool(search or params.get("enabled") or params.get("task") or outcome) or bool(
        params.get("schedule_type")
    )
    return render(
        request,
        "jobs/list.html",
        page_context(
            request,
            page=page,
            jobs=page.object_list,
            query=_query_without_page(request),
            search=search,
            filters={
                "enabled": params.get("enabled", ""),
                "task": params.get("task", ""),
                "schedule_type": params.get("schedule_type", ""),
                "outcome": outcome,
            },
            sort=sort,
            sorts=[
                ("name", "Name, A to Z"),
                ("-name", "Name, Z to A"),
                ("next", "Next fire, soonest"),
                ("-next", "Next fire, latest"),
                ("-last", "Last fire, newest"),
                ("last", "Last fire, oldest"),
                ("task", "Task"),
                ("-priority", "Priority, highest"),
                ("outcome", "Last outcome"),
            ],
            tasks=tasks,
            schedule_types=ScheduleType.choices,
            outcomes=[(s.value, s.label) for s in S if s in TERMINAL_STATES],
            filtered=filtered,
            total=Job.objects.count(),
            # Jobs created later have larger ids: the page tells them apart from edits.
            max_job_id=Job.objects.aggregate(Max("id"))["id__max"] or 0,
            nav="jobs",
        ),
    )


def _job_stats(job: Job) -> dict[str, Any]:
    finished = list(
        job.executions.filter(status__in=TERMINAL_STATES)
        .order_by("-id")
        .values("id", "status", "duration_ms", "finished_at")[:JOB_STATS_EXECUTIONS]
    )
    judged = [e for e in finished if e["status"] in (S.SUCCEEDED, *FAILED_STATUSES)]
    succeeded = sum(1 for e in judged if e["status"] == S.SUCCEEDED)
    durations = sorted(e["duration_ms"] for e in finished if e["duration_ms"] is not None)
    chart = [
        {
            "id": e["id"],
            "status": e["status"],
            "duration_ms": e["duration_ms"],
            "finished_at": e["finished_at"].isoformat() if e["finished_at"] else None,
        }
        for e in reversed(finished[:JOB_DURATION_CHART_POINTS])
        if e["duration_ms"] is not None
    ]
    return {
        "judged": len(judged),
        "succeeded": succeeded,
        "success_rate": round(100 * succeeded / len(judged), 1) if judged else None,
        "avg_ms": sum(durations) / len(durations) if durations else None,
        "p95_ms": durations[min(len(durations) - 1, int(len(durations) * 0.95))]
        if durations
        else None,
        "chart": chart,
        # The page recomputes the rate and the chart from these as runs finish.
        "recent": [
            {"id": e["id"], "status": e["status"], "duration_ms": e["duration_ms"]}
            for e in finished
        ],
    }


@role_required(VIEWER)
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    job.schedule_description = selectors.job_schedule_description(job)
    node_map = node_pks()
    executions = decorate_executions(
        job.executions.order_by("-id")[:JOB_RECENT_EXECUTIONS], node_map
    )
    return render(
        request,
        "jobs/detail.html",
        page_context(
            request,
            node_map=node_map,
            job=job,
            executions=executions,
            stats=_job_stats(job),
            args_json=json.dumps(job.args, indent=2),
            kwargs_json=json.dumps(job.kwargs, indent=2),
            running=job.executions.filter(status=S.RUNNING).count(),
            nav="jobs",
        ),
    )


def _form_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return page_context(
        request,
        timezone_names=timezone_names(),
        task_catalog=registry.task_catalog(),
        nav="jobs",
        **extra,
    )


@role_required(ADMIN)
def job_create(request: HttpRequest) -> HttpResponse:
    form = JobForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            job = services.job_create(data=form.service_data(), by=ui_actor(request))
        except JobValidationError as exc:
            form.add_service_errors(exc.errors)
        else:
            messages.success(request, f"Job “{job.name}” created.")
            return HttpResponseRedirect(f"/jobs/{job.pk}/")
    return render(request, "jobs/form.html", _form_context(request, form=form, job=None))


@role_required(ADMIN)
def job_edit(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    conflict: VersionConflict | None = None
    status = 200
    if request.method == "POST":
        form = JobForm(request.POST, job=job)
        version_form = JobVersionForm(request.POST)
        if form.is_valid() and version_form.is_valid():
            try:
                saved = services.job_update(
                    job_id=job.pk,
                    expected_version=version_form.cleaned_data["version"],
                    changes=form.service_data(),
                    by=ui_actor(request),
                )
            except VersionConflict as exc:
                conflict = exc
                status = 409
            except JobValidationError as exc:
                form.add_service_errors(exc.errors)
            except Job.DoesNotExist:
                messages.error(request, MSG_NOT_A_JOB)
                return HttpResponseRedirect("/jobs/")
            else:
                if saved.version == job.version:
                    messages.info(request, "No changes to save.")
                else:
                    messages.success(request, f"Job “{saved.name}” saved.")
                return HttpResponseRedirect(f"/jobs/{job.pk}/")
        elif not version_form.is_valid():
            form.add_error(None, services.ERR_VERSION_REQUIRED)
    else:
        form = JobForm(job=job)
        version_form = JobVersionForm(initial={"version": job.version})
    return render(
        request,
        "jobs/form.html",
        _form_context(
            request,
            form=form,
            version_form=version_form,
            job=job,
            conflict=conflict,
            conflict_hint=MSG_CONFLICT_HINT,
        ),
        status=status,
    )


@role_required(ADMIN)
def job_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET asks for confirmation; POST deletes the version that was confirmed."""
    job = get_object_or_404(Job, pk=pk)
    if request.method == "POST":
        version_form = JobVersionForm(request.POST)
        version = version_form.cleaned_data["version"] if version_form.is_valid() else None
        try:
            services.job_delete(job_id=job.pk, by=ui_actor(request), expected_version=version)
        except VersionConflict as exc:
            messages.error(request, f"{exc} {MSG_CONFLICT_HINT}")
            return HttpResponseRedirect(f"/jobs/{job.pk}/delete/")
        except Job.DoesNotExist:
            messages.error(request, MSG_NOT_A_JOB)
            return HttpResponseRedirect("/jobs/")
        messages.success(request, f"Job “{job.name}” deleted.")
        return HttpResponseRedirect("/jobs/")
    return render(
        request,
        "jobs/confirm_delete.html",
        page_context(
            request,
            job=job,
            execution_count=job.executions.count(),
            active_count=job.executions.filter(status__in=ACTIVE_STATES).count(),
            nav="jobs",
        ),
    )


def _job_action(
    request: HttpRequest, pk: int, action: Callable[..., Any], done: str
) -> HttpResponseRedirect:
    job = get_object_or_404(Job, pk=pk)
    try:
        result = action(job_id=job.pk, by=ui_actor(request))
    except Job.DoesNotExist:
        messages.error(request, MSG_NOT_A_JOB)
        return HttpResponseRedirect("/jobs/")
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done.format(job=job, result=result))
    return redirect_back(request, f"/jobs/{job.pk}/")


@role_required(OPERATOR)
@require_POST
def job_trigger(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_action(
        request,
        pk,
        services.job_trigger,
        "“{job.name}” queued to run now (execution #{result.pk}).",
    )


@role_required(OPERATOR)
@require_POST
def job_pause(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_action(request, pk, services.job_pause, "“{job.name}” paused.")


@role_required(OPERATOR)
@require_POST
def job_resume(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_action(request, pk, services.job_resume, "“{job.name}” resumed.")


# --- bulk actions ------------------------------------------------------------------------------
# Each selected object goes through the same service as its single action (and is audited the
# same way); one that cannot take the action is skipped and named in the summary.
MAX_BULK = 500
JOB_BULK_ACTIONS: dict[str, tuple[str, Callable[..., Any], str]] = {
    # action: (role, service, past tense)
    "trigger": (OPERATOR, services.job_trigger, "queued to run"),
    "pause": (OPERATOR, services.job_pause, "paused"),
    "resume": (OPERATOR, services.job_resume, "resumed"),
    "delete": (ADMIN, services.job_delete, "deleted"),
}
EXECUTION_BULK_ACTIONS: dict[str, tuple[str, Callable[..., Any], str]] = {
    "cancel": (OPERATOR, services.execution_cancel, "cancelled"),
    "retry": (OPERATOR, services.execution_retry, "retried"),
}
MSG_BULK_NONE = "Select at least one row first."
MSG_BULK_UNKNOWN = "Unknown bulk action."


def _selected_ids(request: HttpRequest) -> list[int]:
    ids = []
    for raw in request.POST.getlist("ids")[:MAX_BULK]:
        if raw.isdigit() and len(raw) <= 12:
            ids.append(int(raw))
    return list(dict.fromkeys(ids))


def _bulk(
    request: HttpRequest,
    actions: dict[str, tuple[str, Callable[..., Any], str]],
    *,
    model: type,
    noun: str,
    label: Callable[[Any], str],
    default: str,
) -> HttpResponse:
    chosen = actions.get(request.POST.get("action", ""))
    if chosen is None:
        messages.error(request, MSG_BULK_UNKNOWN)
        return redirect_back(request, default)
    role, service, done = chosen
    if not has_role(request.user, role):
        raise PermissionDenied
    ids = _selected_ids(request)
    if not ids:
        messages.error(request, MSG_BULK_NONE)
        return redirect_back(request, default)
    objects = model.objects.in_bulk(ids)
    argument = f"{noun}_id"
    succeeded: list[str] = []
    skipped: list[str] = []
    for pk in ids:
        obj = objects.get(pk)
        if obj is None:
            skipped.append(f"#{pk} (gone)")
            continue
        try:
            service(**{argument: pk}, by=ui_actor(request))
        except (ActionNotAllowed, VersionConflict, model.DoesNotExist) as exc:
            skipped.append(f"{label(obj)} ({exc})" if str(exc) else label(obj))
        else:
            succeeded.append(label(obj))
    plural = noun if len(succeeded) == 1 else f"{noun}s"
    if succeeded:
        messages.success(request, f"{len(succeeded)} {plural} {done}: {', '.join(succeeded)}.")
    if skipped:
        messages.warning(request, f"Skipped {len(skipped)}: {'; '.join(skipped)}.")
    return redirect_back(request, default)


@role_required(OPERATOR)
@require_POST
def job_bulk(request: HttpRequest) -> HttpResponse:
    """Run now, pause, resume (operator) or delete (admin) the selected jobs."""
    return _bulk(
        request,
        JOB_BULK_ACTIONS,
        model=Job,
        noun="job",
        label=lambda job: f"“{job.name}”",
        default="/jobs/",
    )


@role_required(OPERATOR)
@require_POST
def execution_bulk(request: HttpRequest) -> HttpResponse:
    """Cancel or retry the selected executions (operator)."""
    return _bulk(
        request,
        EXECUTION_BULK_ACTIONS,
        model=JobExecution,
        noun="execution",
        label=lambda execution: f"#{execution.pk}",
        default="/executions/",
    )


# --- executions -------------------------------------------------------------------------------


@role_required(VIEWER)
def execution_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    job_id = _int_or_none(params.get("job"))
    status = params.get("status", "")
    node = params.get("node", "")
    zone = params.get("tz", "")
    since = _parse_filter_datetime(params.get("since", ""), zone)
    until = _parse_filter_datetime(params.get("until", ""), zone)
    search = params.get("q", "").strip()[:MAX_SEARCH_CHARS]
    executions = selectors.execution_list(
        job_id=job_id,
        statuses=[status] if status in S.values else None,
        node=node or None,
        since=since,
        until=until,
        search=search,
    ).order_by("-id")
    page = _paginate(request, executions)
    node_map = node_pks()
    nodes = sorted(set(node_map) | ({node} if node else set()))
    return render(
        request,
        "executions/list.html",
        page_context(
            request,
            page=page,
            executions=decorate_executions(page.object_list, node_map),
            node_map=node_map,
            query=_query_without_page(request),
            jobs=Job.objects.order_by("name").values_list("pk", "name"),
            statuses=S.choices,
            nodes=nodes,
            filters={
                "job": job_id,
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
            filtered=bool(job_id or status or node or since or until or search),
            nav="executions",
        ),
    )


# A text search longer than this is cut (it is a filter, not a document).
MAX_SEARCH_CHARS = 200
# How an execution was labelled in the audit log before: "<job id>@<scheduled_for>#<attempt>".
OLD_EXECUTION_LABEL = re.compile(r"^\d+@\S+#\d+$")


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
    chain = list(
        JobExecution.objects.filter(
            job_id=execution.job_id, scheduled_for=execution.scheduled_for
        ).order_by("attempt")
    )
    latest_attempt = max(e.attempt for e in chain)
    node_map = node_pks()
    decorate_executions([execution, *chain], node_map)
    return render(
        request,
        "executions/detail.html",
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
        return redirect_back(request, f"/executions/{execution.pk}/")
    messages.success(request, done(result))
    return redirect_back(request, f"/executions/{result.pk}/")


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


# --- audit log --------------------------------------------------------------------------------


def _audit_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@role_required(VIEWER)
def audit_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    events = AuditEvent.objects.all()
    search = params.get("q", "").strip()
    if search:
        events = events.filter(Q(object_repr__icontains=search) | Q(object_id=search))
    for field in ("actor_name", "action", "object_type", "object_id", "source"):
        if params.get(field):
            events = events.filter(**{field: params[field]})
    zone = params.get("tz", "")
    since = _parse_filter_datetime(params.get("since", ""), zone)
    until = _parse_filter_datetime(params.get("until", ""), zone)
    if since:
        events = events.filter(created_at__gte=since)
    if until:
        events = events.filter(created_at__lt=until)
    page = _paginate(request, events)
    node_map = node_pks()
    job_pks = set(
        Job.objects.filter(
            pk__in=[
                int(e.object_id)
                for e in page.object_list
                if e.object_type == "job" and e.object_id.isdigit()
            ]
        ).values_list("pk", flat=True)
    )
    for event in page.object_list:
        event.rows = [
            (field, _audit_value(pair[0]), _audit_value(pair[1]))
            for field, pair in sorted(event.changes.items())
            if isinstance(pair, list) and len(pair) == 2
        ]
        event.link = None
        if event.object_type == "job" and event.object_id.isdigit():
            if int(event.object_id) in job_pks:
                event.link = f"/jobs/{event.object_id}/"
        elif event.object_type == "execution" and event.object_id.isdigit():
            event.link = f"/executions/{event.object_id}/"
            if OLD_EXECUTION_LABEL.match(event.object_repr):
                # Recorded before runs had readable labels ("1@2026-...#1").
                event.object_repr = f"run #{event.object_id}"
        elif event.object_type == "node" and event.object_id in node_map:
            event.link = f"/nodes/{node_map[event.object_id]}/"
    distinct = AuditEvent.objects.order_by()
    return render(
        request,
        "audit/list.html",
        page_context(
            request,
            page=page,
            events=page.object_list,
            query=_query_without_page(request),
            node_map=node_map,
            search=search,
            filters={
                f: params.get(f, "")
                for f in ("actor_name", "action", "object_type", "object_id", "source")
            }
            | {"since": params.get("since", ""), "until": params.get("until", ""), "tz": zone},
            actors=distinct.values_list("actor_name", flat=True).distinct().order_by("actor_name"),
            actions=distinct.values_list("action", flat=True).distinct().order_by("action"),
            object_types=distinct.values_list("object_type", flat=True)
            .distinct()
            .order_by("object_type"),
            sources=AuditSource.choices,
            filtered=bool(search or since or until)
            or any(
                params.get(f)
                for f in ("actor_name", "action", "object_type", "object_id", "source")
            ),
            nav="audit",
        ),
    )
