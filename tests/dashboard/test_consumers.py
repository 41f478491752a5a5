"""The dashboard WebSocket end to end: the real ASGI application (origin check, session auth, routing)
against a real database, with changes committed the way nodes and the API commit them.

pytest-asyncio is not used: each test body is a coroutine run by ``async_to_sync``; database work inside
it goes through ``database_sync_to_async``, which runs it on the test's own thread and connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.sessions.models import Session
from django.utils import timezone

from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from dashboard import live
from dashboard.live import poller as live_poller
from dashboard.live import protocol as live_protocol
from dashboard.live import state as live_state
from jobs.executions import transition
from jobs.models import JobExecution
from jobs.services import SYSTEM, job_create, job_delete, job_trigger, job_update
from jobs.states import ExecutionStatus
from tests.dashboard.live_helpers import Dashboard, closed, of_type, run, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus
INTERVAL = {"name": "poll", "task": "noop", "schedule_type": "interval", "interval_seconds": 3600}
db = database_sync_to_async


@pytest.fixture(autouse=True)
def fast_live(settings: Any) -> None:
    settings.SCHEDULER_LIVE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_IDLE_POLL_S = 0.02  # these changes ring no doorbell (test_doorbell)
    settings.SCHEDULER_LIVE_RECHECK_S = 0.2


# --- who may connect ------------------------------------------------------------------------------


def test_anonymous_is_closed_with_4401() -> None:
    async def body() -> None:
        tab = Dashboard(session_headers(None))
        connected, _ = await tab.connect()
        if connected:
            assert await tab.next() == {"type": "<close>", "code": live.CLOSE_UNAUTHENTICATED}
        await tab.close()
        assert not live.is_running()

    run(body)


def test_foreign_origin_is_rejected(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("admin"))
    foreign = [(b"origin", b"http://evil.example"), *[h for h in headers if h[0] != b"origin"]]

    async def body() -> None:
        for bad in (foreign, [h for h in headers if h[0] != b"origin"]):  # and no Origin at all
            tab = Dashboard(bad)
            connected, _ = await tab.connect()
            assert not connected
            await tab.close()

    run(body)


def test_user_without_role_is_closed_with_4403(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user(None))

    async def body() -> None:
        tab = Dashboard(headers)
        assert (await tab.connect())[0]
        assert await tab.next() == {"type": "<close>", "code": live.CLOSE_FORBIDDEN}
        await tab.close()

    run(body)


def test_inactive_user_is_closed_with_4403(make_user: Callable[..., Any]) -> None:
    user = make_user("admin")
    headers = session_headers(user)
    user.is_active = False
    user.save()

    async def body() -> None:
        tab = Dashboard(headers)
        assert (await tab.connect())[0]
        assert await tab.next() == {"type": "<close>", "code": live.CLOSE_FORBIDDEN}
        await tab.close()

    run(body)


def test_viewer_gets_hello_cluster_and_counts(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer", "vera"))

    async def body() -> None:
        tab = Dashboard(headers)
        hello, cluster, counts = await tab.open()
        assert hello["type"] == "hello"
        assert hello["data"]["user"] == "vera"
        assert hello["data"]["role"] == "viewer"
        assert hello["data"]["server_time"]
        assert abs(hello["ts"] - time.time()) < 5
        assert cluster["type"] == "cluster"
        assert cluster["data"] == {
            "leader": None,
            "term": None,
            "leader_since": None,
            "nodes": [],
            "terms": [],
            "partitions": [],
            "behind": None,
        }
        assert counts == {
            "type": "counts",
            "data": {
                "running": 0,
                "queued": 0,
                "catch_up": 0,
                "late": 0,
                "failed_last_hour": 0,
            },
            "ts": counts["ts"],
        }
        assert live.is_running()
        await tab.close()
        assert not live.is_running()

    run(body)


def test_frames_of_a_poll_during_the_snapshot_come_after_it(
    make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poller sends straight to the socket; a change it delivers while the consumer is still
    reading its snapshot waits, so that hello and the snapshot always come first."""
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)
    real_snapshot = live.snapshot_frames
    delivered = threading.Event()

    def slow_snapshot() -> list[str]:
        polls = live_poller.stats.polls
        execution = job_trigger(job_id=job.pk, by=SYSTEM)
        deadline = time.monotonic() + 2
        # Until a poll has read the new run (the poller runs on the event loop, this in a thread).
        while time.monotonic() < deadline and not delivered.is_set():
            if live_poller.stats.polls >= polls + 2:
                delivered.set()
            time.sleep(0.02)
        assert execution.pk
        return real_snapshot()

    monkeypatch.setattr(live, "snapshot_frames", slow_snapshot)

    async def body() -> None:
        tab = Dashboard(headers)
        connected, _ = await tab.connect()
        assert connected
        kinds = [(await tab.next())["type"] for _ in range(3)]
        assert kinds == ["hello", "cluster", "counts"]
        assert delivered.is_set()
        await tab.wait_for(of_type("executions"))
        await tab.close()

    run(body)


def test_ping_gets_pong(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await tab.comm.send_json_to({"ping": 42})
        pong = await tab.wait_for(of_type("pong"))
        assert pong["data"] == 42
        await tab.comm.send_to(text_data="not json")  # ignored, the socket stays open
        await tab.comm.send_json_to({"ping": "again"})
        assert (await tab.wait_for(of_type("pong")))["data"] == "again"
        await tab.close()

    run(body)


# --- what changes in the database arrives ---------------------------------------------------------


def test_execution_status_change_arrives_within_a_second(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        execution = await db(job_trigger)(job_id=job.pk, by=SYSTEM)
        created = await tab.wait_for(
            of_type("executions", lambda rows: any(r["id"] == execution.pk for r in rows))
        )
        row = next(r for r in created["data"] if r["id"] == execution.pk)
        assert row["status"] == S.PENDING
        assert row["job"] == job.pk
        assert row["job_name"] == "poll"
        assert not {"output", "error", "traceback", "result"} & row.keys()

        moved = await db(transition)(
            execution.pk, source=S.PENDING, target=S.RUNNING, node="n1", started_at=timezone.now()
        )
        assert moved
        committed = time.monotonic()
        running = await tab.wait_for(
            of_type(
                "executions",
                lambda rows: any(
                    r["id"] == execution.pk and r["status"] == S.RUNNING for r in rows
                ),
            )
        )
        assert time.monotonic() - committed < 1.0
        row = next(r for r in running["data"] if r["id"] == execution.pk)
        assert row["node"] == "n1"
        assert row["lag_ms"] is not None
        counts = await tab.wait_for(of_type("counts", lambda data: data["running"] == 1))
        assert counts["data"]["queued"] == 0
        await tab.close()

    run(body)


def test_job_edit_and_deletion_arrive(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(job_update)(
            job_id=job.pk, expected_version=1, changes={"interval_seconds": 60}, by=SYSTEM
        )
        edited = await tab.wait_for(
            of_type("jobs", lambda rows: any(r["id"] == job.pk and r["version"] == 2 for r in rows))
        )
        row = next(r for r in edited["data"] if r["id"] == job.pk)
        assert row["name"] == "poll"
        assert row["schedule_description"]
        assert row["next_fire_at"]

        await db(job_delete)(job_id=job.pk, by=SYSTEM)
        deleted = await tab.wait_for(of_type("jobs_deleted"))
        assert deleted["data"] == [job.pk]
        await tab.close()

    run(body)


def test_new_leader_term_arrives_as_cluster(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))

    def elect() -> None:
        now = timezone.now()
        SchedulerNode.objects.create(
            node_id="node-a", hostname="h", pid=1, started_at=now, last_heartbeat=now
        )
        LeadershipTerm.objects.create(term=7, node_id="node-a", acquired_at=now)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(elect)()
        cluster = await tab.wait_for(of_type("cluster", lambda data: data["term"] == 7))
        assert cluster["data"]["leader"] == "node-a"
        assert cluster["data"]["leader_since"]
        assert [n["node_id"] for n in cluster["data"]["nodes"]] == ["node-a"]
        assert cluster["data"]["nodes"][0]["status"] == NodeStatus.ACTIVE
        assert cluster["data"]["terms"][0]["term"] == 7

        await db(lambda: SchedulerNode.objects.update(status=NodeStatus.DRAINING))()
        cluster = await tab.wait_for(of_type("cluster"))
        assert cluster["data"]["nodes"][0]["status"] == NodeStatus.DRAINING
        await tab.close()

    run(body)


def test_subscribed_execution_streams_its_output(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("operator"))
    job = job_create(data=INTERVAL, by=SYSTEM)
    execution = job_trigger(job_id=job.pk, by=SYSTEM)
    other = job_trigger(job_id=job.pk, by=SYSTEM)

    def finish() -> None:
        transition(execution.pk, source=S.PENDING, target=S.RUNNING, started_at=timezone.now())
        transition(execution.pk, source=S.RUNNING, target=S.SUCCEEDED, output="line 1\nline 2\n")

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await tab.comm.send_json_to({"subscribe_execution": execution.pk})
        first = await tab.wait_for(of_type("execution_output"))
        assert first["data"] == {
            "id": execution.pk,
            "status": S.PENDING,
            "output_from": 0,
            "output": "",
            "error": "",
            "traceback": "",
        }
        await db(finish)()
        done = await tab.wait_for(
            of_type("execution_output", lambda data: data["status"] == S.SUCCEEDED)
        )
        assert done["data"]["output"] == "line 1\nline 2\n"

        # Only subscribed executions stream; after unsubscribing, nothing more.
        await tab.comm.send_json_to({"unsubscribe_execution": execution.pk})
        await tab.comm.send_json_to({"ping": 1})
        await tab.wait_for(of_type("pong"))
        await db(lambda: JobExecution.objects.filter(pk=execution.pk).update(output="x"))()
        await db(lambda: JobExecution.objects.filter(pk=other.pk).update(output="y"))()
        await tab.assert_none(of_type("execution_output"), during=0.5)
        await tab.close()

    run(body)


def test_an_unsubscribe_while_a_poll_reads_stops_what_that_poll_read(
    make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a once-seen flake on MariaDB, made certain: a poll takes the subscriptions,
    the tab unsubscribes (the server answers a ping after it), the output changes, and only then
    does the poll read the row. What it read must not reach the tab."""
    headers = session_headers(make_user("operator"))
    execution = job_trigger(job_id=job_create(data=INTERVAL, by=SYSTEM).pk, by=SYSTEM)
    hold, held, release = threading.Event(), threading.Event(), threading.Event()
    original = live_state.LiveState.poll

    def poll(self: Any, request: live_state.PollRequest) -> live_state.PollResult:
        if hold.is_set() and request.subscriptions:
            hold.clear()
            held.set()
            release.wait(5)
        return original(self, request)

    monkeypatch.setattr(live_state.LiveState, "poll", poll)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await tab.comm.send_json_to({"subscribe_execution": execution.pk})
        await tab.wait_for(of_type("execution_output"))
        hold.set()
        assert await asyncio.to_thread(held.wait, 5), "no poll took the subscription"
        await tab.comm.send_json_to({"unsubscribe_execution": execution.pk})
        await tab.comm.send_json_to({"ping": 2})
        await tab.wait_for(of_type("pong"))
        await db(lambda: JobExecution.objects.filter(pk=execution.pk).update(output="late"))()
        release.set()
        await tab.assert_none(of_type("execution_output"), during=0.5)
        await tab.close()

    run(body)


def test_two_tabs_get_the_same_changes(make_user: Callable[..., Any]) -> None:
    viewer = session_headers(make_user("viewer"))
    admin = session_headers(make_user("admin"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    async def body() -> None:
        tabs = [Dashboard(viewer), Dashboard(admin)]
        for tab in tabs:
            await tab.open()
        execution = await db(job_trigger)(job_id=job.pk, by=SYSTEM)
        for tab in tabs:
            await tab.wait_for(
                of_type("executions", lambda rows: any(r["id"] == execution.pk for r in rows))
            )
        await tabs[0].close()
        assert live.is_running()  # the other tab still needs it
        await tabs[1].close()
        assert not live.is_running()

    run(body)


def test_a_tab_opened_after_a_change_catches_up(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)
    execution = job_trigger(job_id=job.pk, by=SYSTEM)  # between "page render" and socket open

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await tab.wait_for(
            of_type("executions", lambda rows: any(r["id"] == execution.pk for r in rows))
        )
        await tab.close()

    run(body)


# --- access that ends while connected -------------------------------------------------------------


def test_deactivated_user_is_disconnected_with_4403(make_user: Callable[..., Any]) -> None:
    user = make_user("viewer")
    headers = session_headers(user)

    def deactivate() -> None:
        user.is_active = False
        user.save(update_fields=["is_active"])

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(deactivate)()
        started = time.monotonic()
        close = await tab.wait_for(closed, timeout=3.0)
        assert close["code"] == live.CLOSE_FORBIDDEN
        assert time.monotonic() - started < 3.0
        await tab.close()
        assert not live.is_running()

    run(body)


def test_role_removed_while_connected_disconnects_with_4403(make_user: Callable[..., Any]) -> None:
    user = make_user("operator")
    headers = session_headers(user)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(user.groups.clear)()
        assert (await tab.wait_for(closed, timeout=3.0))["code"] == live.CLOSE_FORBIDDEN
        await tab.close()

    run(body)


def test_logged_out_session_is_disconnected_with_4401(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("admin"))

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(lambda: Session.objects.all().delete())()
        assert (await tab.wait_for(closed, timeout=3.0))["code"] == live.CLOSE_UNAUTHENTICATED
        await tab.close()

    run(body)


def test_late_execution_is_counted(make_user: Callable[..., Any]) -> None:
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    def make_late() -> None:
        execution = job_trigger(job_id=job.pk, by=SYSTEM)
        JobExecution.objects.filter(pk=execution.pk).update(
            run_after=timezone.now() - timedelta(seconds=live_protocol.LATE_AFTER_S + 1)
        )

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await db(make_late)()
        counts = await tab.wait_for(of_type("counts", lambda data: data["late"] == 1))
        assert counts["data"]["queued"] == 1
        await tab.close()

    run(body)
