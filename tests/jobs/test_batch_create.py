"""Creating many jobs at once: the batch service, its API endpoint and `jobs apply` on top of it.
All or none, errors keyed by item, a bounded number of statements whatever the batch size."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from jobs import services
from jobs.models import AuditEvent, Job
from jobs.services import (
    ERR_BATCH_DUPLICATE_NAME,
    ERR_BATCH_EMPTY,
    ERR_BATCH_ITEM_NOT_OBJECT,
    ERR_NAME_TAKEN,
    MAX_BATCH_JOBS,
    SYSTEM,
    jobs_create_batch,
)
from jobs.validation import JobValidationError

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def job(name: str, **fields: object) -> dict[str, object]:
    return {
        "name": name,
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 60,
        **fields,
    }


def test_a_batch_creates_every_job_with_its_audit_row_and_next_fire():
    created = jobs_create_batch(items=[job(f"bulk-{k}") for k in range(5)], by=SYSTEM)
    assert [j.name for j in created] == [f"bulk-{k}" for k in range(5)]
    assert all(j.pk for j in created)
    stored = Job.objects.filter(name__startswith="bulk-")
    assert stored.count() == 5
    assert all(j.next_fire_at is not None for j in stored)
    audits = AuditEvent.objects.filter(action="job.create")
    assert sorted(audits.values_list("object_id", flat=True)) == sorted(str(j.pk) for j in created)
    assert audits.first().changes["name"] == [None, audits.first().object_repr]


def test_a_batch_costs_a_few_statements_per_hundred_jobs_not_several_per_job(
    django_assert_max_num_queries,
):
    # Bulk inserts: one statement on MariaDB; on SQLite one per ~30 jobs (its 999 bound variables).
    with django_assert_max_num_queries(300 // 10):
        jobs_create_batch(items=[job(f"many-{k}") for k in range(300)], by=SYSTEM)
    assert Job.objects.count() == 300


def test_one_bad_item_refuses_the_whole_batch_with_errors_keyed_by_item():
    Job.objects.create(name="Taken", task="noop", schedule_type="interval", interval_seconds=5)
    items = [
        job("fine"),
        job("bad-interval", interval_seconds=0),
        "not an object",
        job("FINE"),
        job("taken"),
    ]
    with pytest.raises(JobValidationError) as raised:
        jobs_create_batch(items=items, by=SYSTEM)
    errors = raised.value.errors
    assert list(errors) == ["1.interval_seconds", "2", "3.name", "4.name"]
    assert errors["2"] == [ERR_BATCH_ITEM_NOT_OBJECT]
    assert errors["3.name"] == [ERR_BATCH_DUPLICATE_NAME]
    assert errors["4.name"] == [ERR_NAME_TAKEN]
    assert list(Job.objects.values_list("name", flat=True)) == ["Taken"]
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("count", [0, MAX_BATCH_JOBS + 1])
def test_an_empty_or_oversized_batch_is_refused(count):
    with pytest.raises(JobValidationError) as raised:
        jobs_create_batch(items=[job(f"j{k}") for k in range(count)], by=SYSTEM)
    assert list(raised.value.errors) == ["jobs"]
    if count == 0:
        assert raised.value.errors["jobs"] == [ERR_BATCH_EMPTY]
    assert not Job.objects.exists()


def test_the_api_creates_a_batch_for_an_admin(api_client_for):
    api = api_client_for("admin")
    response = api.post("/api/jobs/batch/", {"jobs": [job("api-1"), job("api-2")]}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["count"] == 2
    assert [j["name"] for j in response.json()["jobs"]] == ["api-1", "api-2"]
    assert AuditEvent.objects.filter(action="job.create", source="api").count() == 2


def test_the_api_refuses_a_bad_batch_with_per_item_errors_and_writes_nothing(api_client_for):
    api = api_client_for("admin")
    response = api.post(
        "/api/jobs/batch/", {"jobs": [job("ok"), job("no-task", task="")]}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["1.task"]
    assert not Job.objects.exists()
    response = api.post("/api/jobs/batch/", {"jobs": {"name": "x"}}, format="json")
    assert response.status_code == 400 and "jobs" in response.json()


def test_the_api_batch_needs_the_admin_role(api_client_for):
    response = api_client_for("operator").post(
        "/api/jobs/batch/", {"jobs": [job("op")]}, format="json"
    )
    assert response.status_code == 403
    assert not Job.objects.exists()


def test_jobs_apply_creates_new_jobs_in_bulk(tmp_path, django_assert_max_num_queries):
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "jobs:\n"
        + "".join(
            f"  - {{name: applied-{k}, task: noop, schedule_type: interval, interval_seconds: 30}}\n"
            for k in range(200)
        )
    )
    with django_assert_max_num_queries(200 // 8):
        call_command("jobs", "apply", str(path))
    assert Job.objects.filter(name__startswith="applied-").count() == 200
    assert AuditEvent.objects.filter(action="job.create", source="cli").count() == 200
    # A second apply changes nothing.
    services.job_apply_definitions(
        definitions=[job(f"applied-{k}", interval_seconds=30) for k in range(200)], by=SYSTEM
    )
    assert Job.objects.count() == 200


def test_jobs_apply_reports_a_name_taken_ignoring_case_by_name():
    Job.objects.create(name="Report", task="noop", schedule_type="interval", interval_seconds=5)
    with pytest.raises(JobValidationError) as raised:
        services.job_apply_definitions(definitions=[job("fresh"), job("report")], by=SYSTEM)
    assert raised.value.errors == {"report.name": [ERR_NAME_TAKEN]}
    assert list(Job.objects.values_list("name", flat=True)) == ["Report"]
