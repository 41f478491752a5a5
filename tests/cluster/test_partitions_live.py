"""Scheduling partitions with real ``runnode`` processes on Redis: the partitions are shared out
over the nodes, a SIGKILLed node's partitions are taken over, and every slot of every job (one
job per partition or more) runs once throughout."""

from __future__ import annotations

import math
import signal
import time
from collections import Counter

import pytest

import tests.cluster.tasks  # noqa: F401 - registers test.record in this process for validation
from cluster.models import LeadershipTerm
from jobs import partitioning, services
from tests.cluster.harness import Cluster, wait_for
from tests.cluster.test_failover import assert_every_slot_once

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PARTITIONS = 4
NODE_ARGS = ["--heartbeat-s", "0.3", "--dead-after-s", "3"]


def open_terms() -> dict[int, str]:
    """partition -> the node whose term of it is open (the newest)."""
    found: dict[int, str] = {}
    for partition, node in (
        LeadershipTerm.objects.filter(ended_at__isnull=True)
        .order_by("term")
        .values_list("partition", "node_id")
    ):
        found[partition] = node
    return found


def shared_over(nodes: set[str]) -> dict[int, str] | None:
    led = open_terms()
    if sorted(led) != list(range(PARTITIONS)) or set(led.values()) != nodes:
        return None
    return led


def test_partitions_are_shared_taken_over_and_every_slot_runs_once(tmp_path, redis_url):
    partitioning.set_count(PARTITIONS)
    jobs = []
    names = (f"part-{k}" for k in range(1000))
    for partition in range(PARTITIONS):  # two jobs in every partition
        for _ in range(2):
            name = next(n for n in names if partitioning.of_name(n, PARTITIONS) == partition)
            path = tmp_path / f"{name}.txt"
            jobs.append(
                (
                    services.job_create(
                        data={
                            "name": name,
                            "task": "test.record",
                            "kwargs": {"path": str(path)},
                            "schedule_type": "interval",
                            "interval_seconds": 1,
                        },
                        by=services.SYSTEM,
                    ),
                    path,
                )
            )
    assert {job.partition for job, _ in jobs} == set(range(PARTITIONS))
    cluster = Cluster(tmp_path, coordination="redis", redis_url=redis_url, default_args=NODE_ARGS)
    try:
        for node in ("n0", "n1", "n2"):
            cluster.start(node)
        led = wait_for(lambda: shared_over({"n0", "n1", "n2"}), 30)
        assert max(Counter(led.values()).values()) == 2, led
        # A node leading a partition other than 0 (not the cluster leader) is killed.
        victim = next(node for p, node in sorted(led.items()) if p and node != led[0])
        taken = [p for p, node in led.items() if node == victim]
        time.sleep(2)
        # Mid-second: the next slot's runs are claimed but not yet marked running (that comes
        # just before their instant), so the kill leaves none lost without a body; a kill at the
        # worst instant is tried in test_fault_windows and on the deterministic cluster.
        time.sleep(math.ceil(time.time()) + 0.5 - time.time())
        killed_at = time.time()
        cluster.nodes[victim].signal(signal.SIGKILL)
        cluster.nodes[victim].wait(5)
        after = wait_for(lambda: shared_over({"n0", "n1", "n2"} - {victim}), 20)
        takeover = max(
            LeadershipTerm.objects.filter(partition=p, node_id=after[p])
            .order_by("-term")
            .first()
            .acquired_at.timestamp()
            for p in taken
        )
        assert takeover - killed_at < 6.0, cluster.logs()
        time.sleep(5)
        checked_until = time.time() - 2
    finally:
        cluster.close()
    for job, path in jobs:
        assert assert_every_slot_once(job, path, until=checked_until) >= 5
    assert any("started leading partition" in node.log() for node in cluster.nodes.values())
