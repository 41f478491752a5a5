"""Queues and job flow limits in the API, the CLI and jobs export / apply: read by viewers, set by
admins, paused and resumed by operators, each change audited; bad input refused by field."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs import flow, services
from jobs.models import AuditEvent, JobExecution, Queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    return services.job_create(
        data={
            "name": "nightly",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "queue": "reports",
            "max_concurrent": 2,
            "rate_limit": 10,
            "rate_period_seconds": 60,
        },
        by=services.SYSTEM,
    )


def test_a_job_carries_its_flow_limits_and_refuses_bad_ones(admin_api, job) -> None:
    seen = admin_api.get(f"/api/jobs/{job.pk}/").data
    assert (seen["max_concurrent"], seen["rate_limit"], seen["rate_period_seconds"]) == (2, 10, 60)
    bad = admin_api.patch(
        f"/api/jobs/{job.pk}/",
        {"max_concurrent": 0, "rate_period_seconds": -5, "version": seen["version"]},
        format="json",
    )
    assert bad.status_code == 400
    assert set(bad.data) >= {"max_concurrent", "rate_period_seconds"}, bad.data
    cleared = admin_api.patch(
        f"/api/jobs/{job.pk}/", {"max_concurrent": None, "version": seen["version"]}, format="json"
    )
    assert cleared.status_code == 200 and cleared.data["max_concurrent"] is None


def test_queues_are_listed_set_paused_and_resumed_by_role(admin_api, api_client_for, job) -> None:
    listed = admin_api.get("/api/queues/")
    assert listed.status_code == 200
    reports = next(q for q in listed.data if q["name"] == "reports")
    assert reports["jobs"] == 1 and reports["configured"] is False and reports["paused"] is False
    viewer = api_client_for("viewer")
    assert viewer.get("/api/queues/reports/").status_code == 200
    assert (
        viewer.patch("/api/queues/reports/", {"max_concurrent": 4}, format="json").status_code
        == 403
    )
    assert viewer.post("/api/queues/reports/pause/").status_code == 403
    operator = api_client_for("operator")
    assert (
        operator.patch("/api/queues/reports/", {"max_concurrent": 4}, format="json").status_code
        == 403
    )
    made = admin_api.patch(
        "/api/queues/reports/", {"max_concurrent": 4, "rate_limit": 100}, format="json"
    )
    assert made.status_code == 200, made.content
    assert (made.data["max_concurrent"], made.data["rate_limit"], made.data["configured"]) == (
        4,
        100,
        True,
    )
    paused = operator.post("/api/queues/reports/pause/")
    assert paused.status_code == 200 and paused.data["paused"] is True
    assert paused.data["max_concurrent"] == 4  # the rest kept
    resumed = operator.post("/api/queues/reports/resume/")
    assert resumed.data["paused"] is False
    actions = list(
        AuditEvent.objects.filter(object_type="queue")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == ["queue.update", "queue.pause", "queue.resume"]
    # PUT sets the queue whole: what it leaves out goes back to its default.
    whole = admin_api.put("/api/queues/reports/", {"rate_limit": 5}, format="json")
    assert whole.status_code == 200
    assert (whole.data["max_concurrent"], whole.data["rate_limit"]) == (None, 5)


def test_bad_queue_settings_are_refused_by_field_and_nothing_is_written(admin_api, job) -> None:
    bad = admin_api.patch(
        "/api/queues/reports/",
        {"max_concurrent": 0, "rate_limit": "ten", "paused": "yes", "colour": "red"},
        format="json",
    )
    assert bad.status_code == 400
    assert set(bad.data) == {"max_concurrent", "rate_limit", "paused", "colour"}, bad.data
    assert not Queue.objects.exists()
    assert admin_api.get("/api/queues/nowhere/").status_code == 404
    assert admin_api.get("/api/queues/Bad Name/").status_code == 404


def test_a_pending_run_says_what_it_waits_for(admin_api, job) -> None:
    run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    admin_api.post("/api/queues/reports/pause/")
    flow.forget_config()
    seen = admin_api.get(f"/api/executions/{run.pk}/").data
    assert seen["waiting"] == "waiting: queue reports paused"
    admin_api.post("/api/queues/reports/resume/")
    JobExecution.objects.filter(pk=run.pk).update(reason="waiting: job limit 2 reached")
    flow.forget_config()
    assert admin_api.get(f"/api/executions/{run.pk}/").data["waiting"] == (
        "waiting: job limit 2 reached"
    )


def test_the_cli_lists_sets_pauses_and_resumes_queues(job) -> None:
    out = io.StringIO()
    call_command(
        "jobs", "queue", "reports", "--max-concurrent", "3", "--rate-limit", "20", stdout=out
    )
    assert "queue reports: max_concurrent 3, rate 20 per 60 s" in out.getvalue()
    call_command("jobs", "queue-pause", "reports", stdout=out)
    listing = io.StringIO()
    call_command("jobs", "queues", "--json", stdout=listing)
    reports = next(q for q in json.loads(listing.getvalue()) if q["name"] == "reports")
    assert (reports["max_concurrent"], reports["rate_limit"], reports["paused"]) == (3, 20, True)
    call_command("jobs", "queue", "reports", "--max-concurrent", "none", stdout=out)
    assert Queue.objects.get(name="reports").max_concurrent is None
    with pytest.raises(CommandError) as refused:
        call_command("jobs", "queue", "reports", "--rate-period", "0")
    assert refused.value.returncode == 2 and "rate_period_seconds" in str(refused.value)
    with pytest.raises(CommandError) as empty:
        call_command("jobs", "queue", "reports")
    assert empty.value.returncode == 2


def test_export_and_apply_carry_the_queues(tmp_path, job) -> None:
    Queue.objects.create(name="reports", max_concurrent=4, paused=True)
    out = io.StringIO()
    call_command("jobs", "export", "--format", "json", stdout=out)
    document = json.loads(out.getvalue())
    assert document["queues"] == [
        {
            "name": "reports",
            "max_concurrent": 4,
            "rate_limit": None,
            "rate_period_seconds": 60,
            "paused": True,
        }
    ]
    assert document["jobs"][0]["max_concurrent"] == 2
    document["queues"][0]["max_concurrent"] = 6
    document["queues"].append({"name": "bulk", "rate_limit": 50, "rate_period_seconds": 10})
    path = tmp_path / "all.json"
    path.write_text(json.dumps(document))
    applied = io.StringIO()
    call_command("jobs", "apply", str(path), stdout=applied)
    assert "queues: 1 created, 1 updated, 0 unchanged" in applied.getvalue()
    assert Queue.objects.get(name="reports").max_concurrent == 6
    assert Queue.objects.get(name="bulk").rate_limit == 50
    document["queues"].append({"name": "broken", "max_concurrent": -1})
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError) as refused:
        call_command("jobs", "apply", str(path))
    assert "broken.max_concurrent" in str(refused.value)
    assert not Queue.objects.filter(name="broken").exists()


def test_a_queue_write_without_a_body_is_refused(admin_api, job) -> None:
    for method in (admin_api.patch, admin_api.put):
        refused = method("/api/queues/reports/")
        assert refused.status_code == 400, refused.content
        assert "non_field_errors" in refused.data
    assert not Queue.objects.exists()
    # An empty object is a body: PUT sets every setting back to its default.
    assert admin_api.put("/api/queues/reports/", {}, format="json").status_code == 200
