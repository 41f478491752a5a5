"""Run history retention: delete finished runs older than a cutoff, a batch at a time.

Nothing here runs by itself: an operator schedules it (the built-in task ``purge_runs``, e.g.
hourly) or runs it by hand (``manage.py jobs purge-runs``). Every execution is a row (200 one-second
jobs write 17 million a day), so a cluster that keeps all of them slows every listing and count
that reads them.

What is deleted: runs in a terminal state (succeeded, failed, timed out, cancelled, lost,
skipped) whose ``finished_at`` is before the cutoff — found oldest first through the index on
``finished_at`` — except

- each job's newest run (its latest fire slot), so a job that has not run for a long time still
  shows how its last run went;
- a run with a notification still to be sent (the notifier needs the row).

Pending, running and retry-scheduled runs are never deleted, however old. Each batch is its own
transaction (a short one: other writers wait for no more than one batch), and one call deletes at
most ``max_rows`` so that a first purge of a long history is spread over several.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from jobs import executions
from jobs.models import JobExecution, Notification, NotificationStatus
from jobs.states import TERMINAL_STATES

logger = logging.getLogger(__name__)

PURGE_BATCH = 1_000
PURGE_MAX_ROWS = 100_000
MAX_BATCH = 10_000
ERR_OLDER_THAN = "must be a number of days greater than 0"
ERR_BATCH = "must be a whole number from 1 to {limit}"
ERR_MAX_ROWS = "must be a whole number of at least 1"


@dataclass
class PurgeResult:
    deleted: int  # runs deleted (or, for a dry run, that would be)
    batches: int
    cutoff: datetime
    complete: bool  # False: stopped at max_rows, and there may be more to delete


class BadPurgeArgument(ValueError):
    """A purge argument out of range; ``param`` names it."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"{param} {reason}")
        self.param = param


def check_purge_arguments(older_than_days: object, batch: object, max_rows: object) -> None:
    """Raise BadPurgeArgument for the first bad argument (the CLI's and the task's check)."""
    if (
        isinstance(older_than_days, bool)
        or not isinstance(older_than_days, int | float)
        or not math.isfinite(older_than_days)
        or older_than_days <= 0
    ):
        raise BadPurgeArgument("older_than_days", ERR_OLDER_THAN)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise BadPurgeArgument("batch", ERR_BATCH.format(limit=MAX_BATCH))
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise BadPurgeArgument("max_rows", ERR_MAX_ROWS)


def _deletable(ids_slots: list[tuple[int, int, datetime]]) -> list[int]:
    """Of (id, job id, slot) candidates, the ids that are neither their job's newest run nor a run
    with a notification still pending."""
    jobs = {job_id for _, job_id, _ in ids_slots}
    # The newest slot of each job: the (job, scheduled_for, attempt) index answers per job.
    newest = dict(
        JobExecution.objects.filter(job_id__in=jobs)
        .order_by()
        .values("job_id")
        .annotate(last=Max("scheduled_for"))
        .values_list("job_id", "last")
    )
    waiting = set(
        Notification.objects.filter(
            execution_id__in=[pk for pk, _, _ in ids_slots], status=NotificationStatus.PENDING
        ).values_list("execution_id", flat=True)
    )
    return [
        pk
        for pk, job_id, slot in ids_slots
        if pk not in waiting and newest.get(job_id) is not None and slot < newest[job_id]
    ]


def purge_finished_runs(
    *,
    older_than: timedelta,
    now: datetime | None = None,
    batch: int = PURGE_BATCH,
    max_rows: int = PURGE_MAX_ROWS,
    dry_run: bool = False,
) -> PurgeResult:
    """Delete terminal runs finished before ``now - older_than`` (see the module), ``batch`` at a
    time, at most ``max_rows`` in all. ``dry_run`` counts what would go and deletes nothing."""
    cutoff = (now or timezone.now()) - older_than
    result = PurgeResult(deleted=0, batches=0, cutoff=cutoff, complete=False)
    after: tuple[datetime, int] | None = None  # (finished_at, id) of the last row kept
    while result.deleted < max_rows:
        candidates = JobExecution.objects.filter(status__in=TERMINAL_STATES, finished_at__lt=cutoff)
        if after is not None:
            candidates = candidates.filter(finished_at__gte=after[0]).exclude(
                finished_at=after[0], pk__lte=after[1]
            )
        rows = list(
            candidates.order_by("finished_at", "pk").values_list(
                "pk", "job_id", "scheduled_for", "finished_at"
            )[: min(batch, max_rows - result.deleted)]
        )
        if not rows:
            result.complete = True
            break
        result.batches += 1
        ids = _deletable([(pk, job_id, slot) for pk, job_id, slot, _ in rows])
        removed = len(ids)
        if ids and not dry_run:
            with transaction.atomic():
                removed = executions.purge_finished(ids, finished_before=cutoff)
        result.deleted += removed
        if dry_run or removed < len(rows):
            # Rows left in the range (kept, or only counted): go on past them, or the next batch
            # would read them again.
            after = (rows[-1][3], rows[-1][0])
    if result.deleted and not dry_run:
        logger.info(
            "purged %d runs finished before %s (%d batches%s)",
            result.deleted,
            cutoff,
            result.batches,
            "" if result.complete else f"; stopped at max_rows {max_rows}",
        )
    return result
