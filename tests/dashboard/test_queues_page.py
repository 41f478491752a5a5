"""The queues page: every queue with its limits and what waits; pause and resume by operators,
refused to viewers; a held run says why on its page and in the run list."""

from __future__ import annotations

import pytest

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
        },
        by=services.SYSTEM,
    )


def client_for(make_user, role: str):
    from django.test import Client

    client = Client()
    client.force_login(make_user(role, f"{role}-user"))
    return client


def test_the_page_lists_queues_and_operators_pause_and_resume(make_user, job) -> None:
    Queue.objects.create(name="reports", max_concurrent=4, rate_limit=10, rate_period_seconds=60)
    viewer = client_for(make_user, "viewer")
    page = viewer.get("/queues/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-queue="reports"' in text and "10 per 60 s" in text and "0 / 4" in text
    assert "queue-pause" not in text and ">Pause<" not in text  # a viewer gets no buttons
    assert viewer.post("/queues/reports/pause/").status_code == 403
    operator = client_for(make_user, "operator")
    assert ">Pause<" in operator.get("/queues/").content.decode()
    assert operator.post("/queues/reports/pause/").status_code == 302
    assert Queue.objects.get(name="reports").paused is True
    assert "paused" in operator.get("/queues/").content.decode()
    assert operator.post("/queues/reports/resume/").status_code == 302
    assert Queue.objects.get(name="reports").paused is False
    assert list(
        AuditEvent.objects.filter(object_type="queue")
        .order_by("pk")
        .values_list("action", "source")
    ) == [("queue.pause", "ui"), ("queue.resume", "ui")]
    assert operator.post("/queues/Not A Queue/pause/").status_code == 302
    assert not Queue.objects.filter(name="Not A Queue").exists()


def test_a_held_run_says_why_on_its_page_and_in_the_list(make_user, job) -> None:
    run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    viewer = client_for(make_user, "viewer")
    Queue.objects.create(name="reports", paused=True)
    flow.forget_config()
    assert "waiting: queue reports paused" in viewer.get(f"/executions/{run.pk}/").content.decode()
    Queue.objects.filter(name="reports").update(paused=False)
    JobExecution.objects.filter(pk=run.pk).update(reason="waiting: queue reports limit 4 reached")
    flow.forget_config()
    listing = viewer.get("/executions/").content.decode()
    assert 'data-field="waiting"' in listing and "queue reports limit 4 reached" in listing
