"""The executor: claims a node's share of the due executions, admits each at its due instant, has a
runner execute it, supervises it and writes its outcome. It wires the rooms it is built from, each
with one responsibility, around one set of books:

    ledger.py      the books: what the node tracks of its runs, under one lock
    claimer.py     the claim loop's pass (what fits, claimed, handed to the starter)
    starter.py     the batches due now, each admitted in a thread of its own
    admitter.py    admission of a batch: facts, the pure rule, the start in one statement
    selffence.py   the last check before a body starts
    noderow.py     the node's own row, written again after a database outage before a start
    outcomes.py    a run's outcome queued for the finisher, its lock and capacity freed
    finisher.py    outcomes written in batches
    supervisor.py  runs over though their bodies have not said so; cancel requests
    audit.py       rows the node holds but no longer tracks, given back
    facts.py       what admission decides on, gathered per batch
    runners.py     how an admitted body runs (a thread; a child process)
    runs.py        what is tracked about a run, and the reasons recorded

Every time it reads comes from an injected clock (``cluster.clock``), and every loop has a step
that does one pass (``starter_step``, ``supervise_once``, ``Finisher.flush``): threads for a node,
the steps themselves for a deterministic test harness.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from django.db import transaction

from cluster.clock import Clock, SystemClock
from cluster.coordination import CoordinationBackend, LockKeeper, LockWatchdog
from cluster.executor.admitter import Admitter
from cluster.executor.audit import RECONCILE_AFTER_S, reconcile
from cluster.executor.claimer import Claimer
from cluster.executor.ledger import Ledger
from cluster.executor.noderow import NodeRow
from cluster.executor.outcomes import Outcomes
from cluster.executor.output import install_output_capture
from cluster.executor.runners import Runner, ThreadRunner
from cluster.executor.runs import REASON_SHUT_DOWN, ActiveRun, Outcome
from cluster.executor.selffence import SelfFence
from cluster.executor.starter import PREPARE_AHEAD_S, PREPARE_WORKERS, Starter
from cluster.executor.supervisor import Supervisor
from cluster.membership import Membership
from jobs import executions

logger = logging.getLogger(__name__)

__all__ = ["PREPARE_AHEAD_S", "PREPARE_WORKERS", "RECONCILE_AFTER_S", "Executor"]

# How often a drain looks whether the node is idle yet (seconds, on the node's clock).
IDLE_POLL_S = 0.05


# A node that could not reach its job locks' quorum claims nothing for this long (seconds).
LOCKS_UNAVAILABLE_HOLD_S = 2.0


class Executor:
    """Claims and runs executions for one node, within ``capacity``.

    The hot path is batched: claims are one transaction per poll; executions due together are
    admitted together (one query for blocking runs, one conditional UPDATE to ``running``) shortly
    before they are due, and their bodies are released at the due instant; outcomes are written by
    the finisher, many per transaction. The supervisor enforces timeouts and cancel requests.
    """

    def __init__(
        self,
        *,
        node_id: str,
        queues: list[str],
        capacity: int,
        backend: CoordinationBackend,
        membership: Membership,
        heartbeat_s: float,
        lookahead_s: float = 1.0,
        clock: Clock | None = None,
        runner: Runner | None = None,
        inline: bool = False,
    ) -> None:
        self.node_id = node_id
        self.queues = queues
        self.capacity = capacity
        self.backend = backend
        self.membership = membership
        self.heartbeat_s = heartbeat_s
        self.clock = clock or SystemClock()
        self.runner = runner or ThreadRunner()
        # A job lock lives as long as a presence: a dead node's locks free when it is declared dead.
        self.job_lock_ttl_ms = int(membership.ttl_s * 1000)
        self.lookahead_s = lookahead_s
        # Switches the node sets: claiming (False while draining); why it claims nothing for now
        # (a database path far slower than a peer's; None: it claims); whether it can write to
        # its database now (a body never starts while it cannot: its node says which bodies run
        # in its presence, and the leader takes the rest of its work, cluster.reaper.read_cut_off);
        # and who to tell when capacity frees (the claim loop looks again at once).
        self.claiming = True
        self.held_back: str | None = None
        # Until when (monotonic) this node claims nothing because it could not reach the job
        # locks' quorum (``locks_unavailable``).
        self.locks_unavailable_until = float("-inf")
        self.database_able: Callable[[], bool] = lambda: True
        # How long (s) this node has been unable to reach its database (0 while it can).
        self.database_cut_for: Callable[[], float] = lambda: 0.0
        self.on_room: Callable[[], None] = lambda: None
        # This node's row, owed a write after each database outage before a run starts (the node
        # gives it its heartbeat write and tells it of outages).
        self.row = NodeRow()
        self.books = Ledger(capacity=capacity, clock=self.clock)
        # One thread keeps every job lock of this node alive (not one per lock).
        self.keeper = LockKeeper(backend)
        self.keeper.kept = self._kept_locks
        self.claimer = Claimer(self, self.books)
        self.admitter = Admitter(self, self.books)
        self.starter = Starter(
            node_id=node_id,
            books=self.books,
            clock_now=self.clock.now,
            admit=self.admitter.admit,
            inline=inline,
        )
        self.fence = SelfFence(self, self.books)
        self.outcomes = Outcomes(self, self.books)
        self.finisher = self.outcomes.finisher
        self.supervisor = Supervisor(self, self.books)
        install_output_capture()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=UTC)

    # --- what the node reads ----------------------------------------------------------------------
    @property
    def running_count(self) -> int:
        return self.books.running_count()

    @property
    def load(self) -> int:
        return self.books.load()

    @property
    def idle_reason(self) -> str | None:
        return self.claimer.idle_reason

    @property
    def next_claim_in(self) -> float | None:
        return self.claimer.next_claim_in

    def snapshot(self) -> dict[str, int]:
        """What is tracked, by kind (for a log line saying why a node claims nothing)."""
        return {**self.books.counts(), **self.starter.counts()}

    def body_ids(self) -> list[int]:
        return self.books.body_ids()

    def refused_ids(self) -> list[int]:
        return self.books.refused_ids()

    def released_ids(self) -> list[int]:
        return self.books.released_ids()

    def forget_refused(self) -> None:
        self.books.forget_refused()

    def running_ids(self) -> list[int]:
        return self.books.running_ids()

    def _kept_locks(self) -> set[int]:
        """The lock keeper's question: which locks to go on extending (the others are given up
        and released). The locks this node holds for a reason (``Ledger.rightful_locks``); while
        the database is unreachable only those of running bodies: a lock taken for a run that
        cannot be written to start (an admission stuck in a hung statement, a run waiting for its
        instant) would hold its job on every node for as long as the partition lasts.

        Not those of running bodies either once this node can no longer do their work: its
        presence is no longer certain (the cluster is about to declare it gone and its runs
        lost), or it has been cut off from its database for as long as a presence lives (the
        leader takes a cut-off node's runs then, ``cluster.reaper``). A body stuck here (in a
        write that cannot reach its database) must not hold its job's lock past that, or the
        next run of its job waits for the stuck body for as long as the partition lasts. The
        runs given up stay active (the body runs on; its outcome is queued when it returns) and
        are named in the presence in place of its bodies until that outcome is written
        (``Ledger.released``); a successor that takes the lock waits until the run has ended,
        lost by the leader or recorded by this node (``cluster.executor.facts.blockers``).
        Past that threshold a cut-off node keeps no lock at all; before it, and while only its
        presence is uncertain, the locks of runs not started are kept until they are handed
        back (the self-fence stops them at their instant)."""
        if not self.membership.confirmed():
            return self.books.rightful_locks() - self.books.give_up_body_locks()
        if not self.database_able():
            if self.database_cut_for() >= self.membership.ttl_s:
                self.books.give_up_body_locks()
                return set()
            return self.books.held_locks()
        return self.books.rightful_locks()

    # --- the loops' passes ----------------------------------------------------------------------------
    def claim_once(self) -> int:
        """Claim what fits; returns the number claimed (the node's claim loop)."""
        return self.claimer.claim_once()

    def run_starter(self, stop: threading.Event) -> None:
        """The starter loop; also starts the finisher, the supervisor and the lock keeper threads."""
        threads = [
            ("finisher", self.finisher.run),
            ("supervisor", self.supervisor.run),
            ("locks", self.keeper.run),
        ]
        for name, target in threads:
            threading.Thread(
                target=target, args=(stop,), name=f"{self.node_id}:{name}", daemon=True
            ).start()
        self.starter.run(stop)

    def starter_step(self) -> float:
        return self.starter.step()

    def wake_starter(self) -> None:
        """Make the starter look now (new work; or its stop event was set and it should end)."""
        self.starter.wake()

    def supervise_once(self) -> int:
        return self.supervisor.supervise_once()

    def apply_cancel_requests(self) -> int:
        return self.supervisor.apply_cancel_requests()

    def extend_locks(self) -> None:
        """One pass of the lock keeper (a stepped executor: the keeper has no thread)."""
        self.keeper.step()

    def reconcile(self, *, now: datetime | None = None) -> tuple[int, int]:
        """The self-audit (``audit.reconcile``). Returns (handed back, ended lost)."""
        return reconcile(node_id=self.node_id, books=self.books, now=now or self.now())

    # --- what the parts and the runners call -------------------------------------------------------
    def room(self) -> None:
        self.claimer.room()

    def release_lock(self, watchdog: LockWatchdog) -> None:
        self.keeper.release(watchdog)

    def may_start(self, run: ActiveRun) -> bool:
        return self.fence.may_start(run)

    def body_room(self) -> bool:
        return self.books.body_room()

    def complete(self, outcome: Outcome, *, body_ended: bool = False) -> bool:
        return self.outcomes.complete(outcome, body_ended=body_ended)

    def locks_unavailable(self) -> None:
        """A job lock could not be asked (too few lock masters answered): claim nothing for
        LOCKS_UNAVAILABLE_HOLD_S, so the runs this node hands back go to nodes that can lock
        them rather than back to it (a chaos run saw a worker with a slowed path to Redis sit on
        claims it could not start, one second at a time, for 8 s)."""
        until = self.clock.monotonic() + LOCKS_UNAVAILABLE_HOLD_S
        if until > self.locks_unavailable_until:
            self.locks_unavailable_until = until

    def still_owner(self, run: ActiveRun) -> bool:
        """The run's claim still holds: its outcome not yet settled, not cancelled, this node's
        membership unbroken since the claim (a lapse means the cluster may have declared the
        run lost and run it again), its job lock (if any) not lost."""
        return (
            not run.completed
            and not run.cancel_event.is_set()
            and self.membership.confirmed(run.epoch)
            and (run.lock is None or not run.lock.lost.is_set())
        )

    # --- drain and shutdown -------------------------------------------------------------------------
    def on_membership_lapse(self) -> int:
        """This node's presence had expired: the cluster may have taken what it claimed. Hand the
        unstarted claims back (conditionally); runs being prepared fail the epoch check at start."""
        return self.release_unstarted()

    def release_unstarted(self) -> int:
        """Hand every claimed-but-unstarted execution back (drain, shutdown)."""
        count = 0
        for execution in self.books.take_unstarted():
            if executions.hand_back(execution):
                count += 1
            self.books.forget(execution.pk)
        return count

    def idle(self) -> bool:
        """Nothing running, nothing being prepared, every outcome written."""
        return self.books.idle()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing runs and every outcome is written (on the node's clock)."""
        deadline = self.clock.monotonic() + timeout_s
        while self.clock.monotonic() < deadline:
            if self.idle():
                return True
            self.clock.sleep(IDLE_POLL_S)
        return self.idle()

    def hand_back_running(self) -> int:
        """After the drain grace period: stop what still runs and record it as lost (retried)."""
        count = 0
        for run in self.books.take_all_running():
            run.cancel_event.set()
            if run.process is not None and run.process.is_alive():
                run.process.kill()
            with transaction.atomic():
                if executions.declare_lost(
                    run.execution,
                    reason=REASON_SHUT_DOWN.format(node=self.node_id),
                    now=self.now(),
                ):
                    count += 1
            lock = self.books.take_lock(run)
            if lock is not None:
                self.release_lock(lock)
        return count
