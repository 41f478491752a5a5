"""The OpenAPI schema's view of errors: every operation declares each status it can answer.

Which statuses an operation can return follows from what it is, so they are added here once rather
than on every view: any call can be refused for its credentials (401), its role (403), its rate
(429) or an unreachable database (503); a call with query parameters or a body can be malformed
(400); a path with an id or a page number can miss (404); a write can conflict with the stored
state (409); a body can be too large (413) or of another media type (415).
"""

from __future__ import annotations

import inspect
from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

ERROR_DESCRIPTIONS = {
    400: "Bad input: the reasons, keyed by field (or `detail`).",
    401: "No or invalid credentials.",
    403: "The role does not allow this.",
    404: "No such object (or page).",
    409: "Conflicts with the stored state (version moved, name taken, action not allowed now).",
    413: "Request body larger than SCHEDULER_MAX_REQUEST_BYTES.",
    415: "Request body not JSON.",
    429: "Rate limit reached; retry after the Retry-After header.",
    503: "Database unavailable or busy; nothing was written, retry.",
}
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
BODY_METHODS = ("POST", "PUT", "PATCH")


class ErrorSerializer(serializers.Serializer):
    """An error that is not about fields."""

    detail = serializers.CharField()
    code = serializers.CharField(required=False)
    current_version = serializers.IntegerField(
        required=False, help_text="On a version conflict: the stored version."
    )


FIELD_ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Reasons keyed by field (`<index>.<field>` in a batch), or `detail`.",
    "additionalProperties": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
    },
}


class SchedulerAutoSchema(AutoSchema):
    """drf-spectacular's schema plus the error statuses above, and request bodies given as raw
    JSON Schema (the job definition's, from ``jobs.definition``) marked required."""

    def _get_request_for_media_type(self, serializer: Any, direction: str = "request") -> Any:
        # A function builds a raw JSON Schema when the schema is generated, so it lists the tasks
        # registered by then (a view's decorator runs at import). Such a body is required.
        if inspect.isfunction(serializer):
            return serializer(), True
        return super()._get_request_for_media_type(serializer, direction)

    def _has_body(self) -> bool:
        return self.method in BODY_METHODS and self.get_request_serializer() is not None

    def _error_codes(self) -> list[int]:
        codes = [401, 403, 429, 503]
        has_query = any(p.get("in") == "query" for p in self._get_parameters())
        if has_query or self._has_body():
            codes.append(400)
        if "{" in self.path or self._is_list_view():
            codes.append(404)
        if self.method in WRITE_METHODS:
            codes.append(409)
        if self._has_body():
            codes += [413, 415]
        return sorted(codes)

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._error_codes():
            if str(code) in responses:
                continue
            if code == 400:
                body = {"application/json": {"schema": FIELD_ERRORS_SCHEMA}}
                responses["400"] = {"content": body, "description": ERROR_DESCRIPTIONS[400]}
            else:
                response = self._get_response_for_code(ErrorSerializer, str(code))
                response["description"] = ERROR_DESCRIPTIONS[code]
                responses[str(code)] = response
        return responses


# Text in a query string may not hold NUL (U+0000): the filters refuse it (400), so say so.
NO_NUL_PATTERN = "^[^\\u0000]*$"


def text_parameters_without_nul(result: dict, generator: Any, request: Any, public: bool) -> dict:
    """A postprocessing hook: every free-text query parameter gets the pattern above."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                free_text = not {"enum", "format", "pattern"} & set(schema)
                if parameter.get("in") == "query" and schema.get("type") == "string" and free_text:
                    schema["pattern"] = NO_NUL_PATTERN
    return result
