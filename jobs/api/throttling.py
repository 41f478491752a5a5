"""API rate limits beyond DRF's per-user and per-address ones: writes (create, edit, trigger, cancel,
drain...) are limited more strictly, per user (``SCHEDULER_API_RATE_WRITES``)."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import UserRateThrottle


class WriteRateThrottle(UserRateThrottle):
    scope = "writes"

    def allow_request(self, request: Any, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)
