"""Bulk actions on the selected rows of the job and execution lists.

Each selected object goes through the same service as its single action (and is audited the same
way); one that cannot take the action is skipped and named in the summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.views.common import redirect_back, role_required, ui_actor
from jobs import services
from jobs.models import Job, JobExecution
from jobs.roles import ADMIN, OPERATOR, has_role
from jobs.services import ActionNotAllowed, VersionConflict

# Each selected object goes through the same service as its single action (and is audited the
# same way); one that cannot take the action is skipped and named in the summary.
MAX_BULK = 500


class Unchanged(Exception):
    """The object already was as the action would leave it: not counted as done."""


def _set_enabled(enabled: bool, why: str) -> Callable[..., Any]:
    def service(*, job_id: int, by: services.Actor) -> None:
        if not services.job_set_enabled(job_id=job_id, enabled=enabled, by=by)[1]:
            raise Unchanged(why)

    return service


JOB_BULK_ACTIONS: dict[str, tuple[str, Callable[..., Any], str]] = {
    # action: (role, service, past tense); a service raises Unchanged for an object it left as it was
    "trigger": (OPERATOR, services.job_trigger, "queued to run"),
    "pause": (OPERATOR, _set_enabled(False, "already paused"), "paused"),
    "resume": (OPERATOR, _set_enabled(True, "not paused"), "resumed"),
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
    unchanged: dict[str, list[str]] = {}  # why: labels
    for pk in ids:
        obj = objects.get(pk)
        if obj is None:
            skipped.append(f"#{pk} (gone)")
            continue
        try:
            service(**{argument: pk}, by=ui_actor(request))
        except Unchanged as exc:
            unchanged.setdefault(str(exc), []).append(label(obj))
        except (ActionNotAllowed, VersionConflict, model.DoesNotExist) as exc:
            skipped.append(f"{label(obj)} ({exc})" if str(exc) else label(obj))
        else:
            succeeded.append(label(obj))
    plural = noun if len(succeeded) == 1 else f"{noun}s"
    if succeeded:
        messages.success(request, f"{len(succeeded)} {plural} {done}: {', '.join(succeeded)}.")
    for why, labels in unchanged.items():
        messages.info(request, f"Unchanged {len(labels)} ({why}): {', '.join(labels)}.")
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
        default=reverse("dashboard:job-list"),
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
        default=reverse("dashboard:execution-list"),
    )
