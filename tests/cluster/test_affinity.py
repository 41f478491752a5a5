"""``runnode --cpus``: a real node pinned to one CPU, every thread of it, and its process-isolated
task's child process not pinned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.utils import timezone

import tests.cluster.tasks  # noqa: F401 - registers test.cpus in this process for validation
from jobs.models import JobExecution
from jobs.services import SYSTEM, job_create
from tests.cluster.harness import Cluster, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="needs CPU affinity and at least two CPUs",
    ),
]


def cpus_of_threads(pid: int) -> set[str]:
    """Each thread's allowed CPUs as the kernel lists them ("0", "0-1")."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.add(line.split()[1])
    return found


def test_a_pinned_node_runs_every_thread_on_its_cpu_and_its_child_processes_on_all(tmp_path):
    everywhere = sorted(os.sched_getaffinity(0))
    pinned = everywhere[-1]
    out = tmp_path / "child-cpus.txt"
    job = job_create(
        data={
            "name": "where",
            "task": "test.cpus",
            "kwargs": {"path": str(out)},
            "schedule_type": "interval",
            "interval_seconds": 3600,
            "isolation": "process",
            "enabled": False,
        },
        by=SYSTEM,
    )
    cluster = Cluster(tmp_path)
    try:
        node = cluster.start("pinned", "--cpus", str(pinned))
        wait_for(lambda: "running (pid" in node.log(), 30)
        now = timezone.now()
        JobExecution.objects.create(
            job=job, scheduled_for=now, run_after=now, trigger="manual", queue=job.queue
        )
        wait_for(out.exists, 30)
        wait_for(out.read_text, 5)
        # Every thread, those started after the pin included (task workers, the finisher...).
        assert cpus_of_threads(node.pid) == {str(pinned)}, node.log()
        assert out.read_text() == ",".join(str(cpu) for cpu in everywhere)
    finally:
        cluster.close()
    assert f"pinned to CPUs [{pinned}]" in cluster.logs()
