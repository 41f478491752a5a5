"""The finisher: outcomes are queued by whoever ends a run and written by one thread, many per
transaction (one commit for many runs)."""

from __future__ import annotations

import logging
import queue
import threading
import time
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
from cluster.executor.runs import Outcome
from jobs import executions
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus
# Outcomes written in one transaction at most.
FINISH_BATCH = 200
# How long outcomes are retried while the database cannot be reached (seconds).
FINISH_RETRY_S = 60.0
# After the first outcome of a batch arrives, how long the finisher gathers more before writing
# (seconds). Bodies due together end together: one write for them, not one per few, keeps the
# finisher's transactions from competing with the bodies still starting. Locks and capacity do
# not wait for it (both are given back when the body ends).
FINISH_GATHER_S = 0.02


class Finisher:
    """Writes queued outcomes; calls ``on_written(batch)`` after each batch, written or given up."""

    def __init__(self, clock: Clock, on_written: Callable[[list[Outcome]], None]) -> None:
        self.clock = clock
        self.on_written = on_written
        self._queue: queue.Queue[Outcome] = queue.Queue()

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def run(self, stop: threading.Event) -> None:
        """Write batches until stopped and nothing is left."""
        while not (stop.is_set() and self._queue.empty()):
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first, *self._take(FINISH_BATCH - 1)]
            gather_until = self.clock.monotonic() + FINISH_GATHER_S
            while len(batch) < FINISH_BATCH and not stop.is_set():
                left = gather_until - self.clock.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
                batch += self._take(FINISH_BATCH - len(batch))
            self.write(batch)

    def flush(self) -> int:
        """Write everything queued now, in this thread (a stepped executor). Returns the count."""
        count = 0
        while batch := self._take(FINISH_BATCH):
            self.write(batch)
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
                now = self._now()
                with transaction.atomic():
                    won = executions.finish_batch(
                        [(outcome.run.execution, _keywords(outcome)) for outcome in batch], now=now
                    )
                node_metrics.fenced(len(batch) - len(won))
                written = True
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
                        )
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # reconnect on the next try
                if self.clock.monotonic() > give_up:
                    logger.error("writing %d outcomes: giving up (%s)", len(batch), exc)
                    break
                if attempt == 1 or attempt % 10 == 0:
                    logger.warning("writing %d outcomes failed (%s); retrying", len(batch), exc)
                time.sleep(min(2.0, 0.1 * 2 ** min(attempt, 5)))
            except Exception:
                logger.exception("writing %d outcomes failed", len(batch))
                close_old_connections()
                break
        if not written:
            for outcome in batch:
                self._write_alone(outcome)
        self.on_written(batch)

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
