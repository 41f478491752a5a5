"""What the executor's parts (claimer, starter, admitter, self-fence, outcomes, audit) and its
runners ask of the executor that holds them: its identity and settings, its switches, its clock,
and the few calls one part makes into another."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from cluster.clock import Clock
from cluster.coordination import CoordinationBackend, LockKeeper, LockWatchdog
from cluster.executor.noderow import NodeRow
from cluster.executor.runners import Runner
from cluster.executor.runs import ActiveRun, Outcome
from cluster.membership import Membership


class Host(Protocol):
    node_id: str
    queues: list[str]
    clock: Clock
    backend: CoordinationBackend
    membership: Membership
    keeper: LockKeeper
    runner: Runner
    heartbeat_s: float
    lookahead_s: float
    job_lock_ttl_ms: int
    # Switches: claiming (False while draining), why claims are held back, whether the database
    # answers, and who to tell when room frees.
    claiming: bool
    held_back: str | None
    locks_unavailable_until: float  # monotonic: no claims before it (job locks unreachable)
    database_able: Callable[[], bool]
    on_room: Callable[[], None]
    # This node's row: written again after a database outage before any run starts.
    row: NodeRow

    def now(self) -> datetime: ...

    def wake_starter(self) -> None: ...

    def room(self) -> None: ...

    def release_lock(self, watchdog: LockWatchdog) -> None: ...

    def may_start(self, run: ActiveRun) -> bool: ...

    def complete(self, outcome: Outcome, *, body_ended: bool = False) -> bool: ...

    def locks_unavailable(self) -> None: ...
