"""The supervisor's rule: which running runs are over though their bodies have not said so (a
timeout passed, a cancel request's grace ran out, the job lock was lost)."""

from __future__ import annotations

from cluster.executor.runs import REASON_LOCK_LOST, REASON_TIMEOUT, ActiveRun, Outcome
from jobs.states import ExecutionStatus

S = ExecutionStatus


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
    if (lock := run.lock) is not None and lock.lost.is_set():
        # Read once: the body's own completion may take the lock meanwhile.
        run.cancel_event.set()
        return Outcome(
            run, S.FAILED, error=REASON_LOCK_LOST, output=output, reason=REASON_LOCK_LOST
        )
    return None
