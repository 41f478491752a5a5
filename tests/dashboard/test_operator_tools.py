"""Operator tools: the execution list as CSV (the list's filters, newest first, formula-looking
cells as text, a cap on the rows, viewers only), and run now with arguments of the run's own."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from dashboard.views import executions as views
from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

S = ExecutionStatus
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)


@pytest.fixture
def runs(db):
    job = services.job_create(
        data={
            "name": "nightly",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )
    made = []
    for k, (status, error) in enumerate(
        [(S.SUCCEEDED, ""), (S.FAILED, '=HYPERLINK("http://x")\nTraceback...'), (S.FAILED, "boom")]
    ):
        slot = T0 + timedelta(minutes=k)
        made.append(
            JobExecution.objects.create(
                job=job, scheduled_for=slot, run_after=slot, status=status, error=error, node="n1"
            )
        )
    return made


def viewer(make_user) -> Client:
    client = Client()
    client.force_login(make_user("viewer", "vera"))
    return client


def read(response) -> list[list[str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_the_export_follows_the_lists_filters_newest_first(make_user, runs) -> None:
    client = viewer(make_user)
    response = client.get("/executions/export.csv", {"status": "failed"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="executions-')
    assert response["X-Export-Truncated"] == "false"
    rows = read(response)
    assert rows[0][:6] == ["id", "job", "scheduled_for", "attempt", "trigger", "status"]
    assert [int(r[0]) for r in rows[1:]] == [runs[2].pk, runs[1].pk]
    error = rows[0].index("error")
    # A cell a spreadsheet would run as a formula is text; an error keeps its first line.
    assert rows[2][error] == '\'=HYPERLINK("http://x")'
    assert rows[1][error] == "boom"
    assert rows[1][rows[0].index("scheduled_for")] == (T0 + timedelta(minutes=2)).isoformat()
    everything = read(client.get("/executions/export.csv"))
    assert len(everything) == 1 + len(runs)
    # A job that does not exist has no runs (not every run).
    assert read(client.get("/executions/export.csv", {"job": "no-such-job"})) == [rows[0]]


def test_the_export_is_capped_and_says_so(make_user, runs, monkeypatch) -> None:
    monkeypatch.setattr(views, "MAX_CSV_ROWS", 2)
    response = viewer(make_user).get("/executions/export.csv")
    assert response["X-Export-Truncated"] == "true"
    assert len(read(response)) == 1 + 2


def test_the_export_needs_a_signed_in_viewer(client, runs) -> None:
    response = client.get("/executions/export.csv")
    assert response.status_code == 302 and "/login" in response["Location"]


def test_the_list_links_to_the_export_with_its_filters(make_user, runs) -> None:
    page = viewer(make_user).get("/executions/", {"status": "failed", "page": "1"})
    assert b'href="/executions/export.csv?status=failed"' in page.content


# --- run now with arguments (the dashboard and the API) ---------------------------------------------


@pytest.fixture
def echo_job(db):
    return services.job_create(
        data={
            "name": "greet",
            "task": "log",
            "kwargs": {"message": "from the job"},
            "schedule_type": "interval",
            "interval_seconds": 3600,
        },
        by=services.SYSTEM,
    )


def operator(make_user) -> Client:
    client = Client()
    client.force_login(make_user("operator", "olga"))
    return client


def test_run_now_with_arguments_from_the_dashboard(make_user, echo_job) -> None:
    client = operator(make_user)
    page = client.get(f"/jobs/{echo_job.pk}/")
    assert b"Run now with other arguments" in page.content
    response = client.post(
        f"/jobs/{echo_job.pk}/trigger/", {"kwargs": '{"message": "just this once"}'}, follow=True
    )
    run = JobExecution.objects.get(job=echo_job)
    assert run.kwargs == {"message": "just this once"} and run.args is None
    assert run.call_arguments() == ([], {"message": "just this once"})
    assert "queued to run now" in response.content.decode()
    # Bad JSON, or a call the task refuses: nothing queued, and the page says why.
    for bad, says in (
        ('{"message": ', "kwargs is not valid JSON"),
        ('{"colour": "red"}', "Not run: kwargs"),
    ):
        response = client.post(f"/jobs/{echo_job.pk}/trigger/", {"kwargs": bad}, follow=True)
        assert says in response.content.decode()
    assert JobExecution.objects.filter(job=echo_job).count() == 1
    # The plain button still runs the job with its own arguments.
    client.post(f"/jobs/{echo_job.pk}/trigger/")
    latest = JobExecution.objects.filter(job=echo_job).latest("pk")
    assert latest.kwargs is None and latest.call_arguments()[1] == {"message": "from the job"}


def test_the_apis_trigger_takes_arguments(admin_api, echo_job) -> None:
    made = admin_api.post(
        f"/api/jobs/{echo_job.pk}/trigger/", {"kwargs": {"message": "api"}}, format="json"
    )
    assert made.status_code == 201, made.content
    assert JobExecution.objects.get(pk=made.data["id"]).kwargs == {"message": "api"}
    plain = admin_api.post(f"/api/jobs/{echo_job.pk}/trigger/")
    assert plain.status_code == 201
    bad = admin_api.post(
        f"/api/jobs/{echo_job.pk}/trigger/", {"kwargs": {"colour": 1}}, format="json"
    )
    assert bad.status_code == 400 and "kwargs" in bad.data
    unknown = admin_api.post(f"/api/jobs/{echo_job.pk}/trigger/", {"when": "now"}, format="json")
    assert unknown.status_code == 400 and "when" in unknown.data
    not_an_object = admin_api.post(f"/api/jobs/{echo_job.pk}/trigger/", [], format="json")
    assert not_an_object.status_code == 400
    assert JobExecution.objects.filter(job=echo_job).count() == 2
