"""Run history retention (jobs.retention): what goes, what stays, batches, the service's audit,
the ``jobs purge-runs`` command and the ``purge_runs`` task. Real rows in the test database."""

from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from jobs import retention, services
from jobs.models import (
    AuditEvent,
    Job,
    JobExecution,
    Notification,
    NotificationRule,
    NotificationStatus,
)
from jobs.registry import TaskArgumentError, TaskContext, validate_task_call
from jobs.states import ExecutionStatus as S
from jobs.tasks import purge_runs

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)
OLD = NOW - timedelta(days=40)  # before a 30-day cutoff
RECENT = NOW - timedelta(days=5)


def make_job(name: str) -> Job:
    return Job.objects.create(
        name=name, task="noop", schedule_type="interval", interval_seconds=60, enabled=False
    )


def run(job: Job, slot: datetime, status: str = S.SUCCEEDED, finished: bool = True) -> int:
    execution = JobExecution.objects.create(
        job=job,
        scheduled_for=slot,
        run_after=slot,
        status=status,
        finished_at=slot + timedelta(seconds=1) if finished else None,
    )
    return execution.pk


def left() -> set[int]:
    return set(JobExecution.objects.values_list("pk", flat=True))


def purge(**options: object) -> retention.PurgeResult:
    return retention.purge_finished_runs(older_than=timedelta(days=30), now=NOW, **options)


def test_only_terminal_runs_finished_before_the_cutoff_go_and_each_jobs_newest_stays():
    job = make_job("hourly")
    gone = [
        run(job, OLD + timedelta(minutes=i), status)
        for i, status in enumerate(
            [S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.LOST, S.SKIPPED]
        )
    ]
    # Active states stay however old; so does a run finished after the cutoff.
    active = [
        run(job, OLD + timedelta(hours=1, minutes=i), status, finished=False)
        for i, status in enumerate([S.PENDING, S.RUNNING, S.RETRY_SCHEDULED])
    ]
    recent = run(job, RECENT)
    # A job whose only runs are old keeps its newest (its last outcome stays visible).
    quiet = make_job("yearly")
    quiet_old = run(quiet, OLD - timedelta(days=1), S.FAILED)
    quiet_newest = run(quiet, OLD)

    result = purge()

    assert result.deleted == len(gone) + 1
    assert result.complete
    assert left() == {*active, recent, quiet_newest}
    assert quiet_old not in left()


def test_batches_go_on_past_kept_rows_and_max_rows_bounds_a_call():
    job = make_job("busy")
    # The kept rows come first in finished_at order: a job's newest and a run with a
    # notification still to send.
    lonely = make_job("lonely")
    kept_newest = run(lonely, OLD - timedelta(days=2))
    waiting = run(job, OLD - timedelta(days=1), S.FAILED)
    rule = NotificationRule.objects.create(name="r", events=["failed"], channel="webhook")
    Notification.objects.create(
        rule=rule, execution_id=waiting, event="failed", next_attempt_at=NOW
    )
    old = [run(job, OLD + timedelta(minutes=i)) for i in range(7)]
    run(job, RECENT)  # the job's newest

    first = purge(batch=2, max_rows=4)
    assert (first.deleted, first.complete) == (4, False)
    second = purge(batch=2, max_rows=4)
    assert (second.deleted, second.complete) == (3, True)
    assert not set(old) & left()
    assert {kept_newest, waiting} <= left()
    # Once its notification is sent, the run may go (and the notification with it).
    Notification.objects.update(status=NotificationStatus.SENT)
    assert purge(batch=1).deleted == 1
    assert waiting not in left() and not Notification.objects.exists()


def test_a_dry_run_counts_what_a_purge_deletes_and_deletes_nothing():
    job = make_job("job")
    for i in range(5):
        run(job, OLD + timedelta(minutes=i))
    run(job, RECENT)
    before = left()
    assert purge(dry_run=True, batch=2).deleted == 5
    assert left() == before
    assert purge(batch=2).deleted == 5


def test_the_service_records_the_purge_in_the_audit_log_and_refuses_bad_arguments():
    job = make_job("job")
    run(job, OLD)
    run(job, RECENT)
    result = services.runs_purge(older_than_days=30, now=NOW, by=services.SYSTEM)
    assert result.deleted == 1
    event = AuditEvent.objects.get(action="runs.purge")
    assert event.changes == {"deleted": [None, 1], "older_than_days": [None, 30]}
    # Nothing to delete: nothing audited.
    services.runs_purge(older_than_days=30, now=NOW, by=services.SYSTEM)
    assert AuditEvent.objects.filter(action="runs.purge").count() == 1

    run(job, OLD - timedelta(hours=1))
    for bad, param in [
        ({"older_than_days": 0}, "older_than_days"),
        ({"older_than_days": -1}, "older_than_days"),
        ({"older_than_days": float("nan")}, "older_than_days"),
        ({"older_than_days": "30"}, "older_than_days"),
        ({"older_than_days": True}, "older_than_days"),
        ({"older_than_days": 30, "batch": 0}, "batch"),
        ({"older_than_days": 30, "batch": retention.MAX_BATCH + 1}, "batch"),
        ({"older_than_days": 30, "max_rows": 0}, "max_rows"),
    ]:
        with pytest.raises(retention.BadPurgeArgument) as excinfo:
            services.runs_purge(by=services.SYSTEM, now=NOW, **bad)
        assert excinfo.value.param == param
        assert str(excinfo.value).startswith(param)
    assert JobExecution.objects.count() == 2


def test_the_command_purges_reports_and_exits_2_on_bad_input():
    job = make_job("job")
    for i in range(3):
        run(job, timezone.now() - timedelta(days=40, minutes=i))
    run(job, timezone.now())
    out = StringIO()
    call_command("jobs", "purge-runs", "--older-than-days", "30", "--dry-run", stdout=out)
    assert out.getvalue().startswith("would delete 3 runs finished before ")
    assert JobExecution.objects.count() == 4
    out = StringIO()
    call_command("jobs", "purge-runs", "--older-than-days", "30", "--max-rows", "2", stdout=out)
    assert "deleted 2 runs" in out.getvalue() and "more remain" in out.getvalue()
    out = StringIO()
    call_command("jobs", "purge-runs", "--older-than-days", "30", stdout=out)
    assert out.getvalue().startswith("deleted 1 runs")
    assert AuditEvent.objects.filter(action="runs.purge", source="cli").count() == 2

    with pytest.raises(CommandError) as excinfo:
        call_command("jobs", "purge-runs", "--older-than-days", "0")
    assert excinfo.value.returncode == 2
    assert "older_than_days must be a number of days greater than 0" in str(excinfo.value)


def test_the_task_is_checked_when_a_job_is_defined_and_purges_when_it_runs():
    validate_task_call("purge_runs", [], {"older_than_days": 30})
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call("purge_runs", [], {"older_than_days": 0})
    assert excinfo.value.field == "kwargs"
    assert "older_than_days" in excinfo.value.message
    with pytest.raises(TaskArgumentError):
        validate_task_call("purge_runs", [], {"older_than_days": 30, "batch": "many"})

    job = make_job("job")
    run(job, timezone.now() - timedelta(days=2))
    run(job, timezone.now())
    context = TaskContext(execution_id=1, job_name="purge", attempt=1, scheduled_for=None)
    result = purge_runs(older_than_days=1, context=context)
    assert result["deleted"] == 1 and result["complete"] is True
    assert "deleted 1 runs finished before" in context.output
    assert JobExecution.objects.count() == 1


def test_the_tasks_defaults_are_the_services():
    import inspect

    defaults = inspect.signature(purge_runs).parameters
    assert defaults["batch"].default == retention.PURGE_BATCH
    assert defaults["max_rows"].default == retention.PURGE_MAX_ROWS
