"""What every dashboard page shares: the role check, the actor of a UI action, the context every
page needs, pagination, the return to the page an action was posted from, and filter parsing."""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.selectors import node_pks
from jobs.api.pagination import CappedCountPaginator
from jobs.models import AuditSource, JobExecution
from jobs.roles import ADMIN, OPERATOR, has_role, user_role
from jobs.services import Actor
from jobs.states import ExecutionStatus
from jobs.validation import in_datetime_range

S = ExecutionStatus
PAGE_SIZE = 50
# The dashboard's lists count this many rows at most (jobs.api.pagination.CappedCountPaginator).
COUNT_CAP = 10_000
# A text search longer than this is cut (it is a filter, not a document).
MAX_SEARCH_CHARS = 200
MSG_NOT_A_JOB = "This job no longer exists."
MSG_CONFLICT_HINT = "Nothing was saved."


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


def paginate(
    request: HttpRequest, items: QuerySet, per_page: int = PAGE_SIZE, *, costly: bool = False
) -> Page:
    """A page of ``items``, counted up to COUNT_CAP. A ``costly`` list (each row is judged by a
    subquery or a text match that no index serves) is counted only up to one row past the asked
    page: enough to offer the next page, without judging every row of a large table."""
    cap = COUNT_CAP
    if costly:
        number = int_or_none(request.GET.get("page")) or 1
        cap = min(COUNT_CAP, number * per_page + 1)
    return CappedCountPaginator(items, per_page, cap=cap).get_page(request.GET.get("page"))


def query_without_page(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


def filter_datetime(raw: str, zone_name: str) -> datetime | None:
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


def int_or_none(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() else None
