"""Real ``runnode`` processes against the test database, for the cluster's fault tests.

Every process is started here and ended here, by PID. Children connect to the same test database as
the test (committed data: tests using this run with ``transaction=True``) and import the test tasks
through SCHEDULER_TASK_MODULES.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
NODE_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


def child_database_url() -> str:
    """A DATABASE_URL naming the database this test process is connected to (the test DB)."""
    sd = connection.settings_dict
    if sd["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(sd['NAME']).resolve()}"
    user = sd.get("USER") or "root"
    password = f":{sd['PASSWORD']}" if sd.get("PASSWORD") else ""
    host = sd.get("HOST") or "127.0.0.1"
    port = sd.get("PORT") or 3306
    return f"mysql://{user}{password}@{host}:{port}/{sd['NAME']}"


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


class NodeProcess:
    def __init__(self, node_id: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.node_id = node_id
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in stop()
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        """SIGCONT (in case it was stopped), SIGTERM, then SIGKILL after a grace period."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()
        return self.process.returncode

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")


class Cluster:
    """Starts nodes with a shared configuration; ``close()`` stops every one of them."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        coordination: str = "database",
        redis_url: str | None = None,
        redlock_urls: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        default_args: list[str] | None = None,
    ) -> None:
        self.tmp_path = tmp_path
        self.nodes: dict[str, NodeProcess] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            {
                "DATABASE_URL": child_database_url(),
                "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
                "DJANGO_SECRET_KEY": "test-secret-key-for-cluster-processes-0123456789abcdef",
                "SCHEDULER_VAR_DIR": str(tmp_path / "var"),
                "SCHEDULER_TASK_MODULES": "tests.cluster.tasks",
                "SCHEDULER_COORDINATION": coordination,
                "SCHEDULER_REDIS_PREFIX": f"t{os.getpid()}x{int(time.time() * 1000) % 10**8}",
                "LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("REDIS_URL", None)
        env.pop("REDLOCK_URLS", None)
        if redis_url:
            env["REDIS_URL"] = redis_url
        if redlock_urls:
            env["REDLOCK_URLS"] = ",".join(redlock_urls)
        env.update(extra_env or {})
        self.env = env
        self.default_args = default_args or []

    def start(self, node_id: str, *args: str) -> NodeProcess:
        argv = [
            sys.executable,
            "manage.py",
            "runnode",
            "--node-id",
            node_id,
            *self.default_args,
            *args,
        ]
        node = NodeProcess(node_id, argv, self.env, self.tmp_path / f"{node_id}.log")
        self.nodes[node_id] = node
        return node

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {n.node_id} ---\n{n.log()[-4000:]}" for n in self.nodes.values())


def current_leader() -> tuple[str, int] | None:
    """(node_id, term) of the cluster leader's (partition 0's) open term, from the database."""
    from cluster.models import LeadershipTerm

    row = (
        LeadershipTerm.objects.filter(partition=0, ended_at__isnull=True)
        .order_by("-term")
        .values_list("node_id", "term")
        .first()
    )
    return (row[0], row[1]) if row else None


def read_records(path: Path) -> list[tuple[int, float, int, float, int]]:
    """Lines written by the test.record task: (execution id, slot, attempt, started, pid)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        execution_id, slot, attempt, started, pid = line.split()
        rows.append((int(execution_id), float(slot), int(attempt), float(started), int(pid)))
    return rows


@contextlib.contextmanager
def running_executor(
    node_id: str, *, capacity: int, ttl_s: float = 3600, teardown_s: float = 5.0
) -> Iterator[Any]:
    """An Executor on an in-memory coordination backend with its starter (and finisher,
    supervisor, lock keeper) threads running. Its membership is renewed once, for ``ttl_s``: no
    cluster can declare it dead meanwhile. On exit, unstarted work goes back, running work is
    handed back, and the threads stop, so no run thread writes into the next test."""
    import threading

    from cluster.coordination.memory import MemoryBackend
    from cluster.executor import Executor
    from cluster.membership import Membership

    backend = MemoryBackend()
    membership = Membership(backend, node_id, ttl_s=ttl_s)
    membership.renew({})
    executor = Executor(
        node_id=node_id,
        queues=["default"],
        capacity=capacity,
        backend=backend,
        membership=membership,
        heartbeat_s=1.0,
    )
    stop = threading.Event()
    starter = threading.Thread(target=executor.run_starter, args=(stop,), daemon=True)
    starter.start()
    try:
        yield executor
    finally:
        executor.claiming = False
        executor.release_unstarted()
        executor.hand_back_running()
        executor.wait_idle(teardown_s)
        stop.set()
        executor.wake_starter()
        starter.join(teardown_s)


def wait_until_ended(execution_id: int, timeout: float = 15.0) -> Any:
    """The execution's row once it reached a terminal state."""
    from jobs.models import JobExecution
    from jobs.states import TERMINAL_STATES

    def ended() -> Any:
        row = JobExecution.objects.get(pk=execution_id)
        return row if row.status in TERMINAL_STATES else None

    return wait_for(ended, timeout, interval=0.02)
