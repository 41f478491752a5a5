"""The live feed's doorbell: rings coalesce, the listener hears them and says when it cannot, and a
dashboard gets a committed change at once although its fallback poll is half a minute away.

On a private Redis (started by the suite) with a key prefix of this test's own."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from cluster import announce
from cluster.coordination.redis_backend import RedisBackend
from dashboard.live import poller as live_poller
from dashboard.live.doorbell import Listener
from jobs.models import JobExecution
from jobs.services import SYSTEM, job_create, job_trigger
from tests.cluster.harness import wait_for
from tests.dashboard.live_helpers import Dashboard, of_type, run, session_headers

INTERVAL = {"name": "bell", "task": "noop", "schedule_type": "interval", "interval_seconds": 3600}
_prefixes = itertools.count()


def unique_prefix() -> str:
    return f"bell{os.getpid()}x{next(_prefixes)}x{int(time.time() * 1000) % 10**8}"


# --- ringing --------------------------------------------------------------------------------------


def test_a_burst_of_rings_is_coalesced_and_the_last_one_is_never_lost() -> None:
    published: list[float] = []
    ringer = announce.Ringer(lambda: published.append(time.monotonic()))
    started = time.monotonic()
    for _ in range(20_000):  # an after-commit hook of a big batch rings once per execution
        ringer.ring()
    last_ring = time.monotonic()
    wait_for(lambda: published and published[-1] >= last_ring, 2)
    elapsed = time.monotonic() - started
    # At most one publish per spacing (and one at the start), however many rings.
    assert 1 <= len(published) <= elapsed / announce.RING_SPACING_S + 2, (len(published), elapsed)


def test_a_failing_publish_is_logged_once_and_ringing_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(announce, "RETRY_AFTER_ERROR_S", 0.2)
    calls: list[float] = []

    def broken() -> None:
        calls.append(time.monotonic())
        raise ConnectionError("Redis is down")

    ringer = announce.Ringer(broken)
    caplog.set_level("WARNING", logger="cluster.announce")
    started = time.monotonic()
    while time.monotonic() - started < 0.7:  # rung all the time, as a busy node does
        ringer.ring()
        time.sleep(0.005)
    wait_for(lambda: len(calls) >= 2, 2)
    # Retried after RETRY_AFTER_ERROR_S, not every RING_SPACING_S (which would be ~35 tries).
    assert 2 <= len(calls) <= 6, len(calls)
    assert min(b - a for a, b in itertools.pairwise(calls)) >= 0.19
    warnings = [r for r in caplog.records if "doorbell" in r.getMessage()]
    assert len(warnings) == 1 and "Redis is down" in warnings[0].getMessage()


# --- listening ------------------------------------------------------------------------------------


class Ear:
    def __init__(self, backend: RedisBackend) -> None:
        self.rings = 0
        self.heard = threading.Event()
        self.listener = Listener(self._on_ring, backend=backend)

    def _on_ring(self) -> None:
        self.rings += 1
        self.heard.set()


@pytest.fixture
def private_redis(redis_factory: Callable[[], Any]) -> Iterator[Any]:
    server = redis_factory()
    yield server
    server.stop()


def test_the_listener_hears_rings_says_when_it_cannot_and_comes_back(private_redis: Any) -> None:
    backend = RedisBackend(private_redis.url, prefix=unique_prefix(), redlock_urls=None)
    ear = Ear(backend)
    ear.listener.start()
    try:
        wait_for(lambda: ear.listener.connected, 5)
        assert ear.rings == 1  # on connecting: whatever rang before
        ear.heard.clear()
        backend.publish(announce.LIVE_CHANNEL, "")
        assert ear.heard.wait(2)
        assert ear.rings == 2

        private_redis.stop()
        wait_for(lambda: not ear.listener.connected, 5)
        rings_when_lost = ear.rings
        assert rings_when_lost == 3  # losing it rings once: the feed polls at full rate now

        private_redis.start()
        wait_for(lambda: ear.listener.connected, 10)
        assert ear.rings == rings_when_lost + 1
        ear.heard.clear()
        backend.publish(announce.LIVE_CHANNEL, "")
        assert ear.heard.wait(2)
    finally:
        ear.listener.stop()
        backend.close()


# --- a dashboard woken by the doorbell ------------------------------------------------------------


@pytest.fixture
def rung_feed(settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis coordination with a prefix of this test's own; the fallback poll (and the session
    recheck, which also wakes the poller) half a minute away: only a ring can deliver soon."""
    settings.SCHEDULER_COORDINATION = "redis"
    settings.REDIS_URL = redis_url
    settings.SCHEDULER_REDIS_PREFIX = unique_prefix()
    settings.SCHEDULER_LIVE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_IDLE_POLL_S = 30.0
    settings.SCHEDULER_LIVE_RECHECK_S = 30.0
    monkeypatch.setattr(announce, "_bus", None)  # one for these settings


@pytest.mark.django_db(transaction=True)
def test_a_committed_change_reaches_the_dashboard_on_the_ring_not_the_fallback_poll(
    make_user: Callable[..., Any], rung_feed: None
) -> None:
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        poller = live_poller._current_poller(create=False)
        assert poller is not None and poller.doorbell is not None
        deadline = time.monotonic() + 5
        while not poller.doorbell.connected and time.monotonic() < deadline:
            await tab.assert_none(lambda m: False, 0.05)
        assert poller.doorbell.connected

        # Idle: once the polls of its start (the catch-up, the subscription's) are done, nothing
        # rings, so the poller sleeps (not 20 polls a second).
        await tab.assert_none(lambda m: False, 0.3)
        polls, queries = live_poller.stats.polls, live_poller.stats.queries
        await tab.assert_none(lambda m: False, 1.0)
        assert live_poller.stats.polls - polls <= 1
        assert live_poller.stats.queries - queries <= 12  # one poll's worth, not twenty

        # A row committed without a ring waits for a poll; a triggered run rings after its
        # commit, and the poll that ring starts reads both (the database, not the ring, is read).
        now = timezone.now()
        unrung = await database_sync_to_async(
            lambda: JobExecution.objects.create(
                job=job, scheduled_for=now, run_after=now, trigger="manual", queue="nobody"
            )
        )()
        await tab.assert_none(
            of_type("executions", lambda rows: any(r["id"] == unrung.pk for r in rows)), 1.0
        )
        execution = await database_sync_to_async(job_trigger)(job_id=job.pk, by=SYSTEM)
        frame = await tab.wait_for(
            of_type("executions", lambda rows: any(r["id"] == unrung.pk for r in rows)), 1.0
        )
        assert {r["id"] for r in frame["data"]} >= {execution.pk, unrung.pk}
        # The trigger's commit rang twice (its execution, its job): let the second ring pass.
        await tab.assert_none(lambda m: False, 0.3)

        await database_sync_to_async(
            lambda: JobExecution.objects.filter(pk=unrung.pk).update(reason="still silent")
        )()
        await tab.assert_none(
            of_type("executions", lambda rows: any(r["id"] == unrung.pk for r in rows)), 1.0
        )
        announce.ring()
        await tab.wait_for(
            of_type(
                "executions",
                lambda rows: any(r.get("reason") == "still silent" for r in rows),
            ),
            1.0,
        )
        await tab.close()

    run(body)
