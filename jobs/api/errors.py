"""Map domain exceptions to HTTP: validation 400 (per field), not found 404, conflicts 409."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.api.parsers import ERR_TOO_LARGE, PayloadTooLarge
from jobs.services import ActionNotAllowed, VersionConflict
from jobs.states import IllegalTransition
from jobs.validation import JobValidationError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, JobValidationError):
        exc = ValidationError(exc.errors)
    elif isinstance(exc, RequestDataTooBig):
        # Django refuses the body by its declared length before reading it (no memory spent).
        limit = settings.SCHEDULER_MAX_REQUEST_BYTES
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
