"""Removing a dead or stopped node from the list: the service, the API, the dashboard and the CLI.
Refused while the node is active or still holds claimed or running executions; audited."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from cluster import services
from cluster.models import NodeStatus, SchedulerNode
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import ActionNotAllowed, Actor
from jobs.states import ExecutionStatus

pytestmark = pytest.mark.django_db


def make_node(node_id: str, status: str) -> SchedulerNode:
    now = timezone.now()
    return SchedulerNode.objects.create(
        node_id=node_id, hostname="h", pid=1, started_at=now, last_heartbeat=now, status=status
    )


def hold_a_run(node_id: str) -> JobExecution:
    job = Job.objects.create(
        name=f"held-{node_id}", task="noop", schedule_type="interval", interval_seconds=60
    )
    now = timezone.now()
    return JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, status=ExecutionStatus.RUNNING, node=node_id
    )


@pytest.mark.parametrize("status", [NodeStatus.DEAD, NodeStatus.STOPPED])
def test_a_dead_or_stopped_node_is_removed_and_audited(status) -> None:
    node = make_node("gone-1", status)
    assert services.node_forget(node_pk=node.pk, by=Actor()) == "gone-1"
    assert not SchedulerNode.objects.filter(node_id="gone-1").exists()
    event = AuditEvent.objects.get(action="node.forget")
    assert (event.object_id, event.changes) == ("gone-1", {"status": [status, None]})


@pytest.mark.parametrize("status", [NodeStatus.ACTIVE, NodeStatus.DRAINING])
def test_a_live_node_is_not_removed(status) -> None:
    node = make_node("alive-1", status)
    with pytest.raises(ActionNotAllowed):
        services.node_forget(node_pk=node.pk, by=Actor())
    assert SchedulerNode.objects.filter(node_id="alive-1").exists()
    assert not AuditEvent.objects.filter(action="node.forget").exists()


def test_a_dead_node_still_holding_runs_is_not_removed() -> None:
    node = make_node("dead-holding", NodeStatus.DEAD)
    hold_a_run("dead-holding")
    with pytest.raises(ActionNotAllowed, match="still holds 1"):
        services.node_forget(node_pk=node.pk, by=Actor())
    assert SchedulerNode.objects.filter(node_id="dead-holding").exists()


def test_the_api_removes_for_an_operator_and_refuses_a_viewer(api_client_for) -> None:
    node = make_node("api-gone", NodeStatus.DEAD)
    live = make_node("api-live", NodeStatus.ACTIVE)
    assert api_client_for("viewer").post(f"/api/nodes/{node.pk}/forget/").status_code == 403
    operator = api_client_for("operator")
    assert operator.post(f"/api/nodes/{live.pk}/forget/").status_code == 409
    assert operator.post(f"/api/nodes/{node.pk}/forget/").status_code == 204
    assert not SchedulerNode.objects.filter(pk=node.pk).exists()
    assert AuditEvent.objects.get(action="node.forget").source == "api"


def test_the_dashboard_removes_a_stopped_node(client, make_user) -> None:
    node = make_node("ui-gone", NodeStatus.STOPPED)
    client.force_login(make_user("operator"))
    listed = client.get("/nodes/").content.decode()
    assert f'action="/nodes/{node.pk}/forget/"' in listed
    response = client.post(f"/nodes/{node.pk}/forget/")
    assert (response.status_code, response["Location"]) == (302, "/nodes/")
    assert not SchedulerNode.objects.filter(pk=node.pk).exists()


def test_the_cli_removes_a_dead_node_and_refuses_an_active_one_with_exit_2() -> None:
    make_node("cli-gone", NodeStatus.DEAD)
    make_node("cli-live", NodeStatus.ACTIVE)
    call_command("nodes", "forget", "cli-gone")
    assert not SchedulerNode.objects.filter(node_id="cli-gone").exists()
    with pytest.raises(CommandError) as raised:
        call_command("nodes", "forget", "cli-live")
    assert raised.value.returncode == 2


def test_the_cli_drains_an_active_node_and_refuses_an_unknown_one_with_exit_2(capsys) -> None:
    make_node("cli-drain", NodeStatus.ACTIVE)
    call_command("nodes", "drain", "cli-drain")
    assert "drain requested for cli-drain" in capsys.readouterr().out
    assert SchedulerNode.objects.get(node_id="cli-drain").drain_requested
    with pytest.raises(CommandError) as raised:
        call_command("nodes", "drain", "nobody")
    assert raised.value.returncode == 2
