"""Start the embedded system: the daphne web server and N ``runnode`` processes; Ctrl-C stops all.

python manage.py runcluster [--host 127.0.0.1] [--port 8000] [--nodes N]
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

from django.core.management import get_commands
from django.core.management.base import BaseCommand, CommandParser

STOP_GRACE_S = 15.0
POLL_S = 0.5


class Command(BaseCommand):
    help = "Run the web server and scheduler nodes together (embedded mode); Ctrl-C stops them all."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--nodes", type=int, default=3, help="Scheduler nodes to start")

    def handle(self, *args: Any, host: str, port: int, nodes: int, **_: Any) -> None:
        commands: list[tuple[str, list[str]]] = [
            (
                "web",
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    host,
                    "-p",
                    str(port),
                    "scheduler_project.asgi:application",
                ],
            )
        ]
        if "runnode" in get_commands():
            for index in range(1, nodes + 1):
                commands.append(
                    (
                        f"node-{index}",
                        [sys.executable, "manage.py", "runnode", "--node-id", f"node-{index}"],
                    )
                )
        elif nodes:
            self.stderr.write(
                "runnode is not available in this build: starting the web server only"
            )
        processes = {name: subprocess.Popen(argv) for name, argv in commands}
        self.stdout.write(
            f"started {', '.join(f'{n} (pid {p.pid})' for n, p in processes.items())}"
        )
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, process in processes.items():
                    if process.poll() is not None:
                        self.stderr.write(
                            f"{name} exited with status {process.returncode}; stopping all"
                        )
                        stopping = True
                time.sleep(POLL_S)
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for process in processes.values():
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
            self.stdout.write("all processes stopped")
