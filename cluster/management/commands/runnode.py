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

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from cluster import affinity, node_metrics, tracing
from cluster import conf as scheduler_settings
from cluster.apps import limit_idle_transactions
from cluster.behind import describe as behind_line
from cluster.behind import partitions_line
from cluster.clock import ReferenceClock
from cluster.coordination import get_backend
from cluster.elector import ElectionConfig
from cluster.logcontext import set_process_context
from cluster.node import (
    NodeConfig,
    NodeRunner,
    connection_budget_problem,
)
from cluster.startup import freeze_loaded
from jobs.conf import app_setting
from jobs.executions.rows import set_job_cache_size

logger = logging.getLogger("cluster.runnode")
EXIT_USAGE = 2
# settings.SCHEDULER key -> the option's name in ``options``.
FLAGS = {
    "QUEUES": "queues",
    "CAPACITY": "capacity",
    "LEASE_TTL_MS": "lease_ttl_ms",
    "RENEW_DEADLINE_MS": "renew_deadline_ms",
    "RETRY_PERIOD_MS": "retry_period_ms",
    "HEARTBEAT_S": "heartbeat_s",
    "DEAD_AFTER_S": "dead_after_s",
    "LOOKAHEAD_S": "lookahead_s",
    "DRAIN_GRACE_S": "grace",
    "DB_CONTROL_LIMIT_S": "db_control_limit_s",
    "BEHIND_WARN_S": "behind_warn_s",
    "CATCH_UP_PER_S": "catch_up_per_s",
    "JOB_CACHE_SIZE": "job_cache_size",
    "METRICS_PORT": "metrics_port",
    "METRICS_HOST": "metrics_host",
    "CPUS": "cpus",
}
ERR_IDLE_TIMEOUT = (
    "SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S={idle} must be below the renew deadline "
    "({deadline} ms): a node frozen inside a transaction would hold the cluster up past a lease"
)


class Command(BaseCommand):
    help = "Run a scheduler node (leader election, scheduling, execution)."

    def add_arguments(self, parser: CommandParser) -> None:
        try:
            knobs = scheduler_settings.knobs()
        except ImproperlyConfigured:
            # Said (naming the knob, exit 2) when the command runs: the help still works.
            knobs = scheduler_settings.from_mapping({})

        def knob(flag: str, key: str, kind: type, text: str) -> None:
            # Unset: settings.SCHEDULER's value (its default, or SCHEDULER_<KEY>).
            parser.add_argument(
                flag,
                type=kind,
                default=None,
                dest=FLAGS[key],
                help=f"{text} (default: SCHEDULER_{key}, now {knobs[key]})",
            )

        parser.add_argument("--node-id", default=f"{socket.gethostname()}-{os.getpid()}")
        knob("--queues", "QUEUES", str, "Comma-separated queues to serve")
        knob("--capacity", "CAPACITY", int, "Executions run at once")
        parser.add_argument(
            "--coordination",
            choices=["database", "redis"],
            default=None,
            help=f"Coordination backend (default: {app_setting('SCHEDULER_COORDINATION')})",
        )
        knob("--lease-ttl-ms", "LEASE_TTL_MS", int, "Leader lease TTL")
        knob("--renew-deadline-ms", "RENEW_DEADLINE_MS", int, "A leader steps down past this")
        knob("--retry-period-ms", "RETRY_PERIOD_MS", int, "Election retry period")
        knob("--heartbeat-s", "HEARTBEAT_S", float, "Presence renewal interval")
        knob(
            "--dead-after-s",
            "DEAD_AFTER_S",
            float,
            "Presence TTL: a node silent this long is dead and its work is reaped",
        )
        knob("--lookahead-s", "LOOKAHEAD_S", float, "The leader creates fires this far ahead")
        knob("--grace", "DRAIN_GRACE_S", float, "Drain grace (s)")
        knob(
            "--db-control-limit-s",
            "DB_CONTROL_LIMIT_S",
            float,
            "Longest database statement on the control path (leader, heartbeat, notifier); "
            "unanswered a little longer, the database counts as unreachable",
        )
        knob(
            "--behind-warn-s",
            "BEHIND_WARN_S",
            float,
            "The leader warns once when fires or claims fall this far behind schedule",
        )
        knob(
            "--catch-up-per-s",
            "CATCH_UP_PER_S",
            float,
            "Runs released a second from misfire catch-up (run_all's missed slots), across the "
            "cluster; 0: no bound",
        )
        knob(
            "--job-cache-size",
            "JOB_CACHE_SIZE",
            int,
            "Jobs this process keeps in memory as its claims last read them (about 2-3.5 KB "
            "each); 0: every claim reads its jobs",
        )
        knob(
            "--metrics-port",
            "METRICS_PORT",
            int,
            "Serve this node's /metrics, /health/live and /health/ready on this port (0: off)",
        )
        knob("--metrics-host", "METRICS_HOST", str, "Address for --metrics-port")
        knob(
            "--cpus",
            "CPUS",
            str,
            "Pin this node's threads to these CPUs, e.g. 0 or 0,1 (see cluster.affinity; "
            "empty: not pinned)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            given = {key: options.get(name) for key, name in FLAGS.items()}
            if given["QUEUES"] is not None:
                given["QUEUES"] = [q.strip() for q in given["QUEUES"].split(",") if q.strip()]
            if given["CPUS"] is not None:
                try:
                    given["CPUS"] = scheduler_settings.cpu_list(given["CPUS"])
                except ValueError:
                    raise ValueError(
                        f"--cpus: {given['CPUS']!r} is not a comma-separated list of CPU numbers"
                    ) from None
            try:
                configured = scheduler_settings.knobs()
            except ImproperlyConfigured as exc:
                raise CommandError(f"settings: {exc}", returncode=2) from None
            knobs = scheduler_settings.with_overrides(configured, given)
            config = NodeConfig(
                node_id=options["node_id"],
                queues=knobs["QUEUES"],
                capacity=knobs["CAPACITY"],
                heartbeat_interval_s=knobs["HEARTBEAT_S"],
                dead_after_s=knobs["DEAD_AFTER_S"],
                lookahead_s=knobs["LOOKAHEAD_S"],
                grace_s=knobs["DRAIN_GRACE_S"],
                db_control_limit_s=knobs["DB_CONTROL_LIMIT_S"],
                behind_warn_s=knobs["BEHIND_WARN_S"],
                catch_up_per_s=knobs["CATCH_UP_PER_S"],
                election=ElectionConfig(
                    lease_ttl_ms=knobs["LEASE_TTL_MS"],
                    renew_deadline_ms=knobs["RENEW_DEADLINE_MS"],
                    retry_period_ms=knobs["RETRY_PERIOD_MS"],
                ),
            )
            idle_s = app_setting("SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S")
            if idle_s and idle_s * 1000 >= config.election.renew_deadline_ms:
                raise ValueError(
                    ERR_IDLE_TIMEOUT.format(idle=idle_s, deadline=config.election.renew_deadline_ms)
                )
        except ValueError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        # Before any thread of the node starts: they all inherit it.
        affinity.pin(knobs["CPUS"])
        set_process_context(node=config.node_id)  # on every log line of this process
        set_job_cache_size(knobs["JOB_CACHE_SIZE"])
        try:
            tracing.configure(config.node_id)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        limit_idle_transactions(app_setting("SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S"))
        connections.close_all()  # reopened with the limit
        coordination = options["coordination"] or app_setting("SCHEDULER_COORDINATION")
        try:
            problem = connection_budget_problem(
                node_id=config.node_id,
                coordination=coordination,
                reserve=app_setting("SCHEDULER_WEB_DB_CONNECTIONS"),
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
        # The node's time is its database's (read now and then, carried by the monotonic clock):
        # a step of this machine's clock moves nothing it computes. Leases in the coordination
        # store are written on the same clock.
        clock = ReferenceClock()
        backend = get_backend(options["coordination"], clock=clock)
        node = NodeRunner(config, backend, clock=clock)
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
        server = self._serve_metrics(node, knobs["METRICS_HOST"], knobs["METRICS_PORT"])
        freeze_loaded()  # Django, the apps, the tasks: out of the collector's sight
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
            member=node.membership.confirmed,
            database=node.database.observe,
            behind=lambda: "; ".join(
                line
                for line in (
                    behind_line(node.behind.state),
                    partitions_line(node.partition_watch.describe()),
                )
                if line
            ),
        )
        try:
            server = node_metrics.serve(app, host, port)
        except OSError as exc:
            # The node runs without its metrics rather than not at all; the log says why.
            logger.error("cannot serve metrics on %s:%s: %s", host, port, exc)
            return None
        self.stdout.write(f"metrics on http://{host}:{server.server_port}/metrics")
        return server
