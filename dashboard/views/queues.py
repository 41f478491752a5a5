"""The queues page: every queue with its flow control (limit, rate, paused), what runs and what a
limit holds back; pause and resume (operator). Writes go through ``jobs.queues``."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboard.views.common import page_context, role_required, ui_actor
from jobs import queues
from jobs.roles import OPERATOR, VIEWER
from jobs.validation import JobValidationError


@role_required(VIEWER)
def queue_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/queues/list.html",
        page_context(request, queues=queues.queues_overview(), nav="queues"),
    )


@role_required(OPERATOR)
@require_POST
def queue_pause(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=True)


@role_required(OPERATOR)
@require_POST
def queue_resume(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=False)


def _set_paused(request: HttpRequest, name: str, *, paused: bool) -> HttpResponse:
    try:
        if paused:
            queues.queue_pause(name=name, by=ui_actor(request))
        else:
            queues.queue_resume(name=name, by=ui_actor(request))
    except JobValidationError:
        messages.error(request, f"No queue named {name!r}.")
        return redirect("dashboard:queue-list")
    messages.success(
        request,
        f"Paused queue {name}: its runs wait until it is resumed."
        if paused
        else f"Resumed queue {name}.",
    )
    return redirect("dashboard:queue-list")
