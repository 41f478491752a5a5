"""The answer to a locked-out login (django-axes' ``AXES_LOCKOUT_CALLABLE``): 429 with
``Retry-After`` (seconds until the username may sign in from this address again) and a body the
client can read: JSON (``detail``, ``code``, ``retry_after``) for an API client, an HTML page for a
browser. Axes' own answer was a line of plain text without Retry-After.

JSON goes to scripts and XMLHttpRequest: under ``/api-auth/`` (the API's login) unless the client
prefers HTML (a browser on the browsable API), elsewhere only when it prefers JSON."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_cool_off
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

API_PATHS = ("/api/", "/api-auth/")
MSG_LOCKED_OUT = (
    "Too many failed sign-in attempts for this username from your address; try again in {wait}."
)


def _latest_attempt(request: HttpRequest, credentials: dict | None) -> Any:
    """When the lockout's cool-off started: the last failure axes recorded for this request's
    username and address (None when the handler keeps no such record)."""
    handler = AxesProxyHandler.get_implementation()
    get_attempts = getattr(handler, "get_user_attempts", None)
    if get_attempts is None:
        return None
    times = [
        attempts.order_by("-attempt_time").values_list("attempt_time", flat=True).first()
        for attempts in get_attempts(request, credentials)
    ]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def retry_after_seconds(request: HttpRequest, credentials: dict | None = None) -> int | None:
    """Whole seconds left of the cool-off (at least 1); None for a lockout without one."""
    cool_off = get_cool_off(request)
    if not cool_off:
        return None
    now = getattr(request, "axes_attempt_time", None) or timezone.now()
    latest = _latest_attempt(request, credentials)
    left = cool_off if latest is None else latest + cool_off - now
    left = min(max(left, timedelta(seconds=1)), cool_off)
    return math.ceil(left.total_seconds())


def _wait_text(seconds: int | None) -> str:
    if seconds is None:
        return "a while (ask an administrator)"
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


def wants_json(request: HttpRequest) -> bool:
    if request.headers.get("x-requested-with") == "XMLHttpRequest":
        return True
    if request.path.startswith(API_PATHS):
        return request.get_preferred_type(["application/json", "text/html"]) != "text/html"
    return request.get_preferred_type(["text/html", "application/json"]) == "application/json"


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    seconds = retry_after_seconds(request, credentials)
    detail = MSG_LOCKED_OUT.format(wait=_wait_text(seconds))
    if wants_json(request):
        response: HttpResponse = JsonResponse(
            {"detail": detail, "code": "locked_out", "retry_after": seconds}, status=429
        )
    else:
        response = render(
            request,
            "registration/locked_out.html",
            {"detail": detail, "retry_after": seconds},
            status=429,
        )
    if seconds is not None:
        response["Retry-After"] = str(seconds)
    return response
