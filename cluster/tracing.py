"""OpenTelemetry traces of an execution's life, across the processes that handle it:

    fire     the leader creates the run's row (a scheduled fire)
    claim    a node claims it (the claim transaction)
    start    from its claim to its body's start (admission, locks, the wait for its instant)
    run      the body
    finish   from the body's end to its outcome committed

Every span of one execution belongs to one trace whose id is derived from the execution id: the
leader and the node that runs it (another process, another host) need no context passed between
them, and a trace can be looked up from an execution id alone (``trace_id_of``). Spans are recorded
when their end is known, with the times they really began and ended.

Off unless ``OTEL_TRACES_EXPORTER`` is ``otlp`` (configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables) or ``console``; ``OTEL_SERVICE_NAME`` names the process (default: the node id). Off,
every call here returns at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

_tracer: Any = None
_provider: Any = None


def configure(service: str, *, exporter: Any = None, batch: bool = True) -> bool:
    """Start tracing in this process if ``OTEL_TRACES_EXPORTER`` asks for it (or ``exporter`` is
    given: tests). Returns whether tracing is on."""
    global _tracer, _provider
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter is None and choice in ("", "none"):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        if choice == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        elif choice == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            raise ImproperlyConfigured(
                f"OTEL_TRACES_EXPORTER must be otlp, console or none, got {choice!r}"
            )
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    )
    _provider = provider
    _tracer = provider.get_tracer("scheduler")
    logger.info("tracing on (%s)", type(exporter).__name__)
    return True


def shutdown() -> None:
    """Flush what is buffered and stop (a node's exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


def trace_id_of(execution_id: int) -> int:
    return int.from_bytes(_digest(execution_id)[:16], "big")


def _digest(execution_id: int) -> bytes:
    return hashlib.sha256(f"scheduler-execution:{execution_id}".encode()).digest()


def _parent(execution_id: int) -> Any:
    """The execution's trace, as a remote parent every process derives the same way."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    digest = _digest(execution_id)
    context = SpanContext(
        trace_id=int.from_bytes(digest[:16], "big"),
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(context))


def _ns(moment: float | datetime) -> int:
    seconds = moment.timestamp() if isinstance(moment, datetime) else moment
    return int(seconds * 1e9)


def span(
    name: str,
    execution_id: int,
    *,
    start: float | datetime,
    end: float | datetime,
    attributes: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    """Record one finished span of an execution's trace."""
    tracer = _tracer
    if tracer is None:
        return
    from opentelemetry.trace import Status, StatusCode

    recorded = tracer.start_span(
        name,
        context=_parent(execution_id),
        start_time=_ns(start),
        attributes={"scheduler.execution_id": execution_id, **(attributes or {})},
    )
    if error:
        recorded.set_status(Status(StatusCode.ERROR, error[:200]))
    recorded.end(end_time=max(_ns(end), _ns(start)))


def fires(created: Iterable[tuple[int, str, datetime]], *, at: datetime, term: int) -> None:
    """The leader created these runs (execution id, job name, slot) at ``at``."""
    if _tracer is None:
        return
    for execution_id, job, slot in created:
        span(
            "fire",
            execution_id,
            start=at,
            end=at,
            attributes={
                "scheduler.job": job,
                "scheduler.slot": slot.isoformat(),
                "scheduler.term": term,
            },
        )
