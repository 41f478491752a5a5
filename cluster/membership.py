"""A node's own, local proof that the cluster still counts it in.

The cluster declares a node dead when its presence in the coordination backend expires (a key with a
TTL on Redis, a lease row on the database backend) and then takes its work: running runs become
``lost``, claimed ones go back to the queue. So before a node starts a side effect it must be able to
show, on its own monotonic clock, that its presence cannot have expired yet:

    renewal started at m0 (monotonic), the backend set the expiry at or after m0 + ttl
    => while monotonic() < m0 + ttl - margin, nobody can have seen this node's presence expire.

The margin covers the clocks' rate difference and the moment between the check and the start. A node
frozen (SIGSTOP, a VM pause) past its TTL fails the check when it resumes, whatever thread runs first.

When a renewal finds the presence had already lapsed, the epoch moves on: whatever the node claimed
under an older epoch may have been taken by the cluster meanwhile, and is given up (handed back
conditionally, so a row the cluster already took is left alone) instead of started.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any

from cluster.clock import Clock, SystemClock
from cluster.coordination import CoordinationBackend

logger = logging.getLogger(__name__)

# Safety margin subtracted from the presence TTL before a start is allowed (seconds).
DEFAULT_MARGIN_S = 0.25


class Membership:
    def __init__(
        self,
        backend: CoordinationBackend,
        node_id: str,
        *,
        ttl_s: float,
        margin_s: float = DEFAULT_MARGIN_S,
        clock: Clock | None = None,
    ) -> None:
        if margin_s <= 0 or margin_s >= ttl_s:
            raise ValueError("the membership margin must be positive and below the presence TTL")
        self.backend = backend
        self.node_id = node_id
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.clock = clock or getattr(backend, "clock", None) or SystemClock()
        self._lock = threading.Lock()
        self._confirmed_until = float("-inf")
        self._epoch = 0
        self._renewed_once = False
        self._last_renewal = float("-inf")
        self._steady_since = float("inf")

    @property
    def epoch(self) -> int:
        """Moves on each time this node's presence is found to have lapsed."""
        with self._lock:
            return self._epoch

    def confirmed(self, epoch: int | None = None) -> bool:
        """True while the presence certainly holds (and, given ``epoch``, has held since then)."""
        now = self.clock.monotonic()
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return False
            return now < self._confirmed_until

    def remaining_s(self) -> float:
        with self._lock:
            return self._confirmed_until - self.clock.monotonic()

    def renew(self, payload: dict[str, Any]) -> bool:
        """One presence renewal. Returns False when the presence had lapsed before it (the epoch
        moved on). Raises CoordinationError when the backend cannot answer: the confirmation then
        simply runs out."""
        started = self.clock.monotonic()
        continuous = self.backend.heartbeat(self.node_id, int(self.ttl_s * 1000), payload)
        with self._lock:
            lapsed = self._renewed_once and not continuous
            if lapsed:
                self._epoch += 1
            self._renewed_once = True
            self._confirmed_until = started + self.ttl_s - self.margin_s
            # Renewals that came late (this node stalled: CPU starvation, a database write lock,
            # a freeze) restart the count of how long it has been renewing steadily.
            if started - self._last_renewal > self.ttl_s / 2:
                self._steady_since = started
            self._last_renewal = started
        if lapsed:
            logger.warning(
                "node %s: presence had lapsed; giving up what it claimed before",
                self.node_id,
                extra={"node": self.node_id},
            )
        return not lapsed

    def steady_for(self) -> float:
        """How long this node has renewed its presence on time without a break (seconds). A node
        that itself stalled has no business declaring others dead: they likely stalled with it
        (a SQLite write lock held by someone, the whole machine starved) and are renewing now."""
        with self._lock:
            return max(0.0, self.clock.monotonic() - self._steady_since)


class Liveness(enum.Enum):
    ALIVE = "alive"  # renews its presence on time
    SUSPECT = "suspect"  # present, but missed renewals: about to expire or late under load
    GONE = "gone"  # its presence expired: the cluster counts it dead


# A node renews every heartbeat interval; one that has not renewed for this many intervals is
# suspect (a live node late under load only makes others wait, never skip or take its work).
SUSPECT_AFTER_INTERVALS = 1.5


def node_liveness(
    live: dict[str, dict[str, Any]],
    node_id: str,
    *,
    now_ms: int,
    ttl_s: float,
    heartbeat_s: float,
) -> Liveness:
    """Judge ``node_id`` from a ``CoordinationBackend.live_nodes()`` answer."""
    presence = live.get(node_id)
    if presence is None:
        return Liveness.GONE
    remaining_ms = presence.get("expires_at_ms", 0) - now_ms
    fresh_ms = (ttl_s - SUSPECT_AFTER_INTERVALS * heartbeat_s) * 1000
    return Liveness.ALIVE if remaining_ms >= fresh_ms else Liveness.SUSPECT


def renewed_at_ms(live: dict[str, dict[str, Any]], node_id: str, *, ttl_s: float) -> int | None:
    """When ``node_id`` last renewed its presence (wall-clock ms, from its expiry), if present."""
    presence = live.get(node_id)
    if presence is None or "expires_at_ms" not in presence:
        return None
    return int(presence["expires_at_ms"] - ttl_s * 1000)
