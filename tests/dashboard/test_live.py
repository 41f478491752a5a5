"""The live feed's parts: change feeds (nothing lost at the cursor, nothing sent twice), one poll's
frames, the access re-check, and the poller's life cycle and error handling."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.utils import timezone

from cluster.models import LeadershipTerm, SchedulerNode
from dashboard import live
from dashboard.live import access as live_access
from dashboard.live import feed as live_feed
from dashboard.live import poller as live_poller
from dashboard.live import protocol as live_protocol
from dashboard.live import state as live_state
from jobs.models import Job, JobExecution
from jobs.services import SYSTEM, job_create, job_delete, job_update
from jobs.states import ExecutionStatus

S = ExecutionStatus
LOOKBACK = timedelta(seconds=5)
INTERVAL = {"name": "poll", "task": "noop", "schedule_type": "interval", "interval_seconds": 3600}
CONFIG = live.LiveConfig(poll_s=0.01, recheck_s=0.1, lookback_s=5.0)


def make_executions(n: int, *, at: Any = None) -> list[int]:
    job = Job.objects.first() or job_create(data=INTERVAL, by=SYSTEM)
    base = timezone.now()
    rows = JobExecution.objects.bulk_create(
        JobExecution(job=job, scheduled_for=base + timedelta(seconds=i), run_after=base)
        for i in range(n)
    )
    ids = [row.pk for row in rows]
    if at is not None:
        JobExecution.objects.filter(pk__in=ids).update(updated_at=at)
    return ids


def stamp(ids: list[int], at: Any) -> None:
    JobExecution.objects.filter(pk__in=ids).update(updated_at=at)


def feed(batch: int = live_protocol.BATCH_SIZE) -> live_feed.ChangeFeed:
    return live_feed.ChangeFeed(
        JobExecution.objects.all, stamp="updated_at", lookback=LOOKBACK, batch=batch
    )


def drain(changes: live_feed.ChangeFeed, *, sweep: bool = True) -> list[int]:
    ids: list[int] = []
    while True:
        rows, more = changes.poll(sweep=sweep)
        ids.extend(row.pk for row in rows)
        if not more:
            return ids


# --- change feeds ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_feed_pages_through_more_rows_with_one_stamp_than_a_batch() -> None:
    t0 = timezone.now()
    changes = feed(batch=10)
    changes.seed(now=t0)
    # One UPDATE of many rows (a batch claim) gives them all the same updated_at.
    ids = make_executions(25, at=t0 + timedelta(seconds=1))
    sent = drain(changes, sweep=False)
    assert sent == sorted(ids)  # oldest first, ties by id, each once
    assert drain(changes) == []


@pytest.mark.django_db
def test_feed_sends_a_row_again_when_it_changes_again() -> None:
    t0 = timezone.now()
    changes = feed()
    changes.seed(now=t0)
    (pk,) = make_executions(1, at=t0 + timedelta(seconds=1))
    assert drain(changes) == [pk]
    stamp([pk], t0 + timedelta(seconds=2))
    assert drain(changes) == [pk]
    assert drain(changes) == []


@pytest.mark.django_db
def test_row_committed_late_with_the_cursors_stamp_and_a_lower_id_is_not_lost() -> None:
    t0 = timezone.now()
    changes = feed()
    changes.seed(now=t0)
    first, second = make_executions(2, at=t0 - timedelta(hours=1))  # not yet "committed"
    boundary = t0 + timedelta(seconds=1)
    stamp([second], boundary)
    assert drain(changes, sweep=False) == [second]  # the cursor is now (boundary, second)
    # `first` commits afterwards with the very same stamp: the forward read cannot see it ...
    stamp([first], boundary)
    assert drain(changes, sweep=False) == []
    # ... the sweep of the lookback window does.
    assert drain(changes) == [first]
    assert drain(changes) == []


@pytest.mark.django_db
def test_row_committed_late_with_an_older_stamp_is_found_within_the_lookback() -> None:
    t0 = timezone.now()
    changes = feed()
    changes.seed(now=t0)
    newer, late, too_late = make_executions(3, at=t0 - timedelta(hours=1))
    stamp([newer], t0 + timedelta(seconds=10))
    assert drain(changes) == [newer]
    # A slow transaction (or a writer whose clock lags) commits a row stamped before `newer`.
    stamp([late], t0 + timedelta(seconds=8))
    stamp([too_late], t0 + timedelta(seconds=10) - LOOKBACK - timedelta(seconds=1))
    assert drain(changes) == [late]


@pytest.mark.django_db
def test_seed_counts_the_lookback_window_as_sent_and_recent_reads_it() -> None:
    t0 = timezone.now()
    old = make_executions(2, at=t0 - timedelta(seconds=1))
    changes = feed()
    changes.seed(now=t0)
    assert drain(changes) == []
    assert [row.pk for row in changes.recent(since=t0 - timedelta(seconds=2))] == old
    assert changes.recent(since=t0) == []


# --- one poll ---------------------------------------------------------------------------------------


def frames_of(result: live_state.PollResult) -> dict[str, Any]:
    decoded = [json.loads(text) for text in result.broadcast]
    by_type: dict[str, Any] = {}
    for message in decoded:
        assert set(message) == {"type", "data", "ts"}
        by_type.setdefault(message["type"], []).append(message["data"])
    return by_type


def poll(
    state: live_state.LiveState, request: live_state.PollRequest | None = None
) -> live_state.PollResult:
    # Let the throttled probes (jobs, counts) come due however long their last run took.
    state._jobs_probe.next_at = state._counts_probe.next_at = 0.0
    return state.poll(request or live_state.PollRequest())


@pytest.mark.django_db
def test_a_poll_sends_only_what_changed() -> None:
    state = live_state.LiveState(CONFIG)
    first = frames_of(poll(state))
    assert set(first) == {"cluster", "counts"}  # the baseline, sent once
    assert frames_of(poll(state)) == {}

    job = job_create(data=INTERVAL, by=SYSTEM)
    frames = frames_of(poll(state))
    assert [row["id"] for row in frames["jobs"][0]] == [job.pk]
    assert set(frames) == {"jobs"}

    job_update(job_id=job.pk, expected_version=1, changes={"enabled": False}, by=SYSTEM)
    frames = frames_of(poll(state))
    assert frames["jobs"][0][0]["enabled"] is False

    now = timezone.now()
    SchedulerNode.objects.create(
        node_id="node-a", hostname="h", pid=1, started_at=now, last_heartbeat=now
    )
    LeadershipTerm.objects.create(term=3, node_id="node-a", acquired_at=now)
    (cluster,) = frames_of(poll(state))["cluster"]
    assert (cluster["leader"], cluster["term"]) == ("node-a", 3)
    SchedulerNode.objects.update(last_heartbeat=now + timedelta(seconds=1))  # a heartbeat
    assert "cluster" in frames_of(poll(state))
    assert frames_of(poll(state)) == {}

    make_executions(2)
    frames = frames_of(poll(state))
    assert len(frames["executions"][0]) == 2
    assert frames["counts"] == [
        {"running": 0, "queued": 2, "catch_up": 0, "late": 0, "failed_last_hour": 0}
    ]

    job_delete(job_id=job.pk, by=SYSTEM)
    assert frames_of(poll(state))["jobs_deleted"] == [[job.pk]]
    assert frames_of(poll(state)).keys() <= {"counts"}


@pytest.mark.django_db
def test_executions_are_sent_in_messages_of_at_most_500() -> None:
    state = live_state.LiveState(CONFIG)
    poll(state)
    ids = make_executions(live_protocol.BATCH_SIZE + 20)
    sent = []
    while True:
        result = poll(state)
        sent.extend(row["id"] for data in frames_of(result).get("executions", []) for row in data)
        assert all(
            len(data) <= live_protocol.BATCH_SIZE
            for data in frames_of(result).get("executions", [])
        )
        if not result.more:
            break
    assert sorted(sent) == sorted(ids)


@pytest.mark.django_db
def test_counts() -> None:
    now = timezone.now()
    ids = make_executions(6)
    late = now - timedelta(seconds=live_protocol.LATE_AFTER_S + 1)
    JobExecution.objects.filter(pk=ids[0]).update(run_after=late, catch_up=True)
    JobExecution.objects.filter(pk=ids[1]).update(status=S.RUNNING)
    JobExecution.objects.filter(pk__in=ids[2:4]).update(status=S.FAILED, finished_at=now)
    JobExecution.objects.filter(pk=ids[4]).update(
        status=S.TIMED_OUT, finished_at=now - timedelta(hours=2)
    )
    JobExecution.objects.filter(pk=ids[5]).update(status=S.SUCCEEDED, finished_at=now)
    assert live.counts_payload(now=now) == {
        "running": 1,
        "queued": 1,
        "catch_up": 1,
        "late": 1,
        "failed_last_hour": 2,
    }


@pytest.mark.django_db
def test_pending_counters_agree_while_runs_arrive_between_statements() -> None:
    """A late run queued between two of the counters' statements is counted in all of the
    pending counters or in none: never ``late`` above ``queued``."""
    now = timezone.now()
    ids = make_executions(6)
    JobExecution.objects.filter(pk__in=ids).update(status=S.SUCCEEDED, finished_at=now)
    late = now - timedelta(seconds=live_protocol.LATE_AFTER_S + 1)
    arriving = list(ids)
    busy = False

    def a_run_arrives(execute: Callable[..., Any], *args: Any) -> Any:
        nonlocal busy
        result = execute(*args)
        if not busy and arriving:
            busy = True
            try:
                JobExecution.objects.filter(pk=arriving.pop()).update(
                    status=S.PENDING, run_after=late, catch_up=True
                )
            finally:
                busy = False
        return result

    with connection.execute_wrapper(a_run_arrives):
        counts = live.counts_payload(now=now)
    assert counts["late"] <= counts["queued"]
    assert counts["catch_up"] <= counts["queued"]
    assert arriving, "each statement let a run arrive"


@pytest.mark.django_db
def test_subscribed_output_is_sent_when_the_execution_changes() -> None:
    state = live_state.LiveState(CONFIG)
    poll(state)
    (pk,) = make_executions(1)
    subscriptions: dict[int, dict[str, Any]] = {pk: {"chan-a": None}, 999_999: {"chan-a": None}}
    result = poll(state, live_state.PollRequest(subscriptions=subscriptions))
    assert "chan-a" not in result.direct  # output frames go out only if still subscribed
    ((channel, execution_id, updated_at, text),) = result.outputs_sent
    assert (channel, execution_id) == ("chan-a", pk)
    assert json.loads(text)["data"] == {
        "id": pk,
        "status": S.PENDING,
        "output_from": 0,
        "output": "",
        "error": "",
        "traceback": "",
    }

    subscriptions[pk]["chan-a"] = updated_at
    assert poll(state, live_state.PollRequest(subscriptions=subscriptions)).outputs_sent == []

    def sent_after(output: str) -> dict[str, dict[str, Any]]:
        """Save ``output``, poll; each channel's frame data, and its new marker recorded."""
        JobExecution.objects.filter(pk=pk).update(output=output, updated_at=timezone.now())
        result = poll(state, live_state.PollRequest(subscriptions=subscriptions))
        frames = {}
        for channel, _, marker, text in result.outputs_sent:
            subscriptions[pk][channel] = marker
            frames[channel] = json.loads(text)["data"]
        return frames

    # The output grows: only what was added goes out, after the length the channel has.
    frames = sent_after("hello")
    assert (frames["chan-a"]["output_from"], frames["chan-a"]["output"]) == (0, "hello")
    frames = sent_after("hello wörld 😀\n")
    assert (frames["chan-a"]["output_from"], frames["chan-a"]["output"]) == (5, " wörld 😀\n")
    # A dashboard subscribing now gets it whole, in the same poll as the other's append.
    subscriptions[pk]["chan-b"] = None
    frames = sent_after("hello wörld 😀\nmore")
    assert (frames["chan-a"]["output_from"], frames["chan-a"]["output"]) == (14, "more")
    assert (frames["chan-b"]["output_from"], frames["chan-b"]["output"]) == (
        0,
        "hello wörld 😀\nmore",
    )
    # Rewritten rather than grown (it never is today, but nothing relies on that): whole again.
    frames = sent_after("replaced")
    assert {channel: (data["output_from"], data["output"]) for channel, data in frames.items()} == {
        "chan-a": (0, "replaced"),
        "chan-b": (0, "replaced"),
    }


@pytest.mark.django_db
def test_recheck_closes_ended_sessions_and_users_without_access(
    make_user: Callable[..., Any],
) -> None:
    def session_of(user: Any) -> str:
        client = Client()
        client.force_login(user)
        return client.session.session_key

    viewer = make_user("viewer", "viewer")
    inactive = make_user("viewer", "inactive")
    norole = make_user(None, "norole")
    root = make_user(None, "root")
    root.is_superuser = True
    root.save()
    logged_out = make_user("admin", "gone")
    clients = {
        "viewer": (viewer.pk, session_of(viewer)),
        "inactive": (inactive.pk, session_of(inactive)),
        "norole": (norole.pk, session_of(norole)),
        "root": (root.pk, session_of(root)),
        "gone": (logged_out.pk, session_of(logged_out)),
    }
    inactive.is_active = False
    inactive.save()
    Session.objects.filter(session_key=clients["gone"][1]).delete()

    revoke = live_access.revocations(clients, now=timezone.now())
    assert revoke == {
        "inactive": live.CLOSE_FORBIDDEN,
        "norole": live.CLOSE_FORBIDDEN,
        "gone": live.CLOSE_UNAUTHENTICATED,
    }


# --- the poller -------------------------------------------------------------------------------------


def live_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dashboard-live")]


class Sink:
    """A dashboard as the poller sees it: what it is sent, in order, frames decoded."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def deliver(self, frames: list[str]) -> None:
        for text in frames:
            self.received.put_nowait(json.loads(text))

    async def revoke(self, code: int) -> None:
        self.received.put_nowait({"type": "<close>", "code": code})

    async def register(self, channel: str, user_id: Any, session_key: str | None) -> None:
        await live.register(
            channel,
            user_id=user_id,
            session_key=session_key,
            deliver=self.deliver,
            revoke=self.revoke,
        )


@pytest.mark.django_db(transaction=True)
def test_poller_keeps_going_after_a_failed_poll_and_stops_with_its_last_client(
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.SCHEDULER_LIVE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_IDLE_POLL_S = 0.02
    monkeypatch.setattr(live_poller, "ERROR_BACKOFF_S", 0.05)
    user = make_user("viewer")
    client = Client()
    client.force_login(user)
    session_key = client.session.session_key
    job = job_create(data=INTERVAL, by=SYSTEM)

    real_poll = live_state.LiveState.poll
    failures = {"left": 2}

    def flaky_poll(
        self: live_state.LiveState, request: live_state.PollRequest
    ) -> live_state.PollResult:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("database is down")
        return real_poll(self, request)

    monkeypatch.setattr(live_state.LiveState, "poll", flaky_poll)

    async def body() -> None:
        sink = Sink()
        await sink.register("tab-1", user.pk, session_key)
        try:
            assert live.is_running()
            await database_sync_to_async(job_update)(
                job_id=job.pk, expected_version=1, changes={"priority": 5}, by=SYSTEM
            )
            deadline = time.monotonic() + 3
            received = []
            while time.monotonic() < deadline:
                received.append(await asyncio.wait_for(sink.received.get(), timeout=3))
                if any(m["type"] == "jobs" and m["data"][0]["version"] == 2 for m in received):
                    break
            else:
                raise AssertionError(f"no jobs frame; got {received}")
        finally:
            await live.unregister("tab-1")
        assert not live.is_running()

    async_to_sync(body)()
    assert failures["left"] == 0
    failed = [r for r in caplog.records if "dashboard live poll failed" in r.getMessage()]
    assert len(failed) == 2
    assert all(r.levelno == logging.ERROR for r in failed)
    assert live_threads() == []  # the database thread ended with the poller


@pytest.mark.django_db(transaction=True)
def test_revoked_client_gets_a_close_message(make_user: Callable[..., Any], settings: Any) -> None:
    settings.SCHEDULER_LIVE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_IDLE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_RECHECK_S = 0.05
    user = make_user("viewer")
    client = Client()
    client.force_login(user)
    session_key = client.session.session_key
    user.groups.clear()

    async def body() -> None:
        sink = Sink()
        await sink.register("tab-1", user.pk, session_key)
        try:
            while True:
                message = await asyncio.wait_for(sink.received.get(), timeout=2)
                if message["type"] == "<close>":
                    break
            assert message["code"] == live.CLOSE_FORBIDDEN
        finally:
            await live.shutdown()
        assert not live.is_running()

    async_to_sync(body)()
