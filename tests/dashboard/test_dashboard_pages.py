"""The server-rendered dashboard: logins, roles, actions through the services, forms, empty states.

Roles are enforced by the server on every action (viewer reads, operator operates, admin also
defines jobs); a refused action answers 403 and changes nothing. Every write is audited as "ui".
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.staticfiles import finders
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from dashboard import selectors as dashboard_selectors
from dashboard.live import payloads
from dashboard.views import common
from dashboard.views import executions as executions_views
from dashboard.views import jobs as jobs_views
from jobs import services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import SYSTEM
from jobs.states import ExecutionStatus

S = ExecutionStatus
PASSWORD = "pw-For-tests-1"  # what tests/conftest.py's make_user gives every user

# Every action form the dashboard may render, by the URL it posts to.
ACTION_FORM_RE = re.compile(r'action="[^"]*/(trigger|pause|resume|cancel|retry|drain|delete)/"')
ADMIN_LINK_RE = re.compile(r'href="/jobs/(new|\d+/edit|\d+/delete)/"')
ACTION_BUTTON_RE = re.compile(
    r"<button[^>]*>\s*(Run now|Pause|Resume|Cancel run|Retry|Drain|Delete job)"
)
ASSET_RE = re.compile(r"<(script|link)\b[^>]*?\b(src|href)=\"([^\"]+)\"", re.IGNORECASE)


# --- data -------------------------------------------------------------------------------------


@pytest.fixture
def data(db):
    now = timezone.now()
    job = services.job_create(
        data={
            "name": "nightly-report",
            "description": "Builds the nightly report.",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 3 * * *",
            "timezone": "Europe/Berlin",
        },
        by=SYSTEM,
    )
    paused = services.job_create(
        data={
            "name": "paused-poll",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "enabled": False,
        },
        by=SYSTEM,
    )

    def execution(**fields):
        fields.setdefault("scheduled_for", now)
        fields.setdefault("run_after", fields["scheduled_for"])
        return JobExecution.objects.create(job=job, **fields)

    pending = execution(status=S.PENDING)
    running = execution(
        scheduled_for=now - timedelta(minutes=1),
        status=S.RUNNING,
        node="node-a",
        term=3,
        claim_token="claim-token-xyz",
        started_at=now - timedelta(seconds=30),
        output="step 1 done\n",
    )
    failed = execution(
        scheduled_for=now - timedelta(minutes=20),
        status=S.FAILED,
        node="node-a",
        term=3,
        claim_token="claim-token-abc",
        started_at=now - timedelta(minutes=20) + timedelta(milliseconds=40),
        finished_at=now - timedelta(minutes=19),
        duration_ms=60000.0,
        error="ValueError: boom",
        traceback="Traceback (most recent call last):\n  ...\nValueError: boom",
    )
    succeeded = execution(
        scheduled_for=now - timedelta(minutes=30),
        status=S.SUCCEEDED,
        node="node-a",
        term=3,
        started_at=now - timedelta(minutes=30),
        finished_at=now - timedelta(minutes=29),
        duration_ms=1234.5,
        result={"rows": 42},
    )
    node = SchedulerNode.objects.create(
        node_id="node-a",
        hostname="host-a",
        pid=4242,
        queues=["default"],
        started_at=now - timedelta(hours=1),
        last_heartbeat=now,
        status=NodeStatus.ACTIVE,
        capacity=4,
        running_count=1,
    )
    LeadershipTerm.objects.create(
        term=2,
        node_id="node-b",
        acquired_at=now - timedelta(hours=1),
        ended_at=now - timedelta(minutes=10),
        end_reason="lease_lost",
    )
    LeadershipTerm.objects.create(term=3, node_id="node-a", acquired_at=now - timedelta(minutes=10))
    return SimpleNamespace(
        job=job,
        paused=paused,
        pending=pending,
        running=running,
        failed=failed,
        succeeded=succeeded,
        node=node,
    )


@pytest.fixture
def login(make_user):
    """A Django test Client signed in as a new user of ``role``."""

    def client(role, username=None):
        user = make_user(role, username or f"dash-{role or 'norole'}")
        browser = Client()
        browser.force_login(user)
        browser.user = user
        return browser

    return client


def read_pages(d) -> list[str]:
    return [
        "/",
        "/dashboard/stats.json",
        "/jobs/",
        f"/jobs/{d.job.pk}/",
        f"/jobs/{d.paused.pk}/",
        "/executions/",
        f"/executions/{d.running.pk}/",
        f"/executions/{d.failed.pk}/",
        f"/executions/{d.succeeded.pk}/",
        "/nodes/",
        f"/nodes/{d.node.pk}/",
        "/audit/",
    ]


def admin_pages(d) -> list[str]:
    return ["/jobs/new/", f"/jobs/{d.job.pk}/edit/", f"/jobs/{d.job.pk}/delete/"]


def html_pages(d) -> list[str]:
    return [p for p in read_pages(d) if not p.endswith(".json")]


def operator_actions(d) -> list[str]:
    return [
        f"/jobs/{d.job.pk}/trigger/",
        f"/jobs/{d.job.pk}/pause/",
        f"/jobs/{d.paused.pk}/resume/",
        f"/executions/{d.pending.pk}/cancel/",
        f"/executions/{d.failed.pk}/retry/",
        f"/nodes/{d.node.pk}/drain/",
    ]


def snapshot() -> tuple:
    return (
        list(Job.objects.order_by("pk").values()),
        list(JobExecution.objects.order_by("pk").values()),
        list(SchedulerNode.objects.order_by("pk").values()),
        list(AuditEvent.objects.order_by("pk").values_list("pk", flat=True)),
    )


def job_form_data(**overrides) -> dict:
    values = {
        "name": "hourly-sync",
        "description": "",
        "task": "noop",
        "args": "[]",
        "kwargs": "{}",
        "schedule_type": "cron",
        "cron_expression": "*/5 * * * *",
        "timezone": "Europe/Berlin",
        "interval_seconds": "",
        "start_at": "",
        "run_at": "",
        "viewer_timezone": "UTC",
        "enabled": "on",
        "misfire_policy": "run_once",
        "misfire_grace_seconds": "60",
        "run_all_max": "10",
        "concurrency_policy": "forbid",
        "max_concurrent": "",
        "rate_limit": "",
        "rate_period_seconds": "60",
        "max_retries": "2",
        "retry_backoff_base": "1",
        "retry_backoff_factor": "2",
        "retry_backoff_max": "300",
        "retry_jitter": "on",
        "timeout_seconds": "",
        "isolation": "thread",
        "queue": "default",
        "priority": "0",
        "spread_seconds": "0",
    }
    values.update(overrides)
    return {k: v for k, v in values.items() if v is not None}


def edit_form_data(job: Job, **overrides) -> dict:
    return job_form_data(
        name=job.name,
        description=job.description,
        cron_expression=job.cron_expression,
        timezone=job.timezone,
        version=str(job.version),
        **overrides,
    )


# --- login ------------------------------------------------------------------------------------


def test_every_page_and_action_requires_login(client, data):
    for path in [*read_pages(data), *admin_pages(data)]:
        response = client.get(path)
        assert response.status_code == 302, path
        location = urlsplit(response["Location"])
        assert location.path == "/login/", path
        assert parse_qs(location.query)["next"] == [path], path
    before = snapshot()
    for path in operator_actions(data):
        response = client.post(path)
        assert response.status_code == 302, path
        assert response["Location"].startswith("/login/?next="), path
    assert snapshot() == before


def test_login_page_signs_in_and_logout_is_post_only(client, make_user):
    make_user("viewer", "alice")
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'name="username"' in page.content
    assert b"csrfmiddlewaretoken" in page.content

    bad = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200
    assert b"alert--error" in bad.content

    good = client.post("/login/", {"username": "alice", "password": PASSWORD, "next": "/jobs/"})
    assert good.status_code == 302
    assert good["Location"] == "/jobs/"
    assert client.get("/jobs/").status_code == 200

    assert client.get("/logout/").status_code == 405  # a link cannot sign anyone out
    out = client.post("/logout/")
    assert out.status_code == 302
    assert out["Location"] == "/login/"
    assert client.get("/jobs/").status_code == 302


def test_a_user_without_a_role_is_refused(login, data):
    browser = login(None)
    for path in [*read_pages(data), *admin_pages(data)]:
        assert browser.get(path).status_code == 403, path


# --- pages for a viewer -----------------------------------------------------------------------


def test_viewer_sees_every_page_with_data(login, data):
    browser = login("viewer")
    for path in read_pages(data):
        response = browser.get(path)
        assert response.status_code == 200, path
    overview = browser.get("/").content.decode()
    assert "node-a" in overview
    assert "Leader" in overview and "term 3" in overview
    assert 'id="overview-data"' in overview
    jobs = browser.get("/jobs/").content.decode()
    assert "nightly-report" in jobs and "paused-poll" in jobs
    detail = browser.get(f"/executions/{data.failed.pk}/").content.decode()
    assert "ValueError: boom" in detail and "Traceback (most recent call last)" in detail
    assert "claim-token-abc" in detail
    running = browser.get(f"/executions/{data.running.pk}/").content.decode()
    assert "step 1 done" in running and "streaming while it runs" in running
    succeeded = browser.get(f"/executions/{data.succeeded.pk}/").content.decode()
    assert "&quot;rows&quot;: 42" in succeeded
    node = browser.get(f"/nodes/{data.node.pk}/").content.decode()
    assert "host-a" in node and f"/executions/{data.failed.pk}/" in node


def test_times_are_rendered_as_time_elements_with_utc(login, data):
    page = login("viewer").get(f"/jobs/{data.job.pk}/").content.decode()
    iso = data.job.next_fire_at.astimezone(UTC).isoformat()
    assert f'<time datetime="{iso}"' in page
    assert "UTC</time>" in page


def test_pages_render_their_empty_states(login, db):
    browser = login("viewer")
    expected = {
        "/": ["No nodes have registered yet", "No leader elected yet", "No executions yet"],
        "/jobs/": ["No jobs yet"],
        "/executions/": ["No executions yet"],
        "/nodes/": ["No nodes have registered yet"],
        "/audit/": ["Nothing has been changed yet"],
    }
    for path, texts in expected.items():
        response = browser.get(path)
        assert response.status_code == 200, path
        for text in texts:
            assert text in response.content.decode(), (path, text)
    stats = browser.get("/dashboard/stats.json").json()
    assert stats["counts"] == {
        "running": 0,
        "queued": 0,
        "catch_up": 0,
        "late": 0,
        "failed_last_hour": 0,
    }
    assert stats["cluster"]["nodes"] == [] and stats["cluster"]["leader"] is None


def test_job_detail_without_runs_and_filtered_empty_lists(login, data):
    browser = login("viewer")
    page = browser.get(f"/jobs/{data.paused.pk}/").content.decode()
    assert "No executions yet" in page and "No finished runs yet" in page
    assert (
        "No jobs match these filters" in browser.get("/jobs/?q=nothing-like-this").content.decode()
    )
    assert "No executions match these filters" in (
        browser.get("/executions/?status=lost").content.decode()
    )
    assert "No audit events match" in browser.get("/audit/?source=cli").content.decode()


def test_viewer_sees_no_action_buttons(login, data):
    browser = login("viewer")
    for path in html_pages(data):
        page = browser.get(path).content.decode()
        assert not ACTION_FORM_RE.search(page), path
        assert not ADMIN_LINK_RE.search(page), path
        assert not ACTION_BUTTON_RE.search(page), path


def test_operator_sees_operator_buttons_but_not_admin_ones(login, data):
    browser = login("operator")
    jobs = browser.get("/jobs/").content.decode()
    assert f'action="/jobs/{data.job.pk}/trigger/"' in jobs
    assert f'action="/jobs/{data.job.pk}/pause/"' in jobs
    assert not ADMIN_LINK_RE.search(jobs)
    assert f'action="/executions/{data.pending.pk}/cancel/"' in (
        browser.get(f"/executions/{data.pending.pk}/").content.decode()
    )
    assert f'action="/executions/{data.failed.pk}/retry/"' in (
        browser.get(f"/executions/{data.failed.pk}/").content.decode()
    )
    assert f'action="/nodes/{data.node.pk}/drain/"' in browser.get("/nodes/").content.decode()
    admin_jobs = login("admin").get(f"/jobs/{data.job.pk}/").content.decode()
    assert f'href="/jobs/{data.job.pk}/edit/"' in admin_jobs
    assert f'href="/jobs/{data.job.pk}/delete/"' in admin_jobs


# --- server-side role enforcement ---------------------------------------------------------------


def test_forged_posts_by_a_viewer_are_refused_and_change_nothing(login, data):
    browser = login("viewer")
    before = snapshot()
    for path in operator_actions(data):
        assert browser.post(path).status_code == 403, path
    assert browser.post("/jobs/new/", job_form_data()).status_code == 403
    edit = edit_form_data(data.job, priority="9")
    assert browser.post(f"/jobs/{data.job.pk}/edit/", edit).status_code == 403
    delete = {"version": data.job.version}
    assert browser.post(f"/jobs/{data.job.pk}/delete/", delete).status_code == 403
    for path in admin_pages(data):
        assert browser.get(path).status_code == 403, path
    assert snapshot() == before


def test_operator_may_not_create_edit_or_delete(login, data):
    browser = login("operator")
    before = snapshot()
    for path in admin_pages(data):
        assert browser.get(path).status_code == 403, path
    assert browser.post("/jobs/new/", job_form_data()).status_code == 403
    edit = edit_form_data(data.job, priority="9")
    assert browser.post(f"/jobs/{data.job.pk}/edit/", edit).status_code == 403
    delete = {"version": data.job.version}
    assert browser.post(f"/jobs/{data.job.pk}/delete/", delete).status_code == 403
    assert snapshot() == before


def ui_events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, source="ui"))


def test_operator_actions_go_through_the_services_and_are_audited(login, data):
    browser = login("operator")

    response = browser.post(f"/jobs/{data.job.pk}/trigger/", {"next": "/jobs/"})
    assert response.status_code == 302 and response["Location"] == "/jobs/"
    manual = JobExecution.objects.filter(job=data.job, trigger="manual").get()
    assert manual.triggered_by == browser.user
    assert ui_events("job.trigger")[0].actor_name == browser.user.username

    assert browser.post(f"/jobs/{data.job.pk}/pause/").status_code == 302
    assert Job.objects.get(pk=data.job.pk).enabled is False
    assert browser.post(f"/jobs/{data.paused.pk}/resume/").status_code == 302
    assert Job.objects.get(pk=data.paused.pk).enabled is True

    assert browser.post(f"/executions/{data.pending.pk}/cancel/").status_code == 302
    assert JobExecution.objects.get(pk=data.pending.pk).status == S.CANCELLED
    assert browser.post(f"/executions/{data.running.pk}/cancel/").status_code == 302
    assert JobExecution.objects.get(pk=data.running.pk).cancel_requested is True

    response = browser.post(f"/executions/{data.failed.pk}/retry/")
    retry = JobExecution.objects.get(
        job=data.job, scheduled_for=data.failed.scheduled_for, attempt=2
    )
    assert response.status_code == 302 and response["Location"] == f"/executions/{retry.pk}/"

    assert browser.post(f"/nodes/{data.node.pk}/drain/").status_code == 302
    assert SchedulerNode.objects.get(pk=data.node.pk).drain_requested is True

    for action in (
        "job.trigger",
        "job.pause",
        "job.resume",
        "execution.cancel",
        "execution.retry",
        "node.drain",
    ):
        assert ui_events(action), action
    assert not AuditEvent.objects.exclude(source__in=["ui", "system"]).exists()


def test_an_action_the_state_forbids_shows_the_reason_and_changes_nothing(login, data):
    browser = login("operator")
    before = snapshot()
    response = browser.post(f"/executions/{data.succeeded.pk}/retry/", follow=True)
    assert response.status_code == 200
    assert "Only a failed, timed-out, lost or cancelled execution can be retried" in (
        response.content.decode()
    )
    response = browser.post(f"/executions/{data.failed.pk}/cancel/", follow=True)
    assert "Cannot cancel an execution that is failed" in response.content.decode()
    assert snapshot() == before


def test_actions_are_post_only_and_refuse_off_site_redirects(login, data):
    browser = login("operator")
    assert browser.get(f"/jobs/{data.job.pk}/trigger/").status_code == 405
    response = browser.post(f"/jobs/{data.job.pk}/pause/", {"next": "https://evil.example/"})
    assert response["Location"] == f"/jobs/{data.job.pk}/"
    assert browser.post("/jobs/999999/trigger/").status_code == 404


# --- the job form -------------------------------------------------------------------------------


def test_admin_creates_a_job_through_the_form(login, db):
    browser = login("admin")
    page = browser.get("/jobs/new/")
    assert page.status_code == 200
    assert b'name="cron_expression"' in page.content and b'id="schedule-preview"' in page.content

    response = browser.post("/jobs/new/", job_form_data(args="[]", kwargs="{}"))
    job = Job.objects.get(name="hourly-sync")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.cron_expression == "*/5 * * * *" and job.timezone == "Europe/Berlin"
    assert job.max_retries == 2 and job.enabled is True and job.next_fire_at is not None
    assert job.created_by == browser.user
    event = AuditEvent.objects.get(action="job.create", object_id=str(job.pk))
    assert event.source == "ui" and event.actor_name == browser.user.username


def test_dates_typed_in_the_form_are_read_in_the_viewers_time_zone(login, db):
    browser = login("admin")
    response = browser.post(
        "/jobs/new/",
        job_form_data(
            name="one-off",
            schedule_type="once",
            cron_expression="",
            timezone="",
            run_at="2031-01-15T10:30:00",
            viewer_timezone="Europe/Berlin",
        ),
    )
    assert response.status_code == 302
    job = Job.objects.get(name="one-off")
    assert job.run_at == datetime(2031, 1, 15, 9, 30, tzinfo=UTC)  # 10:30 CET
    assert job.cron_expression == "" and job.timezone == "UTC"


def test_interval_job_with_json_arguments(login, db):
    browser = login("admin")
    response = browser.post(
        "/jobs/new/",
        job_form_data(
            name="napper",
            task="sleep",
            args="[0.5]",
            schedule_type="interval",
            interval_seconds="90",
            cron_expression="",
            timezone="",
        ),
    )
    assert response.status_code == 302
    job = Job.objects.get(name="napper")
    assert job.args == [0.5] and job.interval_seconds == 90 and job.schedule_type == "interval"


def test_invalid_cron_shows_the_field_error_and_writes_nothing(login, db):
    browser = login("admin")
    before = snapshot()
    response = browser.post("/jobs/new/", job_form_data(cron_expression="61 * * * *"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "field--invalid" in page and 'data-field-name="cron_expression"' in page
    assert "minute" in page  # the cron engine's message names the bad field
    assert snapshot() == before


def test_bad_json_and_bad_zone_are_field_errors(login, db):
    browser = login("admin")
    before = snapshot()
    response = browser.post("/jobs/new/", job_form_data(args="[1,", timezone="Mars/Olympus"))
    assert response.status_code == 200
    assert "Must be valid JSON" in response.content.decode()
    response = browser.post("/jobs/new/", job_form_data(timezone="Mars/Olympus"))
    assert response.status_code == 200
    assert "Mars/Olympus" in response.content.decode()
    assert "field--invalid" in response.content.decode()
    assert snapshot() == before


def test_admin_edits_a_job_with_its_version(login, data):
    browser = login("admin")
    page = browser.get(f"/jobs/{data.job.pk}/edit/").content.decode()
    assert f'name="version" value="{data.job.version}"' in page
    response = browser.post(f"/jobs/{data.job.pk}/edit/", edit_form_data(data.job, priority="7"))
    assert response.status_code == 302
    job = Job.objects.get(pk=data.job.pk)
    assert job.priority == 7 and job.version == data.job.version + 1
    event = AuditEvent.objects.get(action="job.update", object_id=str(job.pk))
    assert event.source == "ui" and "priority" in event.changes


def test_a_stale_edit_shows_the_conflict_and_writes_nothing(login, data):
    browser = login("admin")
    stale = edit_form_data(data.job, priority="7")  # carries version 1
    services.job_update(
        job_id=data.job.pk, expected_version=data.job.version, changes={"priority": 3}, by=SYSTEM
    )
    before = snapshot()
    response = browser.post(f"/jobs/{data.job.pk}/edit/", stale)
    assert response.status_code == 409
    page = response.content.decode()
    assert "The job was changed by someone else" in page
    assert 'id="version-conflict"' in page
    assert snapshot() == before
    assert Job.objects.get(pk=data.job.pk).priority == 3


def test_delete_asks_for_confirmation_and_checks_the_version(login, data):
    browser = login("admin")
    confirm = browser.get(f"/jobs/{data.job.pk}/delete/")
    assert confirm.status_code == 200 and b"Delete job" in confirm.content
    assert Job.objects.filter(pk=data.job.pk).exists()  # GET deletes nothing

    services.job_pause(job_id=data.job.pk, by=SYSTEM)  # bumps the version
    before = snapshot()
    browser.post(f"/jobs/{data.job.pk}/delete/", {"version": data.job.version})
    assert snapshot() == before

    current = Job.objects.get(pk=data.job.pk).version
    response = browser.post(f"/jobs/{data.job.pk}/delete/", {"version": current})
    assert response.status_code == 302 and response["Location"] == "/jobs/"
    assert not Job.objects.filter(pk=data.job.pk).exists()
    assert AuditEvent.objects.get(action="job.delete", object_id=str(data.job.pk)).source == "ui"


# --- CSRF and assets ----------------------------------------------------------------------------


def test_csrf_is_enforced_on_every_form(make_user, data):
    admin = make_user("admin", "csrf-admin")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin)
    before = snapshot()
    posts = [
        ("/jobs/new/", job_form_data()),
        (f"/jobs/{data.job.pk}/edit/", edit_form_data(data.job, priority="5")),
        (f"/jobs/{data.job.pk}/delete/", {"version": data.job.version}),
        *[(path, {}) for path in operator_actions(data)],
        ("/logout/", {}),
    ]
    for path, body in posts:
        assert browser.post(path, body).status_code == 403, path
    assert snapshot() == before
    anonymous = Client(enforce_csrf_checks=True)
    assert (
        anonymous.post("/login/", {"username": "csrf-admin", "password": PASSWORD}).status_code
        == 403
    )


def test_pages_load_only_local_assets(login, client, data):
    browser = login("admin")
    pages = [*html_pages(data), *admin_pages(data)]
    bodies = [browser.get(path).content.decode() for path in pages]
    bodies.append(client.get("/login/").content.decode())
    seen = set()
    for body in bodies:
        for _tag, _attr, url in ASSET_RE.findall(body):
            assert not re.match(r"^(https?:)?//", url), url
            seen.add(url)
    scripts = {u for u in seen if u.endswith(".js")}
    assert "/static/dashboard/js/live.js" in scripts
    for url in seen:
        assert url.startswith("/static/"), url
        assert finders.find(url.removeprefix("/static/")), url


# --- filters and data views ---------------------------------------------------------------------


def test_job_list_search_filters_and_sorting(login, data):
    browser = login("viewer")
    page = browser.get("/jobs/?q=nightly").content.decode()
    assert "nightly-report" in page and "paused-poll" not in page
    page = browser.get("/jobs/?enabled=no").content.decode()
    assert "paused-poll" in page and "nightly-report" not in page
    page = browser.get("/jobs/?schedule_type=interval").content.decode()
    assert "paused-poll" in page and "nightly-report" not in page
    page = browser.get("/jobs/?outcome=never").content.decode()
    assert "paused-poll" in page and "nightly-report" not in page
    page = browser.get("/jobs/?task=noop&sort=-name").content.decode()
    assert page.index("paused-poll") < page.index("nightly-report")
    assert browser.get("/jobs/?sort=nonsense&page=99").status_code == 200


def test_execution_list_filters(login, data):
    browser = login("viewer")
    page = browser.get("/executions/?status=failed").content.decode()
    assert f'data-execution-id="{data.failed.pk}"' in page
    assert f'data-execution-id="{data.succeeded.pk}"' not in page
    page = browser.get(f"/executions/?job={data.paused.pk}").content.decode()
    assert "data-execution-id=" not in page
    since = (timezone.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    page = browser.get(f"/executions/?since={since}&tz=UTC&node=node-a").content.decode()
    assert f'data-execution-id="{data.running.pk}"' in page
    assert f'data-execution-id="{data.failed.pk}"' not in page


def test_execution_detail_shows_the_attempt_chain(login, data):
    retry = services.execution_retry(execution_id=data.failed.pk, by=SYSTEM)
    page = login("viewer").get(f"/executions/{data.failed.pk}/").content.decode()
    assert f'href="/executions/{retry.pk}/"' in page
    assert 'data-attempt="2"' in page


def test_audit_log_shows_changes_as_before_and_after(login, data):
    services.job_update(
        job_id=data.job.pk, expected_version=data.job.version, changes={"priority": 5}, by=SYSTEM
    )
    browser = login("viewer")
    page = browser.get("/audit/?action=job.update").content.decode()
    assert "<code>priority</code>" in page
    assert '<td class="diff__before">0</td>' in page and '<td class="diff__after">5</td>' in page
    assert f'href="/jobs/{data.job.pk}/"' in page
    page = browser.get(f"/audit/?object_type=job&object_id={data.paused.pk}").content.decode()
    assert "paused-poll" in page and "<code>job.update</code>" not in page


def test_stats_json_counts_and_chart_buckets(login, data):
    stats = login("viewer").get("/dashboard/stats.json").json()
    assert stats["counts"] == {
        "running": 1,
        "queued": 1,
        "catch_up": 0,
        "late": 0,
        "failed_last_hour": 1,
    }
    buckets = stats["minutes"]["buckets"]
    outcomes = {}
    for bucket in buckets:
        for status, n in bucket["outcomes"].items():
            outcomes[status] = outcomes.get(status, 0) + n
    assert outcomes == {"failed": 1, "succeeded": 1}
    assert sum(b["dur_n"] for b in buckets) == 2
    # Lag by start minute: the running one started 30 s late, the failed one 40 ms, one on time.
    assert sum(b["lag_n"] for b in buckets) == 3
    assert max(b["lag_max"] for b in buckets) == pytest.approx(30000, abs=1)
    assert sum(b["lag_sum"] for b in buckets) == pytest.approx(30040, abs=1)
    assert stats["cluster"]["leader"] == "node-a" and stats["cluster"]["term"] == 3
    assert [t["term"] for t in stats["cluster"]["terms"]] == [3, 2]


def test_the_charts_read_only_the_minutes_not_yet_settled(data):
    """A minute over for SETTLED_AFTER_S is kept by the process: a second look reads the runs of
    the minutes since (a row written late into a settled minute shows after a restart, which
    clearing the cache stands for)."""
    now = timezone.now()

    def outcomes() -> dict[str, int]:
        found: dict[str, int] = {}
        for bucket in dashboard_selectors.execution_minutes(now=now)["buckets"]:
            for status, n in bucket["outcomes"].items():
                found[status] = found.get(status, 0) + n
        return found

    assert outcomes() == {"failed": 1, "succeeded": 1}
    for minutes_ago in (30, 0):  # one in a settled minute, one in the current one
        slot = now - timedelta(minutes=minutes_ago)
        JobExecution.objects.create(
            job=data.job,
            scheduled_for=slot - timedelta(seconds=1),
            run_after=slot,
            status=S.LOST,
            finished_at=slot,
        )
    with CaptureQueriesContext(connection) as captured:
        assert outcomes() == {"failed": 1, "succeeded": 1, "lost": 1}
    assert len(captured) == 2  # the unsettled minutes' finished runs, and their starts
    dashboard_selectors.settled_minutes.clear()
    assert outcomes() == {"failed": 1, "succeeded": 1, "lost": 2}


def test_editing_a_one_off_that_already_fired_keeps_its_run_at(login, data):
    fired_at = timezone.now() - timedelta(days=2)
    job = services.job_create(
        data={
            "name": "fired-once",
            "task": "noop",
            "schedule_type": "once",
            "run_at": (timezone.now() + timedelta(hours=1)).isoformat(),
        },
        by=SYSTEM,
    )
    Job.objects.filter(pk=job.pk).update(run_at=fired_at, last_fire_at=fired_at, next_fire_at=None)
    job.refresh_from_db()
    browser = login("admin")
    page = browser.get(f"/jobs/{job.pk}/edit/").content.decode()
    shown = fired_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert f'value="{shown}"' in page  # UTC until the page script converts it
    body = job_form_data(
        name=job.name,
        schedule_type="once",
        cron_expression="",
        timezone="",
        run_at=shown,
        priority="4",
        version=str(job.version),
    )
    response = browser.post(f"/jobs/{job.pk}/edit/", body)
    assert response.status_code == 302, response.content.decode()
    job.refresh_from_db()
    assert job.priority == 4 and job.run_at == fired_at and job.next_fire_at is None


# --- a run's output as a file --------------------------------------------------------------------


def test_a_runs_output_downloads_as_a_text_file(data, login) -> None:
    response = login("viewer").get(f"/executions/{data.running.pk}/output.txt")
    assert response.status_code == 200
    assert response.content == b"step 1 done\n"
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="execution-{data.running.pk}-output.txt"'
    )


def test_the_output_download_needs_a_role_and_a_run(data, login) -> None:
    signed_out = Client().get(f"/executions/{data.running.pk}/output.txt")
    assert signed_out.status_code == 302 and "/login/" in signed_out["Location"]
    assert login(None, "nobody").get(f"/executions/{data.running.pk}/output.txt").status_code == 403
    assert login("viewer").get("/executions/999999/output.txt").status_code == 404


def test_a_running_run_shows_how_long_it_has_run_and_links_its_output(data, login) -> None:
    page = login("viewer").get(f"/executions/{data.running.pk}/").content.decode()
    assert re.search(r'data-field="elapsed-row"(?! hidden)', page)
    assert f'href="/executions/{data.running.pk}/output.txt" download' in page
    done = login("viewer", "v2").get(f"/executions/{data.failed.pk}/").content.decode()
    assert 'data-field="elapsed-row" hidden' in done


def test_the_audit_log_names_runs_readably(data, login) -> None:
    services.execution_cancel(execution_id=data.pending.pk, by=SYSTEM)
    event = AuditEvent.objects.get(action="execution.cancel")
    assert event.object_repr == f"nightly-report run #{data.pending.pk}"
    # A row recorded before labels were readable is shown readably too.
    AuditEvent.objects.create(
        action="execution.retry",
        object_type="execution",
        object_id=str(data.failed.pk),
        object_repr=f"{data.job.pk}@2026-11-30T22:11:14.487680+00:00#1",
        changes={},
    )
    page = login("viewer").get("/audit/").content.decode()
    assert f"nightly-report run #{data.pending.pk}" in page
    assert f">run #{data.failed.pk}<" in page
    assert "@2026-11-30T22:11:14" not in page


def test_a_manual_run_says_why_it_has_no_term_and_the_job_shows_its_last_run(data, login) -> None:
    manual = services.job_trigger(job_id=data.job.pk, by=SYSTEM)
    browser = login("viewer")
    page = browser.get(f"/executions/{manual.pk}/").content.decode()
    assert "none: not fired by a leader" in page
    scheduled = browser.get(f"/executions/{data.pending.pk}/").content.decode()
    assert "none: not fired by a leader" not in scheduled
    job_page = browser.get(f"/jobs/{data.job.pk}/").content.decode()
    assert re.search(
        rf'data-field="last_run"><a href="/executions/{manual.pk}/">#{manual.pk}</a>', job_page
    )
    assert "Last scheduled fire" in job_page


@pytest.mark.parametrize(
    ("query", "expect_key"),
    [("nightly", None), ("#{running}", "running"), ("zzz-nothing", "")],
)
def test_the_executions_list_searches_text(data, login, query, expect_key) -> None:
    query = query.format(running=data.running.pk)
    page = login("viewer").get("/executions/", {"q": query}).content.decode()
    shown = set(map(int, re.findall(r'<tr[^>]*data-execution-id="(\d+)"', page)))
    if expect_key is None:
        assert {data.running.pk, data.pending.pk, data.failed.pk} <= shown
    elif expect_key == "":
        assert shown == set()
    else:
        assert shown == {getattr(data, expect_key).pk}
    assert 'data-prepend="false"' in page


def test_the_executions_search_reads_nodes_too(data, login) -> None:
    page = login("viewer").get("/executions/", {"q": "node-a"}).content.decode()
    shown = set(map(int, re.findall(r'<tr[^>]*data-execution-id="(\d+)"', page)))
    assert data.running.pk in shown
    assert shown == set(JobExecution.objects.filter(node="node-a").values_list("pk", flat=True))


def test_the_overview_shows_the_leaders_word_while_the_schedule_is_behind(login, data, monkeypatch):
    """The banner is rendered hidden while the cluster keeps up, and with the leader's figures and
    reasons while its presence says it is behind (the live feed's cluster frame carries the same)."""
    browser = login("viewer")
    page = browser.get("/").content.decode()
    assert 'id="cluster-behind" role="status" aria-live="polite" hidden' in page
    monkeypatch.setattr(
        payloads,
        "leader_behind",
        lambda leader: {
            "since": 1_800_000_000.0,
            "fires_s": 0,
            "claims_s": 31,
            "waiting": 212,
            "why": [
                "claims: 212 due runs in queue 'reports' waiting unclaimed, the oldest 31.0 s",
                "no live node serves queue 'reports'",
            ],
        },
    )
    page = browser.get("/").content.decode()
    assert 'id="cluster-behind" role="status" aria-live="polite">' in page
    assert "fires 0 s, claims 31 s late, 212 due runs waiting" in page
    assert "no live node serves queue &#x27;reports&#x27;" in page


def test_a_list_counts_no_further_than_its_cap(login, data, monkeypatch):
    """Past COUNT_CAP the list says "more than" the cap and its count reads no more rows than
    that (a LIMIT in the count's subquery); below it the exact count, which the live feed keeps."""
    browser = login("viewer")
    page = browser.get("/executions/").content.decode()
    assert "<span data-live-total>4</span> in all" in page
    monkeypatch.setattr(common, "COUNT_CAP", 3)
    with CaptureQueriesContext(connection) as captured:
        page = browser.get("/executions/").content.decode()
    assert "more than 3 in all: narrow the filters to reach older ones" in page
    assert "data-live-total" not in page
    [count] = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert "LIMIT 4" in count.upper(), count
    assert (
        "<span data-live-total>1</span> in all"
        in browser.get("/executions/?status=failed").content.decode()
    )


def test_the_run_lists_job_filter_is_typed_when_there_are_many_jobs(login, data, monkeypatch):
    """A few jobs: a list of names. Many: a name or an id typed in, an unknown one matching no run
    (never every run)."""
    browser = login("viewer")
    page = browser.get("/executions/").content.decode()
    assert '<select id="f-job" name="job">' in page
    monkeypatch.setattr(executions_views, "JOB_CHOICES_LIMIT", 1)
    page = browser.get("/executions/").content.decode()
    assert '<input type="search" id="f-job" name="job" value=""' in page
    assert "nightly-report" not in page.split('id="f-job"')[1].split("</div>")[0]
    by_name = browser.get("/executions/?job=nightly-report").content.decode()
    by_id = browser.get(f"/executions/?job={data.job.pk}").content.decode()
    for listed in (by_name, by_id):
        assert f"/executions/{data.failed.pk}/" in listed
        assert "<span data-live-total>4</span> in all" in listed
    unknown = browser.get("/executions/?job=no-such-job").content.decode()
    assert 'value="no-such-job"' in unknown
    assert f"/executions/{data.failed.pk}/" not in unknown
    assert "data-live-total" not in unknown


def test_a_costly_list_is_counted_one_row_past_its_page(login, data, monkeypatch):
    """A text search, or the jobs' outcome filter, judges each row: such a list is counted only
    far enough to offer the next page; the sort by outcome is offered while the jobs are few."""
    browser = login("viewer")
    with CaptureQueriesContext(connection) as captured:
        page = browser.get("/jobs/?q=nightly").content.decode()
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(*) FROM (SELECT" in q["sql"]]
    # The header's count of every job (capped), then the search's.
    assert len(counts) == 2 and "LIKE" in counts[1] and "LIMIT 52" in counts[1].upper(), counts
    assert "<span data-live-total>1</span> in all" in page
    with CaptureQueriesContext(connection) as captured:
        browser.get("/executions/?q=boom&page=2")
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(*) FROM (SELECT" in q["sql"]]
    assert len(counts) == 1 and "LIMIT 102" in counts[0].upper(), counts

    assert '<option value="outcome"' in browser.get("/jobs/").content.decode()
    monkeypatch.setattr(jobs_views, "OUTCOME_SORT_LIMIT", 1)  # two jobs: too many to sort so
    page = browser.get("/jobs/?sort=outcome").content.decode()
    assert '<option value="outcome"' not in page
    assert '<option value="name" selected>' in page
