"""``runcluster`` (what ``make run`` starts) creates the example jobs on a first start and
supervises its processes: a crashed node is restarted, a drained node stays stopped while the web
server and the other nodes keep running, a taken port is a one-line error with a non-zero status,
and SIGTERM stops everything with 0. Real processes on a SQLite database of the test's own."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from chaos.redis_server import free_port
from tests.cluster.harness import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(
        {
            "SCHEDULER_VAR_DIR": str(tmp_path),
            "SCHEDULER_COORDINATION": "database",
            "DJANGO_SECRET_KEY": "test-secret-key-for-runcluster-0123456789abcdefghijklmnop",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def answers(port: int, path: str = "/health/live") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def free_run_of_ports(count: int) -> int:
    """A port P with P+1 .. P+count free (for --metrics-port P)."""
    for _ in range(50):
        base = free_port()
        ports = range(base + 1, base + count + 1)
        if ports[-1] < 65536 and all(_free(port) for port in ports):
            return base
    raise AssertionError("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pinned_to(pid: int) -> set[str]:
    """The CPUs the threads of ``pid`` may use, as the kernel lists them."""
    return {
        line.split()[1]
        for task in Path(f"/proc/{pid}/task").iterdir()
        for line in (task / "status").read_text().splitlines()
        if line.startswith("Cpus_allowed_list:")
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state says it is gone.
    state = (
        Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else "X"
    )
    return state not in ("Z", "X")


def test_a_crashed_node_is_restarted_and_a_drained_one_stays_down(tmp_path):
    env = environment(tmp_path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    port = free_port()
    metrics = free_run_of_ports(2)
    log = tmp_path / "cluster.log"
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runcluster",
                "--port",
                str(port),
                "--nodes",
                "2",
                "--metrics-port",
                str(metrics),
                "--pin-cpus",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            started = wait_for(lambda: re.search(r"started (.*)", log.read_text()), 30)
            pids = dict(re.findall(r"(\S+) \(pid (\d+)\)", started.group(1)))
            # A first start on a database that never had a job: the example jobs (jobs/examples.py).
            assert re.search(r"created \d+ example jobs", log.read_text()), log.read_text()
            wait_for(lambda: answers(port), 30)
            # Each node serves its probes on --metrics-port + its index.
            wait_for(lambda: answers(metrics + 1, "/health/ready"), 30)
            wait_for(lambda: answers(metrics + 2, "/health/ready"), 30)
            # --pin-cpus: node i on the i-th CPU, in turn.
            cpus = sorted(os.sched_getaffinity(0))
            for index in (1, 2):
                assert pinned_to(int(pids[f"node-{index}"])) == {str(cpus[(index - 1) % len(cpus)])}

            os.kill(int(pids["node-1"]), signal.SIGKILL)
            restarted = wait_for(
                lambda: re.search(r"restarted node-1 \(pid (\d+)\)", log.read_text()), 30
            )
            assert alive(int(restarted.group(1)))
            wait_for(lambda: answers(metrics + 1, "/health/ready"), 30)  # the new process

            os.kill(int(pids["node-2"]), signal.SIGTERM)  # drained: exits 0
            wait_for(lambda: "node-2 stopped (drained" in log.read_text(), 60)
            time.sleep(2 * 1.0)  # past the first restart backoff: it must not come back
            text = log.read_text()
            assert "restarted node-2" not in text
            assert answers(port), text  # the web server stays up
            assert cluster.poll() is None, text

            cluster.send_signal(signal.SIGTERM)
            assert cluster.wait(60) == 0, log.read_text()
        finally:
            if cluster.poll() is None:
                cluster.kill()
                cluster.wait()
    assert "all processes stopped" in log.read_text()
    for pid in (*map(int, pids.values()), int(restarted.group(1))):
        assert not alive(pid)


def test_a_taken_port_is_one_clear_line_and_a_non_zero_status(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "runcluster", "--port", str(port), "--nodes", "1"],
            cwd=ROOT,
            env=environment(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "started" not in result.stdout


def test_the_web_process_serves_the_projects_own_asgi_application(settings):
    """runcluster starts daphne on ``settings.ASGI_APPLICATION``, not on a project it names: a
    host project's settings bring their own."""
    from django.core.management import CommandError

    from cluster.management.commands.runcluster import asgi_target

    assert asgi_target() == "scheduler_project.asgi:application"
    settings.ASGI_APPLICATION = "mysite.asgi.application"
    assert asgi_target() == "mysite.asgi:application"
    settings.ASGI_APPLICATION = "application"
    with pytest.raises(CommandError, match="not a dotted path"):
        asgi_target()
