"""A webhook URL carries its credential (a token in the path or query, or user:password): only admins,
who edit the rules, read it whole. Everyone else sees its scheme and host in the admin; the audit
log never holds more than that, for anyone (the admin, /audit/, /api/audit-events/)."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.test import Client

from jobs import notifications
from jobs.models import AuditEvent, NotificationRule

SECRET = "T0KEN-s3cr3t-abc123"
URL = f"https://hooks.example.com/services/{SECRET}?sig={SECRET}"
RULES = "/admin/jobs/notificationrule/"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def login(make_user):
    def login(role: str) -> Client:
        client = Client()
        client.force_login(make_user(role, f"who-{role}"))
        return client

    return login


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (URL, "https://hooks.example.com/…"),
        ("http://user:pa55@hooks.example.com:8443/x", "http://…@hooks.example.com:8443/…"),
        ("https://hooks.example.com", "https://hooks.example.com"),
        ("https://hooks.example.com/", "https://hooks.example.com/"),
        ("https://hooks.example.com#frag", "https://hooks.example.com/…"),
        ("ops@example.com, dev@example.com", "ops@example.com, dev@example.com"),
        ("", ""),
    ],
)
def test_redact_url_keeps_scheme_and_host_only(url, shown):
    assert notifications.redact_url(url) == shown


def add_rule_in_the_admin(client: Client, target: str = URL) -> NotificationRule:
    response = client.post(
        f"{RULES}add/",
        {"name": "on-call", "events": ["failed"], "channel": "webhook", "target": target},
    )
    assert response.status_code == 302, response.content.decode()[:1000]
    return NotificationRule.objects.get(name="on-call")


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_below_admin_the_admin_pages_show_no_webhook_credential(login, role):
    rule = add_rule_in_the_admin(login("admin"))
    client = login(role)
    for url in (RULES, f"{RULES}{rule.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200
        body = page.content.decode()
        assert SECRET not in body, url
        assert "hooks.example.com" in body, url
    # Nor can the credential be guessed through the changelist's search.
    assert "on-call" not in client.get(RULES, {"q": SECRET[:6]}).content.decode()


def test_an_admin_reads_and_edits_the_whole_webhook_url(login):
    client = login("admin")
    rule = add_rule_in_the_admin(client)
    assert SECRET in client.get(f"{RULES}{rule.pk}/change/").content.decode()
    assert SECRET in client.get(RULES).content.decode()


def test_the_audit_log_never_holds_a_webhook_credential(login, api_client_for):
    admin = login("admin")
    rule = add_rule_in_the_admin(admin)
    response = admin.post(
        f"{RULES}{rule.pk}/change/",
        {
            "name": "on-call",
            "events": ["failed"],
            "channel": "webhook",
            "target": URL.replace(SECRET, SECRET[::-1]),
        },
    )
    assert response.status_code == 302
    created = AuditEvent.objects.get(action="notification_rule.create")
    assert created.changes["target"] == [None, "https://hooks.example.com/…"]
    updated = AuditEvent.objects.get(action="notification_rule.update")
    assert updated.changes["target"] == ["https://hooks.example.com/…"] * 2
    assert SECRET not in str(created.changes) and SECRET[::-1] not in str(updated.changes)
    # Whoever reads it, wherever.
    for client in (admin, login("viewer")):
        for url in (
            "/audit/",
            "/admin/jobs/auditevent/",
            f"/admin/jobs/auditevent/{created.pk}/change/",
        ):
            body = client.get(url).content.decode()
            assert SECRET not in body and SECRET[::-1] not in body, url
    for role in ("viewer", "admin"):
        body = api_client_for(role).get("/api/audit-events/").content.decode()
        assert "hooks.example.com" in body and SECRET not in body


def test_the_migration_redacts_webhook_urls_audited_before(db):
    old = AuditEvent.objects.create(
        action="notification_rule.update",
        object_type="notification_rule",
        object_id="1",
        source="admin",
        changes={"target": [URL, "ops@example.com"], "enabled": ["True", "False"]},
    )
    other = AuditEvent.objects.create(
        action="job.update",
        object_type="job",
        object_id="1",
        source="api",
        changes={"target": [URL, None]},
    )
    migration = importlib.import_module("jobs.migrations.0009_redact_audited_webhook_urls")
    migration.redact_audited_webhook_urls(apps, None)
    old.refresh_from_db()
    other.refresh_from_db()
    assert old.changes == {
        "target": ["https://hooks.example.com/…", "ops@example.com"],
        "enabled": ["True", "False"],
    }
    assert other.changes == {"target": [URL, None]}  # not a rule's: left alone
