"""The execution state machine: every status, every allowed move, and the one conditional write.

    pending ──> running ──> succeeded | failed | timed_out | cancelled | lost
       │  │       └──> pending   (handed back: marked running ahead of its instant, body not started)
       │  └──> cancelled | skipped
    retry_scheduled ──> pending | cancelled
    failed | timed_out | lost  ══> retry_scheduled   (a NEW row, attempt + 1)

A retry is a new row for the same fire slot with ``attempt + 1`` that starts in ``retry_scheduled``
(with ``run_after`` = now + backoff) and becomes ``pending`` when due. The failed row keeps its outcome,
so the attempt chain stays readable and the unique (job, scheduled_for, attempt) still holds.
Rows may also be *created* directly in ``pending`` (a fire), ``retry_scheduled`` (a retry) or
``skipped`` (a slot deliberately not run, with its reason).

This module is the table and its check only; every write of a transition lives in
``jobs.executions``, a conditional UPDATE on the status it leaves and, where the writer holds one, on
its claim token: a stale writer matches no row and changes nothing.
"""

from __future__ import annotations

from django.db import models


class ExecutionStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    TIMED_OUT = "timed_out", "Timed out"
    CANCELLED = "cancelled", "Cancelled"
    LOST = "lost", "Lost"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    SKIPPED = "skipped", "Skipped"


S = ExecutionStatus

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.CANCELLED, S.SKIPPED}),
    # running -> pending: a run is marked running just before its instant (write-ahead); a node that
    # cannot confirm its claim at the instant hands it back instead of starting the body.
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.LOST, S.PENDING}),
    S.RETRY_SCHEDULED: frozenset({S.PENDING, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.CANCELLED: frozenset(),
    S.LOST: frozenset(),
    S.SKIPPED: frozenset(),
}
INITIAL_STATES = frozenset({S.PENDING, S.RETRY_SCHEDULED, S.SKIPPED})
TERMINAL_STATES = frozenset(status for status, nexts in TRANSITIONS.items() if not nexts)
ACTIVE_STATES = frozenset({S.PENDING, S.RUNNING, S.RETRY_SCHEDULED})
# Outcomes after which a further attempt of the same fire slot may be made.
RETRYABLE_STATES = frozenset({S.FAILED, S.TIMED_OUT, S.LOST})

ERR_ILLEGAL_TRANSITION = "illegal execution transition {source} -> {target}"
ERR_UNKNOWN_STATUS = "unknown execution status {status!r}"


class IllegalTransition(ValueError):
    def __init__(self, source: str, target: str) -> None:
        super().__init__(ERR_ILLEGAL_TRANSITION.format(source=source, target=target))
        self.source = source
        self.target = target


def check_transition(source: str, target: str) -> None:
    """Raise IllegalTransition unless source -> target is an edge of the machine."""
    if source not in TRANSITIONS:
        raise ValueError(ERR_UNKNOWN_STATUS.format(status=source))
    if target not in TRANSITIONS:
        raise ValueError(ERR_UNKNOWN_STATUS.format(status=target))
    if target not in TRANSITIONS[source]:
        raise IllegalTransition(source, target)
