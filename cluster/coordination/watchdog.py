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
# Given up by its holder (a node cut off from its database keeps only the locks of running bodies).
LOST_GIVEN_UP = "given_up"


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
        self._stopped = False
        # Set when a node's LockKeeper extends this lock instead of a thread of its own.
        self._keeper: LockKeeper | None = None
        # The lock's own thread and its wake-up, made only by ``start``: a node's locks are kept
        # by its keeper, and making a thread and an event per job lock (a node takes hundreds a
        # second) was a tenth of its admission's time.
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None

    @property
    def handle(self) -> LockHandle:
        """The latest handle (its extension count and validity move on with every extension)."""
        return self._handle

    def start(self) -> LockWatchdog:
        """Extend the lock from a thread of its own."""
        self._stop = threading.Event()
        if self._stopped:  # stopped before it started (see ``stop``)
            self._stop.set()
        self._thread = threading.Thread(
            target=self._run, name=f"lock-watchdog:{self._handle.name}", daemon=True
        )
        self._thread.start()
        return self

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> LockHandle:
        """Stop extending; the caller may release the lock at once. (With a keeper, an extension
        may still be in flight: it cannot bring a released lock back, as every backend extends
        only a lock that still holds our token.)"""
        self._stopped = True
        if (wake := self._stop) is not None:
            wake.set()
        thread = self._thread
        if self._keeper is not None:
            self._keeper.forget(self)
        elif thread is not None and thread.is_alive() and threading.current_thread() is not thread:
            thread.join()
        return self._handle

    def give_up(self, reason: str = LOST_GIVEN_UP) -> LockHandle:
        """Stop extending and report the lock lost (the work it protects must not start); the
        caller releases it."""
        handle = self.stop()
        self._report(reason)
        return handle

    def __enter__(self) -> LockWatchdog:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        wake = self._stop  # made by start, before the thread
        if wake is None:
            return
        while not wake.wait(self.interval_s):
            if not self.extend_once():
                return

    def extend_once(self) -> bool:
        """One extension. False when the lock is lost (reported) and the watchdog must stop."""
        self._last_extension = self.clock.monotonic()
        try:
            result: LockHandle | Exception | None = self.backend.extend_lock(
                self._handle, self.ttl_ms
            )
        except Exception as exc:  # keep trying while the lock is certainly still ours
            result = exc
        return self.apply_extension(result)

    def apply_extension(self, result: LockHandle | Exception | None) -> bool:
        """Take in the result of an extension (the new handle, None: not ours any more, or the
        error that kept the backend from answering). False when the lock is lost (reported)."""
        if isinstance(result, LockHandle):
            self._handle = result
            return True
        if result is None:
            self._report(LOST_NOT_OWNED)
            return False
        next_try = self.clock.monotonic() + self.interval_s
        if next_try < self._handle.valid_until():
            logger.warning("extending lock %s failed, will retry: %s", self._handle.name, result)
            return True
        logger.warning("extending lock %s failed: %s", self._handle.name, result)
        self._report(LOST_UNREACHABLE)
        return False

    def _report(self, reason: str) -> None:
        level = logging.WARNING if reason == LOST_GIVEN_UP else logging.ERROR
        logger.log(
            level, "lock %s lost (%s): abort the work it protects", self._handle.name, reason
        )
        self.lost_reason = reason
        self.lost.set()
        if self.on_lost is not None:
            try:
                self.on_lost(self._handle, reason)
            except Exception:
                logger.exception("on_lost callback of lock %s failed", self._handle.name)


class LockKeeper:
    """One thread per node keeps every lock the node holds alive (instead of a thread per lock).

    Each pass extends together the locks due for it (``interval_s`` since their last extension)
    through ``backend.extend_locks``: on Redis one pipelined round trip per Redlock master, the
    masters asked in parallel, so a slow master costs one timeout per pass, not one per lock. On the
    database backend the keeper's thread is the only one that holds a connection for locks.
    """

    def __init__(self, backend: CoordinationBackend, *, tick_s: float = 0.05) -> None:
        self.backend = backend
        self.tick_s = tick_s
        self._held: dict[int, LockWatchdog] = {}
        self._mutex = threading.Lock()
        self._releases: list[LockHandle] = []
        self._running = threading.Event()
        self._wake = threading.Event()
        # Which locks to keep: None for all (the usual answer), else the ids of the watchdogs to
        # keep; every other is given up and released at the next pass (see ``give_up_unkept``).
        self.kept: Callable[[], set[int] | None] = lambda: None

    def release(self, watchdog: LockWatchdog) -> None:
        """Stop extending ``watchdog``'s lock and release it: while the keeper's thread runs, in
        that thread (woken at once), together with every other release queued meanwhile (on
        Redis one pipelined round trip per master for all of them). A task thread giving its
        lock up as its body ends then spends no round trip of its own, and opens no database
        connection on the database backend: at a whole second a node ends dozens of bodies at
        once, and each release in its own thread held up the bodies still to start. Without a
        keeper thread (a stepped executor), released here and now."""
        handle = watchdog.stop()
        with self._mutex:
            # Checked and queued under the mutex the keeper clears _running under: a handle is
            # never queued after the keeper's last look at the queue.
            queued = self._running.is_set()
            if queued:
                self._releases.append(handle)
        if queued:
            self._wake.set()
        else:
            self._release([handle])

    def _release(self, handles: list[LockHandle]) -> None:
        try:
            results = self.backend.release_locks(handles)
        except Exception as exc:  # they expire by themselves
            results = [exc] * len(handles)
        for handle, result in zip(handles, results, strict=True):
            if isinstance(result, Exception):
                logger.warning("releasing lock %s failed (it will expire): %s", handle.name, result)

    def _release_queued(self) -> int:
        with self._mutex:
            handles, self._releases = self._releases, []
        if handles:
            self._release(handles)
        return len(handles)

    def keep(self, watchdog: LockWatchdog) -> LockWatchdog:
        """Extend ``watchdog``'s lock from now on (its own thread is not started)."""
        watchdog._keeper = self
        with self._mutex:
            self._held[id(watchdog)] = watchdog
        return watchdog

    def forget(self, watchdog: LockWatchdog) -> None:
        """Stop extending ``watchdog``'s lock (no waiting for a pass in flight: see stop())."""
        with self._mutex:
            self._held.pop(id(watchdog), None)

    @property
    def held(self) -> int:
        with self._mutex:
            return len(self._held)

    def run(self, stop: threading.Event) -> None:
        """Passes every ``tick_s`` (or at once when a release is queued) until ``stop`` is set;
        then the queued releases are done and later ones happen in their callers."""
        self._running.set()
        try:
            while not stop.is_set():
                self._wake.wait(self.tick_s)
                self._wake.clear()
                try:
                    self._release_queued()
                    self.step()
                except Exception:
                    logger.exception("lock keeper pass failed")
        finally:
            with self._mutex:
                self._running.clear()
            self._release_queued()

    def give_up_unkept(self) -> int:
        """Give up and release the locks ``kept`` does not name (none while it names all)."""
        keep = self.kept()
        if keep is None:
            return 0
        with self._mutex:
            unkept = [w for key, w in self._held.items() if key not in keep]
        handles = [watchdog.give_up() for watchdog in unkept if not watchdog.stopped]
        if handles:
            self._release(handles)
        return len(handles)

    def step(self) -> int:
        """One pass: give up the locks not to be kept, extend the locks due. Returns how many
        were extended (or tried)."""
        self.give_up_unkept()
        with self._mutex:
            candidates = list(self._held.values())
        by_ttl: dict[int, list[LockWatchdog]] = {}
        for watchdog in candidates:
            now = watchdog.clock.monotonic()
            if not watchdog.stopped and now >= watchdog._last_extension + watchdog.interval_s:
                by_ttl.setdefault(watchdog.ttl_ms, []).append(watchdog)
        tried = 0
        for ttl_ms, due in by_ttl.items():
            for watchdog in due:
                watchdog._last_extension = watchdog.clock.monotonic()
            try:
                results: list[LockHandle | Exception | None] = list(
                    self.backend.extend_locks([w.handle for w in due], ttl_ms)
                )
            except Exception as exc:
                results = [exc] * len(due)
            for watchdog, result in zip(due, results, strict=True):
                tried += 1
                if watchdog.stopped:
                    continue  # released meanwhile: nothing to report
                if not watchdog.apply_extension(result):
                    with self._mutex:
                        self._held.pop(id(watchdog), None)
        return tried
