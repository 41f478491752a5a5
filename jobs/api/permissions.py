"""API authorization by role: reads need viewer, operator actions need operator, the rest admin."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from jobs.api.throttling import throttle_anonymous
from jobs.roles import ADMIN, VIEWER, has_role


def required_role(view: Any, method: str) -> str:
    """The role a request needs: the view's ``role_by_action`` entry, else viewer for reads."""
    action = getattr(view, "action", None)
    mapping = getattr(view, "role_by_action", {})
    if action in mapping:
        return mapping[action]
    return VIEWER if method in SAFE_METHODS else ADMIN


class RolePermission(BasePermission):
    message = "Your role does not allow this action."

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            # Refused (401), but counted against the anonymous rate first: 429 past it. DRF's own
            # throttles run only after the permissions, so they never saw these calls.
            throttle_anonymous(request, view)
            return False
        return has_role(user, required_role(view, request.method))
