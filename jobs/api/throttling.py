"""API rate limits beyond DRF's per-user and per-address ones: writes (create, edit, trigger, cancel,
drain...) are limited more strictly, per user (``SCHEDULER_API_RATE_WRITES``).

Calls without a valid credential count against the per-address anonymous rate
(``SCHEDULER_API_RATE_ANON``) where they are refused: DRF checks throttles only after
authentication and permissions, so a bad key (refused by the authentication) or no key at all
(refused by the permission) got its 401 before any rate applied, and guessing keys was unlimited.
:func:`throttle_anonymous` runs there first: past the rate the answer is 429 with Retry-After."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import Throttled
from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class WriteRateThrottle(UserRateThrottle):
    scope = "writes"

    def allow_request(self, request: Any, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)


class _KnownAnonymousThrottle(AnonRateThrottle):
    """The anon rate (same scope and counter as DRF's AnonRateThrottle) for a request already known
    to have no valid credential: it does not ask ``request.user``, which is still being worked
    out while an authentication class refuses a key."""

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def throttle_anonymous(request: Any, view: Any = None) -> None:
    """Count a call without a valid credential against its address's anon rate; raise Throttled
    (429, Retry-After) past it. Once per request (the browsable API asks the permissions again to
    draw its forms)."""
    http_request = getattr(request, "_request", request)  # the one its clones share
    if getattr(http_request, "_anon_rate_counted", False):
        return
    http_request._anon_rate_counted = True
    throttle = _KnownAnonymousThrottle()
    if not throttle.allow_request(request, view):
        wait = throttle.wait()
        raise Throttled(wait=wait)
