"""Roles: Django groups viewer < operator < admin (created by a data migration).

viewer   reads everything;
operator may also trigger, pause, resume, cancel, retry and drain;
admin    may also create, edit and delete jobs, and use the Django admin to change data.
A superuser is an admin. The server enforces these in the API, the admin and the dashboard alike.
"""

from __future__ import annotations

from typing import Any

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
_RANK = {role: rank for rank, role in enumerate(ROLES, start=1)}


def user_role(user: Any) -> str | None:
    """The highest role of an active, authenticated user; None for anyone else."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, "_scheduler_role", False)
    if cached is not False:
        return cached
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    role = max(names, key=_RANK.__getitem__) if names else None
    user._scheduler_role = role
    return role


def has_role(user: Any, required: str) -> bool:
    role = user_role(user)
    return role is not None and _RANK[role] >= _RANK[required]
