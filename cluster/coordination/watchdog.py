"""Keep a held lock alive while the work it protects runs.

A thread extends the lock every ttl/3. When an extension says the lock is no longer ours, or the
backend keeps failing until the lock's validity would run out before the next try, the watchdog
stops and reports it (``lost`` event + ``on_lost`` callback) so the work can be aborted: past that instant
another node may hold the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cluster.clock import Clock, SystemClock

from .base import CoordinationBackend, LockHandle

logger = logging.getLogger(__name__)

# Extend this many times per TTL: two extensions may fail before the lock can lapse.
EXTENSIONS_PER_TTL = 3

LOST_NOT_OWNED = "not_owned"
LOST_UNREACHABLE = "unreachable"


class LockWatchdog:
    def __init__(
        self,
        backend: CoordinationBackend,
        handle: LockHandle,
        ttl_ms: int,
        *,
        on_lost: Callable[[LockHandle, str], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.ttl_ms = ttl_ms
        self.interval_s = ttl_ms / 1000 / EXTENSIONS_PER_TTL
        self.on_lost = on_lost
        # The handle's acquired_at was read from the backend's clock: compare against the same one.
        self.clock = clock or getattr(backend, "clock", None) or SystemClock()
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self._handle = handle
        self._last_extension = self.clock.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"lock-watchdog:{handle.name}", daemon=True
        )

    @property
    def handle(self) -> LockHandle:
        """The latest handle (its extension count and validity move on with every extension)."""
        return self._handle

    def start(self) -> LockWatchdog:
        self._thread.start()
        return self

    def stop(self) -> LockHandle:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        return self._handle

    def __enter__(self) -> LockWatchdog:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.extend_once():
                return

    def extend_if_due(self) -> bool:
        """For a watchdog driven by its owner instead of its thread (a stepped test cluster):
        extend once if ``interval_s`` has passed on the clock since the last extension. False once
        the lock is lost."""
        if self.lost.is_set():
            return False
        if self.clock.monotonic() < self._last_extension + self.interval_s:
            return True
        return self.extend_once()

    def extend_once(self) -> bool:
        """One extension. False when the lock is lost (reported) and the watchdog must stop."""
        self._last_extension = self.clock.monotonic()
        try:
            extended = self.backend.extend_lock(self._handle, self.ttl_ms)
        except Exception as exc:  # keep trying while the lock is certainly still ours
            next_try = self.clock.monotonic() + self.interval_s
            if next_try < self._handle.valid_until():
                logger.warning("extending lock %s failed, will retry: %s", self._handle.name, exc)
                return True
            logger.warning("extending lock %s failed: %s", self._handle.name, exc)
            self._report(LOST_UNREACHABLE)
            return False
        if extended is None:
            self._report(LOST_NOT_OWNED)
            return False
        self._handle = extended
        return True

    def _report(self, reason: str) -> None:
        logger.error("lock %s lost (%s): abort the work it protects", self._handle.name, reason)
        self.lost_reason = reason
        self.lost.set()
        if self.on_lost is not None:
            try:
                self.on_lost(self._handle, reason)
            except Exception:
                logger.exception("on_lost callback of lock %s failed", self._handle.name)
