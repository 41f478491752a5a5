"""Start the embedded system: the daphne web server and N ``runnode`` processes, supervised.

python manage.py runcluster [--host 127.0.0.1] [--port 8000] [--nodes N]

A node that crashes (a non-zero status, a signal such as SIGKILL) is restarted with backoff and
logged; a node that exits 0 (drained from the dashboard, or sent SIGTERM) stays stopped while the
rest keep running, which is what lets an operator watch a failover in the embedded mode. The web
server never goes down with a node. Ctrl-C (or SIGTERM) drains everything and exits 0; the web
server dying, or the port being taken at start, exits 1 with a one-line message.

On a database that never had a job it first creates a few example jobs (jobs/examples.py) unless
``SCHEDULER_EXAMPLE_JOBS`` is off, so the dashboard shows runs within seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.management import get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

STOP_GRACE_S = 15.0
POLL_S = 0.5
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
# A node that ran this long before crashing starts again from the first backoff.
RESTART_RESET_AFTER_S = 60.0
ERR_PORT_TAKEN = (
    "port {port} on {host} is already in use: stop what holds it, or choose another port "
    "(make run PORT=8001, or runcluster --port 8001)"
)


@dataclass
class Supervised:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    restart_at: float | None = None  # monotonic; set while a crashed node waits for its restart
    stopped: bool = False  # exited 0: drained, stays down

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv)
        self.started_at = time.monotonic()
        self.restart_at = None


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class Command(BaseCommand):
    help = (
        "Run the web server and scheduler nodes together (embedded mode), restarting crashed "
        "nodes; Ctrl-C stops them all."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--nodes", type=int, default=3, help="Scheduler nodes to start")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="Node i serves its metrics and probes on this port + i, on --host (0: none)",
        )
        parser.add_argument(
            "--pin-cpus",
            action="store_true",
            help="Pin node i to one CPU, the CPUs taken in turn (runnode --cpus)",
        )

    def handle(
        self,
        *args: Any,
        host: str,
        port: int,
        nodes: int,
        metrics_port: int = 0,
        pin_cpus: bool = False,
        **_: Any,
    ) -> None:
        if not port_is_free(host, port):
            raise CommandError(ERR_PORT_TAKEN.format(port=port, host=host))
        if metrics_port and not 0 < metrics_port + nodes <= 65535:
            raise CommandError("--metrics-port: node ports must fall within 1-65535", returncode=2)
        for index in range(1, nodes + 1) if metrics_port else ():
            if not port_is_free(host, metrics_port + index):
                raise CommandError(
                    f"metrics port {metrics_port + index} on {host} is already in use: choose "
                    "another --metrics-port"
                )
        self._create_examples()
        web = Supervised(
            "web",
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                asgi_target(),
            ],
        )
        workers: list[Supervised] = []
        if pin_cpus and not hasattr(os, "sched_getaffinity"):
            raise CommandError(
                "--pin-cpus: CPU pinning is not supported on this platform", returncode=2
            )
        cpus = sorted(os.sched_getaffinity(0)) if pin_cpus else []
        if "runnode" in get_commands():
            workers = [
                Supervised(
                    f"node-{index}",
                    [sys.executable, "manage.py", "runnode", "--node-id", f"node-{index}"]
                    + (
                        [
                            "--metrics-host",
                            host,
                            "--metrics-port",
                            str(metrics_port + index),
                        ]
                        if metrics_port
                        else []
                    )
                    + (["--cpus", str(cpus[(index - 1) % len(cpus)])] if pin_cpus else []),
                )
                for index in range(1, nodes + 1)
            ]
        elif nodes:
            self.stderr.write(
                "runnode is not available in this build: starting the web server only"
            )
        everyone = [web, *workers]
        for one in everyone:
            one.start()
        self.stdout.write(
            f"started {', '.join(f'{s.name} (pid {s.process.pid})' for s in everyone if s.process)}"
        )
        self.stdout.flush()
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        failure = None
        try:
            while not stopping:
                if web.process is not None and web.process.poll() is not None:
                    failure = f"the web server exited with status {web.process.returncode}"
                    break
                for node in workers:
                    self._supervise(node)
                time.sleep(POLL_S)
        finally:
            for one in everyone:
                if one.process is not None and one.process.poll() is None:
                    one.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for one in everyone:
                if one.process is None:
                    continue
                try:
                    one.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    one.process.kill()
                    one.process.wait()
            self.stdout.write("all processes stopped")
        if failure:
            raise CommandError(f"{failure}; stopped everything")

    def _create_examples(self) -> None:
        """The example jobs on a first start (jobs/examples.py); a database not migrated yet is
        left to the web server and the nodes to report."""
        from jobs import examples

        try:
            created = examples.create_on_first_start()
        except DatabaseError as exc:
            self.stderr.write(f"example jobs not created: {exc}")
            return
        finally:
            connections.close_all()  # this process keeps none while it supervises
        if created:
            self.stdout.write(
                f"created {len(created)} example jobs ({', '.join(job.name for job in created)}); "
                "SCHEDULER_EXAMPLE_JOBS=0 turns this off"
            )

    def _supervise(self, node: Supervised) -> None:
        """Restart a crashed node with backoff; leave a drained one (exit 0) stopped."""
        if node.stopped or node.process is None:
            return
        now = time.monotonic()
        if node.restart_at is not None:
            if now >= node.restart_at:
                node.start()
                self.stdout.write(f"restarted {node.name} (pid {node.process.pid})")
                self.stdout.flush()
            return
        status = node.process.poll()
        if status is None:
            return
        if status == 0:
            node.stopped = True
            self.stdout.write(
                f"{node.name} stopped (drained, exit 0); the others keep running. It stays "
                "stopped until runcluster starts again."
            )
            self.stdout.flush()
            return
        if now - node.started_at >= RESTART_RESET_AFTER_S:
            node.restarts = 0
        delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2**node.restarts)
        node.restarts += 1
        node.restart_at = now + delay
        self.stderr.write(f"{node.name} exited with status {status}; restarting in {delay:.0f} s")
        self.stderr.flush()


def asgi_target() -> str:
    """``settings.ASGI_APPLICATION`` as daphne takes it (``module:attribute``)."""
    module, _, attribute = settings.ASGI_APPLICATION.rpartition(".")
    if not module:
        raise CommandError(f"ASGI_APPLICATION {settings.ASGI_APPLICATION!r} is not a dotted path")
    return f"{module}:{attribute}"
