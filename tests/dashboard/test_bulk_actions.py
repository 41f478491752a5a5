"""Bulk actions in the dashboard: each selected job or run goes through the same service as its
single action, is audited the same way, and one that cannot take it is skipped and named."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from jobs import services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import SYSTEM
from jobs.states import ExecutionStatus as S

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs() -> list[Job]:
    return [
        services.job_create(
            data={
                "name": f"bulk-{i}",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 60,
            },
            by=SYSTEM,
        )
        for i in range(4)
    ]


@pytest.fixture
def as_role(make_user):
    made = itertools.count()

    def client(role: str | None) -> Client:
        browser = Client()
        browser.force_login(make_user(role, f"bulk-{role or 'none'}-{next(made)}"))
        return browser

    return client


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_an_operator_pauses_three_jobs_at_once(jobs, as_role) -> None:
    ids = [str(job.pk) for job in jobs[:3]]
    response = as_role("operator").post(
        "/jobs/bulk/", {"action": "pause", "ids": ids, "next": "/jobs/?q=bulk"}
    )
    assert response.status_code == 302 and response["Location"] == "/jobs/?q=bulk"
    assert list(
        Job.objects.filter(enabled=False).order_by("name").values_list("name", flat=True)
    ) == [
        "bulk-0",
        "bulk-1",
        "bulk-2",
    ]
    assert AuditEvent.objects.filter(action="job.pause").count() == 3
    assert _messages(response) == ["3 jobs paused: “bulk-0”, “bulk-1”, “bulk-2”."]


@pytest.mark.parametrize(
    ("action", "already", "done", "audited", "why"),
    [
        ("pause", False, "paused", "job.pause", "already paused"),
        ("resume", True, "resumed", "job.resume", "not paused"),
    ],
)
def test_bulk_pause_and_resume_report_only_the_jobs_they_changed(
    jobs, as_role, action, already, done, audited, why
) -> None:
    """A job already in the asked state is not counted as changed: it is named apart."""
    for job in jobs[:3]:
        Job.objects.filter(pk=job.pk).update(enabled=not already)
    Job.objects.filter(pk=jobs[1].pk).update(enabled=already)
    ids = [str(job.pk) for job in jobs[:3]]
    response = as_role("operator").post("/jobs/bulk/", {"action": action, "ids": ids})
    assert response.status_code == 302
    assert Job.objects.filter(pk__in=ids, enabled=already).count() == 3
    assert AuditEvent.objects.filter(action=audited).count() == 2
    assert _messages(response) == [
        f"2 jobs {done}: “bulk-0”, “bulk-2”.",
        f"Unchanged 1 ({why}): “bulk-1”.",
    ]
    # Nothing to change at all: no success message.
    response = as_role("operator").post("/jobs/bulk/", {"action": action, "ids": ids[1:2]})
    assert _messages(response) == [f"Unchanged 1 ({why}): “bulk-1”."]


def test_a_job_that_cannot_take_the_action_is_skipped_and_named(jobs, as_role) -> None:
    operator = as_role("operator")
    response = operator.post(
        "/jobs/bulk/", {"action": "trigger", "ids": [str(jobs[0].pk), "999999"]}
    )
    assert JobExecution.objects.filter(job=jobs[0]).count() == 1
    assert _messages(response) == ["1 job queued to run: “bulk-0”.", "Skipped 1: #999999 (gone)."]


def test_delete_is_for_admins_and_viewers_may_do_nothing(jobs, as_role) -> None:
    ids = [str(jobs[0].pk)]
    assert (
        as_role("operator").post("/jobs/bulk/", {"action": "delete", "ids": ids}).status_code == 403
    )
    assert as_role("viewer").post("/jobs/bulk/", {"action": "pause", "ids": ids}).status_code == 403
    assert Job.objects.filter(pk=jobs[0].pk).exists()
    as_role("admin").post("/jobs/bulk/", {"action": "delete", "ids": ids})
    assert not Job.objects.filter(pk=jobs[0].pk).exists()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"action": "pause"}, "Select at least one row first."),
        ({"action": "explode", "ids": ["1"]}, "Unknown bulk action."),
    ],
)
def test_an_empty_selection_or_unknown_action_changes_nothing(jobs, as_role, body, message) -> None:
    response = as_role("operator").post("/jobs/bulk/", body)
    assert _messages(response) == [message]
    assert not Job.objects.filter(enabled=False).exists()


def test_runs_are_cancelled_and_retried_in_bulk(jobs, as_role) -> None:
    now = timezone.now()
    waiting = [
        JobExecution.objects.create(job=job, scheduled_for=now, run_after=now) for job in jobs[:2]
    ]
    failed = JobExecution.objects.create(
        job=jobs[2], scheduled_for=now, run_after=now, status=S.FAILED, finished_at=now
    )
    operator = as_role("operator")
    operator.post("/executions/bulk/", {"action": "cancel", "ids": [str(e.pk) for e in waiting]})
    assert set(
        JobExecution.objects.filter(pk__in=[e.pk for e in waiting]).values_list("status", flat=True)
    ) == {S.CANCELLED}
    response = operator.post(
        "/executions/bulk/", {"action": "retry", "ids": [str(failed.pk), str(waiting[0].pk)]}
    )
    assert JobExecution.objects.filter(job=jobs[2], attempt=2).exists()
    assert f"2 executions retried: #{failed.pk}, #{waiting[0].pk}." in _messages(response)


def test_the_lists_offer_selection_only_to_operators(jobs, as_role) -> None:
    viewer_page = as_role("viewer").get("/jobs/").content.decode()
    assert 'form="bulk-jobs"' not in viewer_page
    operator_page = as_role("operator").get("/jobs/").content.decode()
    assert operator_page.count('form="bulk-jobs"') == 4
    assert 'value="delete"' not in operator_page
    assert 'value="delete"' in as_role("admin").get("/jobs/").content.decode()
    runs = as_role("operator").get("/executions/").content.decode()
    assert 'data-columns="select,id,' in runs
