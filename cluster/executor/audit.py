"""The executor's self-audit: rows this node holds in the database but no longer tracks (an error in
the hot path, a database outage in the middle of a batch) are given back. A claimed, unstarted run
goes back to the queue; a running one nobody here runs is ended ``lost`` (retried per policy), unless
this process claimed it and never made it active (no body of it ran: back to the queue)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from cluster.executor.ledger import Ledger
from cluster.executor.runs import REASON_UNTRACKED
from jobs import executions
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus

# A row this node holds but does not track is a leftover once it is this old (seconds): a claim or
# a start in flight is never mistaken for one.
RECONCILE_AFTER_S = 5.0


def reconcile(*, node_id: str, books: Ledger, now: datetime) -> tuple[int, int]:
    """One audit of ``node_id``'s rows against ``books``. Returns (handed back, ended lost)."""
    cutoff = now - timedelta(seconds=RECONCILE_AFTER_S)
    tracked, in_flight = books.tracked()

    def untracked(rows: Any) -> list[JobExecution]:
        return [
            row
            for row in rows.exclude(pk__in=tracked)
            if executions.claim_prefix_of(row.claim_token) not in in_flight
        ]

    # No order: the model's default (by fire slot) let MariaDB walk the whole table along the
    # (job, slot, attempt) index instead of taking this node's rows from (status, node).
    mine = JobExecution.objects.select_related("job").filter(node=node_id).order_by()
    claims = untracked(
        mine.filter(status=S.PENDING, claim_token__isnull=False, claimed_at__lt=cutoff)
    )
    handed_back = sum(executions.hand_back(execution) for execution in claims)
    lost = 0
    for execution in untracked(mine.filter(status=S.RUNNING, started_at__lt=cutoff)):
        own, launched = books.launched_here(
            executions.claim_prefix_of(execution.claim_token), execution.pk
        )
        if own and not launched:
            # Claimed by this process and marked running (a claim's own start, a batch whose
            # commit's answer was lost), but never made active here: no body of it ran. Back to
            # the queue, not lost. (A row of an earlier process under this node id may have run:
            # it is lost, as before.)
            handed_back += executions.hand_back_unstarted(execution)
            continue
        with transaction.atomic():
            lost += executions.declare_lost(
                execution, reason=REASON_UNTRACKED.format(node=node_id), now=now
            )
    if handed_back or lost:
        logger.warning(
            "reconciled: %d untracked claims handed back, %d untracked runs ended lost",
            handed_back,
            lost,
            extra={"node": node_id},
        )
    return handed_back, lost
