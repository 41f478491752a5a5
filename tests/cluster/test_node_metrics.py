"""A node's own metrics and probes (``runnode --metrics-port``): after a run, its /metrics has the
named series with the node's label; /health/ready follows the node's membership; the recording
functions do nothing in a process that did not enable them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db.utils import OperationalError
from prometheus_client import generate_latest

import tests.cluster.tasks  # noqa: F401 - registers the test.* tasks
from cluster import node_metrics
from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend
from cluster.dbhealth import DatabaseHealth, Reachability
from cluster.executor import Executor
from cluster.membership import Membership
from jobs import services
from jobs.models import JobExecution
from tests.cluster.harness import running_executor, wait_for, wait_until_ended

pytestmark = pytest.mark.django_db(transaction=True)
NODE = "metrics-node"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def metrics() -> Iterator[node_metrics.NodeMetrics]:
    yield node_metrics.enable(NODE)
    node_metrics.disable()


@pytest.fixture
def executor(metrics) -> Iterator[Executor]:
    with running_executor(NODE, capacity=3) as runner:
        yield runner


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {series} in\n{text}")


def run_one(executor: Executor, name: str, task_name: str, **fields: object) -> JobExecution:
    job = services.job_create(
        data={
            "name": name,
            "task": task_name,
            "schedule_type": "interval",
            "interval_seconds": 3600,
            **fields,
        },
        by=services.SYSTEM,
    )
    [run] = services.runs_enqueue(job_id=job.pk, items=[{}], by=services.SYSTEM)
    assert executor.claim_once() == 1
    return wait_until_ended(run.pk)


def test_a_nodes_metrics_name_its_runs_claims_locks_and_leadership(metrics, executor):
    assert run_one(executor, "ok-job", "noop").status == "succeeded"
    assert run_one(executor, "bad-job", "test.fail", concurrency_policy="forbid").status == "failed"
    node_metrics.leading(7, "started")
    app = node_metrics.app(
        metrics,
        tracked=executor.snapshot,
        capacity=3,
        member=executor.membership.confirmed,
        database=lambda: Reachability(True),
    )
    server = node_metrics.serve(app, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        status, text = get(base + "/metrics")
        assert status == 200
        label = f'node="{NODE}"'
        expected = [
            f'scheduler_node_executions_total{{job="ok-job",{label},outcome="succeeded"}} 1.0',
            f'scheduler_node_executions_total{{job="bad-job",{label},outcome="failed"}} 1.0',
            f"scheduler_node_start_lag_seconds_count{{{label}}} 2.0",
            f'scheduler_node_execution_duration_seconds_count{{job="ok-job",{label}}} 1.0',
            f"scheduler_node_claim_batch_size_count{{{label}}} 2.0",
            f"scheduler_node_leader{{{label}}} 1.0",
            f"scheduler_node_term{{{label}}} 7.0",
            f'scheduler_node_terms_total{{event="started",{label}}} 1.0',
            f"scheduler_node_capacity{{{label}}} 3.0",
            f'scheduler_node_runs{{{label},state="running"}} 0.0',
        ]
        missing = [line for line in expected if line not in text]
        assert not missing, "\n".join(missing) + "\n---\n" + text
        # The forbid run took its job lock (once per admission it went through).
        assert sample(text, f'scheduler_node_lock_acquisitions_total{{{label},result="held"}}') >= 1
        assert sample(text, f"scheduler_node_lock_acquire_seconds_count{{{label}}}") >= 1
        assert get(base + "/health/live")[0] == 200
        assert get(base + "/health/ready")[0] == 200
        assert get(base + "/nothing")[0] == 404
    finally:
        server.shutdown()


def test_readiness_follows_the_nodes_membership(metrics):
    clock = SettableClock()
    membership = Membership(MemoryBackend(clock=clock), NODE, ttl_s=2.0, clock=clock)
    membership.renew({})
    health = DatabaseHealth(node_id=NODE, limit_s=1.0, clock=clock)
    app = node_metrics.app(
        metrics, tracked=dict, capacity=1, member=membership.confirmed, database=health.observe
    )
    server = node_metrics.serve(app, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/health/ready"
        assert get(url)[0] == 200
        clock.advance(5.0)  # no renewal: the presence can no longer be shown
        status, text = get(url)
        assert (status, text) == (503, "membership not confirmed\n")
        membership.renew({})
        assert get(url)[0] == 200
    finally:
        server.shutdown()


def test_readiness_turns_503_while_the_database_cannot_be_reached(metrics):
    clock = SettableClock()
    membership = Membership(MemoryBackend(clock=clock), NODE, ttl_s=60.0, clock=clock)
    membership.renew({})
    health = DatabaseHealth(
        node_id=NODE,
        limit_s=1.0,
        clock=clock,
        on_change=lambda state: node_metrics.database(state.reachable),
    )
    app = node_metrics.app(
        metrics, tracked=dict, capacity=1, member=membership.confirmed, database=health.observe
    )
    server = node_metrics.serve(app, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/health/ready"
        assert get(url) == (200, "member; database reachable\n")
        health.failed(OperationalError(2003, "Can't connect to MySQL server"), "the heartbeat")
        status, text = get(url)
        assert status == 503
        assert text.startswith("database unreachable: "), text
        text = generate_latest(metrics.registry).decode()
        assert sample(text, f'scheduler_node_database_reachable{{node="{NODE}"}}') == 0.0
        assert sample(text, f'scheduler_node_database_unreachable_total{{node="{NODE}"}}') == 1.0
    finally:
        server.shutdown()


def test_recording_is_a_no_op_until_enabled() -> None:
    node_metrics.disable()
    node_metrics.outcome("j", "succeeded", 0.1, 0.2)
    node_metrics.claim(3, 0.01)
    node_metrics.leading(3, "started")
    assert node_metrics.current() is None


@pytest.mark.integration
def test_a_real_runnode_serves_its_metrics_and_probes(tmp_path) -> None:
    """``runnode --metrics-port N``: ready once registered, its series named with the node; a
    SIGTERM drains it (exit 0). A port out of range is exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'node.sqlite3'}",
            "SCHEDULER_VAR_DIR": str(tmp_path),
            "SCHEDULER_COORDINATION": "database",
            "DJANGO_SECRET_KEY": "test-secret-key-for-runnode-metrics-0123456789abcdefgh",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("REDIS_URL", None)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True, timeout=120)
    bad = subprocess.run(
        [*manage, "runnode", "--metrics-port", "70000"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--metrics-port" in bad.stderr
    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "node.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*manage, "runnode", "--node-id", "probed", "--metrics-port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: f"metrics on http://0.0.0.0:{port}/metrics" in log.read_text(), 30)
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: get(base + "/health/ready")[0] == 200, 30)
            assert get(base + "/health/live")[0] == 200
            renewals = 'scheduler_node_presence_renewal_seconds_count{node="probed"}'
            text = wait_for(
                lambda: (lambda t: t if renewals in t else None)(get(base + "/metrics")[1]), 10
            )
            assert 'scheduler_node_capacity{node="probed"} 8.0' in text
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
