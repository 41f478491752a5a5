"""A node's time, from its database: the server's clock read now and then, carried between readings
by the node's monotonic clock (:class:`cluster.clock.ReferenceClock`). A node whose machine clock
is stepped or drifts keeps computing due runs, slots and heartbeats on the cluster's time; it logs
one WARNING when its machine clock is more than CLOCK_WARN_S off the database's, one INFO when it
is back, and exports the offset."""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque

from django.db import connection

from cluster import node_metrics
from cluster.clock import ReferenceClock

logger = logging.getLogger(__name__)

CLOCK_SYNC_S = 5.0  # how often the database's clock is read
CLOCK_WARN_S = 0.5  # a machine clock further off than this is worth a warning
# The server read its clock somewhere inside the round trip; the reading is taken as half-way, so a
# round trip of R can put the node's time off by up to R / 2 (a request held by a link and answered
# at once). A reading is used only when its round trip is at most this, or at most 1.5 times the
# median of the node's last few round trips (a database far away); others are dropped (the next
# one comes with the next heartbeat after CLOCK_SYNC_S). The median is of the readings used: a slow
# path's readings, dropped, must not make themselves typical (a chaos run's slowed database link,
# +0.13 s each way for 10 s, filled the list with its round trips; the next one was used and put a
# node 70 ms ahead, and it started 32 bodies 0.07 s before their instant).
MAX_READING_RTT_S = 0.02
RTT_SLACK = 1.5
# A node that has used no reading for this long takes one as a first reading is taken (a round trip
# up to FIRST_READING_MAX_RTT_S): a database moved further away for good is followed, at an error
# of at most half that round trip, rather than left to the monotonic clock's drift.
CLOCK_STALE_S = 60.0
# Until its first reading a node has only its machine's clock, which may be stepped (a node started
# during a bad NTP step): the first reading is taken with a round trip of up to this (its error is
# at most half of it), and the node claims nothing before it has one.
FIRST_READING_MAX_RTT_S = 0.5
FIRST_READING_ATTEMPTS = 5


def database_time() -> float:
    """The database server's wall time (epoch seconds). SQLite is a file on this machine: its
    clock is the machine's."""
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT UNIX_TIMESTAMP(NOW(6))")
            (value,) = cursor.fetchone()
        return float(value)
    return time.time()


class TimeKeeper:
    """Keeps a node's :class:`ReferenceClock` on its database's time."""

    def __init__(self, node_id: str, clock: ReferenceClock) -> None:
        self.node_id = node_id
        self.clock = clock
        self._last = -CLOCK_SYNC_S
        self._off = False
        # The round trips of the last readings used (``_last``: when the last one was taken).
        self._rtts: deque[float] = deque(maxlen=5)
        # Whether the clock has had a reading (before it, it is the machine's own clock).
        self.synced = False

    def first_sync(self) -> bool:
        """Take the first reading now (at registration, before the node claims anything): a few
        tries, each accepted with a round trip up to FIRST_READING_MAX_RTT_S. Returns whether the
        clock is synced (if not, the heartbeat keeps trying and the node claims nothing)."""
        for _ in range(FIRST_READING_ATTEMPTS):
            self._last = -CLOCK_SYNC_S
            if self.maybe_sync():
                return True
        return self.synced

    def maybe_sync(self) -> bool:
        """Read the database's clock if a reading is due (the caller's database thread). Returns
        whether a reading was taken."""
        if self.clock.monotonic() - self._last < CLOCK_SYNC_S:
            return False
        sent = self.clock.monotonic()
        reference = database_time()
        received = self.clock.monotonic()
        rtt = received - sent
        typical = statistics.median(self._rtts) if self._rtts else 0.0
        stale = received - self._last >= CLOCK_STALE_S
        bound = FIRST_READING_MAX_RTT_S if not self.synced or stale else MAX_READING_RTT_S
        if rtt > max(bound, RTT_SLACK * typical):
            return False
        self._rtts.append(rtt)
        self.synced = True
        self._last = received
        offset = self.clock.sync(reference, sent_mono=sent, received_mono=received)
        node_metrics.clock_offset(offset)
        off = abs(offset) > CLOCK_WARN_S
        if off and not self._off:
            logger.warning(
                "node %s: this machine's clock is %+.3f s off the database's; the node keeps "
                "the database's time",
                self.node_id,
                -offset,
            )
        elif self._off and not off:
            logger.info(
                "node %s: this machine's clock agrees with the database's again (%+.3f s)",
                self.node_id,
                -offset,
            )
        self._off = off
        return True
