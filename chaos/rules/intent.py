"""Rules on what the operator asked for, judged against what the cluster did:

- ``fired_while_paused``: a scheduled fire written while its job was paused (after the pause's
  commit, before the resume's, each with one tick's length of tolerance);
- ``fired_after_delete``: a body of a deleted job that started after the deletion committed;
- ``request_not_run``: a run the operator triggered or enqueued through the API with no row, or
  whose row neither ran nor says why not by the end of the run.

The operator's actions are dated by the operator's own clock (the machine's): each committed
between the request being sent and its answer.
"""

from __future__ import annotations

from chaos.record import (
    CANCELLED,
    EXECUTED,
    LOST,
    RUNNING,
    SCHEDULE_TRIGGER,
    SKIPPED,
    CheckConfig,
    History,
    Index,
    Violation,
    effect_evidence,
    row_evidence,
    slot_key,
    when,
)
from chaos.rules.attempts import clock_off

FIRED_WHILE_PAUSED = "fired_while_paused"
FIRED_AFTER_DELETE = "fired_after_delete"
REQUEST_NOT_RUN = "request_not_run"
KINDS = (FIRED_WHILE_PAUSED, FIRED_AFTER_DELETE, REQUEST_NOT_RUN)

MSG_PAUSED = "job {job_id}: fire of slot {slot} written at {at}, while the job was paused"
MSG_DELETED = "job {job_id}: a body started at {at}, {late_s:.2f} s after the job was deleted"
MSG_NO_ROW = "{action} of job {job_id} answered execution {execution_id}, which has no row"
MSG_NOT_RUN = "{action} of job {job_id}: execution {execution_id} left {status} with no reason"


def fired_while_paused(history: History, config: CheckConfig) -> list[Violation]:
    found = []
    for window in history.paused:
        # The pause committed by its audit row's instant; the leader may be inside a tick that
        # read the job just before it (one tick's length of tolerance). A fire is dated by its
        # tick's instant, taken before the tick waits for its locks: a tick that began just before
        # the resume's audit row and read the job once the resume had committed fires rightly
        # (the same tolerance at the end).
        since = window.start + config.skip_tolerance_s
        until = window.end - config.skip_tolerance_s if window.end is not None else float("inf")
        for row in history.executions:
            if (
                row.job_id != window.job_id
                or row.trigger != SCHEDULE_TRIGGER
                or row.attempt != 1
                or row.status == SKIPPED
                or not since < row.created_at < until
            ):
                continue
            writers = [
                t.node_id
                for t in history.terms
                if t.term == row.term and t.partition == row.partition
            ]
            if any(
                clock_off(history, w, row.created_at - 10, row.created_at + 10) for w in writers
            ):
                continue  # dated by a stepped clock
            found.append(
                Violation(
                    FIRED_WHILE_PAUSED,
                    MSG_PAUSED.format(
                        job_id=row.job_id, slot=when(row.scheduled_for), at=when(row.created_at)
                    ),
                    {"row": row_evidence(row), "paused": [window.start, window.end]},
                )
            )
    return found


def fired_after_delete(history: History, config: CheckConfig) -> list[Violation]:
    found = []
    for deletion in history.deleted:
        for effect in history.side_effects:
            late = effect.at - deletion.answered
            if (
                effect.event == "start"
                and effect.job_id == deletion.job_id
                and (late > config.skip_tolerance_s)
            ):
                found.append(
                    Violation(
                        FIRED_AFTER_DELETE,
                        MSG_DELETED.format(job_id=deletion.job_id, at=when(effect.at), late_s=late),
                        {"start": effect_evidence(effect), "deleted": deletion.answered},
                    )
                )
    return found


def requests_not_run(history: History, index: Index, config: CheckConfig) -> list[Violation]:
    deleted = {d.job_id: d.sent for d in history.deleted}
    end = history.stop_at or history.window_end
    found = []
    for request in history.requested:
        if request.job_id in deleted:
            continue  # its rows went with the job
        row = index.rows.get(request.execution_id)
        if row is None:
            found.append(
                Violation(
                    REQUEST_NOT_RUN,
                    MSG_NO_ROW.format(
                        action=request.action,
                        job_id=request.job_id,
                        execution_id=request.execution_id,
                    ),
                    {"request": request.__dict__},
                )
            )
            continue
        # Every attempt of the run: the request is kept if the last one ran or says why not.
        attempts = index.by_slot.get((row.job_id, slot_key(row.scheduled_for)), [row])
        last = attempts[-1]
        if last.status in EXECUTED or last.status == RUNNING:
            continue
        if last.status in (SKIPPED, LOST, CANCELLED) and last.reason.strip():
            continue
        if end - request.due <= config.pending_bound_s:
            continue  # still deferred when the cluster stopped
        found.append(
            Violation(
                REQUEST_NOT_RUN,
                MSG_NOT_RUN.format(
                    action=request.action,
                    job_id=request.job_id,
                    execution_id=request.execution_id,
                    status=last.status,
                ),
                {"request": request.__dict__, "rows": [row_evidence(e) for e in attempts]},
            )
        )
    return found
