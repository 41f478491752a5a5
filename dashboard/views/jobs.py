"""The job pages: list, detail, the editor (admin), delete (admin) and the single actions
(operator). Every write goes through ``jobs.services`` with the UI's actor."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.db.models import (
    F,
)
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import selectors as dashboard_selectors
from dashboard.views.common import (
    MAX_SEARCH_CHARS,
    MSG_CONFLICT_HINT,
    MSG_NOT_A_JOB,
    S,
    decorate_executions,
    page_context,
    paginate,
    query_without_page,
    redirect_back,
    role_required,
    ui_actor,
)
from jobs import registry, selectors, services
from jobs.definition import timezone_names
from jobs.forms import JobForm, JobVersionForm
from jobs.models import Job, ScheduleType
from jobs.roles import ADMIN, OPERATOR, VIEWER
from jobs.services import ActionNotAllowed, VersionConflict
from jobs.states import TERMINAL_STATES
from jobs.validation import JobValidationError

JOB_RECENT_EXECUTIONS = 25
OUTCOME_SORT_LIMIT = 10_000
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


@role_required(VIEWER)
def job_list(request: HttpRequest) -> HttpResponse:
    params = request.GET
    search = params.get("q", "").strip()
    filters = {
        "enabled": params.get("enabled", ""),
        "task": params.get("task", ""),
        "schedule_type": params.get("schedule_type", ""),
        "outcome": params.get("outcome", ""),
        "tag": params.get("tag", "").strip()[:MAX_SEARCH_CHARS],
    }
    jobs = dashboard_selectors.job_rows(search=search, **filters)
    choices = dashboard_selectors.job_list_choices()
    # Sorting by the last outcome judges every job's runs: offered while the jobs are few.
    by_outcome = not choices["total_capped"] and choices["total"] <= OUTCOME_SORT_LIMIT
    sort = params.get("sort", "name")
    if sort not in JOB_SORTS or (sort.lstrip("-") == "outcome" and not by_outcome):
        sort = "name"
    page = paginate(
        request,
        jobs.order_by(*JOB_SORTS[sort]),
        costly=bool(search or filters["outcome"]),
    )
    for job in page.object_list:
        job.schedule_description = selectors.job_schedule_description(job)
        job.last_outcome_label = S(job.last_outcome).label if job.last_outcome else ""
    filtered = bool(search) or any(filters.values())
    return render(
        request,
        "dashboard/jobs/list.html",
        page_context(
            request,
            page=page,
            jobs=page.object_list,
            query=query_without_page(request),
            search=search,
            filters=filters,
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
                *([("outcome", "Last outcome")] if by_outcome else []),
            ],
            schedule_types=ScheduleType.choices,
            outcomes=[(s.value, s.label) for s in S if s in TERMINAL_STATES],
            filtered=filtered,
            nav="jobs",
            **choices,
        ),
    )


@role_required(VIEWER)
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    job.schedule_description = selectors.job_schedule_description(job)
    node_map = dashboard_selectors.node_pks()
    executions = decorate_executions(
        dashboard_selectors.job_recent_executions(job, JOB_RECENT_EXECUTIONS), node_map
    )
    return render(
        request,
        "dashboard/jobs/detail.html",
        page_context(
            request,
            node_map=node_map,
            job=job,
            executions=executions,
            stats=dashboard_selectors.job_stats(job),
            args_json=json.dumps(job.args, indent=2),
            kwargs_json=json.dumps(job.kwargs, indent=2),
            running=dashboard_selectors.job_running_count(job),
            chain_targets=dashboard_selectors.job_chain_targets(job),
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
            return redirect("dashboard:job-detail", pk=job.pk)
    return render(request, "dashboard/jobs/form.html", _form_context(request, form=form, job=None))


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
                return redirect("dashboard:job-list")
            else:
                if saved.version == job.version:
                    messages.info(request, "No changes to save.")
                else:
                    messages.success(request, f"Job “{saved.name}” saved.")
                return redirect("dashboard:job-detail", pk=job.pk)
        elif not version_form.is_valid():
            form.add_error(None, services.ERR_VERSION_REQUIRED)
    else:
        form = JobForm(job=job)
        version_form = JobVersionForm(initial={"version": job.version})
    return render(
        request,
        "dashboard/jobs/form.html",
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
            return redirect("dashboard:job-delete", pk=job.pk)
        except Job.DoesNotExist:
            messages.error(request, MSG_NOT_A_JOB)
            return redirect("dashboard:job-list")
        messages.success(request, f"Job “{job.name}” deleted.")
        return redirect("dashboard:job-list")
    return render(
        request,
        "dashboard/jobs/confirm_delete.html",
        page_context(
            request,
            job=job,
            nav="jobs",
            **dashboard_selectors.job_execution_counts(job),
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
        return redirect("dashboard:job-list")
    except ActionNotAllowed as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done.format(job=job, result=result))
    return redirect_back(request, reverse("dashboard:job-detail", args=[job.pk]))


MSG_CALL_NOT_JSON = "{field} is not valid JSON: {error}"


@role_required(OPERATOR)
@require_POST
def job_trigger(request: HttpRequest, pk: int) -> HttpResponse:
    """Run now; with the form's ``args``/``kwargs`` (JSON) when sent: this run's own arguments,
    checked against the task (a bad call writes nothing and says why)."""
    call: dict[str, Any] = {}
    for field in ("args", "kwargs"):
        text = request.POST.get(field, "").strip()
        if not text:
            continue
        try:
            call[field] = json.loads(text)
        except ValueError as exc:
            messages.error(request, MSG_CALL_NOT_JSON.format(field=field, error=exc))
            return redirect_back(request, reverse("dashboard:job-detail", args=[pk]))

    def trigger(**kwargs: Any) -> Any:
        return services.job_trigger(**kwargs, **call)

    try:
        return _job_action(
            request, pk, trigger, "“{job.name}” queued to run now (execution #{result.pk})."
        )
    except JobValidationError as exc:
        messages.error(
            request,
            "Not run: "
            + "; ".join(f"{field}: {' '.join(reasons)}" for field, reasons in exc.errors.items()),
        )
        return redirect_back(request, reverse("dashboard:job-detail", args=[pk]))


@role_required(OPERATOR)
@require_POST
def job_pause(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_action(request, pk, services.job_pause, "“{job.name}” paused.")


@role_required(OPERATOR)
@require_POST
def job_resume(request: HttpRequest, pk: int) -> HttpResponse:
    return _job_action(request, pk, services.job_resume, "“{job.name}” resumed.")
