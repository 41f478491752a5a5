"""/metrics: off without a token, bearer-protected with one, and the named series read from the
database after runs, a leader and nodes exist."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils import timezone

from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests-0123456789"


def scrape(token: str | None = TOKEN, host: str = "testserver") -> object:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Client().get("/metrics", HTTP_HOST=host, **headers)


def value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not in:\n{text}"
    return float(match.group(1))


def test_metrics_are_off_without_a_token(settings):
    settings.SCHEDULER_METRICS_TOKEN = ""
    assert scrape().status_code == 404


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_scrape_without_the_token_is_401(settings, token):
    settings.SCHEDULER_METRICS_TOKEN = TOKEN
    response = scrape(token)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_the_series_after_runs_a_leader_and_nodes(settings):
    settings.SCHEDULER_METRICS_TOKEN = TOKEN
    settings.ALLOWED_HOSTS = ["scheduler.example.com"]
    now = timezone.now()
    job = Job.objects.create(
        name="nightly", task="noop", schedule_type="interval", interval_seconds=60
    )
    statuses = (ExecutionStatus.SUCCEEDED, ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED)
    for minutes, status in enumerate(statuses, start=1):
        slot = now - timezone.timedelta(minutes=minutes)
        JobExecution.objects.create(job=job, scheduled_for=slot, run_after=slot, status=status)
    JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now - timezone.timedelta(seconds=30)
    )
    SchedulerNode.objects.create(
        node_id="n1",
        hostname="h",
        pid=1,
        started_at=now,
        last_heartbeat=now,
        status=NodeStatus.ACTIVE,
        running_count=2,
    )
    SchedulerNode.objects.create(
        node_id="n2",
        hostname="h",
        pid=2,
        started_at=now,
        last_heartbeat=now,
        status=NodeStatus.DEAD,
    )
    LeadershipTerm.objects.create(
        term=6, node_id="n2", acquired_at=now, ended_at=now, end_reason="node_died"
    )
    LeadershipTerm.objects.create(term=7, node_id="n1", acquired_at=now)

    response = scrape(host="10.42.0.17:8000")  # Prometheus scrapes the pod IP
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert value(text, 'scheduler_executions{status="succeeded"}') == 2
    assert value(text, 'scheduler_executions{status="pending"}') == 1
    assert value(text, 'scheduler_job_executions{job="nightly",status="failed"}') == 1
    assert value(text, "scheduler_executions_late") == 1
    assert value(text, "scheduler_leader_term") == 7
    assert value(text, 'scheduler_leader{node="n1"}') == 1
    assert value(text, 'scheduler_terms{end_reason="node_died"}') == 1
    assert value(text, 'scheduler_terms{end_reason="open"}') == 1
    assert value(text, 'scheduler_node_up{node="n1",status="active"}') == 1
    assert value(text, 'scheduler_node_up{node="n2",status="dead"}') == 0
    assert value(text, 'scheduler_node_running{node="n1"}') == 2
    assert value(text, 'scheduler_node_heartbeat_age_seconds{node="n1"}') < 60


def test_the_live_feed_counters_of_the_answering_process(settings, monkeypatch):
    from dashboard import live
    from dashboard.live import poller as live_poller

    settings.SCHEDULER_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(live_poller, "stats", live.LiveStats(polls=3, queries=17))
    text = scrape().content.decode()
    assert value(text, "scheduler_live_polls_total") == 3
    assert value(text, "scheduler_live_queries_total") == 17
