"""Enqueueing from application code (``jobs.enqueue``, a task's ``.enqueue``): the API's checks and
audit, inside the caller's transaction (a rollback leaves no run and wakes nobody; on MariaDB a
run is not claimable before its transaction commits), idempotency keys, and jobs declared in code
applied with ``jobs apply --from-code``."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.utils import timezone

import jobs
import tests.cluster.tasks  # noqa: F401 - registers the test.* tasks
from jobs import declarations, events, executions, registry, services
from jobs.client import NoJobForTask, Run, enqueue_task, job_for_task
from jobs.models import AuditEvent, AuditSource, Job, JobExecution, Trigger
from jobs.registry import task
from jobs.states import ExecutionStatus
from jobs.validation import (
    ERR_IDEMPOTENCY_KEY_FORMAT,
    ERR_IDEMPOTENCY_KEY_REPEATED,
    ERR_UNKNOWN_FIELD,
    JobValidationError,
)

S = ExecutionStatus


@task("test.pyapi.report")
def report(report_id: int, fmt: str = "pdf") -> dict:
    """A task application code enqueues."""
    return {"report_id": report_id, "fmt": fmt}


def make_job(name: str = "test.pyapi.report", **fields: object) -> Job:
    return services.job_create(
        data={
            "name": name,
            "task": "test.pyapi.report",
            "kwargs": {"report_id": 0},
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
            **fields,
        },
        by=services.SYSTEM,
    )


@pytest.fixture
def signals_sent():
    """The execution changes announced (what wakes the nodes), as they are sent."""
    sent: list[list[events.ExecutionChange]] = []

    def receiver(sender, changes, **_):
        sent.append(changes)

    events.executions_changed.connect(receiver, dispatch_uid="test-python-api")
    yield sent
    events.executions_changed.disconnect(dispatch_uid="test-python-api")


@pytest.mark.django_db
def test_a_tasks_enqueue_makes_a_run_with_exactly_its_arguments_audited_as_code():
    job = make_job(kwargs={"report_id": 0, "fmt": "csv"})
    run = report.enqueue(report_id=7)
    assert isinstance(run, Run) and run.newly_enqueued
    assert (run.job_id, run.job_name) == (job.pk, job.name)
    row = JobExecution.objects.get(pk=run.id)
    assert (row.trigger, row.status) == (Trigger.ENQUEUE, S.PENDING)
    # Exactly the call made, as Celery's delay: not the job's args beside the kwargs given.
    assert row.call_arguments() == ([], {"report_id": 7})
    assert run.status() == S.PENDING and run.execution().pk == run.id
    audit = AuditEvent.objects.get(action="job.enqueue")
    assert (audit.source, audit.object_id, audit.changes) == (
        AuditSource.CODE,
        str(job.pk),
        {"runs": [None, 1]},
    )


@pytest.mark.django_db
def test_enqueue_call_and_jobs_enqueue_take_a_job_a_due_instant_and_a_priority():
    make_job()
    other = make_job(name="weekly-report", priority=3, args=[0], kwargs={"fmt": "csv"})
    later = timezone.now() + timedelta(hours=1)
    run = report.enqueue_call(args=[], kwargs={"report_id": 2}, job="weekly-report", run_at=later)
    row = JobExecution.objects.get(pk=run.id)
    assert row.job_id == other.pk and row.run_after >= later and row.priority == 3
    by_name = jobs.enqueue("weekly-report", args=[3], priority=9)
    by_id = jobs.enqueue(other.pk, args=[4])
    rows = JobExecution.objects.in_bulk([by_name.id, by_id.id])
    assert rows[by_name.id].priority == 9
    # Absent from enqueue_call / jobs.enqueue: the job's own arguments.
    assert rows[by_id.id].call_arguments() == ([4], {"fmt": "csv"})


@pytest.mark.django_db
def test_bad_arguments_are_refused_by_field_with_nothing_written():
    make_job()
    with pytest.raises(JobValidationError) as refused:
        report.enqueue(fmt="pdf")  # report_id is required
    assert list(refused.value.errors) == ["kwargs"]
    with pytest.raises(JobValidationError) as refused:
        jobs.enqueue("test.pyapi.report", priority=10_000)
    assert list(refused.value.errors) == ["priority"]
    assert (
        not JobExecution.objects.exists()
        and not AuditEvent.objects.filter(action="job.enqueue").exists()
    )


@pytest.mark.django_db
def test_the_tasks_job_is_the_one_named_after_it_else_the_only_one_else_an_error():
    with pytest.raises(NoJobForTask, match=r"no job runs task 'test\.pyapi\.report'"):
        report.enqueue(report_id=1)
    only = make_job(name="reports")
    assert job_for_task("test.pyapi.report") == only
    make_job(name="reports-eu")
    with pytest.raises(NoJobForTask, match=r"2 jobs run task .*'reports', 'reports-eu'.*job="):
        report.enqueue(report_id=1)
    named = make_job()  # named after the task: chosen among several
    assert report.enqueue(report_id=1).job_id == named.pk
    noop_job = services.job_create(
        data={"name": "n", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=services.SYSTEM,
    )
    with pytest.raises(NoJobForTask, match="runs task 'noop'"):
        enqueue_task("test.pyapi.report", job=noop_job, kwargs={"report_id": 1})
    with pytest.raises(Job.DoesNotExist):
        jobs.enqueue("no-such-job")


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_run_and_its_wake_up_come_with_the_commit(signals_sent):
    make_job()
    with transaction.atomic():
        run = report.enqueue(report_id=1)
        assert JobExecution.objects.filter(pk=run.id).exists()  # this transaction sees it
        assert signals_sent == []  # nobody is woken for a run that may yet roll back
    assert [[change.execution_id for change in sent] for sent in signals_sent] == [[run.id]]


@pytest.mark.django_db(transaction=True)
def test_a_rollback_leaves_no_run_no_audit_row_and_wakes_nobody(signals_sent):
    make_job()

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        report.enqueue(report_id=1)
        raise Abandon
    assert not JobExecution.objects.exists()
    assert not AuditEvent.objects.filter(action="job.enqueue").exists()
    assert signals_sent == []


def _claimable(node: str) -> list[int]:
    now = timezone.now()
    claimed = executions.claim_batch(
        node_id=node, queues=["default"], limit=10, horizon=now + timedelta(seconds=5), now=now
    )
    return [run.pk for run in claimed]


@pytest.mark.django_db(transaction=True)
def test_on_mariadb_a_run_is_not_claimable_until_its_transaction_commits():
    """The application's transaction takes 2 s after enqueueing; claimers on their own
    connections, at its start and near its end, see nothing; after the commit, the run."""
    if connection.vendor != "mysql":
        pytest.skip("SQLite serialises writers: no claim can run beside an open write")
    make_job()
    enqueued = threading.Event()
    committed = threading.Event()
    made: list[int] = []

    def application() -> None:
        try:
            with transaction.atomic():
                made.append(report.enqueue(report_id=1).id)
                enqueued.set()
                time.sleep(2.0)  # the application's own work before its commit
            committed.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=application)
    thread.start()
    assert enqueued.wait(10)
    began = time.monotonic()
    during = [_claimable("node-a")]
    time.sleep(1.5)
    during.append(_claimable("node-b"))
    still_open = not committed.is_set()
    thread.join(10)
    after = _claimable("node-a")
    assert still_open and time.monotonic() - began >= 1.5
    assert during == [[], []] and after == made


@pytest.mark.django_db
def test_an_idempotency_key_returns_the_run_it_made_and_makes_no_second():
    make_job()
    first = report.enqueue_call(kwargs={"report_id": 1}, idempotency_key="order-77")
    again = report.enqueue_call(kwargs={"report_id": 1}, idempotency_key="order-77")
    assert first.newly_enqueued and not again.newly_enqueued and again.id == first.id
    assert JobExecution.objects.count() == 1
    assert AuditEvent.objects.filter(action="job.enqueue").count() == 1  # nothing else happened
    assert report.enqueue_call(kwargs={"report_id": 1}, idempotency_key="order-78").newly_enqueued


@pytest.mark.django_db
def test_a_request_mixing_known_and_new_keys_answers_in_the_order_sent():
    job = make_job()
    known = jobs.enqueue(job, kwargs={"report_id": 1}, idempotency_key="a")
    runs = services.runs_enqueue(
        job_id=job.pk,
        items=[{"idempotency_key": "b"}, {"idempotency_key": "a"}, {}],
        by=services.SYSTEM,
    )
    assert [run.newly_enqueued for run in runs] == [True, False, True]
    assert runs[1].pk == known.id and JobExecution.objects.count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", ERR_IDEMPOTENCY_KEY_FORMAT),
        ("a\nb", ERR_IDEMPOTENCY_KEY_FORMAT),
        ("k" * 201, "At most 200 characters."),
        (7, "Must be a string."),
    ],
)
def test_a_bad_idempotency_key_is_refused_by_field(key, reason):
    job = make_job()
    with pytest.raises(JobValidationError) as refused:
        services.runs_enqueue(job_id=job.pk, items=[{"idempotency_key": key}], by=services.SYSTEM)
    assert refused.value.errors == {"0.idempotency_key": [reason]}


@pytest.mark.django_db
def test_a_key_repeated_within_one_request_is_refused_by_the_items_own_indexes():
    job = make_job()
    with pytest.raises(JobValidationError) as refused:
        services.runs_enqueue(
            job_id=job.pk,
            items=[{"priority": 10**6}, {"idempotency_key": "x"}, {}, {"idempotency_key": "x"}],
            by=services.SYSTEM,
        )
    assert set(refused.value.errors) == {"0.priority", "3.idempotency_key"}
    assert refused.value.errors["3.idempotency_key"] == [
        ERR_IDEMPOTENCY_KEY_REPEATED.format(index=1)
    ]
    assert not JobExecution.objects.exists()


@pytest.mark.django_db
def test_keys_differing_only_in_case_or_trailing_spaces_are_different_keys():
    """On MariaDB too, whose default collation compares text ignoring case, accents and trailing
    spaces: the column compares bytes."""
    job = make_job()
    keys = ["Invoice-1", "invoice-1", "invoice-1 ", "invöice-1"]
    runs = services.runs_enqueue(
        job_id=job.pk, items=[{"idempotency_key": key} for key in keys], by=services.SYSTEM
    )
    assert all(run.newly_enqueued for run in runs)
    again = services.runs_enqueue(
        job_id=job.pk, items=[{"idempotency_key": key} for key in keys], by=services.SYSTEM
    )
    assert [run.pk for run in again] == [run.pk for run in runs]
    assert not any(run.newly_enqueued for run in again)


@pytest.mark.django_db
def test_the_rest_api_takes_a_key_and_answers_200_when_it_made_nothing(client, django_user_model):
    job = make_job()
    admin = django_user_model.objects.create_superuser("root", "r@example.com", "pw-long-enough")
    client.force_login(admin)
    url = f"/api/jobs/{job.pk}/enqueue/"
    body = {"runs": [{"kwargs": {"report_id": 5}, "idempotency_key": "inv-5"}]}
    first = client.post(url, body, content_type="application/json")
    assert first.status_code == 201, first.content
    assert first.json()["count"] == 1 and first.json()["already_enqueued"] == []
    again = client.post(url, body, content_type="application/json")
    assert again.status_code == 200
    assert again.json() == {"count": 0, "ids": first.json()["ids"], "already_enqueued": [0]}
    bad = client.post(url, {"runs": [{"idempotency_key": ""}]}, content_type="application/json")
    assert bad.status_code == 400 and "0.idempotency_key" in bad.json()
    unknown = client.post(url, {"runs": [{"key": "x"}]}, content_type="application/json")
    assert unknown.json() == {"0.key": [ERR_UNKNOWN_FIELD]}


# --- jobs declared in code ---------------------------------------------------------------------


@pytest.fixture
def declared():
    names: list[str] = []
    yield names
    for name in names:
        declarations.forget(name)


def test_task_schedule_declares_a_job_named_after_the_task(declared, monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # tasks of this test only
    declared.extend(["test.pyapi.nightly", "every-5-minutes"])

    @task("test.pyapi.nightly", schedule="0 3 * * *", job={"kwargs": {"days": 30}})
    def nightly(days: int) -> None:
        """Declared with its job."""

    @task("test.pyapi.every", schedule=timedelta(minutes=5), job={"name": "every-5-minutes"})
    def every() -> None:
        """Every five minutes."""

    found = {d["name"]: d for d in declarations.declared_jobs()}
    assert found["test.pyapi.nightly"] == {
        "name": "test.pyapi.nightly",
        "task": "test.pyapi.nightly",
        "kwargs": {"days": 30},
        "cron_expression": "0 3 * * *",
        "schedule_type": "cron",
    }
    assert found["every-5-minutes"]["interval_seconds"] == 300
    assert found["every-5-minutes"]["schedule_type"] == "interval"
    with pytest.raises(declarations.DuplicateJobDeclaration):
        declarations.declare_job("every-5-minutes", task="noop", interval_seconds=60)
    with pytest.raises(TypeError, match="whole seconds"):
        declarations.schedule_fields(timedelta(seconds=1.5))


@pytest.mark.django_db
def test_jobs_apply_from_code_creates_shows_and_prunes_through_the_apply_path(declared):
    declarations.declare_job("code-hourly", task="noop", cron_expression="0 * * * *")
    declared.append("code-hourly")
    dry = StringIO()
    call_command("jobs", "apply", "--from-code", "--dry-run", stdout=dry)
    assert "(dry run) created   code-hourly" in dry.getvalue()
    assert not Job.objects.filter(name="code-hourly").exists()
    call_command("jobs", "apply", "--from-code", stdout=StringIO())
    job = Job.objects.get(name="code-hourly")
    assert (job.task, job.cron_expression) == ("noop", "0 * * * *")
    again = StringIO()
    call_command("jobs", "apply", "--from-code", stdout=again)
    assert "unchanged code-hourly" in again.getvalue()
    make_job(name="defined-in-the-dashboard")
    call_command("jobs", "apply", "--from-code", "--prune", stdout=StringIO())
    assert not Job.objects.filter(name="defined-in-the-dashboard").exists()
    assert AuditEvent.objects.filter(action="job.create", source=AuditSource.CLI).exists()


@pytest.mark.django_db
def test_jobs_apply_from_code_refuses_a_bad_declaration_and_a_file_beside_it(declared):
    declarations.declare_job("code-bad", task="noop", cron_expression="61 * * * *")
    declared.append("code-bad")
    with pytest.raises(CommandError, match=r"code-bad\.cron_expression") as refused:
        call_command("jobs", "apply", "--from-code", stdout=StringIO())
    assert refused.value.returncode == 2 and not Job.objects.filter(name="code-bad").exists()
    with pytest.raises(CommandError, match="FILE or --from-code") as refused:
        call_command("jobs", "apply", "jobs.yaml", "--from-code", stdout=StringIO())
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match="FILE or --from-code"):
        call_command("jobs", "apply", stdout=StringIO())
