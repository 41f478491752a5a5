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


def test_a_projects_scheduler_dict_gets_every_default_and_each_value_is_checked():
    knobs = scheduler_settings.from_mapping({"CAPACITY": 4, "QUEUES": "default, reports"})
    assert knobs["CAPACITY"] == 4 and knobs["QUEUES"] == ["default", "reports"]
    assert knobs["LEASE_TTL_MS"] == scheduler_settings.KNOBS["LEASE_TTL_MS"][0]
    assert scheduler_settings.from_mapping({"DEAD_AFTER_S": 3})["DEAD_AFTER_S"] == 3.0
    assert scheduler_settings.from_mapping({}) == scheduler_settings.load({})
    for given, named in [
        ({"CAPACITY": 0}, "SCHEDULER['CAPACITY']=0: must be at least 1"),
        ({"CAPACITY": "many"}, "SCHEDULER['CAPACITY']='many': not a int"),
        ({"CAPACITY": True}, "must be a int"),
        ({"CAPACITY": 2.5}, "must be a int"),
        ({"CAPASITY": 4}, "unknown key(s) 'CAPASITY'"),
        ({"LEASE_TTL_MS": 1000, "RENEW_DEADLINE_MS": 1000}, "RENEW_DEADLINE_MS must be below"),
    ]:
        with pytest.raises(ImproperlyConfigured) as refused:
            scheduler_settings.from_mapping(given)
        assert named in str(refused.value), given
    with pytest.raises(ImproperlyConfigured, match="must be a dict"):
        scheduler_settings.from_mapping([("CAPACITY", 4)])


def test_an_app_setting_a_project_leaves_out_is_its_default(settings):
    from jobs.conf import DEFAULTS, app_setting

    settings.SCHEDULER_MAX_ARGS_DEPTH = 5
    assert app_setting("SCHEDULER_MAX_ARGS_DEPTH") == 5
    del settings.SCHEDULER_MAX_ARGS_DEPTH
    assert app_setting("SCHEDULER_MAX_ARGS_DEPTH") == DEFAULTS["SCHEDULER_MAX_ARGS_DEPTH"] == 16
    with pytest.raises(KeyError):
        app_setting("NOT_A_SCHEDULER_SETTING")
    del settings.SCHEDULER_COORDINATION
    settings.REDIS_URL = ""
    assert app_setting("SCHEDULER_COORDINATION") == "database"
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert app_setting("SCHEDULER_COORDINATION") == "redis"


def test_every_setting_the_apps_read_has_a_default():
    """The apps read settings only through app_setting (a project that leaves one out gets its
    default), and each name they read is one of its defaults."""
    import re
    from pathlib import Path

    from jobs.conf import DEFAULTS

    root = Path(__file__).resolve().parent.parent
    read: set[str] = set()
    for app in ("jobs", "cluster", "dashboard"):
        for path in (root / app).rglob("*.py"):
            text = path.read_text()
            read.update(re.findall(r'app_setting\("([A-Z_]+)"\)', text))
            direct = re.findall(
                r"(?<![`\w.])settings\.(SCHEDULER_\w+|REDIS_URL|REDLOCK_URLS)", text
            )
            assert not direct, f"{path}: reads settings.{direct[0]} directly"
    assert read and read <= set(DEFAULTS), sorted(read - set(DEFAULTS))
