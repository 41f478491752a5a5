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
from jobs import executions
from jobs.models import JobExecution
from jobs.services import SYSTEM, job_create, job_trigger
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


def _spans_of(exporter: InMemorySpanExporter, execution_id: int, names: set[str]) -> dict:
    def got() -> dict | None:
        mine = {
            s.name: s
            for s in exporter.get_finished_spans()
            if s.attributes["scheduler.execution_id"] == execution_id
        }
        return mine if set(mine) >= names else None

    return wait_for(got, 10)


def test_no_span_refers_to_a_parent_that_is_not_exported(exporter, executor):
    """The fire and the claim are roots of the execution's trace; the node's start, run and finish
    are children of its claim (a span it exported). A parent was a span id derived from the
    execution id that no process ever exported."""
    execution = fire_and_run(executor)
    mine = _spans_of(exporter, execution.pk, {"fire", "claim", "start", "run", "finish"})
    exported = {(s.context.trace_id, s.context.span_id) for s in exporter.get_finished_spans()}
    for s in exporter.get_finished_spans():
        if s.parent is not None:
            assert (s.parent.trace_id, s.parent.span_id) in exported, s.name
    assert mine["fire"].parent is None and mine["claim"].parent is None
    for name in ("start", "run", "finish"):
        assert mine[name].parent.span_id == mine["claim"].context.span_id, name
    assert len({s.context.span_id for s in mine.values()}) == len(mine)


def test_a_retrys_claim_links_to_its_first_attempt(exporter, executor):
    job = job_create(
        data={
            "name": "traced-retry",
            "task": "demo_fail",
            "schedule_type": "interval",
            "interval_seconds": 3600,
            "max_retries": 2,
            "retry_backoff_base": 0.1,
            "retry_jitter": False,
        },
        by=SYSTEM,
    )
    ids = []
    for attempt in (1, 2, 3):
        if attempt == 1:
            run = job_trigger(job_id=job.pk, by=SYSTEM)
        else:
            run = JobExecution.objects.get(job=job, attempt=attempt)
            executions.promote_due_retries(horizon=timezone.now() + timedelta(seconds=5))
        assert executor.claim_once() == 1
        assert wait_until_ended(run.pk).status == "failed"
        ids.append(run.pk)
    first, second, third = (_spans_of(exporter, pk, {"claim", "run"}) for pk in ids)
    assert not first["claim"].links
    assert first["claim"].attributes["scheduler.attempt"] == 1
    for retry, attempt in ((second, 2), (third, 3)):
        claim = retry["claim"]
        assert claim.context.trace_id == tracing.trace_id_of(ids[attempt - 1])
        assert claim.attributes["scheduler.attempt"] == attempt
        assert claim.attributes["scheduler.first_attempt.execution_id"] == ids[0]
        assert claim.attributes["scheduler.first_attempt.trace_id"] == format(
            tracing.trace_id_of(ids[0]), "032x"
        )
        (link,) = claim.links
        # To the first attempt's claim: a span that was exported.
        assert (link.context.trace_id, link.context.span_id) == (
            first["claim"].context.trace_id,
            first["claim"].context.span_id,
        )
