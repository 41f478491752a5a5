"""Announcements: what one process committed, told to the others over the coordination bus.

Every write of the jobs', the runs' and the cluster's rows is announced after its commit as an
in-process signal (``jobs.events.job_changed`` and ``executions_changed``,
``cluster.events.cluster_changed``). This module, wired to them in ``cluster/apps.py``, is the only
one that turns them into messages on the bus (``CoordinationBackend.publish``):

- a wake-up on ``WAKE_CHANNEL``: a job edited, created, paused or triggered, or a new pending run,
  wakes the leader and the claimers at once (nodes also poll, within ``LEADER_MAX_SLEEP_S`` and
  ``CLAIM_POLL_S``);
- the live feed's doorbell on ``LIVE_CHANNEL``: "the database changed, look now"; each web
  process's live poller listens (``dashboard.live.doorbell``) and reads the database on a ring
  instead of every ``SCHEDULER_LIVE_POLL_S``. A ring carries nothing: a lost one (the bus
  restarting, a process killed right after its commit) delays a change by at most
  ``SCHEDULER_LIVE_IDLE_POLL_S``, the poll that remains as a fallback.

Ringing is coalesced: a caller only sets a flag (the after-commit hook of a batch of 500 runs must
not make 500 round trips), and one thread per process publishes, at most once every
``RING_SPACING_S``. On a bus that pushes nothing (database coordination) nothing is published.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from cluster import events as cluster_events
from cluster.coordination import CoordinationBackend, get_backend
from jobs import events as job_events

logger = logging.getLogger(__name__)

WAKE_CHANNEL = "wake"
# A draining leader's wake-up once it has released its lease: the others campaign at once.
LEASE_RELEASED = "lease-released"
LIVE_CHANNEL = "live"
RING_SPACING_S = 0.02  # one process publishes at most this often; changes in between share a ring
ERROR_LOG_EVERY_S = 60.0
RETRY_AFTER_ERROR_S = 1.0

_bus: CoordinationBackend | None = None
_bus_lock = threading.Lock()


def bus() -> CoordinationBackend:
    """This process's coordination backend for announcements (made on first use)."""
    global _bus
    with _bus_lock:
        if _bus is None:
            _bus = get_backend()
        return _bus


class Ringer:
    """This process's side of the doorbell: ``ring()`` is cheap and never blocks on the bus."""

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
            # While the bus is unreachable a ring is useless: try again a second later, not 50
            # times a second (each failure is also logged by the backend). Real time on purpose:
            # this paces a network client, not a decision of the cluster's.
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


ringer = Ringer(lambda: bus().publish(LIVE_CHANNEL, ""))
atexit.register(ringer.flush)


def ring(**_payload: Any) -> None:
    """Receiver of every change signal: ring the live feed's doorbell (coalesced)."""
    if bus().pushes:
        ringer.ring()


def wake_nodes(**_payload: Any) -> None:
    """Receiver of ``job_changed``: a job edited, created, paused or triggered may give a node
    something new to do."""
    backend = bus()
    if not backend.pushes:
        return
    try:
        backend.publish(WAKE_CHANNEL, "changed")
    except Exception as exc:  # a wake-up is an optimisation: nodes poll anyway
        logger.warning("could not publish a wake-up: %s", exc)


def wake_for_executions(*, changes: list[Any], **_payload: Any) -> None:
    """Receiver of ``executions_changed``: only new pending runs give a node something new to do;
    one wake-up for all of them."""
    if any(change.status == "pending" for change in changes):
        wake_nodes()


def connect() -> None:
    """Wire the change signals to the bus (once per process, from ``cluster/apps.py``)."""
    job_events.job_changed.connect(wake_nodes, dispatch_uid="announce-wake-job")
    job_events.executions_changed.connect(wake_for_executions, dispatch_uid="announce-wake-runs")
    job_events.job_changed.connect(ring, dispatch_uid="announce-ring-job")
    job_events.executions_changed.connect(ring, dispatch_uid="announce-ring-runs")
    cluster_events.cluster_changed.connect(ring, dispatch_uid="announce-ring-cluster")
