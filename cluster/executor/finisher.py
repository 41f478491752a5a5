"""The finisher: outcomes are queued by whoever ends a run and written by one thread, many per
transaction (one commit for many runs)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)

from cluster import node_metrics, tracing
from cluster.clock import Clock
from cluster.executor.runs import ActiveRun, Outcome
from jobs import executions, secrets
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus
# Outcomes written in one transaction at most.
FINISH_BATCH = 200
# How long outcomes are retried while the database cannot be reached (seconds).
FINISH_RETRY_S = 60.0
# The longest wait between two tries of a batch (seconds). Outcomes not yet written count against
# the node's capacity beyond a budget, so after an outage the node claims again only once they are
# written: a wait of 2 s here once kept nodes full for that long after the database was back (a
# chaos run's slow recoveries). A try while the database is down is one failed connect.
FINISH_RETRY_MAX_WAIT_S = 0.5
# After the first outcome of a batch arrives, how long the finisher gathers more before writing
# (seconds). Bodies due together end together: one write for them, not one per few, keeps the
# finisher's transactions from competing with the bodies still starting. Locks and capacity do
# not wait for it (both are given back when the body ends).
FINISH_GATHER_S = 0.02
# How often the finisher looks whether a batch filled while it gathers (seconds).
FINISH_GATHER_STEP_S = 0.005


# A running run's output is saved as it grows, so viewers see it stream: the first line at once,
# then at most about once per OUTPUT_STREAM_S, sooner when OUTPUT_STREAM_CHARS more were written
# (the output itself is capped by the task context's limit). Looked at every OUTPUT_POLL_S.
OUTPUT_STREAM_S = 1.0
OUTPUT_STREAM_CHARS = 8 * 1024
OUTPUT_POLL_S = 0.2


class Finisher:
    """Writes queued outcomes; calls ``on_written(batch)`` after each batch, written or given up.
    Between batches it saves the output so far of the runs ``running()`` returns (the same thread
    and connection: streaming output costs the node no connection of its own)."""

    def __init__(
        self,
        clock: Clock,
        on_written: Callable[[list[Outcome]], None],
        running: Callable[[], list[ActiveRun]] = list,
    ) -> None:
        self.clock = clock
        self.on_written = on_written
        self.running = running
        # A SimpleQueue: a put is one C call, no condition to notify (every run's body puts).
        self._queue: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._streamed_at = 0.0
        # A stepped finisher's batch that could not reach the database, kept for the next step,
        # and since when it has failed (its clock): given up FINISH_RETRY_S after, as write() is.
        self._held: list[Outcome] = []
        self._failing_since: float | None = None

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def run(self, stop: threading.Event) -> None:
        """Write batches until stopped and nothing is left."""
        while not (stop.is_set() and self._queue.empty()):
            if self.clock.monotonic() - self._streamed_at >= OUTPUT_POLL_S:
                self._streamed_at = self.clock.monotonic()
                self.stream_outputs()
            try:
                first = self._queue.get(timeout=OUTPUT_POLL_S / 2)
            except queue.Empty:
                continue
            # Gathered by looking now and then, not by waiting on the queue: a waiting finisher
            # would be woken by every outcome put (a thread switch per run).
            gather_until = self.clock.monotonic() + FINISH_GATHER_S
            while self._queue.qsize() < FINISH_BATCH - 1 and not stop.is_set():
                left = gather_until - self.clock.monotonic()
                if left <= 0:
                    break
                stop.wait(min(left, FINISH_GATHER_STEP_S))
            self.write([first, *self._take(FINISH_BATCH - 1)])

    def stream_outputs(self, *, force: bool = False) -> int:
        """Save the output so far of running runs that wrote more since it was last saved (at
        once the first time; then per OUTPUT_STREAM_S or OUTPUT_STREAM_CHARS; ``force``: now).
        Returns how many were saved. A database error is logged and tried again next time."""
        now = self.clock.monotonic()
        due: list[tuple[ActiveRun, int]] = []
        for run in self.running():
            size = run.output_size()
            if run.completed or size <= run.output_saved:
                continue
            if (
                force
                or run.output_saved == 0
                or now - run.output_saved_at >= OUTPUT_STREAM_S
                or size - run.output_saved >= OUTPUT_STREAM_CHARS
            ):
                due.append((run, size))
        if not due:
            return 0
        try:
            stamp = self._now()
            with transaction.atomic():
                for run, size in due:
                    text = run.output_so_far()
                    if run.revealed:
                        text = secrets.scrub(text, run.revealed)
                    executions.save_output_so_far(run.execution, text, now=stamp)
                    run.output_saved, run.output_saved_at = size, now
        except (OperationalError, InterfaceError) as exc:
            connection.close()
            logger.warning("saving the output of %d running runs failed (%s)", len(due), exc)
            return 0
        return len(due)

    def flush(self) -> int:
        """Write everything queued now, in this thread (a stepped executor). Returns the count.

        It never waits: while the database cannot be reached, the batch is kept for the next
        flush (and given up, as :meth:`write` gives up, FINISH_RETRY_S after it first failed on
        the finisher's clock), and the error is raised to the caller."""
        count = 0
        while batch := self._held or self._take(FINISH_BATCH):
            self._held = []
            try:
                self._commit(batch)
            except (OperationalError, InterfaceError):
                connection.close()
                now = self.clock.monotonic()
                if self._failing_since is None:
                    self._failing_since = now
                if now - self._failing_since <= FINISH_RETRY_S:
                    self._held = batch
                    raise
                logger.error("writing %d outcomes: giving up", len(batch))
                for outcome in batch:
                    self._write_alone(outcome)
            self._failing_since = None
            self.on_written(batch)
            count += len(batch)
        return count

    def _take(self, limit: int) -> list[Outcome]:
        batch: list[Outcome] = []
        while len(batch) < limit:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def write(self, batch: list[Outcome]) -> None:
        """All outcomes in one transaction. While the database cannot be reached, the batch is
        retried with backoff (for up to FINISH_RETRY_S): an outcome is not turned into a storage
        failure, nor left for the reaper, because of an outage of a few seconds. If the write
        fails otherwise, each outcome is written on its own (one bad outcome must not hold up the
        others), and one that still cannot be stored is recorded as failed with the storage error,
        so no run stays running."""
        written = False
        give_up = self.clock.monotonic() + FINISH_RETRY_S
        attempt = 0
        while not written:
            attempt += 1
            try:
                self._commit(batch)
                written = True
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # reconnect on the next try
                if self.clock.monotonic() > give_up:
                    logger.error("writing %d outcomes: giving up (%s)", len(batch), exc)
                    break
                if attempt == 1 or attempt % 10 == 0:
                    logger.warning("writing %d outcomes failed (%s); retrying", len(batch), exc)
                self.clock.sleep(min(FINISH_RETRY_MAX_WAIT_S, 0.1 * 2 ** min(attempt, 5)))
            except Exception:
                logger.exception("writing %d outcomes failed", len(batch))
                close_old_connections()
                break
        if not written:
            for outcome in batch:
                self._write_alone(outcome)
        self.on_written(batch)

    def _commit(self, batch: list[Outcome]) -> None:
        """The batch in one transaction (outcomes a newer claim fenced off are counted)."""
        won = executions.finish_batch(
            [(outcome.run.execution, _keywords(outcome)) for outcome in batch], now=self._now()
        )
        node_metrics.fenced(len(batch) - len(won))
        if tracing.enabled():
            committed = self.clock.now()
            for outcome in batch:
                tracing.span(
                    "finish",
                    outcome.run.execution.pk,
                    start=outcome.ended or committed,
                    end=committed,
                    attributes={
                        "scheduler.outcome": outcome.status,
                        "scheduler.written": outcome.run.execution.pk in won,
                    },
                    parent_span_id=tracing.node_parent(outcome.run.execution),
                )

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=UTC)

    def _write_alone(self, outcome: Outcome) -> None:
        try:
            with transaction.atomic():
                _write_one(outcome, self._now())
            return
        except Exception as exc:
            logger.exception("outcome of execution %s cannot be stored", outcome.run.execution.pk)
            error = f"the outcome could not be stored: {type(exc).__name__}: {exc}"
        close_old_connections()
        try:
            with transaction.atomic():
                _write_one(Outcome(outcome.run, S.FAILED, error=error), self._now())
        except Exception:
            logger.exception(
                "gave up on execution %s; the reaper will recover it", outcome.run.execution.pk
            )


def _keywords(outcome: Outcome) -> dict[str, Any]:
    """``executions.finish`` keywords of an outcome."""
    return {
        "status": outcome.status,
        "result": outcome.result,
        "error": outcome.error,
        "tb": outcome.tb,
        "output": outcome.output,
        "reason": outcome.reason,
        "started": outcome.started,
        "ended": outcome.ended,
    }


def _write_one(outcome: Outcome, now: datetime) -> bool:
    return executions.finish(outcome.run.execution, now=now, **_keywords(outcome))
