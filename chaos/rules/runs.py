"""Rules on the runs themselves: no slot executed twice (two bodies, two successes), every slot of
the window run or recorded with a reason, nothing left running or claimed once the cluster stopped
and no run running past its timeout plus the dead threshold."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable

from chaos.record import (
    CANCELLED,
    EXECUTED,
    LOST,
    PENDING,
    RETRYABLE,
    RUNNING,
    SCHEDULE_TRIGGER,
    SKIPPED,
    SUCCEEDED,
    CheckConfig,
    Execution,
    History,
    Index,
    JobInfo,
    PauseWindow,
    Violation,
    effect_evidence,
    row_evidence,
    slot_key,
    when,
)
from chaos.rules.leadership import blocking_windows, overlap_s
from chaos.rules.schedule import (
    edited_jobs,
    job_slots,
    slot_step,
)

# --- the kinds of violation --------------------------------------------------------------------------
DUPLICATE_EXECUTION = "duplicate_execution"  # a slot executed twice (rows or side effects)
MISSING_SLOT = "missing_slot"  # a slot neither executed nor recorded with a reason
STUCK_RUNNING = "stuck_running"  # a run left running (or claimed) past timeout + dead threshold

# Messages (tests assert on them).
MSG_TWO_STARTS_ONE_EXECUTION = "execution {execution_id}: its body started {count} times"
MSG_TWO_STARTS_ONE_SLOT = (
    "job {job_id} slot {slot}: attempt {later} started although attempt {earlier} ended "
    "{status} (only a failed, timed-out or lost attempt may be retried)"
)
MSG_TWO_SUCCEEDED = "job {job_id} slot {slot}: {count} succeeded rows"
MSG_NO_ROW = "job {job_id} slot {slot}: no execution row (neither run nor recorded with a reason)"
MSG_NO_REASON = "job {job_id} slot {slot}: recorded {status} without a reason"
MSG_NOT_RUN = (
    "job {job_id} slot {slot}: never run (left {status} {late_s:.1f} s after its slot, when the "
    "cluster stopped)"
)
MSG_LEFT_RUNNING = "execution {execution_id}: left {status} after the cluster stopped"
MSG_LEFT_CLAIMED = "execution {execution_id}: left pending and claimed by {node} after the stop"
MSG_OVERRAN = (
    "execution {execution_id}: running {duration_s:.1f} s, past its timeout ({timeout_s} s) plus "
    "the dead threshold"
)


def duplicates(history: History, index: Index) -> list[Violation]:
    """(a) A slot executed twice: one execution's body started twice; two bodies of one slot unless
    the earlier attempt ended failed/timed out/lost and the later is its retry; two successes."""
    found = []
    for execution_id, starts in index.starts.items():
        if len(starts) > 1:
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_STARTS_ONE_EXECUTION.format(
                        execution_id=execution_id, count=len(starts)
                    ),
                    {"starts": [effect_evidence(s) for s in starts]},
                )
            )
    started_by_slot: dict[tuple[int, int], list[Execution]] = defaultdict(list)
    for execution_id in index.starts:
        row = index.rows.get(execution_id)
        if row is not None:
            started_by_slot[(row.job_id, slot_key(row.scheduled_for))].append(row)
    for (job_id, _), rows in started_by_slot.items():
        rows.sort(key=lambda e: (e.attempt, e.id))
        for earlier, later in itertools.pairwise(rows):
            if earlier.status in RETRYABLE and later.attempt > earlier.attempt:
                continue
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_STARTS_ONE_SLOT.format(
                        job_id=job_id,
                        slot=when(earlier.scheduled_for),
                        earlier=earlier.attempt,
                        later=later.attempt,
                        status=earlier.status,
                    ),
                    {
                        "earlier": row_evidence(earlier),
                        "earlier_starts": [effect_evidence(s) for s in index.starts[earlier.id]],
                        "later": row_evidence(later),
                        "later_starts": [effect_evidence(s) for s in index.starts[later.id]],
                    },
                )
            )
    for (job_id, _), rows in index.by_slot.items():
        succeeded = [e for e in rows if e.status == SUCCEEDED]
        if len(succeeded) > 1:
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_SUCCEEDED.format(
                        job_id=job_id, slot=when(succeeded[0].scheduled_for), count=len(succeeded)
                    ),
                    {"rows": [row_evidence(e) for e in succeeded]},
                )
            )
    return found


def interval_slots(job: JobInfo, start: float, end: float) -> Iterable[float]:
    """The nominal slots of a job in [start, end] (interval jobs, and the cron patterns the
    checker follows on its own: rules.schedule.job_slots)."""
    return job_slots(job, start, end)


def _pause_spans(
    history: History, windows: list[PauseWindow], step: float
) -> list[tuple[float, float]]:
    """The slots a pause excuses: from the first slot the leader had not yet written when the job
    was paused (a pause drops every fire not yet created, which is behind the pause instant when
    the leader lags) to the resume plus one interval (a resumed job fires from its next slot)."""
    spans = []
    for window in windows:
        written = [
            e.scheduled_for
            for e in history.executions
            if e.job_id == window.job_id
            and e.trigger == SCHEDULE_TRIGGER
            and e.attempt == 1
            and e.created_at <= window.start
        ]
        first = min(window.start, max(written) + step) if written else window.start
        end = math.inf if window.end is None else window.end + step
        spans.append((first, end))
    return spans


def slots(history: History, index: Index, config: CheckConfig) -> tuple[int, int, list[Violation]]:
    """(b) Every slot of an interval job inside the window has a row that ran or that says why not.

    Returns (slots checked, indeterminate slots, violations)."""
    pauses: dict[int, list[PauseWindow]] = defaultdict(list)
    for window in history.paused:
        pauses[window.job_id].append(window)
    checked = indeterminate = 0
    found = []
    edited = edited_jobs(history)  # followed edit by edit (rules.schedule.edits_followed)
    for job in history.jobs:
        if job.id in edited:
            continue
        step = slot_step(job)
        # A job's slots count from its first whole interval after it was defined.
        start = max(history.window_start, job.created_at + step)
        paused = _pause_spans(history, pauses[job.id], step)
        for slot in interval_slots(job, start, history.window_end):
            if any(a - 1e-6 <= slot <= b for a, b in paused):
                continue
            checked += 1
            rows = index.by_slot.get((job.id, slot_key(slot)), [])
            if not rows:
                found.append(
                    Violation(
                        MISSING_SLOT,
                        MSG_NO_ROW.format(job_id=job.id, slot=when(slot)),
                        {"job": job.name, "slot": slot},
                    )
                )
                continue
            if any(e.status in EXECUTED for e in rows):
                continue
            if any(e.status == RUNNING or (e.status == PENDING and e.claim_token) for e in rows):
                continue  # left in flight: reported as stuck
            accounted = [e for e in rows if e.status in (SKIPPED, LOST, CANCELLED)]
            if accounted:
                unexplained = [e for e in accounted if not e.reason.strip()]
                if unexplained:
                    found.append(
                        Violation(
                            MISSING_SLOT,
                            MSG_NO_REASON.format(
                                job_id=job.id, slot=when(slot), status=unexplained[0].status
                            ),
                            {"job": job.name, "rows": [row_evidence(e) for e in rows]},
                        )
                    )
                elif rows[-1].status == LOST:
                    indeterminate += 1
                continue
            # Recorded and waiting (pending, a retry's backoff): deferred, not lost, unless it had
            # waited far longer than a healthy cluster ever lets a due run wait.
            late = (history.stop_at or history.window_end) - slot
            if late <= config.pending_bound_s:
                continue
            found.append(
                Violation(
                    MISSING_SLOT,
                    MSG_NOT_RUN.format(
                        job_id=job.id, slot=when(slot), status=rows[-1].status, late_s=late
                    ),
                    {"job": job.name, "rows": [row_evidence(e) for e in rows]},
                )
            )
    return checked, indeterminate, found


def stuck(history: History, config: CheckConfig) -> list[Violation]:
    """(e) Nothing running or claimed once the cluster stopped gracefully, and no run in the
    running state longer than its timeout plus the dead threshold."""
    found = []
    blocked = blocking_windows(history, config)
    for row in history.executions:
        if row.status == RUNNING:
            found.append(
                Violation(
                    STUCK_RUNNING,
                    MSG_LEFT_RUNNING.format(execution_id=row.id, status=row.status),
                    {"row": row_evidence(row), "started_at": row.started_at},
                )
            )
        elif row.status == PENDING and row.claim_token:
            found.append(
                Violation(
                    STUCK_RUNNING,
                    MSG_LEFT_CLAIMED.format(execution_id=row.id, node=row.node or "?"),
                    {"row": row_evidence(row), "claimed_at": row.claimed_at},
                )
            )
        elif (
            row.timeout_seconds
            and row.started_at is not None
            and row.finished_at is not None
            and row.status != SKIPPED
        ):
            duration = row.finished_at - row.started_at
            bound = row.timeout_seconds + config.dead_after_s + config.running_slack_s
            # An outage of the database delays the write of the outcome, not the run.
            if duration > bound and not overlap_s(row.started_at, row.finished_at, blocked):
                found.append(
                    Violation(
                        STUCK_RUNNING,
                        MSG_OVERRAN.format(
                            execution_id=row.id,
                            duration_s=duration,
                            timeout_s=row.timeout_seconds,
                        ),
                        {"row": row_evidence(row), "started_at": row.started_at},
                    )
                )
    return found
