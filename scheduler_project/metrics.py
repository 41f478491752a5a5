"""``GET /metrics``: the cluster's figures for Prometheus, read from the database at scrape time.

Off unless ``SCHEDULER_METRICS_TOKEN`` is set (404); then a scrape must send
``Authorization: Bearer <token>`` (401 otherwise). Like the health probes it answers whatever the
Host header (Prometheus scrapes a pod by its IP) and is exempt from the HTTPS redirect.

Every series is a gauge computed from the rows, so any web process answers the same, and a restart
loses nothing:

- ``scheduler_executions{status}``                 executions by status now
- ``scheduler_job_executions{job,status}``         per job, terminal and active statuses

The runs in a final state are the whole history (every one of them is a row until it is purged):
their counts are taken at most once per ``SCHEDULER_METRICS_HISTORY_TTL_S`` (60 s) in each web
process, and served from memory between, so a scrape every few seconds, or several Prometheus
servers, cost the database one such count a minute. Runs pending, running or awaiting a retry are
few (bounded by the backlog) and counted at every scrape, through the status indexes.
- ``scheduler_executions_late``                    pending runs due more than 1 s ago, unstarted
- ``scheduler_executions_catch_up``                pending runs for missed slots still waiting their
                                                   turn on the catch-up budget (a backlog draining)
- ``scheduler_leader_term``                        the open term (0 without a leader)
- ``scheduler_leader{node}``                       1 for the node holding it
- ``scheduler_terms{end_reason}``                  terms by how they ended (``open`` for the current)
- ``scheduler_node_up{node,status}``               1 for an active or draining node, else 0
- ``scheduler_node_heartbeat_age_seconds{node}``   seconds since each node's last heartbeat
- ``scheduler_node_running{node}``                 runs a node reported running at its last beat

And two counters of the answering web process alone (its live feed for the dashboards it serves):

- ``scheduler_live_polls_total``                   database polls of its live feed
- ``scheduler_live_queries_total``                 the queries those polls ran
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATE_AFTER_S = 1.0


class _History:
    """The counts of runs in a final state by (job, status), kept for a while."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken_at: float | None = None
        self.per_job: list[tuple[str, str, int]] = []

    def fresh(self, ttl_s: float, monotonic: float) -> _History:
        """Recount when the counts are older than ``ttl_s`` (one caller counts, others wait)."""
        from jobs.models import JobExecution
        from jobs.states import TERMINAL_STATES

        with self._lock:
            if self._taken_at is None or monotonic - self._taken_at >= ttl_s:
                self.per_job = _per_job(JobExecution.objects.filter(status__in=TERMINAL_STATES))
                self._taken_at = monotonic
            return self

    def forget(self) -> None:
        with self._lock:
            self._taken_at = None


history = _History()


def _per_job(runs: QuerySet) -> list[tuple[str, str, int]]:
    """(job name, status, count) of ``runs``: one GROUP BY, the by-status counts are its sums."""
    return list(runs.order_by().values_list("job__name", "status").annotate(n=Count("id")))


class ClusterCollector(Collector):
    """The cluster's state as Prometheus gauges, one query per family."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
        from jobs.models import JobExecution
        from jobs.states import ACTIVE_STATES, ExecutionStatus

        now = timezone.now()
        by_status = GaugeMetricFamily(
            "scheduler_executions", "Executions by status", labels=["status"]
        )
        finished = history.fresh(settings.SCHEDULER_METRICS_HISTORY_TTL_S, time.monotonic())
        rows = [*finished.per_job, *_per_job(JobExecution.objects.filter(status__in=ACTIVE_STATES))]
        counts: Counter[str] = Counter()
        for _, status, count in rows:
            counts[status] += count
        for status in ExecutionStatus.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status

        per_job = GaugeMetricFamily(
            "scheduler_job_executions", "Executions by job and status", labels=["job", "status"]
        )
        for job, status, count in rows:
            per_job.add_metric([job, status], count)
        yield per_job

        late = GaugeMetricFamily(
            "scheduler_executions_late", "Pending executions due more than 1 s ago, not started"
        )
        late.add_metric(
            [],
            JobExecution.objects.filter(
                status=ExecutionStatus.PENDING, run_after__lt=now - timedelta(seconds=LATE_AFTER_S)
            ).count(),
        )
        yield late

        catch_up = GaugeMetricFamily(
            "scheduler_executions_catch_up",
            "Pending runs for missed slots waiting their turn on the catch-up budget",
        )
        catch_up.add_metric(
            [],
            JobExecution.objects.filter(status=ExecutionStatus.PENDING, catch_up=True).count(),
        )
        yield catch_up

        open_term = (
            LeadershipTerm.objects.filter(partition=0, ended_at__isnull=True)
            .order_by("-term")
            .first()
        )
        term = GaugeMetricFamily("scheduler_leader_term", "The open leadership term (0: none)")
        term.add_metric([], open_term.term if open_term else 0)
        yield term
        leader = GaugeMetricFamily("scheduler_leader", "1 for the leader", labels=["node"])
        if open_term:
            leader.add_metric([open_term.node_id], 1)
        yield leader
        terms = GaugeMetricFamily(
            "scheduler_terms", "Leadership terms by how they ended", labels=["end_reason"]
        )
        for reason, count in (
            LeadershipTerm.objects.values_list("end_reason").annotate(n=Count("id")).order_by()
        ):
            terms.add_metric([reason or "open"], count)
        yield terms

        up = GaugeMetricFamily("scheduler_node_up", "1 for a live node", labels=["node", "status"])
        age = GaugeMetricFamily(
            "scheduler_node_heartbeat_age_seconds", "Seconds since the heartbeat", labels=["node"]
        )
        running = GaugeMetricFamily(
            "scheduler_node_running", "Runs at the last heartbeat", labels=["node"]
        )
        for node in SchedulerNode.objects.all():
            live = node.status in (NodeStatus.ACTIVE, NodeStatus.DRAINING)
            up.add_metric([node.node_id, node.status], 1 if live else 0)
            age.add_metric([node.node_id], max(0.0, (now - node.last_heartbeat).total_seconds()))
            running.add_metric([node.node_id], node.running_count)
        yield up
        yield age
        yield running


class LiveFeedCollector(Collector):
    """This web process's live feed: what its dashboards cost the database."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        from dashboard.live import poller

        polls = CounterMetricFamily(
            "scheduler_live_polls", "Database polls of this web process's live feed"
        )
        polls.add_metric([], poller.stats.polls)
        yield polls
        queries = CounterMetricFamily(
            "scheduler_live_queries", "Database queries of this web process's live feed"
        )
        queries.add_metric([], poller.stats.queries)
        yield queries


def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.SCHEDULER_METRICS_TOKEN
    if not token:
        return HttpResponse("metrics are off (set SCHEDULER_METRICS_TOKEN)\n", status=404)
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("a bearer token is required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    registry.register(LiveFeedCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
