"""Structured JSON log lines carrying node, term and execution ids when the caller passes them."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

# Attributes a caller may attach with ``logger.info(..., extra={...})`` that end up as JSON keys.
CONTEXT_FIELDS = ("node", "term", "execution", "job", "claim_token", "event")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                payload[field] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)
