"""This node's own row after a database outage: written again before anything starts.

The leader takes the work of a node cut off from its database for the dead threshold
(``cluster.reaper``), but only while that node's row has not been written since: the reaper locks
the row and checks its heartbeat inside the transaction that takes the work. A node whose database
answers again must therefore write its row before it starts a run claimed before the cut.
Otherwise its admission can mark such a run running just before the leader's transaction, which
reads the presence the node wrote during the outage and ends the run lost while its body starts.

One write after each outage pays for it: the next heartbeat's, or the first admission's or body
start's, whichever comes first. Once the row is written, the reaper finds it fresh and takes
nothing; a reaper that locked the row first makes that write wait until its own transaction has
committed, and the runs it took no longer match their claim tokens. An admission marks runs running
on that condition; a run marked running before an outage is read again before its body starts
(``cluster.executor.selffence``), since the leader may have taken it before the row was written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class NodeRow:
    """Whether this node's row is owed a write since its database's last outage, and the write.

    ``write`` is the node's heartbeat write (it raises what a database call raises);
    ``reachable`` is the node's judgement of its database now."""

    def __init__(
        self,
        write: Callable[[], object] | None = None,
        reachable: Callable[[], bool] | None = None,
    ) -> None:
        self._write = write or (lambda: None)
        self._reachable = reachable or (lambda: True)
        self._lock = threading.Lock()
        # One settling write at a time: the bodies due at one instant after an outage wait for
        # the first one's write rather than each writing the same row.
        self._settling = threading.Lock()
        self._outages = 0  # outages seen so far
        self._paid = 0  # outages a write begun after them has answered for

    def outage(self) -> None:
        """The database was judged unreachable: the row is owed a write once it answers again."""
        with self._lock:
            self._outages += 1

    @property
    def owed(self) -> bool:
        return self._paid < self._outages

    def write(self) -> object:
        """Write the row now; returns what ``write`` returns. The write pays what is owed only if
        it began while the database was judged reachable: one begun during an outage and answered
        after it carries an instant that may be older than the leader's cut-off."""
        with self._lock:
            outages = self._outages
        reachable = self._reachable()
        result = self._write()
        if reachable:
            with self._lock:
                self._paid = max(self._paid, outages)
        return result

    def settle(self) -> int:
        """Write the row first if an outage since the last write left it owed (before a run
        starts). Returns the outages counted before the write: a run marked running after this
        call needs no other check until ``outage_since`` that count. Raises the write's database
        error: the caller starts nothing then. No lock while nothing is owed (every body start
        asks): an outage counted just after the read is seen by ``outage_since``."""
        outages = self._outages
        if self._paid < outages:
            with self._settling:
                if self._paid < outages:
                    self.write()
        return outages

    def outage_since(self, count: int) -> bool:
        """Whether an outage began after ``settle`` returned ``count``."""
        return self._outages > count
