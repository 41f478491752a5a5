"""The starter: takes the claimed runs due within PREPARE_AHEAD_S (and the waiting runs due for
another look) as one batch and has it admitted, in a thread of its own: at most PREPARE_WORKERS
batches at once, so one stuck on a cut connection holds up no other. A preparer thread that has
nothing left waits PREPARER_LINGER_S for the next batch, keeping its database connection, before
it ends: runs falling due continuously are admitted without a thread and a connection each."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from django.db import close_old_connections, connection

from cluster.executor.ledger import Ledger
from cluster.executor.runs import Scheduled

logger = logging.getLogger(__name__)

# A claimed execution is admitted this long before it is due, to take locks and mark it running,
# so that the task itself starts on the due instant.
PREPARE_AHEAD_S = 0.25
# Waiting runs whose next look falls within this window are looked at in one batch (seconds).
WAIT_COALESCE_S = 0.05
# The starter's longest sleep when nothing is claimed (it is woken by a claim).
STARTER_IDLE_S = 0.5
# Threads admitting batches at once, at most (each holds one database connection while it runs).
# A thread is started per batch up to this many; beyond, batches queue for the next one free. Not
# a fixed pool of two: a batch stuck on a connection cut mid-query (up to the database read
# timeout) must not hold up the batches behind it (a chaos run saw runs 35 s late that way).
PREPARE_WORKERS = 4
# An idle preparer thread waits this long for the next batch before it ends and closes its
# database connection (seconds).
PREPARER_LINGER_S = 2.0
# When runs fall due continuously (jobs spread over their interval), the starter takes them in
# passes at most this often, each carrying every run due within PREPARE_AHEAD_S, rather than one
# pass per run: each run is still admitted more than PREPARE_AHEAD_S - STARTER_PASS_MIN_S ahead.
STARTER_PASS_MIN_S = 0.05


class Starter:
    def __init__(
        self,
        *,
        node_id: str,
        books: Ledger,
        clock_now: Callable[[], float],
        admit: Callable[[list[Scheduled]], None],
        inline: bool,
    ) -> None:
        self.node_id = node_id
        self.books = books
        self._now = clock_now
        self._admit = admit
        # Batches are admitted in the caller rather than a thread of their own (a stepped
        # executor: everything happens in the test's thread, in order).
        self.inline = inline
        self.woken = threading.Event()
        # The scope each preparer admits in (the node watches its database calls there, with
        # tight bounds: cluster.dbhealth).
        self.watch: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
        self._queue: queue.Queue[list[Scheduled]] = queue.Queue()
        self._preparers = 0  # admission threads running
        self._idle = 0  # of those, waiting for a batch

    def counts(self) -> dict[str, int]:
        with self.books.lock:
            return {"admitting": self._preparers, "queued_batches": self._queue.qsize()}

    def wake(self) -> None:
        """Look now (new work; or the stop event was set and the loop should end)."""
        self.woken.set()

    def run(self, stop: threading.Event) -> None:
        """The starter loop: ``step`` until stopped, sleeping until the next batch is due."""
        while not stop.is_set():
            delay = self.step()
            if delay > 0:
                self.woken.wait(delay)
                self.woken.clear()

    def step(self) -> float:
        """Admit the batch due now (in a thread of its own, or here if ``inline``); returns the
        seconds until the next one is due."""
        now = self._now()
        batch, next_at = self.books.due_batch(now, PREPARE_AHEAD_S, WAIT_COALESCE_S)
        if batch:
            if self.inline:
                self._admit(batch)
            else:
                self._dispatch(batch)
        if next_at is None:
            return STARTER_IDLE_S
        delay = max(0.0, next_at - now)
        return max(delay, STARTER_PASS_MIN_S) if batch and not self.inline else delay

    def _dispatch(self, batch: list[Scheduled]) -> None:
        """Queue ``batch`` for a preparer: one waiting for work takes it, or a new one is started
        when fewer than PREPARE_WORKERS are running (the first of them to be free takes it
        otherwise)."""
        with self.books.lock:
            self._queue.put(batch)
            spawn = self._idle == 0 and self._preparers < PREPARE_WORKERS
            if spawn:
                self._preparers += 1
        if spawn:
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._preparer, name=f"{self.node_id}:prepare", daemon=True).start()

    def _next_batch(self) -> list[Scheduled] | None:
        """The next queued batch, waiting up to PREPARER_LINGER_S; None: this preparer ends (it
        is no longer counted, so the next batch starts another)."""
        with self.books.lock:
            self._idle += 1
        try:
            batch = self._queue.get(timeout=PREPARER_LINGER_S)
        except queue.Empty:
            batch = None
        with self.books.lock:
            self._idle -= 1
            if batch is None:
                # A batch queued between the timeout and this line counted on this thread.
                try:
                    batch = self._queue.get_nowait()
                except queue.Empty:
                    self._preparers -= 1
        return batch

    def _preparer(self) -> None:
        """Admit queued batches until none comes for PREPARER_LINGER_S; then end and close the
        connection."""
        try:
            with self.watch():
                while (batch := self._next_batch()) is not None:
                    try:
                        close_old_connections()  # one broken by an earlier batch is not reused
                        self._admit(batch)
                    except Exception:
                        logger.exception(
                            "admission of a batch failed", extra={"node": self.node_id}
                        )
                        close_old_connections()
        finally:
            connection.close()
