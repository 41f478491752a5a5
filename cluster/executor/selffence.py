"""The self-fence: the last check before a body starts, on this node's own clock.

A body starts only while its node can show that its claim still holds: its membership confirmed
without a lapse since the run was claimed, its database answering, and its job lock (if any) valid
for a margin yet. Otherwise the run is given up: handed back to the queue if the cluster has not
taken it already (the write is conditional on the claim), or left to the leader while the database
cannot be reached (the node's presence names it).
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from cluster.executor.host import Host
from cluster.executor.ledger import OVERFLOW_WAIT_S, Ledger
from cluster.executor.runs import ActiveRun
from jobs import executions

logger = logging.getLogger(__name__)

# A body starts only while its job lock stays valid at least this much longer (seconds).
LOCK_START_MARGIN_S = 0.2
HAND_BACK_ATTEMPTS = 5
HAND_BACK_BACKOFF_S = 0.2


class SelfFence:
    def __init__(self, host: Host, books: Ledger) -> None:
        self.host = host
        self.books = books

    def may_start(self, run: ActiveRun) -> bool:
        """First the run takes a body slot: a run claimed beyond capacity waits for one of the
        node's bodies to end, at most OVERFLOW_WAIT_S, and is given up if none does. Then the
        fence itself."""
        host, books = self.host, self.books
        room = books.take_body_slot(run)
        if room is None:
            # Ended before its body started (an operator's cancel of a process-isolated run
            # between admission and its instant): the outcome is written, nothing starts.
            return False
        lock = run.lock
        lock_ok = lock is None or (
            not lock.lost.is_set()
            and lock.clock.monotonic() < lock.handle.valid_until() - LOCK_START_MARGIN_S
        )
        # Checked after the body slot is taken: a run that passes here is already among
        # ``body_ids``, so a presence that says "unreachable" names every body that may run.
        database_ok = host.database_able()
        taken = False
        if database_ok and room and lock_ok:
            ours = self._ours_after_outages(run)
            database_ok = ours is not None
            taken = ours is False
        if room and lock_ok and database_ok and not taken and host.membership.confirmed(run.epoch):
            return True
        if not books.give_up_start(run, refused=not database_ok):
            return False
        execution = run.execution
        handed_back = False
        try:
            # The body did not start: give the run back, retrying a database that does not
            # answer for a moment (otherwise the audit ends it lost though it never ran). Not
            # while the database is unreachable: the leader hands it back (the node says so).
            for attempt in range(HAND_BACK_ATTEMPTS if database_ok else 0):
                try:
                    handed_back = executions.hand_back_unstarted(execution)
                    break
                except (OperationalError, InterfaceError):
                    logger.warning("hand back of execution %s failed; retrying", execution.pk)
                    connection.close()
                    host.clock.sleep(HAND_BACK_BACKOFF_S * (attempt + 1))
        finally:
            if lock is not None:
                host.release_lock(lock)
        if not room:
            why = f"no body of this node ended within {OVERFLOW_WAIT_S} s (it is at capacity)"
        elif not database_ok:
            why = "the database is unreachable"
        elif taken:
            why = "the leader took it while this node could not reach the database"
        elif not lock_ok:
            why = "lock no longer certain"
        else:
            why = "membership not confirmed"
        logger.warning(
            "execution %s not started: %s (%s)",
            execution.pk,
            why,
            "handed back"
            if handed_back
            else "left to the leader"
            if not database_ok
            else "already taken by the cluster",
            extra={"node": host.node_id, "execution": execution.pk},
        )
        return False

    def _ours_after_outages(self, run: ActiveRun) -> bool | None:
        """After a database outage this node's row is written before any body starts
        (``NodeRow``), and a run marked running before the outage is read again: the leader may
        have taken it meanwhile. True: it may start; False: the row is no longer this run's
        (taken); None: the database did not answer (it does not start either)."""
        row = self.host.row
        try:
            row.settle()
            if not row.outage_since(run.outages):
                return True
            return executions.still_running_here(run.execution)
        except DatabaseError:
            logger.warning(
                "execution %s: the database did not answer the check after an outage",
                run.execution.pk,
                exc_info=True,
                extra={"node": self.host.node_id, "execution": run.execution.pk},
            )
            connection.close()
            return None
