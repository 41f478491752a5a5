"""Log lines that carry their context: node, term, job and execution ids.

A caller may pass them (``logger.info(..., extra={"execution": pk})``); otherwise ``ContextFilter``
(on the console handler) fills in what the process and the thread are known to be working for:
the node a ``runnode`` process runs and its current term while it leads (``set_process_context``),
and the execution a task thread is running (``execution_context``), so a line a task body or
the executor logs while running a job carries them without every call site passing them. JSON
puts them in keys; the text format appends them as ``[node=n1 term=3 execution=42]``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

# Attributes a caller may attach with ``logger.info(..., extra={...})`` that end up as JSON keys.
CONTEXT_FIELDS = ("node", "term", "execution", "job", "claim_token", "event")
# What ContextFilter fills in, in the order the text format shows them.
FILLED_FIELDS = ("node", "term", "job", "execution")

_process: dict[str, Any] = {}
_process_lock = threading.Lock()
_thread = threading.local()


def set_process_context(**fields: Any) -> None:
    """Context every line of this process carries (``node=``, ``term=``; None removes a field)."""
    with _process_lock:
        for name, value in fields.items():
            if value is None:
                _process.pop(name, None)
            else:
                _process[name] = value


def process_context() -> dict[str, Any]:
    with _process_lock:
        return dict(_process)


@contextlib.contextmanager
def execution_context(*, execution: int, job: int | None = None) -> Iterator[None]:
    """Lines logged by this thread meanwhile carry the execution (and job) id."""
    previous = getattr(_thread, "fields", None)
    _thread.fields = {"execution": execution, "job": job}
    try:
        yield
    finally:
        _thread.fields = previous


class ContextFilter(logging.Filter):
    """Fills in the context fields a record lacks; sets ``record.context`` for the text format."""

    def filter(self, record: logging.LogRecord) -> bool:
        filled = {**process_context(), **(getattr(_thread, "fields", None) or {})}
        for name, value in filled.items():
            if value is not None and getattr(record, name, None) is None:
                setattr(record, name, value)
        shown = [
            f"{name}={getattr(record, name)}"
            for name in FILLED_FIELDS
            if getattr(record, name, None) is not None
        ]
        record.context = f" [{' '.join(shown)}]" if shown else ""
        return True


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


class OneLineCacheErrors(logging.Filter):
    """django-redis logs every cache error it ignores (Redis down: each API call's throttle check)
    with a full traceback. One line each says as much: the cause, and that the call went on
    without the cache."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            cause = record.exc_info[1]
            record.msg = "cache unavailable, going on without it: %s: %s"
            record.args = (type(cause).__name__, cause)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = None
            record.exc_text = None
        return True
