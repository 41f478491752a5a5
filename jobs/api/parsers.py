"""A JSON parser that refuses bodies over SCHEDULER_MAX_REQUEST_BYTES (413), non-standard JSON and
JSON nested deeper than a job's arguments may be plus the few levels around them (400)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from jobs.conf import app_setting
from jobs.validation import nested_deeper_than

ERR_TOO_LARGE = "Request body is larger than {limit} bytes."
ERR_TOO_DEEP = (
    "JSON parse error - nested deeper than {limit} levels (lists and objects in each other)."
)
# Levels a body may nest around a job's or a run's arguments: a batch of jobs or the enqueue API's
# {"runs": [{"kwargs": ...}]} is 3 (those are then refused by field, naming it, past their limit).
BODY_DEPTH_AROUND_ARGS = 4


def max_body_depth() -> int:
    return app_setting("SCHEDULER_MAX_ARGS_DEPTH") + BODY_DEPTH_AROUND_ARGS


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = app_setting("SCHEDULER_MAX_REQUEST_BYTES")
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(ERR_TOO_LARGE.format(limit=limit))
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(ERR_TOO_LARGE.format(limit=limit))
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(raw.decode(encoding), parse_constant=_reject_constant)
        except RecursionError as exc:
            raise ParseError(ERR_TOO_DEEP.format(limit=max_body_depth())) from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        # Hundreds of levels parse, then overflow the stack of whatever walks them (a 500).
        if nested_deeper_than(data, max_body_depth()):
            raise ParseError(ERR_TOO_DEEP.format(limit=max_body_depth()))
        return data
