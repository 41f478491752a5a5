"""Admission of a batch of claimed runs: gather the facts for the whole batch, ask the pure rule
(``cluster.admission``) about each run, mark the ones to start running (one statement per
batch) and launch them; skip, hand back or keep waiting the others."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, transaction

from cluster import admission
from cluster.admission import Decision, HandBack, Lock, Skip, Start, Wait
from cluster.coordination import LockWatchdog
from cluster.executor import facts as gather
from cluster.executor.host import Host
from cluster.executor.ledger import Ledger
from cluster.executor.runs import ActiveRun, Scheduled
from jobs import executions, flow
from jobs.models import ConcurrencyPolicy, JobExecution

logger = logging.getLogger(__name__)

# A run whose admission batch failed (the database went away) is looked at again after this, up to
# ADMISSION_ATTEMPTS times; then it is left to ``reconcile``. Keeping it tracked means no other run of
# its job waits RECONCILE_AFTER_S behind a claim nobody would act on.
ADMISSION_RETRY_S = 0.5
ADMISSION_ATTEMPTS = 20


class Admitter:
    def __init__(self, host: Host, books: Ledger) -> None:
        self.host = host
        self.books = books

    def admit(self, batch: list[Scheduled]) -> None:
        """``admit_batch``; if it fails (the database or the lock service went away in the
        middle), the runs it had not settled go back to the waiting room and are admitted again
        ADMISSION_RETRY_S later, so they start as soon as the database answers. A run that keeps
        failing (ADMISSION_ATTEMPTS) stops counting against capacity: a failed batch must never
        leak capacity until the node claims nothing at all. Its row, still claimed by this node,
        is given back by the self-audit."""
        settled: set[int] = set()
        held: dict[int, LockWatchdog] = {}
        taken: list[LockWatchdog] = []
        try:
            self.admit_batch(batch, settled, held, taken)
        except Exception:
            unsettled = [item for item in batch if item.execution.pk not in settled]
            # A job lock kept alive by its watchdog for a run that will not start would block
            # every later run of the job for as long as this node lives.
            for item in unsettled:
                if item.execution.pk in held:
                    self.host.release_lock(held[item.execution.pk])
            for watchdog in taken:  # taken, then the batch failed before it knew whose it was
                if not watchdog.stopped and watchdog not in held.values():
                    self.host.release_lock(watchdog)
            retried = 0
            for item in unsettled:
                item.failures += 1
                if item.failures < ADMISSION_ATTEMPTS and self.host.claiming:
                    self.wait(item, self.host.clock.now() + ADMISSION_RETRY_S)
                    retried += 1
                else:
                    self.forget(item.execution.pk)
            logger.exception(
                "admission of %d runs failed; %d to try again, %d left to reconcile",
                len(batch),
                retried,
                len(unsettled) - retried,
                extra={"node": self.host.node_id},
            )
        finally:
            # Every lock this admission took was released or went to its run by now.
            self.books.locks_settled(taken)

    def admit_batch(
        self,
        batch: list[Scheduled],
        settled: set[int],
        held: dict[int, LockWatchdog],
        taken: list[LockWatchdog],
    ) -> None:
        """The facts are gathered for the whole batch (the later due fires of late runs' jobs, a
        job lock attempt per forbid run, one query for blocking runs, one read of live nodes, one
        query for older fires), each run is admitted, the ones to start are marked running in one
        statement, and the ones told to wait go back to the waiting room, not to a
        thread of their own: a node that is behind pays less per run, not more."""
        host = self.host
        now = host.clock.now()
        newer = gather.newer_due(batch, now=host.now())
        candidates: list[Scheduled] = []
        for item in batch:
            newer_due, newer_catch_up_due = newer.get(item.execution.pk, (0, 0))
            facts = gather.facts(
                item.execution,
                due=item.due,
                now=now,
                claiming=host.claiming,
                newer_due=newer_due,
                newer_catch_up_due=newer_catch_up_due,
            )
            if admission.decided_without_the_job(facts) or not host.claiming:
                self.apply(item.execution, admission.admit(facts))
                settled.add(item.execution.pk)
                continue
            candidates.append(item)
        guarded = [
            item
            for item in candidates
            if item.execution.job.concurrency_policy
            in (ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE)
        ]
        forbid = [
            item
            for item in guarded
            if item.execution.job.concurrency_policy == ConcurrencyPolicy.FORBID
        ]
        blockers = gather.blockers(
            guarded,
            backend=host.backend,
            ttl_s=host.membership.ttl_s,
            heartbeat_s=host.heartbeat_s,
            now=host.now(),
        )
        older = gather.older_waiting(forbid, now=host.now())
        # The job lock is tried only by a run that could start: runs behind an older fire would
        # only take it from the run they wait for (a lock taken and dropped ten times a second by
        # every waiting run starves the one that could go). A run behind a recorded blocker does
        # try: the lock says whether that blocker's body has really not ended.
        lockers = [item.execution for item in forbid if item.execution.pk not in older]
        locks: dict[int, tuple[Lock, LockWatchdog | None]] = dict.fromkeys(
            older, (Lock.NOT_TRIED, None)
        )
        locks.update(
            zip(
                (execution.pk for execution in lockers),
                gather.try_job_locks(
                    host.backend,
                    lockers,
                    host.job_lock_ttl_ms,
                    host.keeper,
                    on_taken=lambda watchdog: self._taken(watchdog, taken),
                ),
                strict=True,
            )
        )
        held.update((pk, lock) for pk, (_, lock) in locks.items() if lock is not None)
        if any(state == Lock.UNAVAILABLE for state, _ in locks.values()):
            # This node cannot reach the job locks' quorum (its path to them is cut or slow):
            # the runs go back, and it claims none for a while, so nodes that can take them.
            host.locks_unavailable()
        starts: list[tuple[Scheduled, LockWatchdog | None]] = []
        now = host.clock.now()
        for item in candidates:
            execution = item.execution
            state, lock = locks.get(execution.pk, (Lock.NOT_NEEDED, None))
            blocker = blockers.get(execution.job_id)
            newer_due, newer_catch_up_due = newer.get(execution.pk, (0, 0))
            decision = admission.admit(
                gather.facts(
                    execution,
                    due=item.due,
                    now=now,
                    claiming=host.claiming,
                    lock=state,
                    blocker=blocker,
                    older_waiting=execution.pk in older,
                    older_unclaimed=older.get(execution.pk, False),
                    seen_blocker=item.seen_blocker,
                    newer_due=newer_due,
                    newer_catch_up_due=newer_catch_up_due,
                )
            )
            item.seen_blocker = blocker.execution_id if blocker is not None else None
            if isinstance(decision, Start):
                starts.append((item, lock))
                continue
            if lock is not None:
                host.release_lock(lock)
            if isinstance(decision, Wait):
                self.wait(item, now + decision.seconds)
            else:
                self.apply(execution, decision)
            settled.add(execution.pk)
        if starts:
            self.start(starts, settled)

    def _taken(self, watchdog: LockWatchdog, taken: list[LockWatchdog]) -> None:
        """A job lock taken for this batch: owned (the keeper keeps it) until the batch is over."""
        self.books.locks_taken(watchdog)
        taken.append(watchdog)

    def wait(self, item: Scheduled, until: float) -> None:
        """Into the waiting room: the starter looks at it again at ``until`` (wall clock)."""
        self.books.wait(item, until)
        self.host.wake_starter()

    def forget(self, execution_id: int) -> None:
        self.books.forget(execution_id)
        self.host.room()

    def apply(self, execution: JobExecution, decision: Decision) -> None:
        """Carry out a decision other than Start for a claimed, unstarted run."""
        host = self.host
        if isinstance(decision, Skip):
            executions.skip(execution, reason=decision.reason, now=host.now())
        elif isinstance(decision, HandBack):
            run_after = (
                None
                if decision.after_s is None
                else host.now() + timedelta(seconds=decision.after_s)
            )
            executions.hand_back(execution, run_after=run_after)
        self.forget(execution.pk)

    def start(
        self,
        starts: list[tuple[Scheduled, LockWatchdog | None]],
        settled: set[int] | None = None,
    ) -> None:
        """Mark the admitted runs running (one statement) and launch them. A run is put in
        ``settled`` as soon as its fate is written: once a commit has marked it running, a
        failure after it (the database going away) must not send it back to admission, which
        would leave it tracked as running with no body."""
        host = self.host
        settled = settled if settled is not None else set()
        if not host.claiming:
            # Draining: nothing new starts; the batch goes back to the queue for another node.
            for item, lock in starts:
                if lock is not None:
                    host.release_lock(lock)
                executions.hand_back(item.execution)
                self.forget(item.execution.pk)
                settled.add(item.execution.pk)
            return
        # After a database outage the node's row is written first: the leader may be taking the
        # runs this node claimed before it, and it takes none once the row says the node answers.
        # A write that fails sends the batch back to admission like any other failure.
        outages = host.row.settle()
        config = flow.queues()
        gated: list[tuple[Scheduled, LockWatchdog | None]] = []
        free: list[tuple[Scheduled, LockWatchdog | None]] = []
        for start in starts:
            (gated if flow.limited(start[0].execution, config) else free).append(start)
        if gated:
            # Runs of limited jobs and queues first, in a transaction of their own: a limit's
            # lock must not hold up the runs that have none, nor their failure these.
            won, held = self._start_gated(gated)
            self._launch(gated, won, held, settled, outages)
        if free:
            # Marked running just before the due instant, in one statement whatever their
            # instants (runs already due start now): one commit per batch, not one per run or
            # per instant (runs of jobs spread over their interval are due microseconds apart,
            # and a commit costs milliseconds). A row cancelled or taken meanwhile does not match
            # and does not start.
            now = host.clock.now()
            won = executions.start_batch(
                [item.execution for item, _ in free],
                planned={
                    item.execution.pk: datetime.fromtimestamp(max(item.due, now), tz=UTC)
                    for item, _ in free
                },
            )
            self._launch(free, won, {}, settled, outages)

    def _launch(
        self,
        starts: list[tuple[Scheduled, LockWatchdog | None]],
        won: set[int],
        held: dict[int, flow.Held],
        settled: set[int],
        outages: int,
    ) -> None:
        """After the commit that marked ``won`` running: track and launch those, hand back the
        ones a flow limit held, forget the ones cancelled or taken meanwhile."""
        host, books = self.host, self.books
        runs: list[ActiveRun] = []
        for item, lock in starts:
            execution = item.execution
            if execution.pk in won:
                run = ActiveRun(
                    execution=execution,
                    due=item.due,
                    lock=lock,
                    epoch=item.epoch,
                    outages=outages,
                )
                with books.lock:
                    books.track_active_locked(run)
                runs.append(run)
                settled.add(execution.pk)
        if runs:
            host.runner.launch(host, runs)
        for item, lock in starts:
            execution = item.execution
            if execution.pk in won:
                continue
            if lock is not None:
                host.release_lock(lock)
            hold = held.get(execution.pk)
            if hold is None:
                logger.info("execution %s was cancelled or taken before it started", execution.pk)
            else:
                # A flow limit holds it back: it waits in the queue (not here: a claim held
                # while waiting counts against this node's capacity), saying why. If the
                # database does not take the hand-back, the self-audit gives the row back.
                try:
                    executions.hand_back(execution, run_after=hold.run_after, reason=hold.reason)
                except DatabaseError:
                    logger.warning(
                        "execution %s held back (%s) could not be handed back now; the self-audit "
                        "will",
                        execution.pk,
                        hold.reason,
                        extra={"execution": execution.pk},
                    )
            self.forget(execution.pk)
            settled.add(execution.pk)

    def _start_gated(
        self, gated: list[tuple[Scheduled, LockWatchdog | None]]
    ) -> tuple[set[int], dict[int, flow.Held]]:
        """The runs of limited jobs and queues through the flow gate, and those it lets through
        marked running, in one transaction (the limits' rows stay locked until it commits). Their
        instants are read once the limits' rows are locked: a wait for the lock must not date a
        release (a rate limit's permit) earlier than it happened."""
        clock = self.host.clock
        due = {item.execution.pk: item.due for item, _ in gated}
        with transaction.atomic():
            decided = flow.gate([item.execution for item, _ in gated], due=due, clock=clock.now)
            won = executions.start_batch(decided.allowed, planned=decided.planned)
            flow.record(decided, won)
        return won, decided.held
