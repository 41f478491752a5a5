"""Notifications: rules (``NotificationRule``) tell a webhook or e-mail addresses when a run ends
badly (failed, timed out, lost, skipped), when a job recovers (a success after a run that ended
badly), or when a run starts later than the rule allows (an SLA: ``late_after_seconds`` past its
due instant); every message is recorded (``Notification``): pending, sent, or failed after its
last try, with the error.

The leader's notifier calls :func:`run_once` about once a second: ``collect`` turns runs that ended
badly since it last looked into pending notifications (one per rule and run: a unique constraint, so
a second leader cannot record one twice), and ``deliver`` sends the due ones, retrying a failed send
with backoff up to ``MAX_ATTEMPTS`` times. Delivery is at least once: a leader that dies between
sending and recording may have the next leader send again.

Only a run's final attempt is told about: a failure that is retried is not, until its last attempt
fails too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db.models import DurationField, Exists, ExpressionWrapper, F, OuterRef, Subquery

from jobs.conf import app_setting
from jobs.models import (
    JobExecution,
    Notification,
    NotificationChannel,
    NotificationEvent,
    NotificationRule,
    NotificationStatus,
)
from jobs.states import ExecutionStatus as S

logger = logging.getLogger(__name__)

# How far back a notifier that has just started (a new leader) looks for runs to tell about.
LOOKBACK = timedelta(minutes=10)
# Runs are read this far before the last one seen: a row committed late with an earlier stamp.
OVERLAP = timedelta(seconds=5)
MAX_ATTEMPTS = 5
# Waits between tries: 5 s, 10 s, 20 s, 40 s.
BACKOFF_S = 5.0
# A send that is under way keeps its row away from other senders for this long.
SENDING_LEASE = timedelta(seconds=60)
WEBHOOK_TIMEOUT_S = 5.0
DELIVER_BATCH = 50
ERR_EVENTS = "Choose one or more of: {choices}."
ERR_LATE_AFTER = "late_start needs late_after_seconds: how late (in seconds) a start may be."
# The final states a "recovered" run recovers from.
BAD_ENDS = (NotificationEvent.FAILED, NotificationEvent.TIMED_OUT, NotificationEvent.LOST)
# Runs looked at per collect, per kind.
COLLECT_LIMIT = 5000
ERR_WEBHOOK_URL = "A webhook target is an http:// or https:// URL."
ERR_EMAILS = "An e-mail target is one or more addresses, comma-separated."


def check_rule(
    *, events: Any, channel: str, target: str, late_after_seconds: Any = None
) -> dict[str, list[str]]:
    """Why a rule's fields are wrong, by field (empty when they are right)."""
    errors: dict[str, list[str]] = {}
    allowed = NotificationEvent.values
    if not isinstance(events, list) or not events or any(e not in allowed for e in events):
        errors["events"] = [ERR_EVENTS.format(choices=", ".join(allowed))]
    elif NotificationEvent.LATE_START in events and (
        isinstance(late_after_seconds, bool)
        or not isinstance(late_after_seconds, int)
        or late_after_seconds < 1
    ):
        errors["late_after_seconds"] = [ERR_LATE_AFTER]
    if channel == NotificationChannel.WEBHOOK:
        parts = urlsplit(target.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            errors["target"] = [ERR_WEBHOOK_URL]
    elif channel == NotificationChannel.EMAIL:
        try:
            for address in email_addresses(target):
                validate_email(address)
            if not email_addresses(target):
                raise ValidationError("none")
        except ValidationError:
            errors["target"] = [ERR_EMAILS]
    return errors


def redact_url(target: str) -> str:
    """A webhook URL as anyone but an admin may read it: its scheme, host and port. Its user and
    password, path, query and fragment (where webhook services put their credential) become "…".
    Anything that is not an http(s) URL (e-mail addresses) is returned as it is."""
    try:
        parts = urlsplit(target.strip())
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return target if parts is not None else "…"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = f"{parts.scheme}://{'…@' if '@' in parts.netloc else ''}{host}"
    if port is not None:
        shown += f":{port}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{shown}/…"
    return shown + parts.path


def email_addresses(target: str) -> list[str]:
    return [part.strip() for part in target.split(",") if part.strip()]


@dataclass
class Notifier:
    """The leader's notifier state: the newest run stamp it has looked at."""

    seen_until: datetime | None = None

    def run_once(self, now: datetime) -> tuple[int, int]:
        """Collect, then deliver; returns (notifications looked at, sent). A run already recorded
        for a rule is looked at again (the overlap) but never recorded twice."""
        return self.collect(now), deliver(now)

    def collect(self, now: datetime) -> int:
        rules = list(NotificationRule.objects.filter(enabled=True))
        if not rules:
            self.seen_until = now
            return 0
        since = (self.seen_until - OVERLAP) if self.seen_until else now - LOOKBACK
        wanted = {event for rule in rules for event in rule.events}
        # The runs that ended badly are told as their status; a success is looked at only when a
        # rule wants to hear of recoveries.
        statuses = sorted((wanted & set(ENDED_BADLY)) | ({S.SUCCEEDED} & _recovery_wanted(wanted)))
        later_attempt = JobExecution.objects.filter(
            job_id=OuterRef("job_id"),
            scheduled_for=OuterRef("scheduled_for"),
            attempt__gt=OuterRef("attempt"),
        )
        runs = list(
            JobExecution.objects.filter(status__in=statuses, updated_at__gte=since)
            .exclude(Exists(later_attempt))
            .only("pk", "job_id", "status", "updated_at", "finished_at")
            .order_by("updated_at")[:COLLECT_LIMIT]
        )
        recovered = _recovered({run.pk: run for run in runs if run.status == S.SUCCEEDED})
        records = [
            Notification(rule=rule, execution_id=run.pk, event=event, next_attempt_at=now)
            for run in runs
            if (event := NotificationEvent.RECOVERED if run.pk in recovered else run.status)
            for rule in rules
            if event in rule.events and rule.job_id in (None, run.job_id)
        ]
        records += _late_starts(rules, since=since, now=now)
        if records:
            Notification.objects.bulk_create(records, ignore_conflicts=True)
        if runs:
            self.seen_until = max(self.seen_until or since, runs[-1].updated_at)
        elif self.seen_until is None:
            self.seen_until = since + OVERLAP
        return len(records)


ENDED_BADLY = (S.FAILED, S.TIMED_OUT, S.LOST, S.SKIPPED)


def _recovery_wanted(wanted: set[str]) -> set[str]:
    return {S.SUCCEEDED} if NotificationEvent.RECOVERED in wanted else set()


def _recovered(successes: dict[int, JobExecution]) -> set[int]:
    """Of these successful runs, those whose job's previous finished run (failed, timed out,
    lost or succeeded; skips and cancels say nothing of the job's health) had ended badly."""
    if not successes:
        return set()
    previous = (
        JobExecution.objects.filter(
            job_id=OuterRef("job_id"),
            finished_at__lt=OuterRef("finished_at"),
            status__in=[S.SUCCEEDED, *BAD_ENDS],
        )
        .order_by("-finished_at", "-pk")
        .values("status")[:1]
    )
    return set(
        JobExecution.objects.filter(pk__in=list(successes))
        .annotate(previous=Subquery(previous))
        .filter(previous__in=BAD_ENDS)
        .values_list("pk", flat=True)
    )


def _late_starts(rules: list[NotificationRule], *, since: datetime, now: datetime) -> list[Any]:
    """One notification per rule that wants late starts and run whose body started in the window
    more than the rule's ``late_after_seconds`` after it was due."""
    found = []
    lateness = ExpressionWrapper(F("started_at") - F("run_after"), output_field=DurationField())
    for rule in rules:
        if NotificationEvent.LATE_START not in rule.events or not rule.late_after_seconds:
            continue
        runs = JobExecution.objects.filter(started_at__gte=since).annotate(late=lateness)
        runs = runs.filter(late__gt=timedelta(seconds=rule.late_after_seconds))
        if rule.job_id is not None:
            runs = runs.filter(job_id=rule.job_id)
        found += [
            Notification(
                rule=rule, execution_id=pk, event=NotificationEvent.LATE_START, next_attempt_at=now
            )
            for pk in runs.order_by("started_at").values_list("pk", flat=True)[:COLLECT_LIMIT]
        ]
    return found


def deliver(now: datetime) -> int:
    """Send the pending notifications that are due; returns how many were sent."""
    due = list(
        Notification.objects.filter(status=NotificationStatus.PENDING, next_attempt_at__lte=now)
        .select_related("rule", "execution__job")
        .order_by("next_attempt_at")[:DELIVER_BATCH]
    )
    sent = 0
    for item in due:
        # Take the row (another sender that read it too finds it taken), then send.
        taken = Notification.objects.filter(
            pk=item.pk, status=NotificationStatus.PENDING, attempts=item.attempts
        ).update(attempts=F("attempts") + 1, next_attempt_at=now + SENDING_LEASE)
        if not taken:
            continue
        attempts = item.attempts + 1
        try:
            send(item)
        except Exception as exc:  # any failure of a send is recorded and retried
            error = f"{type(exc).__name__}: {exc}"[:2000]
            final = attempts >= MAX_ATTEMPTS
            Notification.objects.filter(pk=item.pk).update(
                status=NotificationStatus.FAILED if final else NotificationStatus.PENDING,
                next_attempt_at=now + timedelta(seconds=BACKOFF_S * 2 ** (attempts - 1)),
                last_error=error,
            )
            log = logger.error if final else logger.warning
            log(
                "notification %s (%s, run #%s) failed, attempt %d of %d: %s",
                item.rule.name,
                item.rule.channel,
                item.execution_id,
                attempts,
                MAX_ATTEMPTS,
                error,
            )
        else:
            Notification.objects.filter(pk=item.pk).update(
                status=NotificationStatus.SENT, sent_at=now, last_error=""
            )
            sent += 1
    return sent


def payload(item: Notification) -> dict[str, Any]:
    run = item.execution
    base = app_setting("SCHEDULER_BASE_URL").rstrip("/")
    return {
        "event": item.event,
        "rule": item.rule.name,
        "job": {"id": run.job_id, "name": run.job.name, "task": run.job.task},
        "execution": {
            "id": run.pk,
            "status": run.status,
            "attempt": run.attempt,
            "trigger": run.trigger,
            "scheduled_for": run.scheduled_for.isoformat(),
            "due": run.run_after.isoformat(),
            "started_at": run.started_at.isoformat() if run.started_at else None,
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "node": run.node,
            "error": run.error,
            "reason": run.reason,
            "url": f"{base}/executions/{run.pk}/" if base else f"/executions/{run.pk}/",
        },
    }


def send(item: Notification) -> None:
    """Send one notification by its rule's channel; raises on failure."""
    body = payload(item)
    if item.rule.channel == NotificationChannel.WEBHOOK:
        _post(item.rule.target.strip(), body)
    elif item.rule.channel == NotificationChannel.EMAIL:
        run = body["execution"]
        subject = f"[scheduler] {body['job']['name']}: run #{run['id']} {item.event}"
        lines = [
            f"Job: {body['job']['name']} ({body['job']['task']})",
            f"Run: #{run['id']}, attempt {run['attempt']}, {run['trigger']}",
            f"Status: {run['status']}",
            f"Scheduled for: {run['scheduled_for']}",
            f"Started at: {run['started_at'] or '-'} (due {run['due']})",
            f"Finished at: {run['finished_at'] or '-'}",
            f"Node: {run['node'] or '-'}",
            f"Error: {run['error'] or '-'}",
            f"Reason: {run['reason'] or '-'}",
            f"Details: {run['url']}",
        ]
        send_mail(
            subject,
            "\n".join(lines) + "\n",
            settings.DEFAULT_FROM_EMAIL,
            email_addresses(item.rule.target),
        )
    else:
        raise ValueError(f"unknown channel {item.rule.channel!r}")


def _post(url: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "django-cluster-scheduler"}
    secret = app_setting("SCHEDULER_WEBHOOK_SECRET")
    if secret:
        digest = hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()
        headers["X-Scheduler-Signature"] = f"sha256={digest}"
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(ERR_WEBHOOK_URL)
    request = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
        url, data=data, headers=headers, method="POST"
    )
    # A redirect is not followed: the rule names where the message goes.
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"the webhook answered HTTP {exc.code}") from None
    if not 200 <= status < 300:
        raise RuntimeError(f"the webhook answered HTTP {status}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
