"""One execution's trace (OpenTelemetry, in-memory exporter): the leader's fire and the node's claim,
start, run and finish spans share a trace id derived from the execution id, each with the real times
it began and ended, in order; off (the default), nothing is recorded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cluster import tracing
from cluster.executor import Executor
from cluster.scheduler import scheduler_tick
from jobs.models import JobExecution
from jobs.services import SYSTEM, job_create
from tests.cluster.harness import running_executor, wait_for, wait_until_ended

pytestmark = pytest.mark.django_db(transaction=True)
NODE = "traced-node"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    assert tracing.configure("test", exporter=memory, batch=False)
    yield memory
    tracing.shutdown()


@pytest.fixture
def executor() -> Iterator[Executor]:
    with running_executor(NODE, capacity=2) as runner:
        yield runner


def fire_and_run(executor: Executor) -> JobExecution:
    now = timezone.now()
    job = job_create(
        data={
            "name": "traced",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=SYSTEM,
        now=now - timedelta(minutes=2),
    )
    result = scheduler_tick(term=5, now=now)
    assert result.fired == 1
    execution = JobExecution.objects.get(job=job, status="pending")
    assert executor.claim_once() == 1
    return wait_until_ended(execution.pk)


def test_one_execution_is_one_trace_of_fire_claim_start_run_finish(exporter, executor):
    execution = fire_and_run(executor)
    assert execution.status == "succeeded"
    spans = wait_for(
        lambda: (lambda got: got if {s.name for s in got} >= {"finish"} else None)(
            exporter.get_finished_spans()
        ),
        10,
    )
    mine = {s.name: s for s in spans if s.attributes["scheduler.execution_id"] == execution.pk}
    assert set(mine) == {"fire", "claim", "start", "run", "finish"}, [s.name for s in spans]
    trace_id = tracing.trace_id_of(execution.pk)
    assert {s.context.trace_id for s in mine.values()} == {trace_id}
    fire, claim, start, run, finish = (
        mine[name] for name in ("fire", "claim", "start", "run", "finish")
    )
    # One after the other, each with its own times.
    assert fire.start_time <= claim.start_time <= claim.end_time
    assert claim.start_time <= start.start_time <= start.end_time == run.start_time
    assert run.start_time <= run.end_time <= finish.end_time
    assert fire.attributes["scheduler.job"] == "traced" and fire.attributes["scheduler.term"] == 5
    assert claim.attributes["scheduler.node"] == NODE
    assert run.attributes["scheduler.outcome"] == "succeeded"
    assert finish.attributes["scheduler.written"] is True


def test_tracing_is_off_by_default(executor, monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    tracing.shutdown()
    assert tracing.configure("test") is False
    assert not tracing.enabled()
    assert fire_and_run(executor).status == "succeeded"  # and nothing fails without it
