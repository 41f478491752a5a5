"""The supervisor: which running runs are over though their bodies have not said so (a timeout
passed, a cancel request's grace ran out, the job lock was lost), and an operator's cancel requests
passed on to the runs they name."""

from __future__ import annotations

import threading

from cluster.executor.host import Host
from cluster.executor.ledger import Ledger
from cluster.executor.runs import (
    REASON_CANCELLED,
    REASON_LOCK_LOST,
    REASON_TIMEOUT,
    ActiveRun,
    Outcome,
)
from jobs.models import Isolation, JobExecution
from jobs.states import ExecutionStatus

S = ExecutionStatus

SUPERVISE_INTERVAL_S = 0.05
# A thread body asked to cancel has this long to return with what it has done (seconds).
CANCEL_GRACE_S = 2.0


def verdict(run: ActiveRun, now: float) -> Outcome | None:
    """The outcome to record for ``run`` at monotonic time ``now``, or None while it may go on.

    A run judged over is told to stop (its cancel event is set): a thread body that checks it
    returns, a process body is killed when the outcome is queued."""
    output = run.context.output if run.context else ""
    if run.deadline is not None and now > run.deadline:
        run.cancel_event.set()
        reason = REASON_TIMEOUT.format(seconds=run.execution.job.timeout_seconds)
        return Outcome(run, S.TIMED_OUT, error=reason, output=output, reason=reason)
    if (
        run.cancel_event.is_set()
        and run.outcome_reason
        and (run.cancel_deadline is None or now > run.cancel_deadline)
    ):
        # The task did not return within its grace: the run is over all the same.
        return Outcome(run, S.CANCELLED, output=output, reason=run.outcome_reason)
    if (lock := run.lock) is not None and lock.lost.is_set() and not run.released:
        # (A released run's lock was given up on purpose: its body runs on, unrecorded, and the
        # leader ends it lost if its node stays unable; ending it here would let the node write
        # an outcome for a body still running once the database answers.)
        # Read once: the body's own completion may take the lock meanwhile.
        run.cancel_event.set()
        return Outcome(
            run, S.FAILED, error=REASON_LOCK_LOST, output=output, reason=REASON_LOCK_LOST
        )
    return None


class Supervisor:
    """Ends running runs that are over though their bodies have not said so, and passes an
    operator's cancel requests on to them."""

    def __init__(self, host: Host, books: Ledger) -> None:
        self.host = host
        self.books = books

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SUPERVISE_INTERVAL_S):
            self.supervise_once()

    def supervise_once(self) -> int:
        """One pass over the running runs; returns how many were judged over."""
        now = self.host.clock.monotonic()
        ended = 0
        for run in self.books.running_runs():
            outcome = verdict(run, now)
            if outcome is not None:
                ended += self.host.complete(outcome)
        return ended

    def apply_cancel_requests(self) -> int:
        """Signal the runs an operator asked to cancel (one query over this node's running runs)."""
        ids = self.books.running_ids()
        if not ids:
            return 0
        wanted = list(
            JobExecution.objects.filter(
                pk__in=ids, status=S.RUNNING, cancel_requested=True
            ).values_list("pk", "reason")
        )
        for pk, reason in wanted:
            run = self.books.active_run(pk)
            if run is not None and not run.cancel_event.is_set():
                run.outcome_reason = reason or REASON_CANCELLED
                run.cancel_event.set()
                if run.execution.job.isolation == Isolation.PROCESS:
                    # Recorded as cancelled first, then the child is killed (in complete), so its
                    # death is not mistaken for a failure.
                    self.host.complete(Outcome(run, S.CANCELLED, reason=run.outcome_reason))
                else:
                    # A task in a thread sees the event and returns with what it has done; the
                    # supervisor records the cancel without it after CANCEL_GRACE_S.
                    run.cancel_deadline = self.host.clock.monotonic() + CANCEL_GRACE_S
        return len(wanted)
