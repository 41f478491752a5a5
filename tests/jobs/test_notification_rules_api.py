"""Notification rules in the API (read by viewers with webhook URLs redacted, written by admins,
audited) and in jobs export / apply (by name, jobs and rules in one transaction)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs import notification_rules, services
from jobs.models import AuditEvent, Job, NotificationRule

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/services/T000/B000/secret-token"


@pytest.fixture
def job():
    return services.job_create(
        data={
            "name": "nightly",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )


def body(**over):
    return {
        "name": "ops-hook",
        "job": "nightly",
        "events": ["failed", "late_start"],
        "late_after_seconds": 30,
        "channel": "webhook",
        "target": HOOK,
        **over,
    }


def test_admins_write_rules_viewers_read_them_redacted(admin_api, api_client_for, job) -> None:
    made = admin_api.post("/api/notification-rules/", body(), format="json")
    assert made.status_code == 201, made.content
    assert made.data["job"] == job.pk and made.data["job_name"] == "nightly"
    assert made.data["target"] == HOOK  # an admin reads it whole
    viewer = api_client_for("viewer")
    seen = viewer.get(f"/api/notification-rules/{made.data['id']}/")
    assert seen.status_code == 200 and seen.data["target"] == "https://hooks.example.com/…"
    assert viewer.post("/api/notification-rules/", body(name="x"), format="json").status_code == 403
    changed = admin_api.patch(
        f"/api/notification-rules/{made.data['id']}/", {"enabled": False}, format="json"
    )
    assert changed.status_code == 200 and changed.data["enabled"] is False
    assert changed.data["events"] == ["failed", "late_start"]  # the rest kept
    audit = AuditEvent.objects.filter(object_type="notification_rule").order_by("pk")
    assert [a.action for a in audit] == ["notification_rule.create", "notification_rule.update"]
    assert "secret-token" not in json.dumps([a.changes for a in audit])
    gone = admin_api.delete(f"/api/notification-rules/{made.data['id']}/")
    assert gone.status_code == 204 and not NotificationRule.objects.exists()


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"events": ["exploded"]}, "events"),
        ({"events": ["late_start"], "late_after_seconds": None}, "late_after_seconds"),
        ({"channel": "pigeon"}, "channel"),
        ({"target": "ftp://x"}, "target"),
        ({"job": "no-such-job"}, "job"),
        ({"enabled": "yes"}, "enabled"),
        ({"colour": "red"}, "colour"),
        ({"name": ""}, "name"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field(admin_api, job, over, field) -> None:
    response = admin_api.post("/api/notification-rules/", body(**over), format="json")
    assert response.status_code == 400 and field in response.data, response.data
    assert not NotificationRule.objects.exists()


def test_export_and_apply_carry_the_rules_by_name(job, tmp_path) -> None:
    notification_rules.rule_save(data=body(), by=services.SYSTEM)
    out = io.StringIO()
    call_command("jobs", "export", "--format", "json", stdout=out)
    document = json.loads(out.getvalue())
    assert document["notification_rules"][0]["job"] == "nightly"
    # A fresh installation: the file creates the job and the rule naming it.
    NotificationRule.objects.all().delete()
    Job.objects.all().delete()
    path = tmp_path / "all.json"
    path.write_text(json.dumps(document))
    out = io.StringIO()
    call_command("jobs", "apply", str(path), stdout=out)
    assert "created   notification rule ops-hook" in out.getvalue()
    rule = NotificationRule.objects.get()
    assert rule.job.name == "nightly" and rule.target == HOOK and rule.late_after_seconds == 30
    # Applied again: unchanged. A bad rule refuses the whole file, jobs included.
    out = io.StringIO()
    call_command("jobs", "apply", str(path), stdout=out)
    assert "notification rules: 0 created, 0 updated, 1 unchanged" in out.getvalue()
    document["jobs"][0]["description"] = "changed"
    document["notification_rules"][0]["channel"] = "pigeon"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match=r"ops-hook\.channel") as caught:
        call_command("jobs", "apply", str(path))
    assert caught.value.returncode == 2
    assert Job.objects.get(name="nightly").description == ""
    # A dry run says what it would do and writes nothing.
    document["notification_rules"][0].update(channel="webhook", enabled=False)
    path.write_text(json.dumps(document))
    out = io.StringIO()
    call_command("jobs", "apply", str(path), "--dry-run", stdout=out)
    assert "(dry run) updated   notification rule ops-hook" in out.getvalue()
    assert NotificationRule.objects.get().enabled is True
    assert Job.objects.get(name="nightly").description == ""
