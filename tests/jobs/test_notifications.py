"""Notifications against a local receiver: a rule tells a webhook (or e-mail addresses) once per run
whose final attempt failed, timed out, was lost or skipped, once per recovery (a success after a
failure) and once per run that started later than it allows; a failed send is retried with
backoff, then recorded as failed with its error; every message is recorded."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from jobs import notifications, services
from jobs.models import (
    Job,
    JobExecution,
    Notification,
    NotificationRule,
    NotificationStatus,
)
from jobs.services import SYSTEM
from jobs.states import ExecutionStatus as S

pytestmark = pytest.mark.django_db


class Receiver:
    """A webhook receiver on a free loopback port: records each POST, answers ``statuses`` in
    turn (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict, dict]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), json.loads(body)))
                receiver.raw = body
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def make_job(name: str) -> Job:
    return services.job_create(
        data={"name": name, "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=SYSTEM,
    )


SLOTS = itertools.count()


def ended(job: Job, status: str, *, attempt: int = 1, error: str = "") -> JobExecution:
    now = timezone.now()
    return JobExecution.objects.create(
        job=job,
        scheduled_for=now.replace(microsecond=0) - timedelta(seconds=next(SLOTS)),
        run_after=now,
        attempt=attempt,
        status=status,
        finished_at=now,
        error=error,
        node="node-a",
    )


def rule(target: str, *, events: list[str], job: Job | None = None, channel: str = "webhook"):
    return NotificationRule.objects.create(
        name=f"rule-{NotificationRule.objects.count()}",
        job=job,
        events=events,
        channel=channel,
        target=target,
    )


def test_a_failed_run_is_posted_once_to_the_webhook(receiver, settings) -> None:
    settings.SCHEDULER_BASE_URL = "https://scheduler.example.com"
    job = make_job("nightly")
    rule(receiver.url, events=["failed", "timed_out"])
    run = ended(job, S.FAILED, error="RuntimeError: boom")
    ended(job, S.SUCCEEDED)
    notifier = notifications.Notifier()

    assert notifier.run_once(timezone.now()) == (1, 1)
    (headers, body) = receiver.requests[0]
    assert headers["Content-Type"] == "application/json"
    assert body["event"] == "failed"
    assert body["job"] == {"id": job.pk, "name": "nightly", "task": "noop"}
    assert body["execution"]["id"] == run.pk
    assert body["execution"]["error"] == "RuntimeError: boom"
    assert body["execution"]["url"] == f"https://scheduler.example.com/executions/{run.pk}/"
    record = Notification.objects.get()
    assert (record.status, record.attempts, record.execution_id) == ("sent", 1, run.pk)

    # Looked at again (and by a new leader's notifier): nothing is sent twice.
    assert notifier.run_once(timezone.now())[1] == 0
    assert notifications.Notifier().run_once(timezone.now())[1] == 0
    assert len(receiver.requests) == 1 and Notification.objects.count() == 1


def test_a_failed_send_is_retried_with_backoff_then_recorded_failed(receiver) -> None:
    job = make_job("flaky-hook")
    rule(receiver.url, events=["lost"])
    ended(job, S.LOST)
    receiver.statuses = [500, 503]
    notifier = notifications.Notifier()
    now = timezone.now()
    assert notifier.run_once(now) == (1, 0)
    record = Notification.objects.get()
    assert (record.status, record.attempts) == (NotificationStatus.PENDING, 1)
    assert record.last_error == "RuntimeError: the webhook answered HTTP 500"
    assert record.next_attempt_at == now + timedelta(seconds=notifications.BACKOFF_S)
    assert notifications.deliver(now + timedelta(seconds=1)) == 0  # not due yet
    assert notifications.deliver(now + timedelta(seconds=5)) == 0  # 503
    assert notifications.deliver(now + timedelta(seconds=16)) == 1
    record.refresh_from_db()
    assert (record.status, record.attempts, record.last_error) == ("sent", 3, "")
    assert len(receiver.requests) == 3


def test_a_send_that_keeps_failing_ends_failed_with_its_error() -> None:
    job = make_job("nobody-listens")
    rule("http://127.0.0.1:9/nothing-here", events=["failed"])
    ended(job, S.FAILED)
    now = timezone.now()
    notifications.Notifier().collect(now)
    for i in range(notifications.MAX_ATTEMPTS):
        notifications.deliver(now + timedelta(seconds=1000 * i))
    record = Notification.objects.get()
    assert record.status == NotificationStatus.FAILED
    assert record.attempts == notifications.MAX_ATTEMPTS
    assert "URLError" in record.last_error


def test_only_the_final_attempt_is_told_about(receiver) -> None:
    job = make_job("retried")
    rule(receiver.url, events=["failed"])
    first = ended(job, S.FAILED)
    JobExecution.objects.create(
        job=job,
        scheduled_for=first.scheduled_for,
        run_after=timezone.now(),
        attempt=2,
        status=S.RETRY_SCHEDULED,
    )
    assert notifications.Notifier().run_once(timezone.now()) == (0, 0)


def test_a_job_rule_is_told_about_its_job_only_and_events_filter(receiver) -> None:
    mine, other = make_job("mine"), make_job("other")
    rule(receiver.url, events=["timed_out"], job=mine)
    ended(other, S.TIMED_OUT)
    ended(mine, S.FAILED)
    target = ended(mine, S.TIMED_OUT)
    assert notifications.Notifier().run_once(timezone.now()) == (1, 1)
    assert receiver.requests[0][1]["execution"]["id"] == target.pk


def test_a_paused_rule_is_silent(receiver) -> None:
    rule(receiver.url, events=["failed"]).__class__.objects.update(enabled=False)
    ended(make_job("quiet"), S.FAILED)
    assert notifications.Notifier().run_once(timezone.now()) == (0, 0)


def test_webhooks_are_signed_when_a_secret_is_set(receiver, settings) -> None:
    settings.SCHEDULER_WEBHOOK_SECRET = "hook-secret"
    rule(receiver.url, events=["skipped"])
    ended(make_job("signed"), S.SKIPPED)
    notifications.Notifier().run_once(timezone.now())
    headers, _ = receiver.requests[0]
    expected = hmac.new(b"hook-secret", receiver.raw, hashlib.sha256).hexdigest()
    assert headers["X-Scheduler-Signature"] == f"sha256={expected}"


def test_e_mail_goes_through_djangos_mail_backend(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    rule("ops@example.com, oncall@example.com", events=["failed"], channel="email")
    run = ended(make_job("mailed"), S.FAILED, error="ValueError: bad")
    assert notifications.Notifier().run_once(timezone.now()) == (1, 1)
    (message,) = mail.outbox
    assert message.to == ["ops@example.com", "oncall@example.com"]
    assert message.subject == f"[scheduler] mailed: run #{run.pk} failed"
    assert "Error: ValueError: bad" in message.body


@pytest.mark.parametrize(
    ("events", "channel", "target", "field"),
    [
        ([], "webhook", "https://x.example/h", "events"),
        (["exploded"], "webhook", "https://x.example/h", "events"),
        (["failed"], "webhook", "file:///etc/passwd", "target"),
        (["failed"], "webhook", "https://", "target"),
        (["failed"], "email", "not-an-address", "target"),
        (["failed"], "email", " , ", "target"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field(events, channel, target, field) -> None:
    assert field in notifications.check_rule(events=events, channel=channel, target=target)


def test_a_good_rule_passes() -> None:
    assert (
        notifications.check_rule(
            events=["failed", "lost"], channel="email", target="a@example.com,b@example.com"
        )
        == {}
    )


def test_admins_add_rules_in_the_admin_and_it_is_audited(client, make_user, receiver) -> None:
    from jobs.models import AuditEvent

    client.force_login(make_user("admin", "rita"))
    response = client.post(
        "/admin/jobs/notificationrule/add/",
        {
            "name": "on-call",
            "events": ["failed", "lost"],
            "channel": "webhook",
            "target": receiver.url,
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content[:500]
    assert NotificationRule.objects.get().events == ["failed", "lost"]
    created = AuditEvent.objects.get(action="notification_rule.create")
    # Recorded without the URL's path (a webhook's credential): tests/jobs/test_webhook_redaction.py
    assert created.changes["target"] == [None, notifications.redact_url(receiver.url)]
    assert created.changes["target"][1].endswith("/…")
    rule_pk = NotificationRule.objects.get().pk
    client.post(
        f"/admin/jobs/notificationrule/{rule_pk}/change/",
        {
            "name": "on-call",
            "events": ["failed"],
            "channel": "webhook",
            "target": receiver.url,
            "enabled": "on",
        },
    )
    updated = AuditEvent.objects.get(action="notification_rule.update")
    assert updated.changes == {"events": ["['failed', 'lost']", "['failed']"]}
    bad = client.post(
        "/admin/jobs/notificationrule/add/",
        {"name": "bad", "events": ["failed"], "channel": "webhook", "target": "ftp://x"},
    )
    assert bad.status_code == 200 and notifications.ERR_WEBHOOK_URL in bad.content.decode()


# --- recovered and late start -------------------------------------------------------------------


def finished(job: Job, status: str, *, at, started_late_s: float = 0.0) -> JobExecution:
    due = at - timedelta(seconds=1)
    return JobExecution.objects.create(
        job=job,
        scheduled_for=due,
        run_after=due,
        status=status,
        started_at=due + timedelta(seconds=started_late_s),
        finished_at=at,
        node="node-a",
    )


def test_a_success_after_a_failure_is_told_as_recovered_once(receiver) -> None:
    job, other = make_job("nightly"), make_job("steady")
    rule(receiver.url, events=["recovered"])
    now = timezone.now()
    finished(job, S.SUCCEEDED, at=now - timedelta(seconds=50))
    finished(job, S.FAILED, at=now - timedelta(seconds=40))
    finished(job, S.SKIPPED, at=now - timedelta(seconds=35))  # says nothing of the job's health
    back = finished(job, S.SUCCEEDED, at=now - timedelta(seconds=30))
    finished(job, S.SUCCEEDED, at=now - timedelta(seconds=20))  # healthy already: not told
    finished(other, S.SUCCEEDED, at=now - timedelta(seconds=30))  # never failed: not told
    notifier = notifications.Notifier()
    notifier.run_once(now)
    notifier.run_once(now + timedelta(seconds=1))  # looked at again: still once
    assert [(body["event"], body["execution"]["id"]) for _, body in receiver.requests] == [
        ("recovered", back.pk)
    ]


def test_a_run_that_starts_later_than_the_rule_allows_is_told_once(receiver) -> None:
    job = make_job("sla")
    NotificationRule.objects.create(
        name="sla",
        events=["late_start", "failed"],
        late_after_seconds=5,
        channel="webhook",
        target=receiver.url,
    )
    now = timezone.now()
    on_time = finished(job, S.SUCCEEDED, at=now - timedelta(seconds=30), started_late_s=2)
    late = finished(job, S.FAILED, at=now - timedelta(seconds=20), started_late_s=9)
    notifier = notifications.Notifier()
    notifier.run_once(now)
    notifier.run_once(now + timedelta(seconds=1))
    told = sorted((body["event"], body["execution"]["id"]) for _, body in receiver.requests)
    # The late run that then failed is told of both; the one on time of neither.
    assert told == [("failed", late.pk), ("late_start", late.pk)]
    assert on_time.pk not in {body["execution"]["id"] for _, body in receiver.requests}
    late_body = next(body for _, body in receiver.requests if body["event"] == "late_start")
    assert late_body["execution"]["started_at"] and late_body["execution"]["due"]


@pytest.mark.parametrize(
    ("late_after", "refused"), [(None, True), (0, True), (True, True), (30, False)]
)
def test_a_late_start_rule_needs_its_threshold(late_after, refused) -> None:
    problems = notifications.check_rule(
        events=["late_start"],
        channel="webhook",
        target="https://x.example/hook",
        late_after_seconds=late_after,
    )
    assert ("late_after_seconds" in problems) == refused
