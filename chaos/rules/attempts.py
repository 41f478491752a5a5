"""Rules on each run's attempts and the excuses the checker gives them, judged on the side-effect log
(the one clock of the machine) against the rows:

- ``unexcused_lost``: a run declared lost with no fault on its node (killed, frozen, stopped, cut
  off, slowed, or an outage of everything) that began before the declaration and ended at most
  ``lost_bound_s`` before it;
- ``phantom_outcome``: a run recorded succeeded or timed out with no body start on the row's node;
- ``too_many_attempts``: a slot attempted more than ``max_retries + 1`` times;
- ``early_retry``: a retry whose body started before its previous attempt's end plus the shortest
  backoff the job allows;
- ``early_start``: a scheduled body started before its slot (or its ``run_after``).

A node whose wall clock the nemesis stepped writes its rows' instants on that clock: rules that
compare a row's instant with the log are not applied to rows written while that node's clock was
off (the log itself stays on the machine's clock).
"""

from __future__ import annotations

from chaos import faults
from chaos.record import (
    LOST,
    RETRYABLE,
    SCHEDULE_TRIGGER,
    SUCCEEDED,
    TIMED_OUT,
    CheckConfig,
    Fault,
    History,
    Index,
    Violation,
    effect_evidence,
    row_evidence,
    when,
)

UNEXCUSED_LOST = "unexcused_lost"
PHANTOM_OUTCOME = "phantom_outcome"
TOO_MANY_ATTEMPTS = "too_many_attempts"
EARLY_RETRY = "early_retry"
EARLY_START = "early_start"
KINDS = (UNEXCUSED_LOST, PHANTOM_OUTCOME, TOO_MANY_ATTEMPTS, EARLY_RETRY, EARLY_START)

MSG_UNEXCUSED_LOST = (
    "execution {execution_id}: declared lost at {at} on node {node}, with no fault on that node "
    "within {bound_s:.0f} s before"
)
MSG_PHANTOM = "execution {execution_id}: recorded {status} on {node} but no body started there"
MSG_TOO_MANY = (
    "job {job_id} slot {slot}: {count} attempts, max_retries {max_retries} allows {allowed}"
)
MSG_EARLY_RETRY = (
    "execution {execution_id} (attempt {attempt}): body started {early_s:.2f} s before its backoff "
    "of at least {backoff_s:.2f} s after attempt {previous} ended"
)
MSG_EARLY_START = (
    "execution {execution_id}: body started {early_s:.2f} s before it was due at {due}"
)


def _hits(fault: Fault, node: str) -> bool:
    """Whether ``fault`` could take a run on ``node`` away."""
    if fault.kind not in faults.LOSS_FAULTS and fault.kind != faults.CLOCK_JUMP:
        return False
    return fault.kind in faults.OUTAGE_FAULTS or fault.target in (node, "") or not node


def clock_off(history: History, node: str, start: float, end: float) -> bool:
    """Whether ``node``'s wall clock was stepped at some point of [start, end]."""
    return any(
        f.kind == faults.CLOCK_JUMP and f.target == node and f.start <= end and f.end >= start
        for f in history.faults
    )


def unexcused_lost(history: History, config: CheckConfig) -> list[Violation]:
    found = []
    for row in history.executions:
        if row.status != LOST or row.finished_at is None:
            continue
        at = row.finished_at
        excuses = [
            f
            for f in history.faults
            if _hits(f, row.node)
            and f.start - config.timing_tolerance_s <= at <= f.end + config.lost_bound_s
        ]
        # A node's stepped clock dates its declaration wrongly: any fault of the run's node counts.
        if not excuses and clock_off(history, row.node, at - 10.0, at + 10.0):
            continue
        if not excuses:
            found.append(
                Violation(
                    UNEXCUSED_LOST,
                    MSG_UNEXCUSED_LOST.format(
                        execution_id=row.id,
                        at=when(at),
                        node=row.node or "(none)",
                        bound_s=config.lost_bound_s,
                    ),
                    {
                        "row": row_evidence(row),
                        "faults_on_node": [
                            (f.kind, f.start, f.end) for f in history.faults if _hits(f, row.node)
                        ],
                    },
                )
            )
    return found


def phantom_outcomes(history: History, index: Index) -> list[Violation]:
    found = []
    for row in history.executions:
        if row.status not in (SUCCEEDED, TIMED_OUT):
            continue
        starts = index.starts.get(row.id, [])
        if any(s.node == row.node for s in starts):
            continue
        found.append(
            Violation(
                PHANTOM_OUTCOME,
                MSG_PHANTOM.format(execution_id=row.id, status=row.status, node=row.node),
                {"row": row_evidence(row), "starts": [effect_evidence(s) for s in starts]},
            )
        )
    return found


def attempts(history: History, index: Index, config: CheckConfig) -> list[Violation]:
    """Too many attempts of one slot, and retries that began before their backoff allowed."""
    jobs = {job.id: job for job in history.jobs}
    found = []
    for (job_id, _), rows in index.by_slot.items():  # in attempt order
        slot = rows[0].scheduled_for
        allowed = rows[0].max_retries + 1
        if max(e.attempt for e in rows) > allowed:
            found.append(
                Violation(
                    TOO_MANY_ATTEMPTS,
                    MSG_TOO_MANY.format(
                        job_id=job_id,
                        slot=when(slot),
                        count=max(e.attempt for e in rows),
                        max_retries=rows[0].max_retries,
                        allowed=allowed,
                    ),
                    {"rows": [row_evidence(e) for e in rows]},
                )
            )
        job = jobs.get(job_id)
        previous = {e.attempt: e for e in rows}
        for row in rows:
            before = previous.get(row.attempt - 1)
            starts = index.starts.get(row.id)
            if job is None or before is None or not starts or before.status not in RETRYABLE:
                continue
            ended = before.finished_at  # the backoff runs from the end the cluster recorded
            if ended is None or clock_off(history, before.node, ended - 1.0, starts[0].at):
                continue
            backoff = job.min_backoff_s(before.attempt)
            early = ended + backoff - starts[0].at
            if early > config.timing_tolerance_s:
                found.append(
                    Violation(
                        EARLY_RETRY,
                        MSG_EARLY_RETRY.format(
                            execution_id=row.id,
                            attempt=row.attempt,
                            early_s=early,
                            backoff_s=backoff,
                            previous=before.attempt,
                        ),
                        {
                            "previous": row_evidence(before),
                            "previous_end": ended,
                            "retry": row_evidence(row),
                            "start": effect_evidence(starts[0]),
                        },
                    )
                )
    return found


def early_starts(history: History, index: Index, config: CheckConfig) -> list[Violation]:
    found = []
    for execution_id, starts in index.starts.items():
        row = index.rows.get(execution_id)
        if row is None or row.trigger != SCHEDULE_TRIGGER or row.attempt != 1:
            continue
        due = max(row.scheduled_for, row.run_after or row.scheduled_for)
        early = due - starts[0].at
        if early <= config.timing_tolerance_s:
            continue
        if row.run_after is not None and row.run_after > row.scheduled_for:
            # A spread offset is the writer's wall clock: trust it only when that clock was true.
            if clock_off(history, row.node, row.created_at - 10.0, starts[0].at):
                due = row.scheduled_for
                early = due - starts[0].at
                if early <= config.timing_tolerance_s:
                    continue
        found.append(
            Violation(
                EARLY_START,
                MSG_EARLY_START.format(execution_id=execution_id, early_s=early, due=when(due)),
                {"row": row_evidence(row), "start": effect_evidence(starts[0])},
            )
        )
    return found
