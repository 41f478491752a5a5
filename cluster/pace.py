"""Whether a node's own path to the database keeps up: a leader, or a claimer, whose database calls
are far slower than a live peer's gives its role to that peer.

A database slow for everyone is no reason to move (no peer is faster); a slow link of one node's
own is. The node's database health (``cluster.dbhealth``) measures its calls; the peers' round
trips come from their presences (``db_rtt_ms``). Three judgements:

- *overrun*: a leader pass (a tick and its reaping) still running OVERRUN_S on a path whose
  quickest call since the pass began is slow hands over at once, mid-pass (its writes after the
  hand-over are fenced);
- *behind*: a leader whose ticks begin BEHIND_S after their slots, BEHIND_TICKS in a row, on a slow
  path of its own hands over;
- *claims*: a node whose quickest call over PACE_WINDOW_S is slow steps back from claiming and hands
  back what it claimed but has not started (a claim it cannot start in time holds a forbid job's
  later fires behind it); it claims again once its path is quick or no peer is faster. A leader
  so judged hands leadership over as well, whatever its passes' length.

A leader that hands over holds back from campaigning for YIELD_HOLD_S (its term ends
"fell_behind").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cluster import node_metrics
from cluster.clock import Clock
from cluster.dbhealth import UNREACHABLE, DatabaseHealth
from cluster.executor import Executor

logger = logging.getLogger(__name__)

BEHIND_S = 1.0
BEHIND_TICKS = 3
OVERRUN_S = 1.0
# A path is slow when its quickest call takes this long (seconds) and SLOWER_THAN_PEER times a
# live peer's round trip.
SLOW_ROUND_TRIP_S = 0.02
SLOWER_THAN_PEER = 3.0
YIELD_HOLD_S = 10.0
PACE_WINDOW_S = 1.5
PACE_JUDGE_S = 0.5
STEP_BACK_MIN_S = 2.0
SLOW_PATH = "database path slow"


class Pace:
    def __init__(
        self,
        *,
        node_id: str,
        clock: Clock,
        database: DatabaseHealth,
        executor: Executor,
        live_nodes: Callable[[], dict[str, dict[str, object]]],
        is_leader: Callable[[], bool],
        hand_over: Callable[[], None],
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.database = database
        self.executor = executor
        self._live_nodes = live_nodes
        self._is_leader = is_leader
        self._hand_over_now = hand_over
        self._log_extra = {"node": node_id}
        # Late ticks in a row, and until when this node yields leadership.
        self._late_ticks = 0
        self.yield_until = float("-inf")
        # When the leader pass now running began (monotonic), None between passes.
        self.pass_began: float | None = None
        # Stepping back from claims on a slow path: last judged, and since when.
        self._claims_judged = float("-inf")
        self._stepped_back_at: float | None = None

    def yielding(self) -> bool:
        return self.clock.monotonic() < self.yield_until

    def can_lead(self) -> bool:
        """Able to do the leader's work: the database answers, and this node has not just handed
        leadership over for falling behind."""
        return self.database.able() and not self.yielding()

    def judge_overrun(self) -> None:
        """While a leader pass runs (judged ten times a second by the node's database watch)."""
        began = self.pass_began
        if began is None or self.yielding() or not self._is_leader():
            return
        running = self.clock.monotonic() - began
        if running < OVERRUN_S:
            return
        floor = self.database.fastest_since(began)
        if floor is None or floor < SLOW_ROUND_TRIP_S:
            return
        peer = self.faster_peer(floor)
        if peer is None:
            return
        self._hand_over(
            f"a leader pass has run {running:.1f} s, its quickest database call taking "
            f"{floor * 1000:.0f} ms",
            peer,
        )

    def judge_tick(self, late_s: float) -> None:
        """After a tick that began ``late_s`` after its earliest slot."""
        if late_s < BEHIND_S:
            self._late_ticks = 0
            return
        self._late_ticks += 1
        own = self.database.round_trip_s()
        if self._late_ticks < BEHIND_TICKS or own is None or own < SLOW_ROUND_TRIP_S:
            return
        peer = self.faster_peer(own)
        if peer is None:
            return
        self._hand_over(
            f"ticks begin {late_s:.1f} s after their slots; a database round trip takes "
            f"{own * 1000:.0f} ms here",
            peer,
        )

    def _hand_over(self, why: str, peer: tuple[str, float]) -> None:
        self._late_ticks = 0
        self.yield_until = self.clock.monotonic() + YIELD_HOLD_S
        logger.warning(
            "falling behind: %s, %.1f ms on %s: handing leadership over (no campaign for %.0f s)",
            why,
            peer[1],
            peer[0],
            YIELD_HOLD_S,
            extra=self._log_extra,
        )
        self._hand_over_now()

    def faster_peer(self, own_s: float) -> tuple[str, float] | None:
        """The live peer with the fastest database round trip (node id, ms), if it is at least
        SLOWER_THAN_PEER times faster than ``own_s`` and reaches its database."""
        best: tuple[str, float] | None = None
        for node_id, payload in self._live_nodes().items():
            rtt = payload.get("db_rtt_ms")
            if node_id == self.node_id or payload.get("database") == UNREACHABLE:
                continue
            if not isinstance(rtt, int | float) or rtt * SLOWER_THAN_PEER > own_s * 1000:
                continue
            if best is None or rtt < best[1]:
                best = (node_id, float(rtt))
        return best

    def judge_claims(self) -> None:
        """Before a claim pass: step back from claiming while this node's path is far slower than
        a peer's, handing back the unstarted claims; claim again once it is not."""
        now = self.clock.monotonic()
        if now - self._claims_judged < PACE_JUDGE_S:
            return
        self._claims_judged = now
        floor = self.database.fastest_since(now - PACE_WINDOW_S)
        slow = floor is not None and floor >= SLOW_ROUND_TRIP_S
        peer = self.faster_peer(floor) if slow and floor is not None else None
        if peer is not None and floor is not None and self._is_leader() and not self.yielding():
            # A leader on such a path writes its fires late whether or not a pass ever runs past
            # OVERRUN_S (short passes of slow calls did not: a chaos run's leader wrote its
            # partitions' fires 2-3 s late for 5 s before a pass overran).
            self._hand_over(
                f"its quickest database call in the last {PACE_WINDOW_S:.1f} s took "
                f"{floor * 1000:.0f} ms",
                peer,
            )
        if self._stepped_back_at is None:
            if peer is None or floor is None:
                return
            self._stepped_back_at = now
            self.executor.held_back = SLOW_PATH
            node_metrics.claims_held_back(True)
            handed_back = self.executor.release_unstarted()
            logger.warning(
                "%s: its quickest call in the last %.1f s took %.0f ms, %.1f ms on %s: claiming "
                "nothing, %d unstarted claims handed back",
                SLOW_PATH,
                PACE_WINDOW_S,
                floor * 1000,
                peer[1],
                peer[0],
                handed_back,
                extra=self._log_extra,
            )
            return
        if peer is not None or now - self._stepped_back_at < STEP_BACK_MIN_S:
            return
        held_s = now - self._stepped_back_at
        self._stepped_back_at = None
        self.executor.held_back = None
        node_metrics.claims_held_back(False)
        logger.info(
            "claiming again after %.1f s: %s",
            held_s,
            "no live peer is faster" if slow else "the database path is quick again",
            extra=self._log_extra,
        )
