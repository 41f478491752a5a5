"""The Django admin under the scheduler roles: viewer reads, operator runs actions, admin edits.

Every admin write goes through jobs.services: validated like the API and audited with source "admin".
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.forms import BooleanField, SplitDateTimeField
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from jobs import schedules
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import ERR_VERSION_CONFLICT
from jobs.states import ExecutionStatus

S = ExecutionStatus
JOB_URL = "/admin/jobs/job/"
EXECUTION_URL = "/admin/jobs/jobexecution/"
CHANGELISTS = [
    "/admin/jobs/job/",
    "/admin/jobs/jobexecution/",
    "/admin/jobs/auditevent/",
    "/admin/cluster/schedulernode/",
    "/admin/cluster/leadershipterm/",
    "/admin/cluster/clusterfence/",
    "/admin/cluster/coordinationlease/",
]
STAFF_ROLES = ["viewer", "operator", "admin"]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff(make_user):
    """A test Client logged in as a staff user of the given role."""

    def login(role: str | None, *, is_staff: bool = True) -> Client:
        client = Client()
        client.force_login(make_user(role, f"staff-{role or 'none'}", staff=is_staff))
        return client

    return login


@pytest.fixture
def objects(db):
    now = timezone.now()
    job = Job.objects.create(
        name="admin-job",
        task="noop",
        schedule_type="interval",
        interval_seconds=60,
        next_fire_at=now + timedelta(seconds=60),
    )
    pending = JobExecution.objects.create(job=job, scheduled_for=now, run_after=now)
    slot = now - timedelta(hours=1)
    failed = JobExecution.objects.create(
        job=job, scheduled_for=slot, run_after=slot, status=S.FAILED
    )
    node = SchedulerNode.objects.create(
        node_id="node-a", hostname="h", pid=1, started_at=now, last_heartbeat=now
    )
    term = LeadershipTerm.objects.create(term=3, node_id="node-a", acquired_at=now)
    audit = AuditEvent.objects.create(
        action="job.create", object_type="job", object_id=str(job.pk), source="system"
    )
    return {
        "job": job,
        "pending": pending,
        "failed": failed,
        "node": node,
        "term": term,
        "audit": audit,
    }


def state() -> tuple:
    return (
        list(Job.objects.order_by("pk").values()),
        list(JobExecution.objects.order_by("pk").values()),
        list(SchedulerNode.objects.order_by("pk").values()),
        list(AuditEvent.objects.order_by("pk").values_list("pk", flat=True)),
    )


def form_data(client: Client, url: str, **overrides) -> dict:
    """The POST body the admin form at ``url`` would send with its initial values, plus overrides."""
    response = client.get(url)
    assert response.status_code == 200
    form = response.context["adminform"].form
    data: dict = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field, BooleanField):
            if value:
                data[name] = "on"
        elif isinstance(field, SplitDateTimeField):
            # As a browser sends it: the admin widgets render "%Y-%m-%d" and "%H:%M:%S".
            local = timezone.localtime(value) if value else None
            data[f"{name}_0"] = local.strftime("%Y-%m-%d") if local else ""
            data[f"{name}_1"] = local.strftime("%H:%M:%S") if local else ""
        else:
            data[name] = "" if value is None else str(getattr(value, "value", value))
    for name, value in overrides.items():
        if value is False:
            data.pop(name, None)
        elif value is True:
            data[name] = "on"
        else:
            data[name] = value
    data["_save"] = "Save"
    return data


# --- pages load for every role -------------------------------------------------------------------


@pytest.mark.parametrize("role", STAFF_ROLES)
@pytest.mark.parametrize("url", CHANGELISTS)
def test_changelists_load_for_every_role(staff, objects, role, url):
    response = staff(role).get(url)
    assert response.status_code == 200


@pytest.mark.parametrize("role", STAFF_ROLES)
@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("/admin/jobs/job/{}/change/", "job"),
        ("/admin/jobs/jobexecution/{}/change/", "failed"),
        ("/admin/jobs/auditevent/{}/change/", "audit"),
        ("/admin/cluster/schedulernode/{}/change/", "node"),
        ("/admin/cluster/leadershipterm/{}/change/", "term"),
    ],
)
def test_detail_pages_load_for_every_role(staff, objects, role, url, key):
    response = staff(role).get(url.format(objects[key].pk))
    assert response.status_code == 200


def test_admin_index_lists_the_apps_for_a_viewer(staff, objects):
    response = staff("viewer").get("/admin/")
    assert response.status_code == 200
    assert JOB_URL.encode() in response.content
    assert b"/admin/cluster/schedulernode/" in response.content


def test_non_staff_user_is_sent_to_login(staff, objects):
    client = staff("admin", is_staff=False)
    for url in ("/admin/", JOB_URL, f"{JOB_URL}add/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


def test_anonymous_is_sent_to_login(objects):
    response = Client().get(JOB_URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_role_sees_nothing(staff, objects):
    client = staff(None)
    assert client.get(JOB_URL).status_code == 403
    assert client.get(EXECUTION_URL).status_code == 403
    assert JOB_URL.encode() not in client.get("/admin/").content


# --- viewer and operator cannot edit -------------------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admin_may_add_or_change_jobs(staff, objects, role):
    client = staff(role)
    job = objects["job"]
    assert client.get(f"{JOB_URL}add/").status_code == 403
    assert client.get(f"{JOB_URL}{job.pk}/delete/").status_code == 403

    page = client.get(f"{JOB_URL}{job.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content  # read-only view, no save button
    assert b'name="name"' not in page.content  # no editable inputs

    before = state()
    post = client.post(f"{JOB_URL}{job.pk}/change/", {"name": "hijacked", "priority": "9"})
    assert post.status_code == 403
    post = client.post(f"{JOB_URL}add/", {"name": "new", "task": "noop"})
    assert post.status_code == 403
    post = client.post(f"{JOB_URL}{job.pk}/delete/", {"post": "yes"})
    assert post.status_code == 403
    assert state() == before


def test_admin_sees_an_editable_form(staff, objects):
    page = staff("admin").get(f"{JOB_URL}{objects['job'].pk}/change/")
    assert b'name="_save"' in page.content
    assert b'name="name"' in page.content


# --- admin creates, edits and deletes through the services ---------------------------------------


def test_admin_creates_a_job_through_the_form(staff, objects):
    client = staff("admin")
    data = form_data(
        client,
        f"{JOB_URL}add/",
        name="from-admin",
        task="log",
        args='["hello"]',
        schedule_type="cron",
        cron_expression="*/10 * * * *",
        timezone="Europe/Berlin",
        priority="3",
    )
    response = client.post(f"{JOB_URL}add/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = Job.objects.get(name="from-admin")
    assert (job.task, job.args, job.priority, job.timezone) == (
        "log",
        ["hello"],
        3,
        "Europe/Berlin",
    )
    assert job.next_fire_at is not None and job.next_fire_at > timezone.now()
    assert job.next_fire_at.minute % 10 == 0
    event = AuditEvent.objects.get(action="job.create", object_id=str(job.pk))
    assert event.source == "admin"
    assert event.actor_name == "staff-admin"
    assert event.remote_addr == "127.0.0.1"


def test_admin_creates_an_interval_job(staff, objects):
    client = staff("admin")
    data = form_data(
        client,
        f"{JOB_URL}add/",
        name="every-minute",
        task="noop",
        schedule_type="interval",
        interval_seconds="60",
    )
    response = client.post(f"{JOB_URL}add/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = Job.objects.get(name="every-minute")
    assert (job.interval_seconds, job.cron_expression, job.timezone) == (60, "", "UTC")
    assert job.next_fire_at is not None


def test_admin_creates_a_once_job(staff, objects):
    client = staff("admin")
    run_at = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    data = form_data(
        client,
        f"{JOB_URL}add/",
        name="one-off",
        task="noop",
        schedule_type="once",
        run_at_0=run_at.date().isoformat(),
        run_at_1=run_at.time().isoformat(),
    )
    response = client.post(f"{JOB_URL}add/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = Job.objects.get(name="one-off")
    assert job.run_at == run_at
    assert job.next_fire_at == run_at


def _yesterday() -> dict:
    day = (timezone.now() - timedelta(days=1)).date().isoformat()
    return {"schedule_type": "once", "cron_expression": "", "run_at_0": day, "run_at_1": "10:00:00"}


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"cron_expression": "* * *"},
            "cron_expression",
            schedules.ERR_CRON_FIELD_COUNT.format(count=3),
        ),
        (
            {"cron_expression": "0 0 30 2 *"},
            "cron_expression",
            schedules.ERR_CRON_NEVER_FIRES.format(expression="0 0 30 2 *"),
        ),
        (
            {"timezone": "Mars/Olympus"},
            "timezone",
            schedules.ERR_TIMEZONE_UNKNOWN.format(name="Mars/Olympus"),
        ),
        ({"task": "rm_rf"}, "task", None),
        ({"interval_seconds": "60"}, "interval_seconds", None),
        ({"queue": "Bad Queue"}, "queue", None),
        ({"name": "admin-job"}, "name", None),
        ({"task": "sleep", "args": '["abc"]'}, "args", None),
        ({"args": "not json"}, "args", None),
        ({"priority": "1000000"}, "priority", None),
        ({"timeout_seconds": "0"}, "timeout_seconds", None),
        (_yesterday(), "run_at", None),
    ],
)
def test_invalid_admin_form_shows_the_error_and_writes_nothing(
    staff, objects, overrides, field, message
):
    client = staff("admin")
    data = form_data(
        client,
        f"{JOB_URL}add/",
        **{
            "name": "bad-from-admin",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "* * * * *",
            **overrides,
        },
    )
    before = state()
    response = client.post(f"{JOB_URL}add/", data)
    assert response.status_code == 200  # the form again, with errors
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    if message is not None:
        assert message in errors[field]
        assert escape(message).encode() in response.content
    assert state() == before


def test_admin_edits_a_job_through_the_form(staff, objects):
    client = staff("admin")
    job = objects["job"]
    url = f"{JOB_URL}{job.pk}/change/"
    data = form_data(client, url, priority="7", description="edited")
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert (job.priority, job.description, job.version) == (7, "edited", 2)
    event = AuditEvent.objects.get(action="job.update")
    assert event.source == "admin"
    assert event.changes == {"priority": [0, 7], "description": ["", "edited"]}


def test_admin_switches_a_job_to_cron_through_the_form(staff, objects):
    client = staff("admin")
    job = objects["job"]
    url = f"{JOB_URL}{job.pk}/change/"
    # The form still posts the interval the job had: only the changed fields are submitted.
    data = form_data(client, url, schedule_type="cron", cron_expression="0 * * * *")
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert (job.schedule_type, job.cron_expression, job.interval_seconds) == (
        "cron",
        "0 * * * *",
        None,
    )


@pytest.mark.parametrize("fired", [False, True], ids=["due", "fired"])
def test_admin_edits_a_once_job_without_touching_run_at(staff, objects, fired):
    """A one-off job created through the API "due now" carries microseconds in run_at; the admin
    widgets show whole seconds. Editing only the description must keep run_at as it is."""
    now = timezone.now()
    run_at = (now - timedelta(days=1) if fired else now + timedelta(days=1)).replace(
        microsecond=123456
    )
    job = Job.objects.create(
        name="one-off",
        task="noop",
        schedule_type="once",
        run_at=run_at,
        next_fire_at=None if fired else run_at,
        last_fire_at=run_at if fired else None,
    )
    client = staff("admin")
    url = f"{JOB_URL}{job.pk}/change/"
    response = client.post(url, form_data(client, url, description="edited"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.description == "edited"
    assert job.run_at == run_at
    assert job.next_fire_at == (None if fired else run_at)


def test_admin_edit_with_a_stale_version_is_refused(staff, objects):
    client = staff("admin")
    job = objects["job"]
    url = f"{JOB_URL}{job.pk}/change/"
    data = form_data(client, url, priority="7")  # read at version 1
    Job.objects.filter(pk=job.pk).update(version=2, priority=1)  # someone else saved meanwhile
    before = state()
    response = client.post(url, data)
    assert response.status_code == 200
    assert (
        ERR_VERSION_CONFLICT.format(expected=1, current=2)
        in response.context["adminform"].form.non_field_errors()
    )
    assert state() == before


def test_admin_deletes_a_job_without_executions_through_the_services(staff, objects):
    client = staff("admin")
    job = objects["job"]
    JobExecution.objects.filter(job=job).delete()
    response = client.post(f"{JOB_URL}{job.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
    event = AuditEvent.objects.get(action="job.delete")
    assert (event.source, event.object_repr) == ("admin", "admin-job")


@pytest.mark.parametrize("how", ["delete_view", "delete_selected"])
def test_admin_deletes_a_job_with_executions(staff, objects, how):
    client = staff("admin")
    job = objects["job"]
    if how == "delete_view":
        response = client.post(f"{JOB_URL}{job.pk}/delete/", {"post": "yes"})
    else:
        response = client.post(
            JOB_URL, {"action": "delete_selected", "_selected_action": [job.pk], "post": "yes"}
        )
    assert response.status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JobExecution.objects.filter(job_id=job.pk).exists()
    assert AuditEvent.objects.filter(action="job.delete", source="admin").count() == 1


# --- actions -------------------------------------------------------------------------------------


def run_action(client: Client, url: str, action: str, *pks: int):
    return client.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks]})


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_job_actions_work_for_operator_and_admin(staff, objects, role):
    client = staff(role)
    job = objects["job"]
    listing = client.get(JOB_URL)
    for action in ("pause_jobs", "resume_jobs", "trigger_jobs"):
        assert f'value="{action}"'.encode() in listing.content

    assert run_action(client, JOB_URL, "pause_jobs", job.pk).status_code == 302
    job.refresh_from_db()
    assert (job.enabled, job.next_fire_at) == (False, None)

    assert run_action(client, JOB_URL, "resume_jobs", job.pk).status_code == 302
    job.refresh_from_db()
    assert job.enabled is True and job.next_fire_at is not None

    assert run_action(client, JOB_URL, "trigger_jobs", job.pk).status_code == 302
    execution = JobExecution.objects.filter(job=job).order_by("-pk").first()
    assert (execution.status, execution.trigger) == (S.PENDING, "manual")

    events = AuditEvent.objects.filter(source="admin").order_by("pk")
    assert [e.action for e in events] == ["job.pause", "job.resume", "job.trigger"]
    assert {e.actor_name for e in events} == {f"staff-{role}"}


@pytest.mark.parametrize(
    ("action", "already", "verb", "why"),
    [
        ("pause_jobs", False, "Paused", "already paused"),
        ("resume_jobs", True, "Resumed", "not paused"),
    ],
)
def test_admin_pause_and_resume_count_only_the_jobs_they_changed(
    staff, objects, action, already, verb, why
):
    from django.contrib.messages import get_messages

    client = staff("operator")
    job = objects["job"]
    other = Job.objects.create(
        name="admin-job-2", task="noop", schedule_type="interval", interval_seconds=60
    )
    Job.objects.filter(pk=job.pk).update(enabled=not already)
    Job.objects.filter(pk=other.pk).update(enabled=already)
    response = run_action(client, JOB_URL, action, job.pk, other.pk)
    assert response.status_code == 302
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert shown == [
        f"{verb} 1 job(s).",
        f"Unchanged 1 job(s) ({why}): admin-job-2.",
    ]
    assert AuditEvent.objects.filter(source="admin").count() == 1


@pytest.mark.parametrize("action", ["pause_jobs", "resume_jobs", "trigger_jobs", "delete_selected"])
def test_job_actions_are_not_offered_to_a_viewer(staff, objects, action):
    client = staff("viewer")
    listing = client.get(JOB_URL)
    assert f'value="{action}"'.encode() not in listing.content
    before = state()
    response = run_action(client, JOB_URL, action, objects["job"].pk)
    assert response.status_code in (200, 302, 403)
    assert state() == before


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_execution_actions_work_for_operator(staff, objects, role):
    client = staff(role)
    pending, failed = objects["pending"], objects["failed"]
    assert run_action(client, EXECUTION_URL, "cancel_executions", pending.pk).status_code == 302
    pending.refresh_from_db()
    assert pending.status == S.CANCELLED
    assert run_action(client, EXECUTION_URL, "retry_executions", failed.pk).status_code == 302
    retry = JobExecution.objects.get(job=failed.job, scheduled_for=failed.scheduled_for, attempt=2)
    assert retry.trigger == "retry"
    assert set(AuditEvent.objects.filter(source="admin").values_list("action", flat=True)) == {
        "execution.cancel",
        "execution.retry",
    }


def test_refused_execution_action_is_reported_not_raised(staff, objects):
    client = staff("operator")
    finished = objects["failed"]
    before = state()
    response = client.post(
        EXECUTION_URL,
        {"action": "cancel_executions", "_selected_action": [str(finished.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert f"#{finished.pk}".encode() in response.content  # the warning names the execution
    assert state() == before


@pytest.mark.parametrize("action", ["cancel_executions", "retry_executions"])
def test_execution_actions_are_refused_for_a_viewer(staff, objects, action):
    client = staff("viewer")
    assert f'value="{action}"'.encode() not in client.get(EXECUTION_URL).content
    before = state()
    run_action(client, EXECUTION_URL, action, objects["pending"].pk, objects["failed"].pk)
    assert state() == before


def test_node_drain_action(staff, objects):
    node = objects["node"]
    viewer = staff("viewer")
    before = state()
    run_action(viewer, "/admin/cluster/schedulernode/", "drain_nodes", node.pk)
    assert state() == before

    operator = staff("operator")
    response = run_action(operator, "/admin/cluster/schedulernode/", "drain_nodes", node.pk)
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.drain_requested is True
    assert node.status == NodeStatus.ACTIVE
    assert AuditEvent.objects.get(action="node.drain").source == "admin"


def test_admin_session_writes_need_the_csrf_token(make_user, objects):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("admin", "csrf-admin"))
    before = state()
    response = client.post(
        JOB_URL, {"action": "pause_jobs", "_selected_action": [objects["job"].pk]}
    )
    assert response.status_code == 403
    assert state() == before


# --- read-only models ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "key"),
    [
        (EXECUTION_URL, "failed"),
        ("/admin/jobs/auditevent/", "audit"),
        ("/admin/cluster/schedulernode/", "node"),
        ("/admin/cluster/leadershipterm/", "term"),
    ],
)
def test_read_only_models_even_for_admin(staff, objects, base, key):
    client = staff("admin")
    pk = objects[key].pk
    assert client.get(f"{base}add/").status_code == 403
    assert client.get(f"{base}{pk}/delete/").status_code == 403
    page = client.get(f"{base}{pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert b'value="delete_selected"' not in client.get(base).content
    before = state()
    assert client.post(f"{base}{pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{base}{pk}/change/", {"status": "succeeded"}).status_code == 403
    run_action(client, base, "delete_selected", pk)
    assert state() == before


# --- API keys ---------------------------------------------------------------------------------------


def test_the_admin_lists_api_keys_by_prefix_never_their_digest_and_revokes_audited(staff):
    from django.contrib.auth import get_user_model

    from jobs import tokens
    from jobs.models import ApiToken
    from jobs.services import SYSTEM

    admin = staff("admin")
    user = get_user_model().objects.get(username="staff-admin")
    key, token = tokens.issue(user, by=SYSTEM, name="deploy")
    page = admin.get("/admin/jobs/apitoken/")
    assert page.status_code == 200
    body = page.content.decode()
    assert token.prefix in body and "deploy" in body
    assert token.digest not in body and key not in body
    detail = admin.get(f"/admin/jobs/apitoken/{token.pk}/change/").content.decode()
    assert token.digest not in detail and key not in detail
    assert admin.get("/admin/jobs/apitoken/add/").status_code == 403
    # REST framework's clear-text token table is not in the admin.
    assert admin.get("/admin/authtoken/tokenproxy/").status_code == 404
    # A viewer cannot revoke; an admin can, and it is audited (source admin).
    viewer = staff("viewer")
    assert (
        viewer.post(f"/admin/jobs/apitoken/{token.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    response = admin.post(f"/admin/jobs/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    event = AuditEvent.objects.get(action="token.revoke")
    assert (event.source, event.actor_name) == ("admin", "staff-admin")
    assert key not in str(event.changes)


def test_admin_sets_a_queue_and_an_operator_pauses_it_audited(staff, objects):
    client = staff("admin")
    response = client.post(
        "/admin/jobs/queue/add/",
        {"name": "reports", "max_concurrent": "4", "rate_limit": "", "rate_period_seconds": "60"},
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    from jobs.models import Queue

    queue = Queue.objects.get(name="reports")
    assert (queue.max_concurrent, queue.rate_limit, queue.paused) == (4, None, False)
    assert AuditEvent.objects.get(action="queue.update", object_id="reports").source == "admin"
    operator = staff("operator")
    assert operator.get("/admin/jobs/queue/").status_code == 200
    response = operator.post(
        "/admin/jobs/queue/",
        {"action": "pause_queues", "_selected_action": ["reports"]},
    )
    assert response.status_code == 302
    assert Queue.objects.get(name="reports").paused is True
    assert AuditEvent.objects.filter(action="queue.pause", object_id="reports").exists()


def test_a_job_another_chains_to_is_not_deleted_from_the_admin(staff, objects):
    from jobs import services

    target = services.job_create(
        data={
            "name": "chained-to",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )
    services.job_create(
        data={
            "name": "chains-it",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "on_success": ["chained-to"],
        },
        by=services.SYSTEM,
    )
    client = staff("admin")
    response = client.post(f"{JOB_URL}{target.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert Job.objects.filter(pk=target.pk).exists()
    assert "chains-it" in response.content.decode()
    response = client.post(
        JOB_URL,
        {"action": "delete_selected", "_selected_action": [target.pk], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    assert Job.objects.filter(pk=target.pk).exists()


def test_bad_queue_settings_in_the_admin_are_refused_by_field(staff, objects):
    from jobs.models import Queue

    client = staff("admin")
    response = client.post(
        "/admin/jobs/queue/add/",
        {"name": "Bad Name", "max_concurrent": "0", "rate_limit": "", "rate_period_seconds": "0"},
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert {"name", "max_concurrent", "rate_period_seconds"} <= set(errors), errors
    assert not Queue.objects.exists()
    client.post(
        "/admin/jobs/queue/add/",
        {"name": "reports", "max_concurrent": "2", "rate_limit": "", "rate_period_seconds": "60"},
    )
    response = client.post("/admin/jobs/queue/reports/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Queue.objects.exists()
    assert AuditEvent.objects.filter(action="queue.delete", object_id="reports").exists()
