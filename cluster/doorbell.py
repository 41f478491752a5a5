"""The live feed's doorbell: a ring on Redis says "the database changed, look now".

Every process rings after it commits something a dashboard shows (an execution or a job changed,
a term began or ended); the live poller of each web process listens and reads the database at
once, instead of re-reading it every ``SCHEDULER_LIVE_POLL_S`` while nothing happens. The database
stays the truth: a ring carries nothing, and a lost one (Redis restarting, a process killed right
after its commit) delays a change by at most ``SCHEDULER_LIVE_IDLE_POLL_S``, the poll that remains
as a fallback. Without Redis (database coordination) there is no doorbell and the feed polls every
``SCHEDULER_LIVE_POLL_S`` as before.

Ringing is coalesced: a caller only sets a flag (an after-commit hook of a batch of 500 executions
must not make 500 round trips to Redis), and one thread per process publishes it, at most once
every ``RING_SPACING_S``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from cluster import wake
from jobs.conf import app_setting

logger = logging.getLogger(__name__)

LIVE_CHANNEL = "live"
RING_SPACING_S = 0.02  # one process publishes at most this often; changes in between share a ring
LISTEN_POLL_S = 0.25  # how often the listener looks at its stop flag while no ring comes
RECONNECT_S = 1.0
ERROR_LOG_EVERY_S = 60.0
RETRY_AFTER_ERROR_S = 1.0


def enabled() -> bool:
    return app_setting("SCHEDULER_COORDINATION") == "redis"


class Ringer:
    """This process's side of the doorbell: ``ring()`` is cheap and never blocks on Redis."""

    def __init__(self, publish: Callable[[], None]) -> None:
        self._publish = publish
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._logged_at = float("-inf")

    def ring(self) -> None:
        self._wanted.set()
        if self._thread is None or self._pid != os.getpid():
            with self._lock:
                if self._thread is None or self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._thread = threading.Thread(
                        target=self._run, name="live-doorbell", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            # While Redis is unreachable a ring is useless: try again a second later, not 50
            # times a second (each failure is also logged by the backend).
            time.sleep(RING_SPACING_S if self._send() else RETRY_AFTER_ERROR_S)

    def flush(self) -> None:
        """At exit: a ring still wanted goes out now (a CLI that commits and exits at once)."""
        if self._wanted.is_set():
            self._wanted.clear()
            self._send()

    def _send(self) -> bool:
        try:
            self._publish()
        except Exception as exc:  # a ring is an optimisation: the feed polls anyway
            now = time.monotonic()
            if now - self._logged_at >= ERROR_LOG_EVERY_S:
                self._logged_at = now
                logger.warning("could not ring the live feed's doorbell: %s", exc)
            return False
        return True


def _publish_ring() -> None:
    wake.publisher().publish(LIVE_CHANNEL, "")


ringer = Ringer(_publish_ring)
atexit.register(ringer.flush)


def ring(**_payload: Any) -> None:
    """Ring after a commit (a receiver of jobs.events.job_changed / executions_changed, which are
    sent after commit, and called by nodes when a term begins or ends)."""
    if enabled():
        ringer.ring()


class Listener:
    """A web process's ear: a thread subscribed to the doorbell that calls ``on_ring`` for each
    ring, and once more whenever it (re)connects or loses the connection, since a ring may have
    been missed meanwhile. ``connected`` says whether rings can currently be heard: while it is
    False the feed must poll at its full rate."""

    def __init__(self, on_ring: Callable[[], None], backend: Any = None) -> None:
        self.on_ring = on_ring
        self._backend = backend
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-doorbell-ear", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._listen()
                failures = 0
            except Exception as exc:
                failures += 1
                if failures == 1 and not self._stop.is_set():
                    logger.warning(
                        "live feed doorbell unavailable (%s); polling every "
                        "SCHEDULER_LIVE_POLL_S until it is back",
                        exc,
                    )
            finally:
                if self.connected:
                    self.connected = False
                    self.on_ring()
            self._stop.wait(RECONNECT_S)

    def _listen(self) -> None:
        backend = self._backend or wake.publisher()
        pubsub = backend.client.pubsub()
        try:
            pubsub.subscribe(backend.channel_key(LIVE_CHANNEL))
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=LISTEN_POLL_S)
                if message is None:
                    continue
                if message.get("type") == "subscribe":
                    # Confirmed: from here on every ring is heard. One more poll covers anything
                    # rung before (or while the connection was down).
                    self.connected = True
                    self.on_ring()
                elif message.get("type") == "message":
                    self.on_ring()
        finally:
            try:
                pubsub.close()
            except Exception:  # closing a broken connection: nothing more to do
                logger.debug("closing the doorbell subscription failed", exc_info=True)
