"""The enqueue API: many runs of one job, each with arguments of its own (Celery's ``apply_async``
for a scheduler). All or none, errors keyed by item, one INSERT, slots unique per job, and the
runs' own arguments used by the body and kept by their retries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.utils import timezone

import tests.cluster.tasks  # noqa: F401 - registers the test.* tasks
from jobs import executions, services
from jobs.models import AuditEvent, Job, JobExecution, Trigger
from jobs.services import (
    ERR_ENQUEUE_EMPTY,
    ERR_ENQUEUE_ITEM_NOT_OBJECT,
    ERR_ENQUEUE_NOT_LIST,
    MAX_ENQUEUE_RUNS,
    SYSTEM,
    runs_enqueue,
)
from jobs.states import ExecutionStatus
from jobs.validation import ERR_UNKNOWN_FIELD, JobValidationError

pytestmark = pytest.mark.django_db

S = ExecutionStatus


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_job(task: str = "test.record", **fields: object) -> Job:
    return services.job_create(
        data={
            "name": "target",
            "task": task,
            "kwargs": {"path": "/tmp/default"},
            "schedule_type": "interval",
            "interval_seconds": 3600,
            **fields,
        },
        by=SYSTEM,
    )


def test_runs_are_inserted_pending_with_their_own_arguments_and_one_audit_row():
    job = make_job()
    now = timezone.now().replace(microsecond=500_000)  # never a whole second (see below)
    created = runs_enqueue(
        job_id=job.pk,
        items=[{"kwargs": {"path": f"/tmp/{k}"}} for k in range(3)] + [{}],
        by=SYSTEM,
        now=now,
    )
    assert len(created) == 4 and all(run.pk for run in created)
    rows = list(JobExecution.objects.filter(job=job).order_by("scheduled_for"))
    assert [row.pk for row in rows] == [run.pk for run in created]  # slots keep the order sent
    assert {row.status for row in rows} == {S.PENDING}
    assert {row.trigger for row in rows} == {Trigger.ENQUEUE}
    assert [row.kwargs for row in rows] == [{"path": f"/tmp/{k}"} for k in range(3)] + [None]
    # Absent arguments are the job's, read when the run starts.
    assert rows[3].call_arguments() == ([], {"path": "/tmp/default"})
    assert rows[0].call_arguments() == ([], {"path": "/tmp/0"})
    # Due now, a microsecond apart: unique per job, in the order sent.
    assert rows[0].scheduled_for == now
    assert [row.scheduled_for - now for row in rows] == [
        timedelta(microseconds=k) for k in range(4)
    ]
    assert all(row.run_after == row.scheduled_for for row in rows)
    audit = AuditEvent.objects.get(action="job.enqueue")
    assert (audit.object_id, audit.changes) == (str(job.pk), {"runs": [None, 4]})


def test_a_second_request_at_the_same_instant_takes_the_next_free_slots():
    job = make_job()
    now = timezone.now().replace(microsecond=500_000)  # never a whole second (see below)
    first = runs_enqueue(job_id=job.pk, items=[{}, {}], by=SYSTEM, now=now)
    second = runs_enqueue(job_id=job.pk, items=[{}, {}], by=SYSTEM, now=now)
    slots = [run.scheduled_for for run in first + second]
    assert slots == [now + timedelta(microseconds=k) for k in range(4)]


def test_a_slot_taken_by_a_concurrent_writer_is_retried_not_half_written(monkeypatch):
    job = make_job()
    real = executions.create_enqueued
    calls = []

    def racing(job, runs, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise IntegrityError("duplicate entry for execution_unique_fire")
        return real(job, runs, **kwargs)

    monkeypatch.setattr(executions, "create_enqueued", racing)
    created = runs_enqueue(job_id=job.pk, items=[{}, {}, {}], by=SYSTEM)
    assert len(calls) == 2
    assert JobExecution.objects.filter(job=job).count() == len(created) == 3
    assert AuditEvent.objects.filter(action="job.enqueue").count() == 1


def test_an_enqueued_run_never_takes_a_whole_second_slot_of_the_schedule():
    """A run enqueued for 12:00:00 sharp must not take the slot the job's own fire of that
    second will be created at (the leader leaves out a fire whose slot has a row)."""
    job = make_job(schedule_type="cron", cron_expression="* * * * *", interval_seconds=None)
    sharp = (timezone.now() + timedelta(minutes=2)).replace(second=0, microsecond=0)
    (run,) = runs_enqueue(job_id=job.pk, items=[{"run_at": sharp.isoformat()}], by=SYSTEM)
    assert run.scheduled_for == sharp + timedelta(microseconds=1)
    fire = executions.new_fire(job, sharp, term=1, now=timezone.now())
    assert executions.create_fires([fire]) == [fire]  # the schedule's own fire still goes in
    assert JobExecution.objects.filter(job=job, scheduled_for=sharp).count() == 1


def test_runs_wanting_one_instant_in_several_requests_find_slots_past_what_was_read_first():
    """Each request reads the job's taken slots near the instant it wants; a third request of
    1,500 runs for one instant must read on past its first window, not collide and fail."""
    job = make_job()
    at = (timezone.now() + timedelta(hours=1)).replace(microsecond=500_000)
    items = [{"run_at": at.isoformat()}] * 1500
    created = [runs_enqueue(job_id=job.pk, items=items, by=SYSTEM) for _ in range(3)]
    slots = [run.scheduled_for for batch in created for run in batch]
    assert len(set(slots)) == 4500 == JobExecution.objects.filter(job=job).count()
    assert max(slots) - min(slots) >= timedelta(microseconds=4499)


@pytest.mark.parametrize("schedule", ["once", "interval"])
def test_an_enqueued_run_never_takes_the_slot_of_a_fractional_schedule(schedule):
    """A one-off's run_at, or an interval's start, may fall on any microsecond: enqueued runs
    keep clear of that phase too, so the job's own fire is never left out."""
    fire_at = (timezone.now() + timedelta(minutes=5)).replace(microsecond=250_000)
    fields = (
        {"schedule_type": "once", "run_at": fire_at.isoformat(), "interval_seconds": None}
        if schedule == "once"
        else {"start_at": fire_at.isoformat()}
    )
    job = make_job(**fields)
    runs = runs_enqueue(job_id=job.pk, items=[{"run_at": fire_at.isoformat()}] * 3, by=SYSTEM)
    assert fire_at not in {run.scheduled_for for run in runs}
    fire = executions.new_fire(job, fire_at, term=1, now=timezone.now())
    assert executions.create_fires([fire]) == [fire]


def test_a_job_deleted_during_the_request_is_not_retried_as_a_slot_clash(monkeypatch):
    """The insert fails its foreign key when the job was deleted after it was read: that is the
    job's absence (a 404 in the API), not a slot taken by a concurrent writer to retry."""
    job = make_job()
    attempts = []

    def foreign_key_fails(target, runs, **kwargs):
        attempts.append(1)
        raise IntegrityError("a foreign key constraint fails")

    class JobGoneMeanwhile:
        DoesNotExist = Job.DoesNotExist
        objects = type(
            "Manager",
            (),
            {
                "get": staticmethod(lambda pk: job),
                "filter": staticmethod(lambda pk: type("Q", (), {"exists": lambda self: False})()),
            },
        )()

    monkeypatch.setattr(executions, "create_enqueued", foreign_key_fails)
    monkeypatch.setattr(services, "Job", JobGoneMeanwhile)
    with pytest.raises(Job.DoesNotExist):
        runs_enqueue(job_id=job.pk, items=[{}], by=SYSTEM)
    assert attempts == [1]


def test_run_at_and_priority_per_run_and_a_past_run_at_means_now():
    job = make_job(priority=5)
    now = timezone.now().replace(microsecond=500_000)  # never a whole second (see below)
    later = now + timedelta(minutes=5)
    created = runs_enqueue(
        job_id=job.pk,
        items=[
            {"run_at": later.isoformat(), "priority": -3},
            {"run_at": (now - timedelta(days=1)).isoformat()},
        ],
        by=SYSTEM,
        now=now,
    )
    first, second = (JobExecution.objects.get(pk=run.pk) for run in created)
    assert (first.run_after, first.priority) == (later, -3)
    assert (second.run_after, second.priority) == (now, 5)


def test_one_bad_run_refuses_the_request_with_errors_keyed_by_item():
    job = make_job()
    items = [
        {"kwargs": {"path": "/tmp/ok"}},
        {"kwargs": {"wrong": 1}},
        "not an object",
        {"args": "not a list"},
        {"run_at": "yesterday", "priority": 5000, "colour": "red"},
    ]
    with pytest.raises(JobValidationError) as raised:
        runs_enqueue(job_id=job.pk, items=items, by=SYSTEM)
    errors = raised.value.errors
    assert set(errors) == {
        "1.kwargs",
        "2",
        "3.args",
        "4.run_at",
        "4.priority",
        "4.colour",
    }, errors
    assert errors["2"] == [ERR_ENQUEUE_ITEM_NOT_OBJECT]
    assert errors["4.colour"] == [ERR_UNKNOWN_FIELD]
    assert not JobExecution.objects.exists()
    assert not AuditEvent.objects.filter(action="job.enqueue").exists()


@pytest.mark.parametrize(
    ("items", "error"),
    [([], ERR_ENQUEUE_EMPTY), ({"kwargs": {}}, ERR_ENQUEUE_NOT_LIST), (None, ERR_ENQUEUE_NOT_LIST)],
)
def test_an_empty_or_malformed_request_is_refused(items, error):
    job = make_job()
    with pytest.raises(JobValidationError) as raised:
        runs_enqueue(job_id=job.pk, items=items, by=SYSTEM)
    assert raised.value.errors == {"runs": [error]}


def test_an_oversized_request_is_refused():
    job = make_job()
    with pytest.raises(JobValidationError) as raised:
        runs_enqueue(job_id=job.pk, items=[{}] * (MAX_ENQUEUE_RUNS + 1), by=SYSTEM)
    assert list(raised.value.errors) == ["runs"]
    assert not JobExecution.objects.exists()


def test_five_thousand_runs_cost_a_few_statements(django_assert_max_num_queries):
    job = make_job()
    # On SQLite a bulk insert is split by its 999 bound variables: a few dozen statements.
    with django_assert_max_num_queries(200):
        runs_enqueue(job_id=job.pk, items=[{"args": []}] * MAX_ENQUEUE_RUNS, by=SYSTEM)
    assert JobExecution.objects.filter(job=job).count() == MAX_ENQUEUE_RUNS


def test_a_retry_of_an_enqueued_run_keeps_its_arguments():
    job = make_job(max_retries=1)
    (run,) = runs_enqueue(job_id=job.pk, items=[{"kwargs": {"path": "/tmp/own"}}], by=SYSTEM)
    run = JobExecution.objects.select_related("job").get(pk=run.pk)
    retry = executions.create_retry_if_allowed(run, now=timezone.now())
    assert retry is not None and retry.kwargs == {"path": "/tmp/own"}
    again = executions.create_retry_now(retry, run_after=timezone.now())
    assert again.kwargs == {"path": "/tmp/own"}


# --- the API ------------------------------------------------------------------------------------


def test_the_api_enqueues_for_an_operator(api_client_for):
    job = make_job()
    api = api_client_for("operator")
    response = api.post(
        f"/api/jobs/{job.pk}/enqueue/",
        {"runs": [{"kwargs": {"path": "/tmp/a"}}, {"args": [], "kwargs": {"path": "/tmp/b"}}]},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["count"] == 2
    assert body["ids"] == list(
        JobExecution.objects.filter(job=job).order_by("scheduled_for").values_list("pk", flat=True)
    )
    detail = api.get(f"/api/executions/{body['ids'][1]}/").json()
    assert (detail["trigger"], detail["kwargs"]) == ("enqueue", {"path": "/tmp/b"})
    assert detail["triggered_by"] == api.user.username
    assert detail["status"] == "pending" and detail["created_at"] is not None
    assert AuditEvent.objects.get(action="job.enqueue").source == "api"


def test_the_api_refuses_bad_runs_with_per_item_errors(api_client_for):
    job = make_job()
    api = api_client_for("operator")
    response = api.post(
        f"/api/jobs/{job.pk}/enqueue/", {"runs": [{}, {"kwargs": {"nope": 1}}]}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["1.kwargs"]
    response = api.post(f"/api/jobs/{job.pk}/enqueue/", {"runs": "x"}, format="json")
    assert response.status_code == 400 and response.json() == {"runs": [ERR_ENQUEUE_NOT_LIST]}
    assert not JobExecution.objects.exists()


def test_the_api_enqueue_needs_the_operator_role_and_a_job(api_client_for):
    job = make_job()
    response = api_client_for("viewer").post(
        f"/api/jobs/{job.pk}/enqueue/", {"runs": [{}]}, format="json"
    )
    assert response.status_code == 403
    response = api_client_for("operator").post(
        f"/api/jobs/{job.pk + 1000}/enqueue/", {"runs": [{}]}, format="json"
    )
    assert response.status_code == 404
    assert not JobExecution.objects.exists()


def test_a_job_whose_task_is_not_loaded_is_refused_once_not_per_run(api_client_for):
    job = make_job()
    Job.objects.filter(pk=job.pk).update(task="test.not_loaded_here")
    with pytest.raises(JobValidationError) as refused:
        runs_enqueue(job_id=job.pk, items=[{}] * 50, by=SYSTEM)
    assert list(refused.value.errors) == ["task"]
    assert "test.not_loaded_here" in refused.value.errors["task"][0]
    response = api_client_for("operator").post(
        f"/api/jobs/{job.pk}/enqueue/", {"runs": [{}, {}, {}]}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["task"]
    assert not JobExecution.objects.exists()
    assert not AuditEvent.objects.filter(action="job.enqueue").exists()
