"""The jobs and executions REST API end to end: CRUD, optimistic locking, actions, filters, docs, audit."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cluster.models import LeadershipTerm, SchedulerNode
from cluster.services import ERR_NODE_NOT_RUNNING
from jobs import schedules, services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import (
    ERR_ALREADY_RETRIED,
    ERR_CANNOT_CANCEL,
    ERR_CANNOT_RETRY,
    ERR_VERSION_CONFLICT,
    ERR_VERSION_REQUIRED,
)
from jobs.states import ExecutionStatus
from jobs.validation import MAX_PREVIEW_COUNT

S = ExecutionStatus
CLIENT_ADDR = "10.1.2.3"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def future(**delta) -> datetime:
    return timezone.now() + timedelta(**delta)


def iso(value: datetime) -> str:
    return value.isoformat()


def dt(text: str | None) -> datetime | None:
    return parse_datetime(text) if text else None


CRON = {
    "name": "cron-job",
    "task": "noop",
    "schedule_type": "cron",
    "cron_expression": "*/5 * * * *",
}
INTERVAL = {
    "name": "interval-job",
    "task": "noop",
    "schedule_type": "interval",
    "interval_seconds": 60,
}


def once_body() -> dict:
    return {
        "name": "once-job",
        "task": "log",
        "args": ["hello"],
        "kwargs": {"level": "warning"},
        "schedule_type": "once",
        "run_at": iso(future(hours=2)),
    }


def create(client, body: dict) -> dict:
    response = client.post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.data
    return response.data


def make_job(**fields) -> Job:
    values = {
        "name": "job",
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 60,
        "next_fire_at": future(seconds=60),
        **fields,
    }
    return Job.objects.create(**values)


def make_execution(job: Job, status: str = S.PENDING, **fields) -> JobExecution:
    slot = fields.pop("scheduled_for", timezone.now())
    return JobExecution.objects.create(
        job=job, scheduled_for=slot, run_after=slot, status=status, **fields
    )


# --- CRUD round trips ----------------------------------------------------------------------------


def check_cron_fire(data: dict, before: datetime) -> None:
    fire = dt(data["next_fire_at"])
    assert before < fire <= before + timedelta(minutes=5, seconds=1)
    assert fire.minute % 5 == 0 and fire.second == 0 and fire.microsecond == 0


def check_interval_fire(data: dict, before: datetime) -> None:
    fire = dt(data["next_fire_at"])
    assert before < fire <= before + timedelta(seconds=61)
    # No start_at: slots are aligned to the Unix epoch.
    assert fire.timestamp() % 60 == 0


def check_once_fire(data: dict, before: datetime) -> None:
    assert dt(data["next_fire_at"]) == dt(data["run_at"])


@pytest.mark.parametrize(
    ("body_factory", "check_fire"),
    [
        (lambda: dict(CRON), check_cron_fire),
        (lambda: dict(INTERVAL), check_interval_fire),
        (once_body, check_once_fire),
    ],
    ids=["cron", "interval", "once"],
)
def test_crud_round_trip(admin_api, body_factory, check_fire):
    body = body_factory()
    before = timezone.now()
    created = create(admin_api, body)
    for field, value in body.items():
        if field == "run_at":
            assert dt(created[field]) == dt(value)
        else:
            assert created[field] == value
    assert created["version"] == 1
    assert created["enabled"] is True
    assert created["created_by"] == admin_api.user.username
    assert created["schedule_description"]
    check_fire(created, before)

    url = f"/api/jobs/{created['id']}/"
    fetched = admin_api.get(url)
    assert fetched.status_code == 200
    assert fetched.data == created

    listed = admin_api.get("/api/jobs/").data
    assert listed["count"] == 1 and listed["results"][0]["id"] == created["id"]

    patched = admin_api.patch(url, {"description": "changed", "version": 1}, format="json")
    assert patched.status_code == 200, patched.data
    assert patched.data["description"] == "changed"
    assert patched.data["version"] == 2
    assert Job.objects.get(pk=created["id"]).description == "changed"

    deleted = admin_api.delete(url)
    assert deleted.status_code == 204
    assert not Job.objects.filter(pk=created["id"]).exists()
    assert admin_api.get(url).status_code == 404


def test_cron_timezone_is_honoured(admin_api):
    data = create(
        admin_api,
        {**CRON, "cron_expression": "0 9 * * *", "timezone": "America/New_York"},
    )
    fire = dt(data["next_fire_at"]).astimezone(schedules.validate_timezone("America/New_York"))
    assert (fire.hour, fire.minute) == (9, 0)


def test_interval_with_a_future_start_at_first_fires_at_start_at(admin_api):
    start = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    data = create(admin_api, {**INTERVAL, "start_at": iso(start)})
    assert dt(data["next_fire_at"]) == start


def test_interval_with_a_past_start_at_is_aligned_to_it(admin_api):
    start = (timezone.now() - timedelta(hours=1)).replace(microsecond=0) + timedelta(seconds=7)
    before = timezone.now()
    data = create(admin_api, {**INTERVAL, "start_at": iso(start)})
    fire = dt(data["next_fire_at"])
    assert before < fire <= before + timedelta(seconds=61)
    assert (fire - start).total_seconds() % 60 == 0


def test_cron_with_seconds(admin_api):
    before = timezone.now()
    data = create(admin_api, {**CRON, "cron_expression": "*/15 * * * * *"})
    fire = dt(data["next_fire_at"])
    assert before < fire <= before + timedelta(seconds=15)
    assert fire.second % 15 == 0


def test_unknown_job_is_404(admin_api):
    assert admin_api.get("/api/jobs/999999/").status_code == 404
    assert admin_api.post("/api/jobs/999999/trigger/").status_code == 404
    assert admin_api.post("/api/executions/999999/cancel/").status_code == 404


# --- optimistic locking --------------------------------------------------------------------------


def test_patch_with_stale_version_is_409_and_changes_nothing(admin_api):
    job = create(admin_api, INTERVAL)
    url = f"/api/jobs/{job['id']}/"
    first = admin_api.patch(url, {"priority": 1, "version": 1}, format="json")
    assert first.status_code == 200
    audits = AuditEvent.objects.count()

    stale = admin_api.patch(url, {"priority": 9, "version": 1}, format="json")
    assert stale.status_code == 409
    assert stale.data["code"] == "version_conflict"
    assert stale.data["current_version"] == 2
    assert stale.data["detail"] == ERR_VERSION_CONFLICT.format(expected=1, current=2)
    stored = Job.objects.get(pk=job["id"])
    assert (stored.priority, stored.version) == (1, 2)
    assert AuditEvent.objects.count() == audits


@pytest.mark.parametrize("method", ["patch", "put"])
def test_update_without_version_is_400(admin_api, method):
    job = create(admin_api, INTERVAL)
    response = getattr(admin_api, method)(
        f"/api/jobs/{job['id']}/", {**INTERVAL, "priority": 4}, format="json"
    )
    assert response.status_code == 400
    assert response.data["version"] == [ERR_VERSION_REQUIRED]
    assert Job.objects.get(pk=job["id"]).priority == 0


@pytest.mark.parametrize(
    "version",
    [
        "abc",
        True,
        [1],
        {"v": 1},
        1.5,
    ],
)
def test_update_with_malformed_version_is_400(admin_api, version):
    job = create(admin_api, INTERVAL)
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/", {"priority": 4, "version": version}, format="json"
    )
    assert response.status_code == 400
    assert "version" in response.data
    assert Job.objects.get(pk=job["id"]).priority == 0


@pytest.mark.parametrize("header", ['"1"', "1", 'W/"1"'])
def test_version_via_if_match_header(admin_api, header):
    job = create(admin_api, INTERVAL)
    url = f"/api/jobs/{job['id']}/"
    response = admin_api.patch(url, {"priority": 7}, format="json", HTTP_IF_MATCH=header)
    assert response.status_code == 200, response.data
    assert response.data["version"] == 2
    stale = admin_api.patch(url, {"priority": 8}, format="json", HTTP_IF_MATCH=header)
    assert stale.status_code == 409
    assert stale.data["current_version"] == 2
    assert Job.objects.get(pk=job["id"]).priority == 7


def test_noop_patch_keeps_version_and_writes_no_audit(admin_api):
    job = create(admin_api, INTERVAL)
    audits = AuditEvent.objects.count()
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/", {"interval_seconds": 60, "version": 1}, format="json"
    )
    assert response.status_code == 200
    assert response.data["version"] == 1
    assert AuditEvent.objects.count() == audits


def test_stale_delete_is_409(admin_api):
    job = create(admin_api, INTERVAL)
    admin_api.patch(f"/api/jobs/{job['id']}/", {"priority": 1, "version": 1}, format="json")
    response = admin_api.delete(f"/api/jobs/{job['id']}/?version=1")
    assert response.status_code == 409
    assert response.data["code"] == "version_conflict"
    assert Job.objects.filter(pk=job["id"]).exists()
    assert admin_api.delete(f"/api/jobs/{job['id']}/?version=2").status_code == 204


# --- PUT / PATCH semantics -----------------------------------------------------------------------


def test_put_replaces_fields_left_out_return_to_defaults(admin_api):
    job = create(
        admin_api,
        {
            **INTERVAL,
            "description": "busy",
            "priority": 5,
            "max_retries": 3,
            "timeout_seconds": 30,
            "queue": "heavy",
            "enabled": False,
            "concurrency_policy": "allow",
        },
    )
    response = admin_api.put(
        f"/api/jobs/{job['id']}/", {**INTERVAL, "interval_seconds": 90, "version": 1}, format="json"
    )
    assert response.status_code == 200, response.data
    data = response.data
    assert data["interval_seconds"] == 90
    assert data["description"] == ""
    assert data["priority"] == 0
    assert data["max_retries"] == 0
    assert data["timeout_seconds"] is None
    assert data["queue"] == "default"
    assert data["enabled"] is True
    assert data["concurrency_policy"] == "forbid"
    assert data["next_fire_at"] is not None


def test_patch_keeps_fields_left_out(admin_api):
    job = create(admin_api, {**INTERVAL, "priority": 5, "queue": "heavy"})
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/", {"description": "d", "version": 1}, format="json"
    )
    assert response.status_code == 200
    assert (response.data["priority"], response.data["queue"]) == (5, "heavy")


def test_changing_schedule_type_clears_the_other_types_fields(admin_api):
    job = create(admin_api, {**CRON, "timezone": "Europe/Berlin"})
    url = f"/api/jobs/{job['id']}/"
    to_interval = admin_api.patch(
        url, {"schedule_type": "interval", "interval_seconds": 300, "version": 1}, format="json"
    )
    assert to_interval.status_code == 200, to_interval.data
    assert to_interval.data["cron_expression"] == ""
    assert to_interval.data["timezone"] == "UTC"
    assert to_interval.data["interval_seconds"] == 300

    run_at = future(days=1)
    to_once = admin_api.patch(
        url, {"schedule_type": "once", "run_at": iso(run_at), "version": 2}, format="json"
    )
    assert to_once.status_code == 200, to_once.data
    assert to_once.data["interval_seconds"] is None
    assert to_once.data["start_at"] is None
    assert dt(to_once.data["next_fire_at"]) == run_at

    to_cron = admin_api.patch(
        url, {"schedule_type": "cron", "cron_expression": "0 * * * *", "version": 3}, format="json"
    )
    assert to_cron.status_code == 200, to_cron.data
    assert to_cron.data["run_at"] is None
    stored = Job.objects.get(pk=job["id"])
    assert (stored.interval_seconds, stored.run_at, stored.cron_expression) == (
        None,
        None,
        "0 * * * *",
    )


def test_schedule_change_recomputes_next_fire(admin_api):
    job = create(admin_api, INTERVAL)
    response = admin_api.patch(
        f"/api/jobs/{job['id']}/",
        {"schedule_type": "once", "run_at": iso(future(days=3)), "version": 1},
        format="json",
    )
    assert dt(response.data["next_fire_at"]) == dt(response.data["run_at"])


# --- pause / resume / trigger --------------------------------------------------------------------


def test_pause_and_resume(admin_api):
    job = create(admin_api, INTERVAL)
    url = f"/api/jobs/{job['id']}/"
    paused = admin_api.post(url + "pause/")
    assert paused.status_code == 200
    assert paused.data["enabled"] is False
    assert paused.data["next_fire_at"] is None
    assert paused.data["version"] == 2
    stored = Job.objects.get(pk=job["id"])
    assert (stored.enabled, stored.next_fire_at) == (False, None)

    # Pausing again is a no-op, not an error.
    again = admin_api.post(url + "pause/")
    assert again.status_code == 200 and again.data["version"] == 2

    before = timezone.now()
    resumed = admin_api.post(url + "resume/")
    assert resumed.status_code == 200
    assert resumed.data["enabled"] is True
    fire = dt(resumed.data["next_fire_at"])
    assert before < fire <= before + timedelta(seconds=61)
    assert resumed.data["version"] == 3


def test_trigger_creates_a_pending_api_execution(admin_api):
    job = create(admin_api, {**INTERVAL, "queue": "heavy", "priority": 3})
    admin_api.post(f"/api/jobs/{job['id']}/pause/")  # a paused job can still be run by hand
    before = timezone.now()
    response = admin_api.post(f"/api/jobs/{job['id']}/trigger/")
    assert response.status_code == 201
    execution = JobExecution.objects.get(pk=response.data["id"])
    assert execution.job_id == job["id"]
    assert execution.status == S.PENDING
    assert execution.trigger == "api"
    assert execution.attempt == 1
    assert (execution.queue, execution.priority) == ("heavy", 3)
    assert execution.triggered_by_id == admin_api.user.pk
    assert before <= execution.scheduled_for <= timezone.now()
    assert response.data["triggered_by"] == admin_api.user.username


# --- cancel / retry ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [S.PENDING, S.RETRY_SCHEDULED])
def test_cancel_waiting_execution(admin_api, status):
    execution = make_execution(make_job(), status)
    response = admin_api.post(f"/api/executions/{execution.pk}/cancel/")
    assert response.status_code == 200
    assert response.data["status"] == S.CANCELLED
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED
    assert execution.finished_at is not None
    assert admin_api.user.username in execution.reason


def test_cancel_running_execution_requests_cancellation(admin_api):
    execution = make_execution(make_job(), S.RUNNING, node="node-a", claim_token="tok")
    response = admin_api.post(f"/api/executions/{execution.pk}/cancel/")
    assert response.status_code == 200
    assert response.data["status"] == S.RUNNING
    assert response.data["cancel_requested"] is True
    execution.refresh_from_db()
    assert (execution.status, execution.cancel_requested) == (S.RUNNING, True)


@pytest.mark.parametrize(
    "status", [S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.LOST, S.SKIPPED]
)
def test_cancel_finished_execution_is_409(admin_api, status):
    execution = make_execution(make_job(), status)
    response = admin_api.post(f"/api/executions/{execution.pk}/cancel/")
    assert response.status_code == 409
    assert response.data["code"] == "not_allowed"
    assert response.data["detail"] == ERR_CANNOT_CANCEL.format(status=status)
    execution.refresh_from_db()
    assert execution.status == status
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("status", [S.FAILED, S.TIMED_OUT, S.LOST, S.CANCELLED])
def test_retry_creates_the_next_attempt_once(admin_api, status):
    slot = timezone.now() - timedelta(hours=1)
    original = make_execution(make_job(), status, scheduled_for=slot)
    response = admin_api.post(f"/api/executions/{original.pk}/retry/")
    assert response.status_code == 201, response.data
    retry = JobExecution.objects.get(pk=response.data["id"])
    assert retry.pk != original.pk
    assert retry.attempt == 2
    assert retry.scheduled_for == slot
    assert retry.status == S.PENDING
    assert retry.trigger == "retry"
    original.refresh_from_db()
    assert original.status == status  # the old row keeps its outcome

    again = admin_api.post(f"/api/executions/{original.pk}/retry/")
    assert again.status_code == 409
    assert again.data["detail"] == ERR_ALREADY_RETRIED
    assert JobExecution.objects.filter(job=original.job).count() == 2


@pytest.mark.parametrize("status", [S.PENDING, S.RUNNING, S.SUCCEEDED, S.SKIPPED])
def test_retry_of_non_retryable_execution_is_409(admin_api, status):
    execution = make_execution(make_job(), status)
    response = admin_api.post(f"/api/executions/{execution.pk}/retry/")
    assert response.status_code == 409
    assert response.data["detail"] == ERR_CANNOT_RETRY.format(status=status)
    assert JobExecution.objects.count() == 1


def test_retry_of_the_retry_makes_attempt_3(admin_api):
    original = make_execution(make_job(), S.FAILED)
    second = admin_api.post(f"/api/executions/{original.pk}/retry/").data
    JobExecution.objects.filter(pk=second["id"]).update(status=S.FAILED)
    third = admin_api.post(f"/api/executions/{second['id']}/retry/")
    assert third.status_code == 201
    assert third.data["attempt"] == 3


# --- nodes --------------------------------------------------------------------------------------


def make_node(status: str = "active") -> SchedulerNode:
    now = timezone.now()
    return SchedulerNode.objects.create(
        node_id=f"node-{status}",
        hostname="h",
        pid=1,
        started_at=now,
        last_heartbeat=now,
        status=status,
    )


def test_drain_is_idempotent(admin_api):
    node = make_node()
    first = admin_api.post(f"/api/nodes/{node.pk}/drain/")
    assert first.status_code == 200
    assert first.data["drain_requested"] is True
    again = admin_api.post(f"/api/nodes/{node.pk}/drain/")
    assert again.status_code == 200
    assert AuditEvent.objects.filter(action="node.drain").count() == 1


@pytest.mark.parametrize("status", ["draining", "dead", "stopped"])
def test_drain_of_an_inactive_node_is_409(admin_api, status):
    node = make_node(status)
    response = admin_api.post(f"/api/nodes/{node.pk}/drain/")
    assert response.status_code == 409
    assert response.data["detail"] == ERR_NODE_NOT_RUNNING.format(node=node.node_id, status=status)
    node.refresh_from_db()
    assert node.drain_requested is False
    assert not AuditEvent.objects.exists()


def test_cluster_state(admin_api):
    make_node()
    make_node("dead")
    LeadershipTerm.objects.create(term=4, node_id="node-active", acquired_at=timezone.now())
    data = admin_api.get("/api/cluster/").data
    assert (data["leader"], data["term"]) == ("node-active", 4)
    assert data["nodes"] == {"active": 1, "dead": 1}


# --- filters, pagination, search, ordering -------------------------------------------------------


@pytest.fixture
def executions(db):
    base = datetime(2030, 1, 1, tzinfo=UTC)
    alpha, beta = make_job(name="alpha"), make_job(name="beta")
    rows = {
        "a1": make_execution(alpha, S.FAILED, scheduled_for=base, node="n1"),
        "a2": make_execution(
            alpha, S.SUCCEEDED, scheduled_for=base + timedelta(hours=1), node="n2"
        ),
        "a3": make_execution(alpha, S.PENDING, scheduled_for=base + timedelta(hours=2)),
        "b1": make_execution(beta, S.FAILED, scheduled_for=base + timedelta(hours=1), node="n1"),
        "b2": make_execution(beta, S.RUNNING, scheduled_for=base + timedelta(hours=3), node="n2"),
    }
    return {"base": base, "alpha": alpha, "beta": beta, **rows}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", {"a1", "a2", "a3", "b1", "b2"}),
        ("job={alpha}", {"a1", "a2", "a3"}),
        ("job_name=beta", {"b1", "b2"}),
        ("status=failed", {"a1", "b1"}),
        ("status=failed&status=running", {"a1", "b1", "b2"}),
        ("status=failed&job={beta}", {"b1"}),
        ("node=n1", {"a1", "b1"}),
        ("node=n2&status=succeeded", {"a2"}),
        ("scheduled_after=2030-01-01T01:00:00Z", {"a2", "a3", "b1", "b2"}),
        ("scheduled_before=2030-01-01T01:00:00Z", {"a1"}),
        (
            "scheduled_after=2030-01-01T01:00:00Z&scheduled_before=2030-01-01T03:00:00Z",
            {"a2", "a3", "b1"},
        ),
    ],
)
def test_execution_filters(admin_api, executions, query, expected):
    url = "/api/executions/?" + query.format(
        alpha=executions["alpha"].pk, beta=executions["beta"].pk
    )
    response = admin_api.get(url)
    assert response.status_code == 200
    ids = {row["id"] for row in response.data["results"]}
    assert ids == {executions[key].pk for key in expected}
    assert response.data["count"] == len(expected)


@pytest.mark.parametrize("query", ["status=bogus", "scheduled_after=yesterday", "job=not-a-number"])
def test_execution_bad_filter_is_400(admin_api, executions, query):
    assert admin_api.get("/api/executions/?" + query).status_code == 400


def test_executions_are_newest_first(admin_api, executions):
    slots = [dt(r["scheduled_for"]) for r in admin_api.get("/api/executions/").data["results"]]
    assert slots == sorted(slots, reverse=True)


def test_pagination(admin_api):
    for index in range(7):
        make_job(name=f"job-{index}")
    first = admin_api.get("/api/jobs/?page_size=3").data
    assert first["count"] == 7
    assert [j["name"] for j in first["results"]] == ["job-0", "job-1", "job-2"]
    assert first["previous"] is None
    assert "page=2" in first["next"]
    last = admin_api.get("/api/jobs/?page_size=3&page=3").data
    assert [j["name"] for j in last["results"]] == ["job-6"]
    assert last["next"] is None
    assert admin_api.get("/api/jobs/?page_size=3&page=4").status_code == 404
    # The default page size applies without page_size.
    assert len(admin_api.get("/api/jobs/").data["results"]) == 7


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("search=report", ["nightly-report"]),
        ("search=cleans", ["tmp-cleanup"]),
        ("search=sleep", ["heartbeat"]),
        ("enabled=false", ["tmp-cleanup"]),
        ("ordering=name", ["heartbeat", "nightly-report", "tmp-cleanup"]),
        ("ordering=-name", ["tmp-cleanup", "nightly-report", "heartbeat"]),
        ("ordering=-priority", ["tmp-cleanup", "heartbeat", "nightly-report"]),
        ("ordering=priority", ["nightly-report", "heartbeat", "tmp-cleanup"]),
    ],
)
def test_job_search_filter_and_ordering(admin_api, query, expected):
    make_job(name="nightly-report", priority=-5, task="noop")
    make_job(name="tmp-cleanup", priority=9, description="cleans /tmp", enabled=False)
    make_job(name="heartbeat", priority=1, task="sleep", args=[0])
    response = admin_api.get("/api/jobs/?" + query)
    assert response.status_code == 200
    assert [j["name"] for j in response.data["results"]] == expected


# --- schema and docs -----------------------------------------------------------------------------


def test_schema_is_openapi_3_and_lists_the_endpoints(admin_api):
    response = admin_api.get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/jobs/",
        "/api/jobs/{id}/",
        "/api/jobs/{id}/trigger/",
        "/api/executions/",
        "/api/executions/{id}/retry/",
        "/api/nodes/{id}/drain/",
        "/api/schedule-preview/",
    ):
        assert path in schema["paths"], path


ASSET_RE = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)", re.I)


@pytest.mark.parametrize(
    "url",
    [
        "/api/docs/",
        "/api/redoc/",
        "/api/jobs/",  # the browsable API
        "/api/executions/",
        "/api-auth/login/",
    ],
)
def test_docs_page_uses_only_local_assets(admin_api, url):
    response = admin_api.get(url, HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    html = response.content.decode()
    assets = ASSET_RE.findall(html)
    assert assets, "the page should load its UI from static files"
    for asset in assets:
        assert not re.match(r"^(https?:)?//", asset, re.I), asset
    assert not re.search(r"https?://(cdn|unpkg|cdnjs|fonts\.googleapis)", html, re.I)
    # And those assets are really served (vendored, not missing); Swagger UI's start-up script
    # is the docs page's own (?script), for the signed-in viewer of the page.
    for asset in assets:
        assert admin_api.get(asset).status_code == 200, asset


# --- schedule preview ----------------------------------------------------------------------------


def test_schedule_preview_cron(admin_api):
    response = admin_api.get(
        "/api/schedule-preview/",
        {"schedule_type": "cron", "cron_expression": "0 12 * * *", "timezone": "UTC", "count": 3},
    )
    assert response.status_code == 200
    fires = [dt(f) for f in response.data["next_fires"]]
    assert len(fires) == 3
    assert all((f.hour, f.minute) == (12, 0) for f in fires)
    assert fires == sorted(fires) and fires[0] > timezone.now()
    assert response.data["description"] == schedules.describe_schedule(
        schedule_type="cron", cron_expression="0 12 * * *", timezone="UTC"
    )


def test_schedule_preview_interval_and_once(admin_api):
    interval = admin_api.get(
        "/api/schedule-preview/", {"schedule_type": "interval", "interval_seconds": 3600}
    )
    assert interval.status_code == 200
    fires = [dt(f) for f in interval.data["next_fires"]]
    assert len(fires) == 5  # the default count
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(fires))
    assert interval.data["description"]

    run_at = future(days=2).replace(microsecond=0)
    once = admin_api.get("/api/schedule-preview/", {"schedule_type": "once", "run_at": iso(run_at)})
    assert once.status_code == 200
    assert [dt(f) for f in once.data["next_fires"]] == [run_at]


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        (
            {"schedule_type": "cron", "cron_expression": "* * *"},
            "cron_expression",
            schedules.ERR_CRON_FIELD_COUNT.format(count=3),
        ),
        (
            {"schedule_type": "cron", "cron_expression": "61 * * * *"},
            "cron_expression",
            schedules.ERR_CRON_OUT_OF_RANGE.format(field="minute", value=61, low=0, high=59),
        ),
        (
            {"schedule_type": "cron", "cron_expression": "* * * * *", "timezone": "Mars/Base"},
            "timezone",
            schedules.ERR_TIMEZONE_UNKNOWN.format(name="Mars/Base"),
        ),
        ({"schedule_type": "weekly"}, "schedule_type", None),
        ({}, "schedule_type", None),
        ({"schedule_type": "interval", "interval_seconds": "0"}, "interval_seconds", None),
        ({"schedule_type": "interval", "interval_seconds": "x"}, "interval_seconds", None),
        ({"schedule_type": "once"}, "run_at", None),
        ({"schedule_type": "once", "run_at": "2030-01-01T10:00:00"}, "run_at", None),
        (
            {"schedule_type": "interval", "interval_seconds": "60", "count": MAX_PREVIEW_COUNT + 1},
            "count",
            None,
        ),
        ({"schedule_type": "interval", "interval_seconds": "60", "count": "0"}, "count", None),
    ],
)
def test_schedule_preview_bad_input_is_400_naming_the_field(admin_api, params, field, message):
    response = admin_api.get("/api/schedule-preview/", params)
    assert response.status_code == 400, response.data
    assert field in response.data
    if message is not None:
        assert response.data[field] == [message]


# --- audit trail ---------------------------------------------------------------------------------


def _do_create(api, job, execution):
    assert (
        api.post("/api/jobs/", {**INTERVAL, "name": "audited-new"}, format="json").status_code
        == 201
    )
    return (
        "job.create",
        "job",
        None,
        {"name": [None, "audited-new"], "interval_seconds": [None, 60]},
    )


def _do_update(api, job, execution):
    body = {"priority": 4, "version": job.version}
    assert api.patch(f"/api/jobs/{job.pk}/", body, format="json").status_code == 200
    return "job.update", "job", job.pk, {"priority": [0, 4]}


def _do_delete(api, job, execution):
    assert api.delete(f"/api/jobs/{job.pk}/").status_code == 204
    return "job.delete", "job", job.pk, {"name": ["audited", None], "interval_seconds": [60, None]}


def _do_pause(api, job, execution):
    assert api.post(f"/api/jobs/{job.pk}/pause/").status_code == 200
    return "job.pause", "job", job.pk, {"enabled": [True, False]}


def _do_resume(api, job, execution):
    Job.objects.filter(pk=job.pk).update(enabled=False, next_fire_at=None)
    assert api.post(f"/api/jobs/{job.pk}/resume/").status_code == 200
    return "job.resume", "job", job.pk, {"enabled": [False, True]}


def _do_trigger(api, job, execution):
    response = api.post(f"/api/jobs/{job.pk}/trigger/")
    assert response.status_code == 201
    return "job.trigger", "job", job.pk, {"execution": [None, response.data["id"]]}


def _do_cancel(api, job, execution):
    assert api.post(f"/api/executions/{execution.pk}/cancel/").status_code == 200
    return "execution.cancel", "execution", execution.pk, {"status": [S.PENDING, S.CANCELLED]}


def _do_retry(api, job, execution):
    JobExecution.objects.filter(pk=execution.pk).update(status=S.FAILED)
    response = api.post(f"/api/executions/{execution.pk}/retry/")
    assert response.status_code == 201
    return "execution.retry", "execution", execution.pk, {"retry": [None, response.data["id"]]}


@pytest.mark.parametrize(
    "do",
    [
        _do_create,
        _do_update,
        _do_delete,
        _do_pause,
        _do_resume,
        _do_trigger,
        _do_cancel,
        _do_retry,
    ],
    ids=lambda f: f.__name__[4:],
)
def test_every_api_write_is_audited(api_client_for, do):
    api = api_client_for("admin")
    api.defaults["REMOTE_ADDR"] = CLIENT_ADDR
    job = make_job(name="audited")
    execution = make_execution(job)
    action, object_type, object_id, changes = do(api, job, execution)

    events = list(AuditEvent.objects.all())
    assert len(events) == 1
    event = events[0]
    assert event.action == action
    assert event.object_type == object_type
    if object_id is not None:
        assert event.object_id == str(object_id)
    assert event.actor_id == api.user.pk
    assert event.actor_name == api.user.username
    assert event.source == "api"
    assert event.remote_addr == CLIENT_ADDR
    for field, pair in changes.items():
        assert event.changes[field] == pair, field

    listed = api.get("/api/audit-events/?source=api").data["results"]
    assert [row["action"] for row in listed] == [action]


@pytest.mark.parametrize("url", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_signed_out_send_the_browser_to_sign_in(client, url):
    response = client.get(url, HTTP_ACCEPT="text/html")
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={url}"


def test_the_schema_signed_out_is_still_a_401(client):
    assert client.get("/api/schema/").status_code == 401


def test_the_dashboard_header_links_to_the_api_docs_and_the_admin(client, make_user):
    client.force_login(make_user("viewer", staff=True))
    html = client.get("/").content.decode()
    assert 'href="/api/docs/"' in html
    assert 'href="/admin/"' in html


@pytest.mark.django_db
def test_a_list_is_counted_no_further_than_its_cap(admin_api, monkeypatch):
    """Past COUNT_CAP a list says count_capped and counts the cap (the count reads no more rows
    than that); the pages reach the first COUNT_CAP rows."""
    from jobs.api import pagination

    for n in range(3):
        services.job_create(
            data={
                "name": f"capped-{n}",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 60,
            },
            by=services.SYSTEM,
        )
    listed = admin_api.get("/api/jobs/").json()
    assert (listed["count"], listed["count_capped"]) == (3, False)
    monkeypatch.setattr(pagination, "COUNT_CAP", 2)
    listed = admin_api.get("/api/jobs/?page_size=1").json()
    assert (listed["count"], listed["count_capped"], len(listed["results"])) == (2, True, 1)
    assert admin_api.get("/api/jobs/?page_size=1&page=2").status_code == 200
    assert admin_api.get("/api/jobs/?page_size=1&page=3").status_code == 404
