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

No span has a parent that is not exported: ``fire`` (the leader's) and ``claim`` (the node's) are
roots of the trace, and the node's ``start``, ``run`` and ``finish`` are children of its ``claim``,
whose span id is derived from the execution id and its claim time (``claim_span_id``), so it is
known again wherever the run's claim time is (a claim handed back and made again is a new claim
span). A retry's ``claim`` links to its first attempt's ``claim`` (another trace) and names it in
attributes (``scheduler.first_attempt.execution_id`` and ``.trace_id``).

Off unless ``OTEL_TRACES_EXPORTER`` is ``otlp`` (configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables) or ``console``; ``OTEL_SERVICE_NAME`` names the process (default: the node id). Off,
every call here returns at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

_tracer: Any = None
_provider: Any = None
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Chosen(threading.local):
    """The trace id and span id the next span started in this thread is to have (None: random)."""

    trace_id: int | None = None
    span_id: int | None = None


_chosen = _Chosen()


def _id_generator() -> Any:
    """The SDK's random ids, except where a span's are chosen (derived from its execution)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ChosenIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            chosen = _chosen.trace_id
            return chosen if chosen is not None else super().generate_trace_id()

        def generate_span_id(self) -> int:
            chosen = _chosen.span_id
            return chosen if chosen is not None else super().generate_span_id()

    return ChosenIds()


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
    provider = TracerProvider(resource=resource, id_generator=_id_generator())
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


def claim_span_id(execution_id: int, claimed_at: datetime) -> int:
    """The span id of the claim of ``execution_id`` made at ``claimed_at`` (as stored)."""
    micros = (claimed_at - EPOCH) // timedelta(microseconds=1)
    digest = hashlib.sha256(f"scheduler-claim:{execution_id}:{micros}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _context_of(trace_id: int, span_id: int) -> Any:
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


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
    parent_span_id: int | None = None,
    span_id: int | None = None,
    links: Iterable[tuple[int, int, dict[str, Any]]] = (),
) -> None:
    """Record one finished span of an execution's trace: a root of it, or the child of the span
    ``parent_span_id`` of that trace (one this process exported); ``span_id`` chosen or random;
    ``links`` to other spans as (trace id, span id, attributes)."""
    tracer = _tracer
    if tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, NonRecordingSpan, Status, StatusCode

    trace_id = trace_id_of(execution_id)
    context = Context()  # a root: no parent, whatever this thread's current span
    if parent_span_id is not None:
        parent = NonRecordingSpan(_context_of(trace_id, parent_span_id))
        context = trace.set_span_in_context(parent, Context())
    _chosen.trace_id, _chosen.span_id = trace_id, span_id
    try:
        recorded = tracer.start_span(
            name,
            context=context,
            start_time=_ns(start),
            attributes={"scheduler.execution_id": execution_id, **(attributes or {})},
            links=[Link(_context_of(t, s), attrs) for t, s, attrs in links],
        )
    finally:
        _chosen.trace_id = _chosen.span_id = None
    if error:
        recorded.set_status(Status(StatusCode.ERROR, error[:200]))
    recorded.end(end_time=max(_ns(end), _ns(start)))


def node_parent(execution: Any) -> int | None:
    """The span id of the claim under which a node records a run's later spans (None: unclaimed)."""
    claimed_at = getattr(execution, "claimed_at", None)
    return None if claimed_at is None else claim_span_id(execution.pk, claimed_at)


def _first_attempts(executions: Iterable[Any]) -> dict[int, tuple[int, datetime | None]]:
    """For each retry among ``executions`` (attempt > 1): its first attempt's id and claim time
    (one query for all of them)."""
    from django.db.models import Q

    from jobs.models import JobExecution

    retries = [e for e in executions if (e.attempt or 1) > 1]
    if not retries:
        return {}
    match = Q()
    for e in retries:
        match |= Q(job_id=e.job_id, scheduled_for=e.scheduled_for)
    firsts = {
        (job_id, slot): (pk, claimed_at)
        for pk, job_id, slot, claimed_at in JobExecution.objects.filter(match, attempt=1)
        .order_by()
        .values_list("pk", "job_id", "scheduled_for", "claimed_at")
    }
    return {
        e.pk: firsts[(e.job_id, e.scheduled_for)]
        for e in retries
        if (e.job_id, e.scheduled_for) in firsts
    }


def claims(executions: list[Any], *, start: datetime, end: datetime, node: str) -> None:
    """A node claimed these runs (their ``claimed_at`` set) between ``start`` and ``end``. Each
    claim is a root of its run's trace, the parent of the node's later spans of the run; a
    retry's links to its first attempt's claim."""
    if _tracer is None:
        return
    firsts = _first_attempts(executions)
    for execution in executions:
        attributes: dict[str, Any] = {
            "scheduler.node": node,
            "scheduler.batch": len(executions),
            "scheduler.attempt": execution.attempt,
        }
        links = []
        if execution.pk in firsts:
            first_id, first_claimed_at = firsts[execution.pk]
            attributes["scheduler.first_attempt.execution_id"] = first_id
            attributes["scheduler.first_attempt.trace_id"] = format(trace_id_of(first_id), "032x")
            if first_claimed_at is not None:  # never claimed (cancelled while pending): no span
                links.append(
                    (
                        trace_id_of(first_id),
                        claim_span_id(first_id, first_claimed_at),
                        {"scheduler.link": "first_attempt"},
                    )
                )
        span(
            "claim",
            execution.pk,
            start=start,
            end=end,
            attributes=attributes,
            span_id=node_parent(execution),
            links=links,
        )


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
