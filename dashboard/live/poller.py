"""The event-loop side: the one polling task of this web process, the registry of its connected
dashboards, and when it polls (on the doorbell, or every so often)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection, connections

from dashboard.live import doorbell
from dashboard.live.protocol import MAX_SUBSCRIPTIONS, LiveConfig, OutputSent
from dashboard.live.state import LiveState, PollRequest, PollResult

logger = logging.getLogger(__name__)


ERROR_BACKOFF_S = 0.5
MAX_ERROR_BACKOFF_S = 10.0
CONNECTION_RECYCLE_S = 10.0  # the poller's connection is closed this often (close_old_connections)
STOP_WAIT_S = 2.0  # how long stopping waits for the database thread to finish its current poll


@dataclass
class LiveStats:
    """This process's live feed since it started (``/metrics``; the W5 benchmark reads them)."""

    polls: int = 0
    queries: int = 0  # database queries of the polls


stats = LiveStats()


@dataclass
class LiveClient:
    user_id: Any
    session_key: str | None
    # The dashboard's own coroutines, called from the poller's task: frames to send, a close code.
    # The poller and its dashboards share this process and its event loop: frames go straight to
    # the socket, encoded once, with no channel layer in between.
    deliver: Callable[[list[str]], Awaitable[None]]
    revoke: Callable[[int], Awaitable[None]]
    needs_catchup: bool = True
    # execution id -> what the last execution_output sent carried (None: nothing sent yet)
    subscriptions: dict[int, OutputSent] = field(default_factory=dict)


def _count_query(execute: Callable[..., Any], *args: Any) -> Any:
    stats.queries += 1
    return execute(*args)


class LivePoller:
    """The one polling task of this process, and the registry of its connected dashboards."""

    def __init__(self, config: LiveConfig, clients: dict[str, LiveClient] | None = None) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.clients: dict[str, LiveClient] = clients if clients is not None else {}
        self.state = LiveState(config)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-live")
        self._poll = sync_to_async(
            self._poll_in_db_thread, thread_sensitive=False, executor=self._executor
        )
        self._recycle_at = time.monotonic() + CONNECTION_RECYCLE_S
        self._next_recheck = time.monotonic() + config.recheck_s
        self._rung = asyncio.Event()
        self.doorbell: doorbell.Listener | None = None
        if config.doorbell:
            self.doorbell = doorbell.Listener(self._ring_from_thread)
            self.doorbell.start()
        self.task = self.loop.create_task(self._run(), name="dashboard-live-poller")

    def _ring_from_thread(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._rung.set)

    def ring(self) -> None:
        """Poll soon (from the event loop's thread): a new dashboard, a new subscription."""
        self._rung.set()

    async def _pause(self, started: float) -> None:
        """Until the next poll is due: ``poll_s`` after the last one began; with the doorbell
        heard, then until a ring (rings during the gap coalesce), a recheck or ``idle_poll_s``."""
        await asyncio.sleep(max(0.0, self.config.poll_s - (time.monotonic() - started)))
        if self.doorbell is None or not self.doorbell.connected or self._rung.is_set():
            return
        now = time.monotonic()
        timeout = min(started + self.config.idle_poll_s, self._next_recheck) - now
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rung.wait(), timeout)

    def _poll_in_db_thread(self, request: PollRequest) -> PollResult:
        # Not database_sync_to_async: it closes the connection around every call, and with SQLite
        # (CONN_MAX_AGE=0) reconnecting 20 times a second costs more than the poll itself. The one
        # connection of this thread is closed after an error instead, and recycled regularly.
        try:
            with connection.execute_wrapper(_count_query):
                return self.state.poll(request)
        except Exception:
            connections.close_all()
            raise
        finally:
            if time.monotonic() >= self._recycle_at:
                self._recycle_at = time.monotonic() + CONNECTION_RECYCLE_S
                close_old_connections()

    async def _run(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            if not self.clients:  # all revoked, their disconnects (which stop this task) pending
                await asyncio.sleep(self.config.poll_s)
                continue
            self._rung.clear()  # a ring from here on means a change this poll may not see
            try:
                request = self._request(started)
                result = await self._poll(request)
                stats.polls += 1
                self._applied(request, result)
                await self._deliver(result)
            except Exception:
                failures += 1
                delay = min(ERROR_BACKOFF_S * 2 ** (failures - 1), MAX_ERROR_BACKOFF_S)
                logger.exception(
                    "dashboard live poll failed (%d in a row); retrying in %.1f s", failures, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            if result.more:
                await asyncio.sleep(0)  # behind: read the next page at once
            else:
                await self._pause(started)

    def _request(self, now: float) -> PollRequest:
        request = PollRequest(
            catchup=[channel for channel, c in self.clients.items() if c.needs_catchup]
        )
        for channel, client in self.clients.items():
            for execution_id, sent in client.subscriptions.items():
                request.subscriptions.setdefault(execution_id, {})[channel] = sent
        if now >= self._next_recheck and self.clients:
            request.recheck = {ch: (c.user_id, c.session_key) for ch, c in self.clients.items()}
        return request

    def _applied(self, request: PollRequest, result: PollResult) -> None:
        """Record what the poll sent (only after it succeeded: a failed one is retried in full)."""
        for channel in request.catchup:
            if channel in self.clients:
                self.clients[channel].needs_catchup = False
        for channel, execution_id, sent, _text in result.outputs_sent:
            client = self.clients.get(channel)
            if client is not None and execution_id in client.subscriptions:
                client.subscriptions[execution_id] = sent
        if request.recheck is not None:
            self._next_recheck = time.monotonic() + self.config.recheck_s

    async def _deliver(self, result: PollResult) -> None:
        # Direct frames (catch-up, output) were read first: they go out before the broadcast. An
        # output frame goes only to a dashboard still subscribed: one that unsubscribed while the
        # poll was reading must get nothing more of that execution.
        direct = {channel: list(frames) for channel, frames in result.direct.items()}
        for channel, execution_id, _sent, text in result.outputs_sent:
            client = self.clients.get(channel)
            if client is not None and execution_id in client.subscriptions:
                direct.setdefault(channel, []).append(text)
        # A dashboard whose access this poll revoked gets nothing more than its close.
        for channel, frames in direct.items():
            if channel not in result.revoke:
                await self._frames(self.clients.get(channel), frames)
        if result.broadcast:
            for channel, client in list(self.clients.items()):
                if channel not in result.revoke:
                    await self._frames(client, result.broadcast)
        for channel, code in result.revoke.items():
            client = self.clients.pop(channel, None)
            if client is None:
                continue
            try:
                await client.revoke(code)
            except Exception:  # a socket closing meanwhile: nothing more to tell it
                logger.debug("could not close dashboard %s", channel, exc_info=True)

    async def _frames(self, client: LiveClient | None, frames: list[str]) -> None:
        if client is None:
            return  # gone while the poll ran
        try:
            await client.deliver(frames)
        except Exception:  # a socket closing meanwhile; its disconnect unregisters it
            logger.debug("could not send to a dashboard", exc_info=True)

    async def stop(self) -> None:
        if self.doorbell is not None:
            self.doorbell.stop()
        self.task.cancel()
        await asyncio.wait({self.task}, timeout=STOP_WAIT_S)
        # Close this thread's connection, then let the thread end (after any poll in flight).
        self._executor.submit(connections.close_all)
        waiting = self.loop.run_in_executor(None, partial(self._executor.shutdown, wait=True))
        await asyncio.wait({waiting}, timeout=STOP_WAIT_S)

    def abandon(self) -> None:
        """Forget a poller whose event loop is gone (tests run one loop each)."""
        if self.doorbell is not None:
            self.doorbell.stop()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.task.cancel)
        self._executor.submit(connections.close_all)
        self._executor.shutdown(wait=False)


_poller: LivePoller | None = None


def _current_poller(*, create: bool) -> LivePoller | None:
    global _poller
    loop = asyncio.get_running_loop()
    clients = None
    if _poller is not None and (_poller.loop is not loop or _poller.task.done()):
        if _poller.loop is loop:
            clients = _poller.clients  # the task died (it should not): keep its clients
        _poller.abandon()
        _poller = None
    if _poller is None and create:
        _poller = LivePoller(LiveConfig.from_settings(), clients)
    return _poller


async def register(
    channel_name: str,
    *,
    user_id: Any,
    session_key: str | None,
    deliver: Callable[[list[str]], Awaitable[None]],
    revoke: Callable[[int], Awaitable[None]],
) -> None:
    """Add a dashboard, with the coroutines that send it frames and close it; starts the poller
    for the first one."""
    poller = _current_poller(create=True)
    assert poller is not None
    poller.clients[channel_name] = LiveClient(
        user_id=user_id, session_key=session_key, deliver=deliver, revoke=revoke
    )
    poller.ring()  # its catch-up


async def unregister(channel_name: str) -> None:
    """Remove a dashboard; stops the poller when it was the last one."""
    global _poller
    poller = _current_poller(create=False)
    if poller is None:
        return
    poller.clients.pop(channel_name, None)
    if not poller.clients:
        _poller = None
        await poller.stop()


async def shutdown() -> None:
    """Stop the poller whatever its clients (process shutdown, tests)."""
    global _poller
    poller = _current_poller(create=False)
    _poller = None
    if poller is not None:
        await poller.stop()


def subscribe(channel_name: str, execution_id: int) -> None:
    """Stream ``execution_output`` of one execution to one dashboard (from the next poll)."""
    poller = _current_poller(create=False)
    client = poller.clients.get(channel_name) if poller else None
    if client is None:
        return
    client.subscriptions.pop(execution_id, None)
    client.subscriptions[execution_id] = None  # (re)subscribing sends the current state again
    while len(client.subscriptions) > MAX_SUBSCRIPTIONS:
        del client.subscriptions[next(iter(client.subscriptions))]
    poller.ring()


def unsubscribe(channel_name: str, execution_id: int) -> None:
    poller = _current_poller(create=False)
    client = poller.clients.get(channel_name) if poller else None
    if client is not None:
        client.subscriptions.pop(execution_id, None)


def is_running() -> bool:
    poller = _poller
    return poller is not None and not poller.task.done()
