"""The settings the REST API needs from Django REST framework and drf-spectacular: its token and
session authentication, its role permission, bounded parser, pagination, strict filters, schema,
error answers and rate limits. DRF reads them from the project's settings, so a project that
serves the API sets them from here::

    from jobs.api.settings import SPECTACULAR_SETTINGS, rest_framework

    REST_FRAMEWORK = rest_framework()

``dashboard.api_urls`` refuses to load without the role permission: an API left to DRF's own
defaults would let anyone in.

Nothing here may import models: settings modules import it.
"""

from __future__ import annotations

from typing import Any

ROLE_PERMISSION = "jobs.api.permissions.RolePermission"


def rest_framework(
    *, anon_rate: str = "60/min", user_rate: str = "1200/min", writes_rate: str = "300/min"
) -> dict[str, Any]:
    """``REST_FRAMEWORK`` for the scheduler's API, with its rate limits (calls per period)."""
    return {
        "DEFAULT_AUTHENTICATION_CLASSES": [
            # Token first: an anonymous API call then gets 401 with WWW-Authenticate, not 403.
            "jobs.api.authentication.HashedTokenAuthentication",
            "rest_framework.authentication.SessionAuthentication",
        ],
        "DEFAULT_PERMISSION_CLASSES": [ROLE_PERMISSION],
        "DEFAULT_PARSER_CLASSES": ["jobs.api.parsers.BoundedJSONParser"],
        "DEFAULT_PAGINATION_CLASS": "jobs.api.pagination.Pagination",
        "DEFAULT_FILTER_BACKENDS": [
            "jobs.api.filters.StrictFilterBackend",
            "jobs.api.filters.SearchFilter",
            "jobs.api.filters.OrderingFilter",
        ],
        "DEFAULT_SCHEMA_CLASS": "jobs.api.schema.SchedulerAutoSchema",
        "EXCEPTION_HANDLER": "jobs.api.errors.exception_handler",
        "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
        # Per user (token or session) for every call, stricter for writes; per address when
        # anonymous. Counted in the cache: shared by every web process when it is Redis.
        "DEFAULT_THROTTLE_CLASSES": [
            "rest_framework.throttling.AnonRateThrottle",
            "rest_framework.throttling.UserRateThrottle",
            "jobs.api.throttling.WriteRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": anon_rate, "user": user_rate, "writes": writes_rate},
    }


SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Job scheduler API",
    "DESCRIPTION": "Jobs, executions, nodes and the cluster of the distributed job scheduler.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and docs pages need a login like everything else (docs/security.md).
    "SERVE_PERMISSIONS": [ROLE_PERMISSION],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "jobs.api.schema.text_parameters_without_nul",
    ],
    # A run's status is read through two components (a run, a run's detail): named by its
    # choices, as it was when one component held it (the hook names a shared set by a hash).
    "ENUM_NAME_OVERRIDES": {"ExecutionStatusEnum": "jobs.states.ExecutionStatus"},
}
