"""Leader election over a coordination lease (after client-go's leaderelection).

The elector knows nothing of Redis or SQL: it talks to a :class:`CoordinationBackend` whose calls
each make one attempt. Retries, jitter and timing live here. The algorithm, one
:meth:`LeaderElector.tick` at a time:

- follower: try to acquire the lease (a new, higher term); on success start leading;
- leader: renew every ``renew_interval``; a renew refused by the compare-and-set means the lease is
  someone else's (or expired): stop leading at once; a renew that fails (backend unreachable) is
  retried every ``retry_period`` until ``renew_deadline`` has passed since the last successful
  renew, then stop leading — before the lease can expire and a new leader can be elected;
- :meth:`LeaderElector.release` hands over at once (SIGTERM): stop leading, release the lease;
- ``can_lead``: leading means being able to do the leader's work, not only to reach the lease. A
  leader that cannot (``can_lead()`` is false: its database does not answer) stops leading and
  releases the lease at its next step, so another node takes over at once instead of after the
  partition; a follower that cannot does not campaign.
- ``can_campaign``: whether a follower may take a lease now, beside ``can_lead`` (a node whose
  database path is too slow to claim runs leads on what it holds, but takes nothing new).
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cluster import conf
from cluster.clock import Clock, SystemClock
from cluster.coordination.base import CoordinationBackend, Lease

logger = logging.getLogger(__name__)

# Reasons passed to on_stopped_leading (the values of cluster.models.TermEndReason).
STEPPED_DOWN = "stepped_down"
LEASE_LOST = "lease_lost"
# The leader could not do its work (its database unreachable): it released the lease.
UNABLE = "unable"

ERR_TIMING_ORDER = (
    "election timing must satisfy lease_ttl_ms > renew_deadline_ms > retry_period_ms > 0, "
    "got lease_ttl_ms={lease_ttl_ms}, renew_deadline_ms={renew_deadline_ms}, "
    "retry_period_ms={retry_period_ms}"
)
ERR_TIMING_TYPE = "{field} must be an integer number of milliseconds, got {value!r}"
ERR_JITTER = "jitter_factor must be in [0, 1), got {value!r}"

# How many renewals per lease TTL: two may fail and be retried before the renew deadline.
RENEWALS_PER_TTL = 3
# A renewal that used more than half the room left for retries is logged at most this often (s).
RENEW_WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class ElectionConfig:
    """Timing of the election, validated up front.

    The defaults replace a SIGKILLed leader within 3 s (docs/architecture.md). Worst case: the dead leader
    renewed just before it died, so its lease lives lease_ttl (2000 ms) more; a follower then tries
    within retry_period (250 ms) plus jitter (at most 20 %: 50 ms): takeover <= 2000 + 250 + 50
    = 2300 ms, leaving about 700 ms for round trips and clock skew. The leader renews every
    ttl/3 (about 667 ms), so a failed renew is retried a few times before the renew deadline
    (1500 ms), and a leader that cannot renew stops leading 500 ms before its lease can expire and
    another node can be elected: two leaders never believe they lead at the same time (fencing
    covers the rest).
    """

    lease_ttl_ms: int = conf.default("LEASE_TTL_MS")
    renew_deadline_ms: int = conf.default("RENEW_DEADLINE_MS")
    retry_period_ms: int = conf.default("RETRY_PERIOD_MS")
    # Each wait is stretched by a random 0..jitter_factor of itself, so followers do not stampede.
    jitter_factor: float = 0.2

    def __post_init__(self) -> None:
        for field in ("lease_ttl_ms", "renew_deadline_ms", "retry_period_ms"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(ERR_TIMING_TYPE.format(field=field, value=value))
        if conf.election_problem(self.lease_ttl_ms, self.renew_deadline_ms, self.retry_period_ms):
            raise ValueError(
                ERR_TIMING_ORDER.format(
                    lease_ttl_ms=self.lease_ttl_ms,
                    renew_deadline_ms=self.renew_deadline_ms,
                    retry_period_ms=self.retry_period_ms,
                )
            )
        if not 0 <= self.jitter_factor < 1:
            raise ValueError(ERR_JITTER.format(value=self.jitter_factor))

    @property
    def renew_interval_ms(self) -> int:
        """ttl/3, but leaving room for one retry before the renew deadline, never below the retry
        period."""
        return max(
            self.retry_period_ms,
            min(self.lease_ttl_ms // RENEWALS_PER_TTL, self.renew_deadline_ms // 2),
        )


class LeaderElector:
    def __init__(
        self,
        backend: CoordinationBackend,
        name: str,
        identity: str,
        config: ElectionConfig | None = None,
        *,
        clock: Clock | None = None,
        on_started_leading: Callable[[Lease], None] | None = None,
        on_stopped_leading: Callable[[Lease, str], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        can_lead: Callable[[], bool] | None = None,
        can_campaign: Callable[[], bool] | None = None,
        poked: threading.Event | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self.identity = identity
        self.config = config or ElectionConfig()
        self.clock = clock or SystemClock()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.can_lead = can_lead
        self.can_campaign = can_campaign
        # tick() may run in the election thread while release() comes from a signal handler.
        self._mutex = threading.RLock()
        self._lease: Lease | None = None
        # Monotonic instant just before the last successful acquire/renew call: the lease is
        # certainly ours until _renewed_at + lease_ttl.
        self._renewed_at = 0.0
        self._next_renew_at = 0.0
        # After release(), followers get one lease TTL to take over before we campaign again.
        self._campaign_after = -math.inf
        self._observed_leader: str | None = None
        # Set by poke(): the loop steps now instead of at its next retry (an event shared by the
        # electors one loop steps together: cluster.partitions).
        self._poked = poked or threading.Event()
        # The longest a renewal has taken from when it was due (lateness + round trip), seconds.
        self.slowest_renewal_s = 0.0
        self._warned_at = -math.inf

    # --- state ------------------------------------------------------------------------------------
    # Both read without the mutex (one attribute read each): leader work may check them while a
    # callback, run under the mutex, waits for that work to finish.
    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def is_leader(self) -> bool:
        """True while we lead and the renew deadline has not passed since the last successful renew.

        Checked against the clock, not only set by tick(): a leader whose loop stalled stops
        acting at the renew deadline, before its lease can expire and another node can be elected.
        """
        return self._lease is not None and self.clock.monotonic() < self._renew_deadline()

    def _lease_deadline(self) -> float:
        return self._renewed_at + self.config.lease_ttl_ms / 1000

    def _renew_deadline(self) -> float:
        return self._renewed_at + self.config.renew_deadline_ms / 1000

    # --- the algorithm ----------------------------------------------------------------------------
    def tick(self) -> float:
        """One step at the clock's current time. Returns the seconds until the next step is due."""
        with self._mutex:
            if self._lease is None:
                return self._campaign()
            if not self._able():
                self._give_up()
                return self.config.retry_period_ms / 1000
            return self._keep_leading()

    def _able(self) -> bool:
        return self._check(self.can_lead, "can-lead", "assuming unable")

    def _may_campaign(self) -> bool:
        return self._check(self.can_campaign, "can-campaign", "not campaigning")

    def _check(self, check: Callable[[], bool] | None, what: str, failed: str) -> bool:
        """A caller's check (none: yes); one that raises says no."""
        if check is None:
            return True
        try:
            return bool(check())
        except Exception:
            logger.exception("the %s check of %s failed; %s", what, self.name, failed)
            return False

    def _give_up(self) -> None:
        """Unable to do the leader's work: stop leading and release the lease, so a node that can
        takes over now (expiry would take a whole TTL). Campaign again no sooner than a TTL from
        now, and only once able."""
        lease = self._lease
        assert lease is not None
        self._campaign_after = self.clock.monotonic() + self.config.lease_ttl_ms / 1000
        self._stop_leading(UNABLE)
        try:
            released = self.backend.release_lease(lease)
        except Exception as exc:
            # It expires by itself within the TTL; renewals have stopped.
            logger.warning(
                "releasing lease %s (term %d) failed (%s); it expires by itself",
                self.name,
                lease.term,
                exc,
                extra={"node": self.identity, "term": lease.term},
            )
            return
        if not released:
            logger.warning(
                "lease %s (term %d) was no longer ours to release", self.name, lease.term
            )

    def run(self, stop_event: threading.Event) -> None:
        """Campaign, lead, renew until that fails, campaign again; until ``stop_event`` is set.
        Always stops leading (releasing the lease) on the way out."""
        try:
            while not stop_event.is_set():
                try:
                    delay = self.tick()
                except Exception:  # a bug here must not end the election loop
                    logger.exception("election tick for %s failed", self.name)
                    delay = self.config.retry_period_ms / 1000
                self._poked.wait(self._jittered(delay))
                self._poked.clear()
        finally:
            self.release()

    def poke(self) -> None:
        """Step now (the leader released its lease: campaign at once, not at the next retry; or
        the loop is to stop and should see it)."""
        self._poked.set()

    def release(self) -> bool:
        """Hand leadership over at once: stop leading, then release the lease (not wait for
        expiry). The leader's work is stopped first so that it never overlaps the next leader's.
        Returns True if the lease was still ours and was released."""
        with self._mutex:
            lease = self._lease
            if lease is None:
                return False
            self._campaign_after = self.clock.monotonic() + self.config.lease_ttl_ms / 1000
            self._stop_leading(STEPPED_DOWN)
            try:
                released = self.backend.release_lease(lease)
            except Exception:
                logger.exception("releasing lease %s (term %d) failed", self.name, lease.term)
                return False
            if not released:
                logger.warning(
                    "lease %s (term %d) was no longer ours to release", self.name, lease.term
                )
            return released

    def _campaign(self) -> float:
        retry_s = self.config.retry_period_ms / 1000
        started = self.clock.monotonic()
        if started < self._campaign_after:
            return self._campaign_after - started
        if not self._able() or not self._may_campaign():
            return retry_s
        try:
            lease = self.backend.acquire_lease(self.name, self.identity, self.config.lease_ttl_ms)
        except Exception:
            logger.exception("acquiring lease %s failed", self.name)
            return retry_s
        if lease is None:
            self._observe_leader()
            return retry_s
        self._renewed_at = started
        self._next_renew_at = started + self.config.renew_interval_ms / 1000
        self._lease = lease  # last: is_leader reads it without the mutex
        logger.info(
            "%s started leading %s in term %d",
            self.identity,
            self.name,
            lease.term,
            extra={"node": self.identity, "term": lease.term},
        )
        self._notify_new_leader(self.identity)
        self._callback(self.on_started_leading, lease)
        return self._next_renew_at - started

    def _keep_leading(self) -> float:
        lease = self._lease
        assert lease is not None
        retry_s = self.config.retry_period_ms / 1000
        started = self.clock.monotonic()
        if started >= self._lease_deadline():
            # No renew for a whole TTL (the process was paused, or ticks stopped): it is gone.
            self._stop_leading(LEASE_LOST)
            return 0.0
        if started < self._next_renew_at:
            return self._next_renew_at - started
        try:
            renewed = self.backend.renew_lease(lease, self.config.lease_ttl_ms)
        except Exception:
            logger.exception("renewing lease %s (term %d) failed", self.name, lease.term)
            failed_at = self.clock.monotonic()
            if failed_at >= self._renew_deadline():
                self._stop_leading(LEASE_LOST)
                return retry_s
            # Retry every retry period, and once more exactly at the deadline.
            self._next_renew_at = min(failed_at + retry_s, self._renew_deadline())
            return self._next_renew_at - failed_at
        if renewed is None:
            # The compare-and-set refused: the lease expired or is someone else's now.
            self._stop_leading(LEASE_LOST)
            return retry_s
        self._renewed_at = started
        self._lease = renewed
        self._check_renew_timing(
            late_s=started - self._next_renew_at, took_s=self.clock.monotonic() - started
        )
        self._next_renew_at = started + self.config.renew_interval_ms / 1000
        return self._next_renew_at - started

    def _check_renew_timing(self, *, late_s: float, took_s: float) -> None:
        """Warn (at most once per RENEW_WARN_EVERY_S) when a renewal came late or slow enough to
        eat half the room the timing leaves for retries (renew deadline - renew interval): on a
        machine that starved the election thread this much, a little more would make the leader
        step down and leadership flap. The warning names the knobs to raise."""
        room_s = (self.config.renew_deadline_ms - self.config.renew_interval_ms) / 1000
        used_s = max(0.0, late_s) + took_s
        self.slowest_renewal_s = max(self.slowest_renewal_s, used_s)
        now = self.clock.monotonic()
        if used_s <= room_s / 2 or now - self._warned_at < RENEW_WARN_EVERY_S:
            return
        self._warned_at = now
        logger.warning(
            "lease %s renewed %.0f ms after it was due (%.0f ms late, %.0f ms round trip): half "
            "the %.0f ms the timing leaves for retries; if this lasts, raise "
            "SCHEDULER_RENEW_DEADLINE_MS and SCHEDULER_LEASE_TTL_MS (now %d and %d ms)",
            self.name,
            used_s * 1000,
            max(0.0, late_s) * 1000,
            took_s * 1000,
            room_s * 1000,
            self.config.renew_deadline_ms,
            self.config.lease_ttl_ms,
            extra={"node": self.identity},
        )

    def _stop_leading(self, reason: str) -> None:
        lease = self._lease
        if lease is None:
            return
        self._lease = None
        log = logger.info if reason == STEPPED_DOWN else logger.warning
        log(
            "%s stopped leading %s in term %d: %s",
            self.identity,
            self.name,
            lease.term,
            reason,
            extra={"node": self.identity, "term": lease.term},
        )
        self._callback(self.on_stopped_leading, lease, reason)

    def _observe_leader(self) -> None:
        if self.on_new_leader is None:
            return
        try:
            current = self.backend.current_lease(self.name)
        except Exception:
            logger.exception("reading lease %s failed", self.name)
            return
        if current is not None:
            self._notify_new_leader(current.holder)

    def _notify_new_leader(self, holder: str) -> None:
        if holder != self._observed_leader:
            self._observed_leader = holder
            self._callback(self.on_new_leader, holder)

    def _callback(self, callback: Callable[..., None] | None, *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            logger.exception("election callback %s failed", getattr(callback, "__name__", callback))

    def _jittered(self, delay_s: float) -> float:
        return delay_s * (1 + random.uniform(0, self.config.jitter_factor))
