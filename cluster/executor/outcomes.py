"""A run's outcome, from its body (or the supervisor) to the finisher: queued once, its job lock
released as soon as its body is known to be over, capacity freed, metrics and spans recorded once
written."""

from __future__ import annotations

from cluster import node_metrics, tracing
from cluster.executor.finisher import Finisher
from cluster.executor.host import Host
from cluster.executor.ledger import Ledger
from cluster.executor.runs import Outcome

PROCESS_REAP_S = 2.0


class Outcomes:
    def __init__(self, host: Host, books: Ledger) -> None:
        self.host = host
        self.books = books
        self.finisher = Finisher(host.clock, self.written, running=books.running_runs)

    def complete(self, outcome: Outcome, *, body_ended: bool = False) -> bool:
        """Queue the first outcome of a run for the finisher; later ones are dropped.

        When the body is known to have ended (it returned, or its process is gone), the job lock
        is released now, before the outcome is written: the next run of a forbid job may start
        as soon as this body is over, however far behind the finisher is. A thread body given up
        on (timeout, cancel, lock lost) may still be running: its lock goes after the write."""
        host, books = self.host, self.books
        run = outcome.run
        first, lock = books.ended(run, take_lock=lambda: body_ended and run.process is None)
        if not first:
            return False
        if run.process is not None:
            if run.process.is_alive():
                run.process.kill()
                run.process.join(PROCESS_REAP_S)  # reap it: no zombie left behind
            body_ended = body_ended or not run.process.is_alive()
            lock = books.take_lock(run) if body_ended else None
        # Metrics and spans are recorded by the finisher's thread (``written``): a body's thread
        # does as little as it can after the task returns, for the bodies due at the same instant
        # still waiting for the interpreter to start theirs.
        self.finisher.put(outcome)
        if lock is not None:
            host.release_lock(lock)
        # Room again (an outcome waiting for the finisher counts only beyond a budget): the
        # claim loop looks now, not after the outcome's write (runs beyond a full node's
        # capacity at a whole second waited for that write, then for their claim).
        host.room()
        return True

    def written(self, batch: list[Outcome]) -> None:
        """The finisher wrote (or gave up on) ``batch``: its locks go, its capacity frees; its
        metrics and spans are recorded."""
        host, books = self.host, self.books
        for outcome in batch:
            lock = books.take_lock(outcome.run)
            if lock is not None:
                host.release_lock(lock)
        books.written([o.run.execution.pk for o in batch])
        host.room()
        traced = tracing.enabled()
        for outcome in batch:
            run = outcome.run
            started, ended = outcome.started, outcome.ended
            node_metrics.outcome(
                run.execution.job.name,
                outcome.status,
                None if started is None else started - run.due,
                None if started is None or ended is None else ended - started,
            )
            if traced:
                self._trace(outcome)

    def _trace(self, outcome: Outcome) -> None:
        """The start (claimed to body start) and run (the body) spans of a run's trace."""
        execution = outcome.run.execution
        attributes = {"scheduler.node": self.host.node_id, "scheduler.job": execution.job.name}
        if outcome.started is None:
            return  # ended before its body started: no start, no run
        parent = tracing.node_parent(execution)  # this node's claim span
        if execution.claimed_at is not None:
            tracing.span(
                "start",
                execution.pk,
                start=execution.claimed_at,
                end=outcome.started,
                attributes={**attributes, "scheduler.due": outcome.run.due},
                parent_span_id=parent,
            )
        tracing.span(
            "run",
            execution.pk,
            start=outcome.started,
            end=outcome.ended or self.host.clock.now(),
            attributes={**attributes, "scheduler.outcome": outcome.status},
            error=outcome.error or None,
            parent_span_id=parent,
        )
