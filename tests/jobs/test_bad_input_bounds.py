"""Out-of-range and malformed input is a 400 naming the field (each of these was a 500): dates whose
conversion to UTC overflows or that no database column can hold, an If-Match of thousands of
digits, a lone surrogate in text or in a task's arguments."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from jobs import services
from jobs.models import Job, JobExecution
from jobs.validation import (
    ERR_ARGS_TOO_DEEP,
    ERR_DATETIME_RANGE,
    ERR_NOT_UNICODE,
    JobValidationError,
)

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


# --- JSON nested too deep ----------------------------------------------------------------------


def nested(depth: int, kind: str = "list") -> str:
    """JSON text of a list (or object) ``depth`` levels deep."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


# A task that takes any JSON as its argument (no validate hook): only the depth can be wrong.
ANY_ARGUMENT_TASK = "demo_fail"


def job_body(kwargs_text: str, name: str = "deep") -> str:
    return (
        f'{{"name": "{name}", "task": "{ANY_ARGUMENT_TASK}", "schedule_type": "interval", '
        f'"interval_seconds": 60, "kwargs": {{"message": {kwargs_text}}}}}'
    )


@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize("depth", [900, 5000])
def test_a_body_nested_hundreds_deep_is_a_400_json_error(admin_api, depth, kind) -> None:
    """It was an HTML 500 (RecursionError) at 900 levels; past ~1,000 a 400 saying "maximum
    recursion depth exceeded"."""
    admin_api.raise_request_exception = False
    response = admin_api.generic(
        "POST", "/api/jobs/", job_body(nested(depth, kind)), content_type="application/json"
    )
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    detail = response.json()["detail"]
    assert "nested deeper than" in detail and "recursion" not in detail, detail
    assert not Job.objects.filter(name="deep").exists()


def test_arguments_nested_past_the_limit_are_a_400_naming_the_field(admin_api, settings) -> None:
    limit = settings.SCHEDULER_MAX_ARGS_DEPTH
    response = admin_api.generic(
        "POST", "/api/jobs/", job_body(nested(limit)), content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json() == {"kwargs": [ERR_ARGS_TOO_DEEP.format(limit=limit)]}
    # One level less (kwargs itself is one) is fine.
    response = admin_api.generic(
        "POST",
        "/api/jobs/",
        job_body(nested(limit - 1), "deep-ok"),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content


def test_deep_arguments_given_to_the_services_are_refused_not_a_recursion_error() -> None:
    with pytest.raises(JobValidationError) as caught:
        services.job_create(
            data={
                "name": "deep-service",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 60,
                "args": json.loads(nested(900)),
            },
            by=services.SYSTEM,
        )
    assert "args" in caught.value.errors


def test_an_enqueued_run_with_deep_arguments_is_a_400(admin_api, settings) -> None:
    job = services.job_create(
        data={
            "name": "enqueue-deep",
            "task": ANY_ARGUMENT_TASK,
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )
    limit = settings.SCHEDULER_MAX_ARGS_DEPTH
    for depth, expected in ((limit - 1, 201), (limit, 400)):
        body = '{"runs": [{"kwargs": {"message": ' + nested(depth) + "}}]}"
        response = admin_api.generic(
            "POST", f"/api/jobs/{job.pk}/enqueue/", body, content_type="application/json"
        )
        assert response.status_code == expected, response.content
    assert response.json() == {"0.kwargs": [ERR_ARGS_TOO_DEEP.format(limit=limit)]}
    assert JobExecution.objects.filter(job=job).count() == 1


@pytest.mark.parametrize("depth", [900, 5000])
def test_the_dashboard_and_admin_forms_refuse_deep_json_with_a_form_error(make_user, depth) -> None:
    from tests.dashboard.test_dashboard_pages import job_form_data

    browser = Client(raise_request_exception=False)
    browser.force_login(make_user("admin", "deep-admin"))
    response = browser.post(
        "/jobs/new/",
        job_form_data(name="deep-form", task=ANY_ARGUMENT_TASK, kwargs=nested(depth, "object")),
    )
    assert response.status_code == 200
    assert "nested deeper than" in response.content.decode()
    response = browser.post(
        "/admin/jobs/job/add/",
        {
            "name": "deep-admin-form",
            "task": ANY_ARGUMENT_TASK,
            "schedule_type": "interval",
            "interval_seconds": "60",
            "args": "[]",
            "kwargs": nested(depth, "object"),
        },
    )
    assert response.status_code == 200
    assert "nested deeper than" in response.content.decode()
    assert not Job.objects.filter(name__startswith="deep-").exists()
