"""A node's database connections stay within its budget whatever its capacity, and runnode refuses
to start a node that would not fit the server's max_connections (MariaDB; SQLite has no such
limit)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from cluster.models import NodeStatus, SchedulerNode
from cluster.node import NODE_DB_CONNECTIONS, connection_budget_problem
from jobs.models import JobExecution
from jobs.services import SYSTEM, jobs_create_batch
from jobs.states import ExecutionStatus
from tests.cluster.harness import ROOT, Cluster, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ON_MYSQL = connection.vendor == "mysql"
mysql_only = pytest.mark.skipif(not ON_MYSQL, reason="connection limits are a MariaDB matter")
LOAD_S = 6.0
JOBS = 100


def server_limit() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_connections")
        return int(cursor.fetchone()[0])


def connections_to_this_database() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s",
            [connection.settings_dict["NAME"]],
        )
        return int(cursor.fetchone()[0])


def register(count: int) -> None:
    SchedulerNode.objects.bulk_create(
        SchedulerNode(
            node_id=f"running-{k}",
            hostname="h",
            pid=k + 1,
            started_at=timezone.now(),
            last_heartbeat=timezone.now(),
            status=NodeStatus.ACTIVE,
        )
        for k in range(count)
    )


def test_sqlite_has_no_connection_limit_to_check() -> None:
    if ON_MYSQL:
        pytest.skip("the suite runs on MariaDB")
    assert connection_budget_problem(node_id="n", coordination="database", reserve=10**6) is None


@mysql_only
def test_nodes_that_fit_max_connections_start_and_one_more_is_refused() -> None:
    limit, budget, reserve = server_limit(), NODE_DB_CONNECTIONS["redis"], 20
    fits = (limit - reserve) // budget - 1  # running nodes that leave room for this one
    register(fits)
    assert connection_budget_problem(node_id="new", coordination="redis", reserve=reserve) is None
    SchedulerNode.objects.filter(node_id="running-0").update(node_id="one-too-many")
    register(1)  # running-0 again: one more node than fits
    problem = connection_budget_problem(node_id="new", coordination="redis", reserve=reserve)
    assert problem is not None
    assert f"allows {limit} connections" in problem and "max_connections" in problem
    # Stopped and dead nodes hold no connections: they do not count.
    SchedulerNode.objects.filter(node_id="one-too-many").update(status=NodeStatus.DEAD)
    assert connection_budget_problem(node_id="new", coordination="redis", reserve=reserve) is None
    # Nor do rows still marked active whose nodes stopped heartbeating (died, and not reaped yet:
    # after a host reboot every node would otherwise be locked out).
    SchedulerNode.objects.filter(node_id="one-too-many").update(
        status=NodeStatus.ACTIVE, last_heartbeat=timezone.now() - timedelta(seconds=30)
    )
    assert connection_budget_problem(node_id="new", coordination="redis", reserve=reserve) is None


@mysql_only
def test_runnode_refuses_a_node_that_cannot_fit_with_exit_2(tmp_path) -> None:
    cluster = Cluster(tmp_path, extra_env={"SCHEDULER_WEB_DB_CONNECTIONS": str(server_limit())})
    result = subprocess.run(
        [sys.executable, "manage.py", "runnode", "--node-id", "too-many"],
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "max_connections" in result.stderr
    assert not SchedulerNode.objects.filter(node_id="too-many").exists()


@mysql_only
@pytest.mark.integration
def test_a_busy_node_stays_within_its_connection_budget(tmp_path) -> None:
    """One node of capacity 64 running 100 forbid 1 s jobs (100 starts a second, a job lock each):
    the connections it opens never exceed its budget."""
    jobs_create_batch(
        items=[
            {
                "name": f"busy-{k}",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 1,
                "concurrency_policy": "forbid",
            }
            for k in range(JOBS)
        ],
        by=SYSTEM,
    )
    baseline = connections_to_this_database()
    cluster = Cluster(tmp_path, coordination="database", extra_env={"LOG_LEVEL": "DEBUG"})
    peak = 0
    try:
        cluster.start("busy", "--capacity", "64")
        wait_for(
            lambda: JobExecution.objects.filter(status=ExecutionStatus.SUCCEEDED).count() >= JOBS,
            30,
        )
        until = time.monotonic() + LOAD_S
        while time.monotonic() < until:
            peak = max(peak, connections_to_this_database() - baseline)
            time.sleep(0.05)
        ran = JobExecution.objects.filter(status=ExecutionStatus.SUCCEEDED).count()
    finally:
        cluster.close()
    assert ran >= JOBS * LOAD_S * 0.5, f"the node ran only {ran} runs: {cluster.logs()}"
    assert 0 < peak <= NODE_DB_CONNECTIONS["database"], f"{peak} connections: {cluster.logs()}"
