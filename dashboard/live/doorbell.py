"""A web process's ear for the live feed's doorbell (``cluster.announce`` rings it after every
commit a dashboard shows): a thread subscribed to ``LIVE_CHANNEL`` on the coordination bus."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cluster import announce
from cluster.coordination import CoordinationBackend

logger = logging.getLogger(__name__)

RECONNECT_S = 1.0


class Listener:
    """Calls ``on_ring`` for each ring, and once more whenever it (re)subscribes or loses the bus,
    since a ring may have been missed meanwhile. ``connected`` says whether rings can be heard
    now: while it is False the feed must poll at its full rate."""

    def __init__(
        self, on_ring: Callable[[], None], backend: CoordinationBackend | None = None
    ) -> None:
        self.on_ring = on_ring
        self._backend = backend
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-doorbell-ear", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _subscribed(self) -> None:
        # From here on every ring is heard; one more poll covers anything rung before.
        self.connected = True
        self.on_ring()

    def _run(self) -> None:
        failures = 0
        backend = self._backend or announce.bus()
        while not self._stop.is_set():
            try:
                for _ in backend.subscribe(announce.LIVE_CHANNEL, self._stop, self._subscribed):
                    self.on_ring()
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
