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
from scheduler_project import metrics

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture(autouse=True)
def _no_history_counted_yet():
    """Each test starts with nothing counted (another test's rows are gone)."""
    metrics.history.forget()
    yield
    metrics.history.forget()


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
    assert value(text, "scheduler_executions_catch_up") == 0
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


def test_finished_runs_are_counted_once_per_ttl_and_active_ones_at_every_scrape(
    settings, monkeypatch
):
    settings.SCHEDULER_METRICS_TOKEN = TOKEN
    settings.SCHEDULER_METRICS_HISTORY_TTL_S = 60
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    now = timezone.now()
    job = Job.objects.create(name="j", task="noop", schedule_type="interval", interval_seconds=60)

    def add(status: str, minutes: int) -> None:
        slot = now - timezone.timedelta(minutes=minutes)
        JobExecution.objects.create(job=job, scheduled_for=slot, run_after=slot, status=status)

    add(ExecutionStatus.SUCCEEDED, 1)
    add(ExecutionStatus.RUNNING, 2)
    text = scrape().content.decode()
    assert value(text, 'scheduler_executions{status="succeeded"}') == 1
    assert value(text, 'scheduler_executions{status="running"}') == 1

    # Within the TTL: a new running run shows at once, a new finished one at the next count.
    add(ExecutionStatus.SUCCEEDED, 3)
    add(ExecutionStatus.RUNNING, 4)
    clock[0] += 59
    text = scrape().content.decode()
    assert value(text, 'scheduler_executions{status="succeeded"}') == 1
    assert value(text, 'scheduler_job_executions{job="j",status="succeeded"}') == 1
    assert value(text, 'scheduler_executions{status="running"}') == 2
    assert value(text, 'scheduler_job_executions{job="j",status="running"}') == 2

    clock[0] += 1
    text = scrape().content.decode()
    assert value(text, 'scheduler_executions{status="succeeded"}') == 2
    assert value(text, 'scheduler_job_executions{job="j",status="succeeded"}') == 2


def test_a_ttl_of_zero_counts_finished_runs_at_every_scrape(settings):
    settings.SCHEDULER_METRICS_TOKEN = TOKEN
    settings.SCHEDULER_METRICS_HISTORY_TTL_S = 0
    job = Job.objects.create(name="j", task="noop", schedule_type="interval", interval_seconds=60)
    now = timezone.now()
    for minutes in (1, 2):
        slot = now - timezone.timedelta(minutes=minutes)
        JobExecution.objects.create(
            job=job, scheduled_for=slot, run_after=slot, status=ExecutionStatus.FAILED
        )
        text = scrape().content.decode()
        assert value(text, 'scheduler_executions{status="failed"}') == minutes
