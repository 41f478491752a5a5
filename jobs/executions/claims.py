"""Claiming runs and handing them back: the claim's SQL (read the candidates through the claim's
index, lock them by primary key, claim them in one UPDATE, marking running those that start in the
claim's own transaction) and the hand-backs of claimed, unstarted runs."""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils.timezone import now as timezone_now

from jobs import driver
from jobs.executions.rows import attach_jobs, row_loader
from jobs.executions.transitions import announce_many, transition
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus, check_transition

logger = logging.getLogger(__name__)

S = ExecutionStatus

# A claim reads this many times as many candidates as it wants (see claim_batch).
CLAIM_CANDIDATES_FACTOR = 2


def claim_batch(
    *,
    node_id: str,
    queues: list[str],
    limit: int,
    horizon: datetime,
    now: datetime,
    start_now: Callable[[list[JobExecution]], list[JobExecution]] | None = None,
    prefix: str | None = None,
) -> list[JobExecution]:
    """Claim up to ``limit`` pending, unclaimed executions due before ``horizon``, highest priority
    and earliest due first (one transaction; ``SKIP LOCKED`` where the engine has it; on SQLite
    the write transaction serialises claimers).

    ``start_now`` picks, from the rows claimed, those to mark running at ``now`` in the same
    statement: runs already due that need nothing looked at before they start save a commit and
    a hand-over to the starter. Those come back with status ``running``.

    ``prefix`` is the batch's claim token prefix (each row's token is ``<prefix><id>``), chosen by
    the caller so that it knows the claim's rows before the claim returns.

    The hot path of every node, so it is written in SQL and counted in round trips (each costs
    the node and the server about 80 us of CPU together on the 2-core machine): a look for
    candidates and their jobs' version stamps, outside any transaction (most polls find nothing,
    and on SQLite a write transaction takes the one database-wide write lock); then, in one
    transaction, the rows themselves (locked) and one UPDATE that claims them all and starts
    those that start now. Five round trips on MariaDB (look, BEGIN, lock, UPDATE, COMMIT)."""
    if limit <= 0:
        return []
    prefix = prefix or new_claim_prefix()
    sql = _ClaimSQL.of(connection)
    queue_marks = ", ".join(["%s"] * len(queues))
    due = [S.PENDING, *queues, _db_datetime(horizon)]
    with connection.cursor() as cursor:
        # More candidates than wanted: those another claimer holds are skipped (SKIP LOCKED) and
        # the next ones taken instead, in the same transaction.
        cursor.execute(
            sql.candidates.format(queues=queue_marks), [*due, limit * CLAIM_CANDIDATES_FACTOR]
        )
        found = cursor.fetchall()
    if not found:
        return []
    candidates = [row[0] for row in found]
    # The jobs' version stamps, read with the candidates (a query of their own in the claim's
    # transaction before): a job is read again only when its row changed since it was cached.
    stamps = {job_id: (version, created) for _, job_id, version, created in found}
    picked_ids: set[int] = set()
    with driver.transaction_script() as script:
        claimed = _lock_claimable(script, sql, candidates, queue_marks, due, limit)
        if not claimed:
            return []
        attach_jobs(claimed, stamps)
        picked = start_now(claimed) if start_now is not None else []
        # Stamped now, not at the claim's ``now``: the claim may have waited for the write lock
        # (SQLite), and a row running "since" before that wait looks older than it is.
        started_at = timezone_now()
        picked_ids = {execution.pk for execution in picked}
        # Each row gets its own token "<batch>-<id>"; the runs to start now are claimed and
        # marked running in the same statement (one row change each, not two). The rows are
        # locked by this transaction, so every one of them matches; the statement still asks
        # that each be pending and unclaimed.
        statement, params = _claim_statement(
            sql, claimed, picked_ids, prefix, node_id, now, started_at
        )
        matched = script.execute_and_commit(statement, params)
    if matched != len(claimed):
        # Committed with the statement: the claim is what the rows say.
        logger.warning(
            "claim %s matched %d of the %d rows it had locked; keeping those that carry its token",
            prefix,
            matched,
            len(claimed),
        )
        claimed = _claimed_after_all(claimed, prefix)
        picked_ids &= {execution.pk for execution in claimed}
    for execution in claimed:
        execution.claim_token = f"{prefix}{execution.pk}"
        execution.node, execution.claimed_at, execution.updated_at = node_id, now, started_at
        if execution.pk in picked_ids:
            execution.status, execution.started_at = S.RUNNING, started_at
    announce_many([(e.pk, e.job_id, S.RUNNING) for e in claimed if e.pk in picked_ids])
    return claimed


def _claimed_after_all(claimed: list[JobExecution], prefix: str) -> list[JobExecution]:
    """The rows of ``claimed`` that carry this claim's token (read after its commit)."""
    tokens = {f"{prefix}{execution.pk}": execution for execution in claimed}
    won = set(
        JobExecution.objects.filter(claim_token__in=list(tokens)).values_list(
            "claim_token", flat=True
        )
    )
    return [execution for token, execution in tokens.items() if token in won]


def _claim_statement(
    sql: _ClaimSQL,
    claimed: list[JobExecution],
    picked_ids: set[int],
    prefix: str,
    node_id: str,
    now: datetime,
    started_at: datetime,
) -> tuple[str, list[Any]]:
    """The claim's one UPDATE and its parameters: every row of ``claimed`` gets its token, the
    ones in ``picked_ids`` are marked running too."""
    ids = [execution.pk for execution in claimed]
    claim = [prefix, node_id, _db_datetime(now), _db_datetime(started_at)]
    marks = ", ".join(["%s"] * len(ids))
    unclaimed = [*ids, S.PENDING]
    if not picked_ids:
        return sql.claim.format(ids=marks), [*claim, *unclaimed]
    check_transition(S.PENDING, S.RUNNING)
    if len(picked_ids) == len(ids):
        started = [S.RUNNING, _db_datetime(started_at)]
        return sql.claim_and_start.format(ids=marks), [*claim, *started, *unclaimed]
    picked = list(picked_ids)
    statement = sql.claim_some_started.format(ids=marks, picked=", ".join(["%s"] * len(picked)))
    return statement, [*claim, *picked, S.RUNNING, *picked, _db_datetime(started_at), *unclaimed]


def _lock_claimable(
    script: driver.Transaction,
    sql: _ClaimSQL,
    candidates: list[int],
    queue_marks: str,
    due: list[Any],
    limit: int,
) -> list[JobExecution]:
    """In the claim's transaction: the claimable rows, locked, at most ``limit``.

    With SKIP LOCKED (MariaDB): the candidates (in claim order) by their ids, still pending and
    unclaimed, skipping rows another claimer holds; then the next candidates for what is still
    missing. Locking rows through the claim's index instead cost more with every row claimed
    before (a locking read steps over the index entries the claims left for purge: 0.5 ms for
    64 rows at the start of a 10,000-run backlog, 4.5 ms at its end), a read by id does not.
    Without (SQLite): the write transaction holds the whole database, so the claim's own query,
    read again inside it, is the truth."""
    load = row_loader(connection.vendor)
    if sql.lock_by_ids is None:
        cursor = script.execute(sql.ordered.format(queues=queue_marks), [*due, limit])
        return [load(row) for row in cursor.fetchall()]
    rows: list[JobExecution] = []
    taken = 0
    while len(rows) < limit and taken < len(candidates):
        batch = candidates[taken : taken + limit - len(rows)]
        taken += len(batch)
        marks = ", ".join(["%s"] * len(batch))
        cursor = script.execute(sql.lock_by_ids.format(ids=marks), [*batch, S.PENDING])
        rows += [load(row) for row in cursor.fetchall()]
    # Claim order (priority first, then due time), as the candidates were read.
    order = {pk: index for index, pk in enumerate(candidates)}
    rows.sort(key=lambda row: order[row.pk])
    return rows


@dataclass(frozen=True)
class _ClaimSQL:
    """The claim's statements for one database engine (table and column names from the model;
    every value a parameter; ``{queues}``, ``{ids}`` and ``{picked}`` become as many
    placeholders)."""

    candidates: str
    ordered: str
    lock_by_ids: str | None
    claim: str
    claim_and_start: str
    claim_some_started: str

    @staticmethod
    @functools.cache
    def _build(vendor: str, skip_locked: bool) -> _ClaimSQL:
        # Only the model's own table and column names go into the text (S608: reviewed).
        q = connection.ops.quote_name
        table = q(JobExecution._meta.db_table)
        jobs = q(Job._meta.db_table)
        columns = ", ".join(q(field.column) for field in JobExecution._meta.concrete_fields)
        where = (
            f"{q('status')} = %s AND {q('queue')} IN ({{queues}}) AND {q('claim_token')} IS NULL"
            f" AND {q('run_after')} <= %s"
        )
        order = f"ORDER BY {q('priority')} DESC, {q('run_after')}, {q('id')} LIMIT %s"
        # The same range and order, read through the claim's index first (a derived table: the
        # candidates are found before any join), then each with its job's version stamp (its
        # primary key). A plain join let MariaDB start from the job and sort every pending run
        # of it (a whole backlog of one job, for each claim).
        look_columns = f"{q('id')}, {q('job_id')}, {q('priority')}, {q('run_after')}"
        look = f"SELECT {look_columns} FROM {table} WHERE {where} {order}"  # noqa: S608
        look_order = f"ORDER BY c.{q('priority')} DESC, c.{q('run_after')}, c.{q('id')}"
        token = "CONCAT(%s, id)" if vendor == "mysql" else "(%s || id)"
        claim = (
            f"UPDATE {table} SET {q('claim_token')} = {token}, {q('node')} = %s, "  # noqa: S608
            f"{q('claimed_at')} = %s, {q('updated_at')} = %s"
        )
        by_ids = f"WHERE {q('id')} IN ({{ids}})"
        still_unclaimed = f"{by_ids} AND {q('status')} = %s AND {q('claim_token')} IS NULL"
        return _ClaimSQL(
            candidates=(
                f"SELECT c.{q('id')}, c.{q('job_id')}, j.{q('version')}, "  # noqa: S608
                f"j.{q('created_at')} FROM ({look}) c JOIN {jobs} j ON j.{q('id')} = "
                f"c.{q('job_id')} {look_order}"
            ),
            ordered=f"SELECT {columns} FROM {table} WHERE {where} {order}",  # noqa: S608
            # By primary key always: with few rows pending when its estimate is made, MariaDB
            # may choose a status index, and a locking read through it walks (and locks) every
            # pending row of a burst that arrives meanwhile.
            lock_by_ids=(
                f"SELECT {columns} FROM {table} FORCE INDEX (PRIMARY) {by_ids} "  # noqa: S608
                f"AND {q('status')} = %s AND {q('claim_token')} IS NULL FOR UPDATE SKIP LOCKED"
                if skip_locked
                else None
            ),
            claim=f"{claim} {still_unclaimed}",
            claim_and_start=(
                f"{claim}, {q('status')} = %s, {q('started_at')} = %s {still_unclaimed}"
            ),
            claim_some_started=(
                f"{claim}, {q('status')} = CASE WHEN {q('id')} IN ({{picked}}) THEN %s ELSE "
                f"{q('status')} END, {q('started_at')} = CASE WHEN {q('id')} IN ({{picked}}) "
                f"THEN %s ELSE {q('started_at')} END {still_unclaimed}"
            ),
        )

    @classmethod
    def of(cls, conn: Any) -> _ClaimSQL:
        return cls._build(conn.vendor, conn.features.has_select_for_update_skip_locked)


def _db_datetime(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


# Claim prefixes: random per process (64 bits, drawn once), then counted. A fresh uuid4 per claim
# read the kernel's random source every time: 0.36 ms a call on the development VM, about 10 us
# a run in a burst.
_PREFIX_NONCE = uuid.uuid4().hex[:12]
_prefix_counter = itertools.count(1)


def new_claim_prefix() -> str:
    """A claim batch's token prefix (unique: this process's nonce and a count); each row's token
    is ``<prefix><id>``."""
    return f"{_PREFIX_NONCE}{next(_prefix_counter):x}-"


def claim_prefix_of(token: str | None) -> str:
    """The batch prefix of a claim token ("" for none)."""
    return (token or "")[: (token or "").rfind("-") + 1]


def hand_back(
    execution: JobExecution, *, run_after: datetime | None = None, reason: str | None = None
) -> bool:
    """Give a claimed, unstarted execution back to the queue (drain, a lock service that cannot
    answer, a buffer_one run waiting its turn, a flow limit reached), due again at ``run_after``
    when given, with ``reason`` (what it waits for) when given."""
    fields: dict[str, Any] = {"claim_token": None, "node": "", "claimed_at": None}
    if run_after is not None:
        fields["run_after"] = run_after
    if reason is not None:
        fields["reason"] = reason[:255]
    return bool(
        JobExecution.objects.filter(
            pk=execution.pk, status=S.PENDING, claim_token=execution.claim_token
        ).update(**fields)
    )


def hand_back_unstarted(execution: JobExecution) -> bool:
    """running -> pending for a run marked running ahead of its instant whose body never started
    (its node could not confirm its claim). Conditional on the claim token: a run the cluster has
    already declared lost or handed to another node is left alone."""
    return transition(
        execution.pk,
        source=S.RUNNING,
        target=S.PENDING,
        job_id=execution.job_id,
        claim_token=execution.claim_token,
        claim_token_new=None,
        node="",
        claimed_at=None,
        started_at=None,
    )


def still_running_here(execution: JobExecution) -> bool:
    """Whether the row still says running under this writer's claim token (a read: the leader may
    have ended it lost, or handed it back, while its node could not reach the database)."""
    return JobExecution.objects.filter(
        pk=execution.pk, status=S.RUNNING, claim_token=execution.claim_token
    ).exists()


def hand_back_claims(*, node: str, claimed_before: datetime) -> int:
    """The claimed, unstarted executions ``node`` took before ``claimed_before`` go back to the
    queue (a node cut off from the database since then cannot start them)."""
    return JobExecution.objects.filter(
        node=node, claimed_at__lt=claimed_before, status=S.PENDING
    ).update(claim_token=None, node="", claimed_at=None)


def hand_back_nodes(nodes: Iterable[str]) -> int:
    """Every claimed, unstarted execution of these (dead or stopped) nodes goes back to the queue."""
    return JobExecution.objects.filter(node__in=list(nodes), status=S.PENDING).update(
        claim_token=None, node="", claimed_at=None
    )
