"""Run one scheduler node: ``python manage.py runnode [--node-id ID] [--queues a,b] [--capacity N]``.

SIGTERM/SIGINT drain the node: it stops claiming, hands leadership over at once (release, not
expiry), finishes running work within ``--grace`` seconds (then hands it back as lost, to be retried),
marks itself stopped and exits 0. Bad options print a message and exit 2. A node started while the
database or the coordination backend cannot be reached waits for them (logging each retry).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from cluster import node_metrics, tracing
from cluster.apps import limit_idle_transactions
from cluster.coordination import get_backend
from cluster.elector import ElectionConfig
from cluster.node import (
    DEAD_AFTER_S,
    DEFAULT_GRACE_S,
    HEARTBEAT_INTERVAL_S,
    LOOKAHEAD_S,
    NodeConfig,
    NodeRunner,
    connection_budget_problem,
)
from scheduler_project.logging import set_process_context

logger = logging.getLogger("cluster.runnode")
EXIT_USAGE = 2
ERR_IDLE_TIMEOUT = (
    "SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S={idle} must be below the renew deadline "
    "({deadline} ms): a node frozen inside a transaction would hold the cluster up past a lease"
)


class Command(BaseCommand):
    help = "Run a scheduler node (leader election, scheduling, execution)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node-id", default=f"{socket.gethostname()}-{os.getpid()}")
        parser.add_argument("--queues", default="default", help="Comma-separated queues to serve")
        parser.add_argument("--capacity", type=int, default=8, help="Executions run at once")
        parser.add_argument(
            "--coordination",
            choices=["database", "redis"],
            default=None,
            help=f"Coordination backend (default: {settings.SCHEDULER_COORDINATION})",
        )
        parser.add_argument("--lease-ttl-ms", type=int, default=2000)
        parser.add_argument("--renew-deadline-ms", type=int, default=1500)
        parser.add_argument("--retry-period-ms", type=int, default=250)
        parser.add_argument("--heartbeat-s", type=float, default=HEARTBEAT_INTERVAL_S)
        parser.add_argument(
            "--dead-after-s",
            type=float,
            default=DEAD_AFTER_S,
            help="Presence TTL: a node silent this long is dead and its work is reaped",
        )
        parser.add_argument("--lookahead-s", type=float, default=LOOKAHEAD_S)
        parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, help="Drain grace (s)")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="Serve this node's /metrics, /health/live and /health/ready on this port (0: off)",
        )
        parser.add_argument(
            "--metrics-host",
            default="0.0.0.0",  # noqa: S104 - a node pod is probed on its own address
            help="Address for --metrics-port",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = NodeConfig(
                node_id=options["node_id"],
                queues=[q.strip() for q in options["queues"].split(",") if q.strip()],
                capacity=options["capacity"],
                heartbeat_interval_s=options["heartbeat_s"],
                dead_after_s=options["dead_after_s"],
                lookahead_s=options["lookahead_s"],
                grace_s=options["grace"],
                election=ElectionConfig(
                    lease_ttl_ms=options["lease_ttl_ms"],
                    renew_deadline_ms=options["renew_deadline_ms"],
                    retry_period_ms=options["retry_period_ms"],
                ),
            )
            if not 0 <= options["metrics_port"] <= 65535:
                raise ValueError("--metrics-port must be a TCP port (1-65535), or 0 for none")
            idle_s = settings.SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S
            if idle_s and idle_s * 1000 >= config.election.renew_deadline_ms:
                raise ValueError(
                    ERR_IDLE_TIMEOUT.format(idle=idle_s, deadline=config.election.renew_deadline_ms)
                )
        except ValueError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        set_process_context(node=config.node_id)  # on every log line of this process
        try:
            tracing.configure(config.node_id)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        limit_idle_transactions(settings.SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S)
        connections.close_all()  # reopened with the limit
        coordination = options["coordination"] or settings.SCHEDULER_COORDINATION
        try:
            problem = connection_budget_problem(
                node_id=config.node_id,
                coordination=coordination,
                reserve=settings.SCHEDULER_WEB_DB_CONNECTIONS,
                dead_after_s=config.dead_after_s,
            )
        except DatabaseError as exc:
            # The database cannot be reached: nothing to check against now (the node waits for
            # it below, and the server refuses connections beyond its limit in any case).
            logger.warning("could not check the connection budget: %s", exc)
            problem = None
        finally:
            connections.close_all()
        if problem:
            raise CommandError(problem, returncode=EXIT_USAGE)
        backend = get_backend(options["coordination"])
        node = NodeRunner(config, backend)
        drain_requested = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            logger.info(
                "signal %s: draining", signal.Signals(signum).name, extra={"node": config.node_id}
            )
            drain_requested.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Started during a database or Redis outage (or before them): wait, logging, instead of
        # exiting; a signal meanwhile stops the wait and the node exits 0 having run nothing.
        if not node.register_when_reachable(drain_requested):
            self.stdout.write(f"node {config.node_id} stopped before it could register")
            return
        connections.close_all()  # the main thread holds none while the node runs
        server = self._serve_metrics(node, options["metrics_host"], options["metrics_port"])
        node.start(registered=True)
        self.stdout.write(f"node {config.node_id} running (pid {os.getpid()})")
        self.stdout.flush()
        while not node.stop_event.is_set():
            if drain_requested.wait(0.2):
                node.shutdown()
        node.join()
        if server is not None:
            server.shutdown()
        tracing.shutdown()
        self.stdout.write(f"node {config.node_id} stopped")

    def _serve_metrics(self, node: NodeRunner, host: str, port: int) -> Any:
        if not port:
            return None
        metrics = node_metrics.enable(node.config.node_id)
        app = node_metrics.app(
            metrics,
            tracked=node.executor.snapshot,
            capacity=node.config.capacity,
            ready=node.membership.confirmed,
        )
        try:
            server = node_metrics.serve(app, host, port)
        except OSError as exc:
            # The node runs without its metrics rather than not at all; the log says why.
            logger.error("cannot serve metrics on %s:%s: %s", host, port, exc)
            return None
        self.stdout.write(f"metrics on http://{host}:{server.server_port}/metrics")
        return server
