"""Out-of-range and malformed input is a 400 naming the field (each of these was a 500): dates whose
conversion to UTC overflows or that no database column can hold, an If-Match of thousands of
digits, a lone surrogate in text or in a task's arguments."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from jobs import services
from jobs.models import Job, JobExecution
from jobs.validation import ERR_DATETIME_RANGE, ERR_NOT_UNICODE

pytestmark = pytest.mark.django_db

LOW = "0001-01-01T00:00:00%2B14:00"  # one minute into year 1, in UTC+14: before year 1 in UTC
HIGH = "9999-12-31T23:59:59-14:00"  # past year 9999 in UTC


@pytest.fixture
def job() -> Job:
    return services.job_create(
        data={
            "name": "bounds",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )


@pytest.mark.parametrize(
    ("url", "field"),
    [
        (f"/api/schedule-preview/?schedule_type=once&run_at={HIGH}", "run_at"),
        (
            f"/api/schedule-preview/?schedule_type=interval&interval_seconds=60&start_at={LOW}",
            "start_at",
        ),
    ],
)
def test_out_of_range_dates_are_a_400_naming_the_parameter(api_client_for, url, field) -> None:
    response = api_client_for("viewer").get(url)
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {field: [ERR_DATETIME_RANGE]}


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        (f"scheduled_after={LOW}", True),
        (f"scheduled_before={LOW}", False),
        (f"created_before={HIGH}", True),
        (f"created_after={HIGH}", False),
        (f"finished_after={LOW}", True),
    ],
)
def test_a_filter_bound_past_the_storable_range_is_clamped(
    api_client_for, job, query, matches
) -> None:
    """No row lies outside what the database stores: a bound before it selects from the start,
    one after it up to the end (each of these was a 500, then a 400 the schema did not declare)."""
    run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    JobExecution.objects.filter(pk=run.pk).update(finished_at=run.created_at)
    response = api_client_for("viewer").get(f"/api/executions/?{query}")
    assert response.status_code == 200, response.content[:300]
    assert [r["id"] for r in response.json()["results"]] == ([run.pk] if matches else [])


def test_an_audit_bound_before_the_storable_range_selects_from_the_start(
    api_client_for, job
) -> None:
    response = api_client_for("viewer").get(f"/api/audit-events/?since={LOW}")
    assert response.status_code == 200
    assert response.json()["count"] >= 1


@pytest.mark.parametrize("value", ["", "2026-01-01", "2026-01-01T00:00", "soon"])
def test_a_filter_bound_needs_a_date_time_with_an_offset(api_client_for, value) -> None:
    response = api_client_for("viewer").get(f"/api/executions/?created_after={value}")
    assert response.status_code == 400
    assert list(response.json()) == ["created_after"]


def test_a_date_in_range_still_filters(api_client_for) -> None:
    response = api_client_for("viewer").get("/api/executions/?scheduled_after=2026-01-01T00:00Z")
    assert response.status_code == 200


@pytest.mark.parametrize("field", ["run_at"])
def test_a_job_due_past_the_storable_range_is_refused(admin_api, field) -> None:
    body = {"name": "far-away", "task": "noop", "schedule_type": "once", field: HIGH}
    response = admin_api.post("/api/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json()[field] == [ERR_DATETIME_RANGE]
    assert not Job.objects.filter(name="far-away").exists()


@pytest.mark.parametrize(
    "query", [f"until={HIGH[:16]}&tz=Etc/GMT%2B12", "since=0001-01-01T00:00&tz=Etc/GMT-14"]
)
def test_the_dashboard_ignores_an_out_of_range_filter(make_user, query) -> None:
    browser = Client()
    browser.force_login(make_user("viewer"))
    assert browser.get(f"/executions/?{query}").status_code == 200


def test_an_if_match_of_thousands_of_digits_is_a_400(admin_api, job) -> None:
    response = admin_api.patch(
        f"/api/jobs/{job.pk}/", {"description": "x"}, format="json", HTTP_IF_MATCH="1" * 4400
    )
    assert response.status_code == 400
    assert "version" in response.json()


def test_a_lone_surrogate_in_text_is_a_400(admin_api, job) -> None:
    raw = '{"description": "\\ud800", "version": VERSION}'.replace("VERSION", str(job.version))
    response = admin_api.generic(
        "PATCH", f"/api/jobs/{job.pk}/", raw, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json() == {"description": [ERR_NOT_UNICODE]}
    job.refresh_from_db()
    assert job.description == ""


def test_a_lone_surrogate_in_a_tasks_arguments_is_a_400(admin_api) -> None:
    raw = json.dumps(
        {
            "name": "surrogate-args",
            "task": "log",
            "kwargs": {"message": "PLACEHOLDER"},
            "schedule_type": "interval",
            "interval_seconds": 60,
        }
    ).replace("PLACEHOLDER", "\\udfff")
    response = admin_api.generic("POST", "/api/jobs/", raw, content_type="application/json")
    assert response.status_code == 400
    assert ERR_NOT_UNICODE in response.json()["kwargs"]
    assert not Job.objects.filter(name="surrogate-args").exists()
