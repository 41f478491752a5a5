"""The role matrix of the REST API (docs/security.md): who may call which endpoint, and what a refusal leaves.

anonymous -> 401 everywhere; authenticated without a role -> 403 everywhere; viewer reads;
operator also triggers, pauses, resumes, cancels, retries and drains; admin does everything.
A refused write changes nothing: no row differs and no AuditEvent is written.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from jobs.models import AuditEvent, Job, JobExecution
from jobs.states import ExecutionStatus
from tests.conftest import api_key_for

PASSWORD = "pw-For-tests-1"  # the password tests/conftest.py's make_user gives every user
ROLES = ["anonymous", "norole", "viewer", "operator", "admin"]

READ, OPERATE, ADMIN_WRITE = "read", "operate", "admin"


def _full_definition(name: str) -> dict:
    return {
        "name": name,
        "task": "noop",
        "schedule_type": "interval",
        "interval_seconds": 120,
    }


# (id, method, url template, kind, expected status when allowed, body)
ENDPOINTS = [
    ("api-root", "get", "/api/", READ, 200, None),
    ("jobs-list", "get", "/api/jobs/", READ, 200, None),
    ("jobs-detail", "get", "/api/jobs/{job}/", READ, 200, None),
    ("jobs-create", "post", "/api/jobs/", ADMIN_WRITE, 201, _full_definition("created-job")),
    (
        "jobs-put",
        "put",
        "/api/jobs/{job}/",
        ADMIN_WRITE,
        200,
        {**_full_definition("role-job"), "version": 1},
    ),
    ("jobs-patch", "patch", "/api/jobs/{job}/", ADMIN_WRITE, 200, {"priority": 5, "version": 1}),
    ("jobs-delete", "delete", "/api/jobs/{job}/", ADMIN_WRITE, 204, None),
    ("jobs-trigger", "post", "/api/jobs/{job}/trigger/", OPERATE, 201, None),
    ("jobs-pause", "post", "/api/jobs/{job}/pause/", OPERATE, 200, None),
    ("jobs-resume", "post", "/api/jobs/{paused}/resume/", OPERATE, 200, None),
    ("executions-list", "get", "/api/executions/", READ, 200, None),
    ("executions-detail", "get", "/api/executions/{pending}/", READ, 200, None),
    ("executions-cancel", "post", "/api/executions/{pending}/cancel/", OPERATE, 200, None),
    ("executions-retry", "post", "/api/executions/{failed}/retry/", OPERATE, 201, None),
    ("nodes-list", "get", "/api/nodes/", READ, 200, None),
    ("nodes-detail", "get", "/api/nodes/{node}/", READ, 200, None),
    ("nodes-drain", "post", "/api/nodes/{node}/drain/", OPERATE, 200, None),
    ("terms-list", "get", "/api/terms/", READ, 200, None),
    ("terms-detail", "get", "/api/terms/{term}/", READ, 200, None),
    ("cluster", "get", "/api/cluster/", READ, 200, None),
    ("audit-list", "get", "/api/audit-events/", READ, 200, None),
    ("audit-detail", "get", "/api/audit-events/{audit}/", READ, 200, None),
    (
        "schedule-preview",
        "get",
        "/api/schedule-preview/?schedule_type=cron&cron_expression=*/5+*+*+*+*&timezone=UTC",
        READ,
        200,
        None,
    ),
    ("schema", "get", "/api/schema/", READ, 200, None),
    ("docs", "get", "/api/docs/", READ, 200, None),
    ("redoc", "get", "/api/redoc/", READ, 200, None),
]
# Pages a browser opens: signed out, they send it to sign in (302) rather than answer 401.
SIGN_IN_FIRST = {"/api/docs/", "/api/redoc/"}


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def expected_status(role: str, kind: str, allowed_status: int) -> int:
    if role == "anonymous":
        return 401
    if role == "norole":
        return 403
    allowed = {
        "viewer": {READ},
        "operator": {READ, OPERATE},
        "admin": {READ, OPERATE, ADMIN_WRITE},
    }[role]
    return allowed_status if kind in allowed else 403


def _matrix():
    # The schema and docs pages (drf-spectacular views) are included: they take
    # SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"], not DEFAULT_PERMISSION_CLASSES, so they need
    # their own check that login is required (docs/security.md: everywhere but health and metrics).
    for role in ROLES:
        for endpoint in ENDPOINTS:
            yield pytest.param(role, *endpoint[1:], id=f"{role}-{endpoint[0]}")


@pytest.fixture
def world(db):
    """One of everything an endpoint acts on, in a state where the action is allowed."""
    now = timezone.now()
    job = Job.objects.create(
        name="role-job",
        task="noop",
        schedule_type="interval",
        interval_seconds=60,
        next_fire_at=now + timedelta(seconds=60),
    )
    paused = Job.objects.create(
        name="paused-job", task="noop", schedule_type="interval", interval_seconds=60, enabled=False
    )
    pending = JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, status=ExecutionStatus.PENDING
    )
    slot = now - timedelta(minutes=5)
    failed = JobExecution.objects.create(
        job=job, scheduled_for=slot, run_after=slot, status=ExecutionStatus.FAILED
    )
    node = SchedulerNode.objects.create(
        node_id="node-a",
        hostname="host-a",
        pid=123,
        started_at=now,
        last_heartbeat=now,
        status=NodeStatus.ACTIVE,
    )
    term = LeadershipTerm.objects.create(term=7, node_id="node-a", acquired_at=now)
    audit = AuditEvent.objects.create(
        action="job.create", object_type="job", object_id=str(job.pk), source="system"
    )
    return {
        "job": job.pk,
        "paused": paused.pk,
        "pending": pending.pk,
        "failed": failed.pk,
        "node": node.pk,
        "term": term.pk,
        "audit": audit.pk,
    }


def client_for(role: str, api_client_for) -> APIClient:
    if role == "anonymous":
        return APIClient()
    return api_client_for(None if role == "norole" else role)


def snapshot() -> dict:
    """Everything a write could touch (AuditEvent by its rows, so a new one shows)."""
    return {
        "jobs": list(Job.objects.order_by("pk").values()),
        "executions": list(JobExecution.objects.order_by("pk").values()),
        "nodes": list(SchedulerNode.objects.order_by("pk").values()),
        "terms": list(LeadershipTerm.objects.order_by("pk").values()),
        "audit": list(AuditEvent.objects.order_by("pk").values_list("pk", flat=True)),
    }


@pytest.mark.parametrize(("role", "method", "url", "kind", "allowed_status", "body"), _matrix())
def test_role_matrix(world, api_client_for, role, method, url, kind, allowed_status, body):
    client = client_for(role, api_client_for)
    before = snapshot()
    response = getattr(client, method)(url.format(**world), body, format="json")
    want = expected_status(role, kind, allowed_status)
    if role == "anonymous" and url in SIGN_IN_FIRST:
        want = 302
    assert response.status_code == want, (response.status_code, getattr(response, "data", None))
    after = snapshot()
    if want >= 400 or method == "get":
        # A refused request, or a read, changes nothing at all.
        assert after == before
    else:
        # An allowed write did change something and left exactly one audit row.
        assert after != before
        assert len(after["audit"]) == len(before["audit"]) + 1
        event = AuditEvent.objects.latest("pk")
        assert event.source == "api"
        assert event.actor_id == client.user.pk


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("post", "/api/executions/"),
        ("put", "/api/executions/{pending}/"),
        ("delete", "/api/executions/{pending}/"),
        ("post", "/api/nodes/"),
        ("delete", "/api/nodes/{node}/"),
        ("post", "/api/terms/"),
        ("post", "/api/audit-events/"),
        ("delete", "/api/audit-events/{audit}/"),
        ("post", "/api/cluster/"),
        ("post", "/api/schedule-preview/"),
    ],
)
def test_read_only_resources_refuse_writes_even_for_admin(world, admin_api, method, url):
    before = snapshot()
    response = getattr(admin_api, method)(url.format(**world), {}, format="json")
    assert response.status_code == 405
    assert snapshot() == before


@pytest.mark.parametrize("url", ["/health/live", "/health/ready"])
def test_health_is_public(db, url):
    assert APIClient().get(url).status_code == 200


def test_anonymous_gets_401_with_www_authenticate(world):
    response = APIClient().get("/api/jobs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")


@pytest.mark.parametrize("method", ["get", "post"])
def test_deactivated_users_token_is_refused(world, api_client_for, method):
    client = api_client_for("admin")
    client.user.is_active = False
    client.user.save()
    before = snapshot()
    url = "/api/jobs/" if method == "get" else f"/api/jobs/{world['job']}/pause/"
    response = getattr(client, method)(url)
    assert response.status_code == 401
    assert snapshot() == before


def test_unknown_token_is_refused(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert client.get("/api/jobs/").status_code == 401


def test_role_removed_takes_effect_on_next_request(world, api_client_for):
    client = api_client_for("operator")
    assert client.get("/api/jobs/").status_code == 200
    client.user.groups.clear()
    assert client.get("/api/jobs/").status_code == 403


def test_superuser_without_group_is_admin(world, make_user):
    user = make_user(None, "root")
    user.is_superuser = True
    user.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_key_for(user)}")
    response = client.post("/api/jobs/", _full_definition("by-superuser"), format="json")
    assert response.status_code == 201


# --- CSRF on session-authenticated writes --------------------------------------------------------


def session_client(make_user, role: str) -> APIClient:
    user = make_user(role, f"session-{role}")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client: APIClient) -> str:
    response = client.get("/api-auth/login/")
    assert response.status_code == 200
    return client.cookies["csrftoken"].value


@pytest.mark.parametrize(
    ("role", "method", "url", "body", "ok"),
    [
        ("operator", "post", "/api/jobs/{job}/pause/", None, 200),
        ("operator", "post", "/api/executions/{pending}/cancel/", None, 200),
        ("admin", "post", "/api/jobs/", _full_definition("csrf-job"), 201),
        ("admin", "patch", "/api/jobs/{job}/", {"priority": 3, "version": 1}, 200),
        ("admin", "delete", "/api/jobs/{job}/", None, 204),
    ],
)
def test_session_write_needs_csrf_token(world, make_user, role, method, url, body, ok):
    client = session_client(make_user, role)
    before = snapshot()
    refused = getattr(client, method)(url.format(**world), body, format="json")
    assert refused.status_code == 403
    assert "CSRF" in str(refused.data["detail"])
    assert snapshot() == before

    token = csrf_token(client)
    accepted = getattr(client, method)(
        url.format(**world), body, format="json", HTTP_X_CSRFTOKEN=token
    )
    assert accepted.status_code == ok, accepted.data if hasattr(accepted, "data") else accepted
    assert len(snapshot()["audit"]) == len(before["audit"]) + 1


def test_session_write_with_wrong_csrf_token_is_refused(world, make_user):
    client = session_client(make_user, "operator")
    csrf_token(client)
    before = snapshot()
    response = client.post(f"/api/jobs/{world['job']}/pause/", HTTP_X_CSRFTOKEN="x" * 32)
    assert response.status_code == 403
    assert snapshot() == before


def test_session_reads_need_no_csrf_token(world, make_user):
    client = session_client(make_user, "viewer")
    assert client.get("/api/jobs/").status_code == 200


def test_session_viewer_with_csrf_token_still_cannot_write(world, make_user):
    client = session_client(make_user, "viewer")
    token = csrf_token(client)
    before = snapshot()
    response = client.post(f"/api/jobs/{world['job']}/pause/", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 403
    assert snapshot() == before


def test_token_auth_write_needs_no_csrf(world, make_user):
    user = make_user("operator", "token-op")
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_key_for(user)}")
    response = client.post(f"/api/jobs/{world['job']}/pause/")
    assert response.status_code == 200
    assert Job.objects.get(pk=world["job"]).enabled is False
