"""Map domain exceptions to HTTP: validation 400 (per field), not found 404, conflicts 409, the
database unreachable or busy 503 (nothing was written; try again)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import OperationalError
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.api.parsers import ERR_TOO_LARGE, PayloadTooLarge
from jobs.conf import app_setting
from jobs.services import ActionNotAllowed, VersionConflict
from jobs.states import IllegalTransition
from jobs.validation import JobValidationError

logger = logging.getLogger(__name__)


def _path(context: dict[str, Any]) -> str:
    request = context.get("request")
    return f"{request.method} {request.path}" if request is not None else "?"


ERR_DATABASE_UNAVAILABLE = "The database is unavailable or busy; try again in a moment."


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, OperationalError):
        # Unreachable, or a conflict that outlasted the services' own retries: nothing was
        # written (the transaction was rolled back), and the client may simply try again.
        logger.warning("database error answering %s: %s", _path(context), exc)
        return Response(
            {"detail": ERR_DATABASE_UNAVAILABLE, "code": "database_unavailable"},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, JobValidationError):
        exc = ValidationError(exc.errors)
    elif isinstance(exc, RequestDataTooBig):
        # Django refuses the body by its declared length before reading it (no memory spent).
        limit = app_setting("SCHEDULER_MAX_REQUEST_BYTES")
        exc = PayloadTooLarge(ERR_TOO_LARGE.format(limit=limit))
    elif isinstance(exc, ObjectDoesNotExist):
        exc = NotFound()
    elif isinstance(exc, VersionConflict):
        return Response(
            {"detail": str(exc), "code": "version_conflict", "current_version": exc.current},
            status=status.HTTP_409_CONFLICT,
        )
    elif isinstance(exc, ActionNotAllowed | IllegalTransition):
        return Response(
            {"detail": str(exc), "code": "not_allowed"}, status=status.HTTP_409_CONFLICT
        )
    return drf_exception_handler(exc, context)
