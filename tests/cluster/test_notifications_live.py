"""Failure notifications from a real cluster: a run that fails on a runnode process is posted by
the leader's notifier to a local webhook receiver, once, and recorded as sent."""

from __future__ import annotations

import pytest

from cluster.models import NodeStatus, SchedulerNode
from jobs import services
from jobs.models import Notification, NotificationRule
from tests.cluster.harness import Cluster, wait_for
from tests.jobs.test_notifications import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NODE_ARGS = ["--heartbeat-s", "0.3", "--dead-after-s", "3"]
WAIT_S = 30.0


def test_a_failing_run_on_a_live_cluster_reaches_the_webhook(tmp_path) -> None:
    receiver = Receiver()
    cluster = Cluster(tmp_path, coordination="database", default_args=NODE_ARGS)
    try:
        NotificationRule.objects.create(
            name="on-call", events=["failed"], channel="webhook", target=receiver.url
        )
        job = services.job_create(
            data={
                "name": "always-fails",
                "task": "demo_fail",
                "kwargs": {"message": "disk full"},
                "schedule_type": "cron",
                "cron_expression": "0 0 1 1 *",
            },
            by=services.SYSTEM,
        )
        cluster.start("n0")
        wait_for(
            lambda: SchedulerNode.objects.filter(node_id="n0", status=NodeStatus.ACTIVE).exists(),
            WAIT_S,
        )
        run = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
        wait_for(lambda: receiver.requests, WAIT_S, interval=0.1)
        _, body = receiver.requests[0]
        assert body["execution"]["id"] == run.pk
        assert body["execution"]["error"] == "RuntimeError: disk full"
        assert body["event"] == "failed"
        wait_for(lambda: Notification.objects.filter(status="sent").exists(), WAIT_S)
        assert len(receiver.requests) == 1
    finally:
        print(cluster.logs())
        cluster.close()
        receiver.close()
