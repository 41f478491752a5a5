"""A running run's output streams: the node saves it as it grows (the first line at once, then about
once a second), fenced by the run's claim, with the secrets the run was given scrubbed; a process
run's child reports its output the same way. And the demo tasks that show it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.executor import Executor
from cluster.executor.finisher import OUTPUT_STREAM_S
from jobs import executions, services
from jobs.models import Isolation, Job, JobExecution, Trigger
from jobs.registry import TaskContext, task
from jobs.services import SYSTEM, job_create
from jobs.states import TERMINAL_STATES, ExecutionStatus
from tests.cluster.harness import running_executor, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus
WAIT_S = 10.0
# What a viewer may wait for a line written by a running task (the bound).
FIRST_LINE_WITHIN_S = 2.0
SECRET_VALUE = "streamed-s3cr3t-value"

release = threading.Event()


@task("test.print_then_wait", takes_context=True)
def print_then_wait(secret: str = "", *, context: TaskContext) -> str:
    """Print a line (and the secret it was given), then wait for the test to release it."""
    print(f"first line {secret}".strip())
    context.log("second line")
    release.wait(WAIT_S)
    print("last line")
    return "done"


@pytest.fixture
def executor() -> Iterator[Executor]:
    release.clear()
    with running_executor("stream-node", capacity=4) as runner:
        yield runner
    release.set()


def make_job(name: str, task_name: str, **fields: object) -> Job:
    data = {"name": name, "task": task_name, "schedule_type": "interval", "interval_seconds": 3600}
    return job_create(data={**data, **fields}, by=SYSTEM)


def submit(job: Job) -> JobExecution:
    now = timezone.now()
    return JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, trigger=Trigger.MANUAL, queue=job.queue
    )


def output_while_running(execution: JobExecution, text: str, within: float) -> JobExecution:
    """The row once its saved output holds ``text`` while it is still running."""

    def seen() -> JobExecution | None:
        row = JobExecution.objects.get(pk=execution.pk)
        assert row.status not in TERMINAL_STATES, (row.status, row.output)
        return row if text in row.output else None

    return wait_for(seen, within, interval=0.02)


def test_a_threads_output_is_saved_while_it_runs(executor) -> None:
    execution = submit(make_job("streams", "test.print_then_wait"))
    assert executor.claim_once() == 1
    wait_for(lambda: JobExecution.objects.get(pk=execution.pk).status == S.RUNNING, WAIT_S)
    started = time.monotonic()
    row = output_while_running(execution, "second line", FIRST_LINE_WITHIN_S)
    assert time.monotonic() - started < FIRST_LINE_WITHIN_S
    assert row.output == "first line\nsecond line\n"
    assert "last line" not in row.output
    release.set()
    done = wait_for(
        lambda: (r := JobExecution.objects.get(pk=execution.pk)).status in TERMINAL_STATES and r,
        WAIT_S,
    )
    assert done.status == S.SUCCEEDED
    assert done.output == "first line\nsecond line\nlast line\n"


def test_streamed_output_carries_no_secret_the_run_was_given(executor, monkeypatch) -> None:
    monkeypatch.setenv("SCHEDULER_SECRET_STREAM_TOKEN", SECRET_VALUE)
    job = make_job(
        "streams-secret", "test.print_then_wait", kwargs={"secret": {"$secret": "STREAM_TOKEN"}}
    )
    execution = submit(job)
    assert executor.claim_once() == 1
    row = output_while_running(execution, "second line", WAIT_S)
    assert SECRET_VALUE not in row.output
    assert "first line [secret]" in row.output


def test_a_save_is_fenced_by_the_claim(executor) -> None:
    execution = submit(make_job("fenced", "test.print_then_wait"))
    assert executor.claim_once() == 1
    running = wait_for(
        lambda: (r := JobExecution.objects.get(pk=execution.pk)).status == S.RUNNING and r, WAIT_S
    )
    stale = JobExecution.objects.get(pk=execution.pk)
    stale.claim_token = "someone-else"
    assert not executions.save_output_so_far(stale, "stale words", now=timezone.now())
    assert executions.save_output_so_far(running, "the claim's words", now=timezone.now())
    release.set()
    done = wait_for(
        lambda: (r := JobExecution.objects.get(pk=execution.pk)).status in TERMINAL_STATES and r,
        WAIT_S,
    )
    # Once ended, nothing more is saved over the final output.
    assert not executions.save_output_so_far(done, "too late", now=timezone.now())
    assert "stale" not in done.output and "too late" not in done.output


def test_a_process_runs_output_streams_from_its_child(executor) -> None:
    job = make_job(
        "ticker-process",
        "demo_ticker",
        kwargs={"seconds": 6, "interval": 0.5},
        isolation=Isolation.PROCESS,
    )
    execution = submit(job)
    assert executor.claim_once() == 1
    wait_for(lambda: JobExecution.objects.get(pk=execution.pk).status == S.RUNNING, WAIT_S)
    # The child starts a fresh interpreter (about a second here), then reports once a second.
    row = output_while_running(execution, "tick 2", WAIT_S)
    assert row.output.startswith("tick 1 at ")
    services.execution_cancel(execution_id=execution.pk, by=SYSTEM)


def test_a_run_that_writes_nothing_is_never_saved_early(executor, monkeypatch) -> None:
    saved: list[int] = []
    monkeypatch.setattr(
        executions, "save_output_so_far", lambda execution, *a, **k: saved.append(execution.pk)
    )
    execution = submit(make_job("quiet", "sleep", kwargs={"seconds": 2 * OUTPUT_STREAM_S}))
    assert executor.claim_once() == 1
    wait_for(
        lambda: JobExecution.objects.get(pk=execution.pk).status in TERMINAL_STATES,
        WAIT_S,
    )
    assert saved == []


# --- the demo tasks ----------------------------------------------------------------------------


def test_the_demo_tasks_show_success_failure_and_streaming(executor) -> None:
    ticker = submit(make_job("demo-ticker", "demo_ticker", kwargs={"seconds": 1, "interval": 0.2}))
    fail = submit(make_job("demo-fail", "demo_fail", kwargs={"message": "no luck"}))
    report = submit(make_job("demo-report", "demo_report"))
    assert executor.claim_once() == 3

    def ended(execution: JobExecution) -> JobExecution:
        return wait_for(
            lambda: (
                (r := JobExecution.objects.get(pk=execution.pk)).status in TERMINAL_STATES and r
            ),
            WAIT_S,
        )

    done = ended(ticker)
    assert done.status == S.SUCCEEDED
    assert done.result["lines"] >= 4 and done.output.count("tick ") == done.result["lines"]
    failed = ended(fail)
    assert (failed.status, failed.error) == (S.FAILED, "RuntimeError: no luck")
    assert failed.output == "attempt 1: about to fail\n"
    reported = ended(report)
    assert reported.result == {"job": "demo-report", "attempt": 1, "rows": 3, "ok": True}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"seconds": -1}, "kwargs"), ({"interval": 0}, "kwargs"), ({"seconds": "ten"}, "kwargs")],
)
def test_the_ticker_refuses_bad_arguments_when_defined(kwargs, field) -> None:
    with pytest.raises(services.JobValidationError) as refused:
        make_job("bad-ticker", "demo_ticker", kwargs=kwargs)
    assert field in refused.value.errors


@pytest.mark.parametrize(
    ("env", "expected"), [({}, "False"), ({"SCHEDULER_DEMO_TASKS": "1"}, "True")]
)
def test_the_demo_tasks_are_off_under_production_settings_unless_asked(env, expected) -> None:
    script = "from jobs import registry; print(registry.is_registered('demo_ticker'))"
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings_production",
        "DJANGO_SECRET_KEY": "k" * 40 + "abcdefghij",
        "DJANGO_ALLOWED_HOSTS": "scheduler.example.com",
        **env,
    }
    environment.pop("SCHEDULER_DEMO_TASKS", None) if not env else None
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == expected


def test_due_in_the_future_is_not_streamed_before_it_starts(executor) -> None:
    job = make_job("later", "test.print_then_wait")
    due = timezone.now() + timedelta(seconds=0.6)
    execution = JobExecution.objects.create(
        job=job, scheduled_for=due, run_after=due, trigger=Trigger.MANUAL, queue=job.queue
    )
    assert executor.claim_once() == 1
    row = output_while_running(execution, "first line", WAIT_S)
    assert row.started_at is not None and row.started_at >= due - timedelta(milliseconds=5)
