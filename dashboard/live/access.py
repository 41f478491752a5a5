"""Who may hold a dashboard socket open: checked when it connects and re-checked while it is open."""

from __future__ import annotations

from datetime import datetime
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model

from dashboard.live.protocol import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED
from jobs.roles import ROLES, user_role

SESSION_DB_ENGINES = {
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
}


def dashboard_access(user: Any, session: Any) -> tuple[int | None, str | None]:
    """(close code, None) for a connection to refuse, else (None, role)."""
    if user is None or not user.is_authenticated:
        # Django resolves an inactive user's session to AnonymousUser: tell that case apart, since
        # logging in again will not help (4403, not 4401).
        try:
            user_id = session.get(SESSION_KEY) if session is not None else None
            if user_id is not None and (
                get_user_model()._default_manager.filter(pk=user_id, is_active=False).exists()
            ):
                return CLOSE_FORBIDDEN, None
        except (ValueError, TypeError):
            pass
        return CLOSE_UNAUTHENTICATED, None
    role = user_role(user)
    if role is None:
        return CLOSE_FORBIDDEN, None
    return None, role


def revocations(clients: dict[str, tuple[Any, str | None]], *, now: datetime) -> dict[str, int]:
    """Close codes for clients whose session ended (4401) or whose user lost access (4403)."""
    user_model = get_user_model()
    user_ids = {user_id for user_id, _ in clients.values()}
    active = dict(
        user_model._default_manager.filter(pk__in=user_ids, is_active=True).values_list(
            "pk", "is_superuser"
        )
    )
    with_role = set(
        user_model.groups.through.objects.filter(
            user_id__in=user_ids, group__name__in=ROLES
        ).values_list("user_id", flat=True)
    )
    allowed = {pk for pk, superuser in active.items() if superuser or pk in with_role}
    sessions = live_sessions({key for _, key in clients.values() if key}, now=now)
    revoke = {}
    for channel, (user_id, session_key) in clients.items():
        if session_key not in sessions:
            revoke[channel] = CLOSE_UNAUTHENTICATED
        elif user_id not in allowed:
            revoke[channel] = CLOSE_FORBIDDEN
    return revoke


def live_sessions(keys: set[str], *, now: datetime) -> set[str]:
    """Which of these session keys still belong to a live session."""
    if settings.SESSION_ENGINE in SESSION_DB_ENGINES:
        from django.contrib.sessions.models import Session

        return set(
            Session.objects.filter(session_key__in=keys, expire_date__gt=now).values_list(
                "session_key", flat=True
            )
        )
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return {key for key in keys if store().exists(key)}
