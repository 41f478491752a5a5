"""settings.SCHEDULER: the node's knobs, from defaults and SCHEDULER_<KEY> variables, checked when the
settings load; runnode's flags override them, checked the same way (exit 2 naming the flag)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from cluster import conf as scheduler_settings


def test_the_defaults_are_the_documented_ones():
    knobs = scheduler_settings.load({})
    assert knobs["CAPACITY"] == 8 and knobs["QUEUES"] == ["default"]
    assert (knobs["HEARTBEAT_S"], knobs["DEAD_AFTER_S"]) == (0.5, 2.0)
    assert (knobs["LEASE_TTL_MS"], knobs["RENEW_DEADLINE_MS"], knobs["RETRY_PERIOD_MS"]) == (
        2000,
        1500,
        250,
    )
    assert knobs["METRICS_PORT"] == 0
    assert knobs["CPUS"] == []  # not pinned


def test_variables_override_the_defaults():
    knobs = scheduler_settings.load(
        {
            "SCHEDULER_CAPACITY": "32",
            "SCHEDULER_QUEUES": "default, reports",
            "SCHEDULER_HEARTBEAT_S": "1",
            "SCHEDULER_DEAD_AFTER_S": "5",
            "SCHEDULER_METRICS_PORT": "9100",
            "SCHEDULER_CPUS": "0",
        }
    )
    assert knobs["CPUS"] == [0]
    assert knobs["CAPACITY"] == 32 and knobs["QUEUES"] == ["default", "reports"]
    assert (knobs["HEARTBEAT_S"], knobs["DEAD_AFTER_S"], knobs["METRICS_PORT"]) == (1.0, 5.0, 9100)


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"SCHEDULER_CAPACITY": "many"}, "SCHEDULER_CAPACITY='many': not a int"),
        ({"SCHEDULER_CAPACITY": "0"}, "SCHEDULER_CAPACITY='0': must be at least 1"),
        ({"SCHEDULER_QUEUES": " , "}, "SCHEDULER_QUEUES"),
        ({"SCHEDULER_METRICS_PORT": "70000"}, "SCHEDULER_METRICS_PORT"),
        ({"SCHEDULER_DEAD_AFTER_S": "1"}, "DEAD_AFTER_S must exceed two HEARTBEAT_S"),
        ({"SCHEDULER_RENEW_DEADLINE_MS": "2000"}, "RENEW_DEADLINE_MS must be below LEASE_TTL_MS"),
        ({"SCHEDULER_CPUS": "0,x"}, "SCHEDULER_CPUS='0,x': not a cpu_list"),
        ({"SCHEDULER_CPUS": "4096"}, "SCHEDULER_CPUS='4096': CPUs [4096] are not available"),
    ],
)
def test_a_bad_value_stops_the_settings_naming_it(environ, needle):
    with pytest.raises(ImproperlyConfigured) as raised:
        scheduler_settings.load(environ)
    assert needle in str(raised.value)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--capacity", "0"], "--capacity: must be at least 1"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--renew-deadline-ms", "2500"], "RENEW_DEADLINE_MS must be below LEASE_TTL_MS"),
        (["--heartbeat-s", "1.5"], "DEAD_AFTER_S must exceed two HEARTBEAT_S"),
        (["--cpus", "one"], "--cpus: 'one' is not a comma-separated list of CPU numbers"),
        (["--cpus", "4096"], "--cpus: CPUs [4096] are not available to this process"),
    ],
)
def test_runnode_flags_are_checked_like_the_settings_exit_2(argv, needle):
    with pytest.raises(CommandError) as raised:
        call_command("runnode", *argv)
    assert raised.value.returncode == 2
    assert needle in str(raised.value)


@pytest.mark.django_db
def test_a_node_records_its_own_timing_and_the_pages_judge_it_by_that(make_user):
    from django.test import Client

    from cluster.coordination.memory import MemoryBackend
    from cluster.models import SchedulerNode
    from cluster.node import NodeConfig, NodeRunner

    runner = NodeRunner(
        NodeConfig(node_id="slow-beat", heartbeat_interval_s=2.0, dead_after_s=10.0),
        backend=MemoryBackend(),
    )
    runner.register()
    row = SchedulerNode.objects.get(node_id="slow-beat")
    assert (row.heartbeat_interval_s, row.dead_after_s) == (2.0, 10.0)
    client = Client()
    client.force_login(make_user("viewer"))
    for path in ("/nodes/", f"/nodes/{row.pk}/", "/"):
        html = client.get(path).content.decode()
        assert 'data-heartbeat-s="2" data-dead-s="10"' in html, path
    assert client.get(f"/api/nodes/{row.pk}/").json()["dead_after_s"] == 10.0
