"""A node's own figures for Prometheus, and its probes, served by ``runnode --metrics-port``.

The web process's ``/metrics`` shows the cluster as the database has it (any web process answers
the same). What only a node knows is here, in the node process's own registry: how late its bodies
start, how long they run, what its claims and job locks cost, whether it leads, how often its
outcome writes were fenced. Every series is prefixed ``scheduler_node_``; the node id is the
``node`` label of each (a scrape of several nodes stays apart even behind one job name).

The same port answers ``/health/live`` (200 while the node's loops turn: its claim loop passed in
the last LIVE_AFTER_S) and ``/health/ready`` (200 while the node can show it is a member, the
condition it starts bodies under, and its database answers: a node cut off from its database
can do none of its work), for the probes of a node pod.

The recording functions are cheap no-ops until ``enable`` is called: a test harness, a web process
and a node without ``--metrics-port`` pay nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from cluster.dbhealth import Reachability

logger = logging.getLogger(__name__)

# The node is live while its claim loop has passed within this long (seconds).
LIVE_AFTER_S = 30.0
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class NodeMetrics:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.registry = CollectorRegistry()
        node = ["node"]
        r = self.registry
        self.executions = Counter(
            "scheduler_node_executions",
            "Runs this node ended, by job and outcome.",
            [*node, "job", "outcome"],
            registry=r,
        )
        self.start_lag = Histogram(
            "scheduler_node_start_lag_seconds",
            "From a run's due instant to its body's start, on this node.",
            node,
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "scheduler_node_execution_duration_seconds",
            "How long bodies ran, by job.",
            [*node, "job"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.claim_batch = Histogram(
            "scheduler_node_claim_batch_size",
            "Runs taken by one claim that found any.",
            node,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.claim_seconds = Histogram(
            "scheduler_node_claim_seconds",
            "One claim transaction, however many it took.",
            node,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.lock_seconds = Histogram(
            "scheduler_node_lock_acquire_seconds",
            "One round of job lock acquisitions (all the locks of an admission batch).",
            node,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.lock_results = Counter(
            "scheduler_node_lock_acquisitions",
            "Job lock attempts by result: held, taken (by another run), unavailable (no quorum).",
            [*node, "result"],
            registry=r,
        )
        self.fenced = Counter(
            "scheduler_node_fenced_outcomes",
            "Outcomes this node's finisher could not write: the run was no longer its own.",
            node,
            registry=r,
        )
        self.terms = Counter(
            "scheduler_node_terms",
            "Terms this node led, by how they ended (started counts every one).",
            [*node, "event"],
            registry=r,
        )
        self.leader = Gauge(
            "scheduler_node_leader", "1 while this node leads, else 0.", node, registry=r
        )
        self.term = Gauge(
            "scheduler_node_term", "The term this node leads in (0: not leading).", node, registry=r
        )
        self.presence_seconds = Histogram(
            "scheduler_node_presence_renewal_seconds",
            "One renewal of this node's presence in the coordination backend.",
            node,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.presence_failures = Counter(
            "scheduler_node_presence_renewal_failures",
            "Renewals that failed (the backend could not answer).",
            node,
            registry=r,
        )
        self.gauges = Gauge(
            "scheduler_node_runs",
            "Runs this node tracks, by state (claimed, waiting, running, unwritten).",
            [*node, "state"],
            registry=r,
        )
        self.capacity = Gauge(
            "scheduler_node_capacity", "Runs this node executes at once.", node, registry=r
        )
        self.database_reachable = Gauge(
            "scheduler_node_database_reachable",
            "1 while this node's database answers its calls, 0 while it does not.",
            node,
            registry=r,
        )
        self.database_outages = Counter(
            "scheduler_node_database_unreachable",
            "Times this node found its database unreachable (each outage counts once).",
            node,
            registry=r,
        )
        self.claims_held_back = Gauge(
            "scheduler_node_claims_held_back",
            "1 while this node claims nothing because its database path is far slower than a "
            "peer's, 0 while it claims.",
            node,
            registry=r,
        )
        self.clock_offset = Gauge(
            "scheduler_node_clock_offset_seconds",
            "This machine's wall clock minus the database's, at the last reading (the node keeps "
            "the database's time).",
            node,
            registry=r,
        )
        self.behind = Gauge(
            "scheduler_node_behind_seconds",
            "How far behind schedule the cluster is, measured by its leader about once a second "
            "(part: fires, the earliest fire not yet written; claims, the oldest due run not yet "
            "claimed); 0 on a node that does not lead.",
            [*node, "part"],
            registry=r,
        )
        self.partition_behind = Gauge(
            "scheduler_partition_behind_seconds",
            "With several scheduling partitions: how far past due the earliest fire not yet "
            "written is in each partition this node leads, measured about once a second "
            "(a partition's series goes when its leadership moves to another node).",
            [*node, "partition"],
            registry=r,
        )
        self.due_waiting = Gauge(
            "scheduler_node_due_runs_waiting",
            "Due runs left unclaimed past SCHEDULER_BEHIND_WARN_S (at most 1,000 counted), "
            "measured by the leader.",
            node,
            registry=r,
        )
        self.labels(self.database_reachable).set(1)
        self.labels(self.claims_held_back).set(0)
        self.last_claim_pass = time.monotonic()

    def labels(self, metric: Any, **labels: str) -> Any:
        return metric.labels(node=self.node_id, **labels)


_current: NodeMetrics | None = None


def enable(node_id: str) -> NodeMetrics:
    """Start recording for this process (a node that serves its metrics)."""
    global _current
    _current = NodeMetrics(node_id)
    return _current


def disable() -> None:
    global _current
    _current = None


def current() -> NodeMetrics | None:
    return _current


# --- recording (no-ops when disabled) -------------------------------------------------------------


def outcome(job: str, status: str, lag_s: float | None, duration_s: float | None) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.executions, job=job, outcome=status).inc()
    if lag_s is not None:
        m.labels(m.start_lag).observe(max(0.0, lag_s))
    if duration_s is not None:
        m.labels(m.duration, job=job).observe(max(0.0, duration_s))


def claim(count: int, seconds: float) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.claim_seconds).observe(seconds)
    if count:
        m.labels(m.claim_batch).observe(count)


def claim_pass() -> None:
    m = _current
    if m is not None:
        m.last_claim_pass = time.monotonic()


def locks(results: Iterable[str], seconds: float) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.lock_seconds).observe(seconds)
    for result in results:
        m.labels(m.lock_results, result=result).inc()


def fenced(count: int) -> None:
    m = _current
    if m is not None and count:
        m.labels(m.fenced).inc(count)


def leading(term: int | None, event: str | None = None) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.leader).set(1 if term else 0)
    m.labels(m.term).set(term or 0)
    if event:
        m.labels(m.terms, event=event).inc()


def clock_offset(reference_minus_local: float) -> None:
    m = _current
    if m is not None:
        m.labels(m.clock_offset).set(-reference_minus_local)


def database(reachable: bool) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.database_reachable).set(1 if reachable else 0)
    if not reachable:
        m.labels(m.database_outages).inc()


def claims_held_back(held: bool) -> None:
    m = _current
    if m is not None:
        m.labels(m.claims_held_back).set(1 if held else 0)


def behind(*, fires_s: float, claims_s: float, waiting: int) -> None:
    m = _current
    if m is None:
        return
    m.labels(m.behind, part="fires").set(fires_s)
    m.labels(m.behind, part="claims").set(claims_s)
    m.labels(m.due_waiting).set(waiting)


def partition_behind(partition: int, seconds: float | None) -> None:
    """A partition's lag, as its leader here measured it (None: no longer led here)."""
    m = _current
    if m is None:
        return
    if seconds is None:
        with contextlib.suppress(KeyError):
            m.partition_behind.remove(m.node_id, str(partition))
    else:
        m.labels(m.partition_behind, partition=str(partition)).set(seconds)


def presence(seconds: float | None) -> None:
    m = _current
    if m is None:
        return
    if seconds is None:
        m.labels(m.presence_failures).inc()
    else:
        m.labels(m.presence_seconds).observe(seconds)


# --- serving ----------------------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(WSGIServer):
    daemon_threads = True


def app(
    metrics: NodeMetrics,
    *,
    tracked: Callable[[], dict[str, int]],
    capacity: int,
    member: Callable[[], bool],
    database: Callable[[], Reachability],
    behind: Callable[[], str] = lambda: "",
) -> Callable[..., Iterable[bytes]]:
    """The node's WSGI application: /metrics, /health/live, /health/ready.

    Readiness is 503 while the node cannot do its work (membership unconfirmed, database
    unreachable). A cluster behind schedule is said in its text but keeps it 200: the node can
    work, and a readiness gate that failed for the cluster's backlog would stall the very
    roll-out that adds capacity."""

    def respond(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            metrics.labels(metrics.capacity).set(capacity)
            for state, count in tracked().items():
                metrics.labels(metrics.gauges, state=state).set(count)
            body = generate_latest(metrics.registry)
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        if path == "/health/live":
            age = time.monotonic() - metrics.last_claim_pass
            ok = age < LIVE_AFTER_S
            return _text(start_response, ok, f"claim loop passed {age:.1f} s ago\n")
        if path == "/health/ready":
            problems = []
            if not member():
                problems.append("membership not confirmed")
            reach = database()
            if not reach.reachable:
                problems.append(f"database unreachable: {reach.reason}")
            text = "; ".join(problems) if problems else "member; database reachable"
            lag = behind()
            if lag:
                text = f"{text}; {lag}"
            return _text(start_response, not problems, text + "\n")
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: /metrics, /health/live, /health/ready\n"]

    return respond


def _text(start_response: Callable[..., Any], ok: bool, text: str) -> list[bytes]:
    start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
    return [text.encode()]


def serve(wsgi_app: Callable[..., Iterable[bytes]], host: str, port: int) -> WSGIServer:
    """Serve ``wsgi_app`` on a daemon thread; returns the server (``shutdown()`` stops it)."""
    server = make_server(host, port, wsgi_app, server_class=_Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server
