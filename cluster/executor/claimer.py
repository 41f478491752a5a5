"""The claim loop's pass: claim what fits this node's capacity, the due runs of its queues, and hand
them to the starter (or start them in the claim itself: due already, with no concurrency guard and
no flow limit). A paused queue is not claimed from."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from cluster import admission, node_metrics, tracing
from cluster.admission import Start
from cluster.executor import facts as gather
from cluster.executor.host import Host
from cluster.executor.ledger import Ledger
from cluster.executor.runs import ActiveRun
from jobs import executions, flow
from jobs.models import ConcurrencyPolicy, JobExecution
from jobs.states import ExecutionStatus

S = ExecutionStatus

# Policies whose runs look at other runs of their job (and forbid's at the job lock) before they
# start: never started in the claim's own transaction.
GUARDED_POLICIES = (ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE)
# A node behind (its last claim took all it asked for, of runs already due: more are waiting)
# claims again once this share of its capacity is free, or CLAIM_GATHER_S after the first slot
# freed, rather than at each slot: a claim costs about the same whatever its size (five round
# trips and the statements' own work), and in a burst of short runs a node that claimed a few
# at a time spent more of the machine on claiming than on running them.
CLAIM_GATHER_SHARE = 0.5
CLAIM_GATHER_S = 0.005
# A claim that took fewer runs than it had room for took everything due within its look-ahead:
# the next pass comes at most this soon (seconds; a wake-up, new runs written, comes at once).
# When runs fall due continuously (jobs spread over their interval) each pass then carries what
# fell due meanwhile, rather than a claim, with its round trips, per run or two.
CLAIM_PASS_MIN_S = 0.05


# Why a node claims nothing for a moment after it could not reach its job locks' quorum.
LOCKS_UNAVAILABLE = "job locks unreachable from this node"


class Claimer:
    def __init__(self, host: Host, books: Ledger) -> None:
        self.host = host
        self.books = books
        # Claim gathering (see CLAIM_GATHER_SHARE): whether the last claim left runs due behind
        # it, when room first freed since, and how long the claim loop may wait before it looks
        # again (None: until it is woken, or its poll).
        self._behind = False
        self._room_since: float | None = None
        self.next_claim_in: float | None = None
        # Why the last claim pass took nothing (None when it claimed, or failed).
        self.idle_reason: str | None = None

    def claim_once(self) -> int:
        """Claim what fits; returns the number claimed. Why a pass took nothing is kept in
        ``idle_reason`` (the node logs one that lasts)."""
        host, books = self.host, self.books
        node_metrics.claim_pass()
        self.next_claim_in = None
        if not host.claiming:
            self.idle_reason = "draining"
            return 0
        if not host.membership.confirmed():
            # A node that cannot show it is still a member claims nothing it could not start.
            self.idle_reason = "membership unconfirmed"
            return 0
        if host.held_back is not None:
            self.idle_reason = host.held_back
            return 0
        if host.clock.monotonic() < host.locks_unavailable_until:
            self.idle_reason = LOCKS_UNAVAILABLE
            self.next_claim_in = host.locks_unavailable_until - host.clock.monotonic()
            return 0
        # Room and the gathering state change together, under the lock that a run's completion
        # takes to decide whether to wake this loop (``room``): a wake-up cannot be lost between
        # them.
        with books.lock:
            free = books.capacity + books.overflow_locked() - books.load_locked()
            wait = self._gather_wait(free) if free > 0 else 0.0
            if free <= 0 or wait <= 0:
                self._room_since = None
        if free <= 0:
            self.idle_reason = "full"
            return 0
        if wait > 0:
            self.idle_reason = "gathering room"
            self.next_claim_in = wait
            return 0
        self.idle_reason = None
        prefix = executions.new_claim_prefix()
        books.claim_began(prefix)
        try:
            return self._claim(free, prefix)
        finally:
            books.claim_ended(prefix)

    def _gather_threshold(self) -> int:
        return max(1, int(self.books.capacity * CLAIM_GATHER_SHARE))

    def _gather_wait(self, free: int) -> float:
        """Seconds the claim loop waits for more room before claiming ``free`` slots (0: now).
        With the books' lock held."""
        if not self._behind or free >= self._gather_threshold():
            return 0.0
        now = self.host.clock.monotonic()
        if self._room_since is None:
            self._room_since = now
        return max(0.0, self._room_since + CLAIM_GATHER_S - now)

    def room(self) -> None:
        """Room freed: wake the claim loop, unless it is gathering and the room is not yet worth a
        claim (it comes back by itself within CLAIM_GATHER_S)."""
        books = self.books
        with books.lock:
            gathering = (
                self._behind
                and self._room_since is not None
                and books.capacity - books.load_locked() < self._gather_threshold()
            )
        if not gathering:
            self.host.on_room()

    def _claim(self, free: int, prefix: str) -> int:
        host, books = self.host, self.books
        epoch = host.membership.epoch
        now = host.now()
        began = time.monotonic()
        queues = flow.unpaused(host.queues)
        if not queues:
            self.idle_reason = "every queue paused"
            self.next_claim_in = flow.CONFIG_TTL_S
            return 0
        # Runs due now are marked running by the claim itself: like an admission's, after the
        # node's row is written following an outage, and counting the outages so far.
        outages = host.row.settle()
        claimed = executions.claim_batch(
            node_id=host.node_id,
            queues=queues,
            limit=free,
            horizon=now + timedelta(seconds=host.lookahead_s),
            now=now,
            start_now=self._startable_at_claim,
            prefix=prefix,
        )
        node_metrics.claim(len(claimed), time.monotonic() - began)
        if claimed and tracing.enabled():
            tracing.claims(claimed, start=now, end=host.clock.now(), node=host.node_id)
        # Behind: every slot asked for was filled, and with runs due already (not claimed ahead
        # of their instant): more are likely waiting.
        behind = (
            len(claimed) == free
            and free > 0
            and max(execution.run_after for execution in claimed) <= now
        )
        with books.lock:
            self._behind = behind
        if not claimed:
            self.idle_reason = "nothing due"
            return 0
        if len(claimed) < free:
            self.next_claim_in = CLAIM_PASS_MIN_S
        started: list[ActiveRun] = []
        with books.lock:
            # A drain that began while the claim waited for the database (SQLite's write
            # lock) has already emptied the heap: these go straight back, not into it.
            keep = host.claiming
            for execution in claimed if keep else ():
                due = execution.run_after.timestamp()
                if execution.status == S.RUNNING:
                    run = ActiveRun(execution=execution, due=due, epoch=epoch, outages=outages)
                    books.track_active_locked(run)
                    started.append(run)
                    continue
                books.schedule_locked(execution, due, epoch)
        if not keep:
            for execution in claimed:
                if execution.status == S.RUNNING:
                    executions.hand_back_unstarted(execution)
                else:
                    executions.hand_back(execution)
            return 0
        if started:
            host.runner.launch(host, started)
        if len(started) < len(claimed):
            host.wake_starter()
        return len(claimed)

    def _startable_at_claim(self, claimed: list[JobExecution]) -> list[JobExecution]:
        """The claimed runs that start in the claim's own transaction: due already, of a job
        with no concurrency guard (no job lock to take, no other run to look at), not so late that
        a later fire of its job may have overtaken it, and admitted on the facts of the run alone
        (not a stale misfire). The rest go to the starter."""
        host = self.host
        if not host.claiming:
            return []
        now = host.clock.now()
        instant = datetime.fromtimestamp(now, tz=UTC)
        config = flow.queues()
        picks = []
        for execution in claimed:
            due = execution.run_after.timestamp()
            if due > now or execution.job.concurrency_policy in GUARDED_POLICIES:
                continue
            if flow.limited(execution, config):
                continue  # the flow gate decides, in the starter
            if gather.may_be_overtaken(execution, now=instant):
                continue
            decision = admission.admit(
                gather.facts(execution, due=due, now=now, claiming=host.claiming)
            )
            if isinstance(decision, Start):
                picks.append(execution)
        return picks
