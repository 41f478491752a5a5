"""The executor's books: what one node tracks of its runs, under one lock.

Claims not yet started (due in the timer heap, in the waiting room, or being admitted), the active
runs and the body slots they hold, outcomes not yet written, runs refused while the database was
unreachable, and what this process claimed and launched (for the self-audit). Every method is short
and thread-safe; nothing here talks to the database or the coordination backend.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable

from cluster.clock import Clock
from cluster.coordination import LockWatchdog
from cluster.executor.runs import ActiveRun, Scheduled, Waiting
from jobs.models import JobExecution

# A node with no body running may claim this share of its capacity beyond it (rounded down).
# At a whole second with more runs due than the cluster's capacity (W1: 200 jobs, 3 nodes of 64),
# the runs beyond a full node's capacity are then claimed and admitted ahead of their instant like
# the others, and start the moment one of the node's bodies ends. Before, they were claimed and
# admitted after the instant (a claim and an admission of their own while every node and the
# database were at their busiest): 35-55 ms late, the whole of W1's p99. A body never starts
# beyond capacity: a run beyond it waits for a body to end, at most OVERFLOW_WAIT_S, then goes
# back to the queue for a node with room.
OVERFLOW_SHARE = 0.125
OVERFLOW_WAIT_S = 0.2
# How long a run waiting for a body to end sleeps between looks at its own state (a cancel).
BODY_WAIT_STEP_S = 0.05
# How many runs refused for an unreachable database a presence names at most.
REFUSED_REMEMBERED = 256
# How many of its latest active runs (and claims) a node remembers for its self-audit.
LAUNCHED_REMEMBERED = 100_000


class Ledger:
    def __init__(self, *, capacity: int, clock: Clock) -> None:
        self.capacity = capacity
        self.clock = clock
        self.lock = threading.Lock()
        self.timer_heap: list[Scheduled] = []
        self.waiting: list[Waiting] = []
        self._seq = 0
        self.active: dict[int, ActiveRun] = {}
        # Claimed and not yet active (in the heap, waiting, or being admitted).
        self.claimed: set[int] = set()
        # Bodies started and not yet ended (at most ``capacity``), and the condition a run beyond
        # them waits on (see OVERFLOW_SHARE).
        self.bodies = 0
        self.body_ended = threading.Condition(self.lock)
        # Outcomes queued for the finisher (their runs still say running in the database).
        self.unwritten = 0
        self.finishing: set[int] = set()
        # Runs made active but refused at their start while the database was unreachable (their
        # rows still say running): the presence names them so the leader hands them back.
        self.refused: OrderedDict[int, None] = OrderedDict()
        # Claim token prefixes of claims in flight (their rows are not tracked yet).
        self.claims_in_flight: set[str] = set()
        # Runs this node made active (their bodies may have started), newest last.
        self.launched: OrderedDict[int, None] = OrderedDict()
        # Claim token prefixes of this process's own claims, newest last (not a previous process
        # that ran under the same node id: its bodies may have run).
        self.own_prefixes: OrderedDict[str, None] = OrderedDict()
        # Job locks held by admissions in flight, and by runs whose outcome is queued while their
        # thread body may still run (released once the outcome is written): with the active runs'
        # own, the only locks this node may hold (see rightful_locks).
        self.admitting_locks: dict[int, LockWatchdog] = {}
        self.finishing_locks: dict[int, LockWatchdog] = {}
        # Runs whose job lock this node gave up while their body ran (cut off from the database
        # past the dead threshold, or its presence no longer certain), until their outcome is
        # written or given up: the body may still be inside the task, so the presence names them
        # and no successor starts before the cluster has ended them (``cluster.executor.facts``).
        self.released: set[int] = set()

    # --- capacity ---------------------------------------------------------------------------------
    def overflow_locked(self) -> int:
        """How many runs beyond ``capacity`` the node may claim now (``lock`` held): a share of it
        while no body runs (runs claimed ahead of an instant), none while any does (a node busy
        with long bodies must leave what it cannot start to nodes with room)."""
        if self.bodies:
            return 0
        return int(self.capacity * OVERFLOW_SHARE)

    def load_locked(self) -> int:
        """Claimed + running (+ outcomes not yet written, see below): what counts against capacity
        (``lock`` held).

        Runs in the waiting room count only beyond a second budget of ``capacity``: runs waiting
        their turn (an older fire of their job first, a lock about to free) must never fill a
        node so that the run they wait for cannot be claimed by anyone (a deadlock of capacity).
        Outcomes waiting for the finisher count only beyond a budget of ``capacity`` too: their
        bodies are over and their locks released, so a finisher a little behind (a batch in
        flight, a database slow for a moment) must not stop the node claiming; one far behind
        does."""
        waiting = len(self.waiting)
        return (
            len(self.claimed)
            - waiting
            + max(0, waiting - self.capacity)
            + len(self.active)
            + max(0, self.unwritten - self.capacity)
        )

    def load(self) -> int:
        with self.lock:
            return self.load_locked()

    def counts(self) -> dict[str, int]:
        """What is tracked, by kind (for a log line saying why a node claims nothing)."""
        with self.lock:
            return {
                "claimed": len(self.claimed),
                "waiting": len(self.waiting),
                "timed": len(self.timer_heap),
                "running": len(self.active),
                "bodies": self.bodies,
                "unwritten": self.unwritten,
            }

    # --- claims -------------------------------------------------------------------------------------
    def claim_began(self, prefix: str) -> None:
        """Until its rows are tracked, the self-audit leaves this claim's rows alone."""
        with self.lock:
            self.claims_in_flight.add(prefix)
            self.own_prefixes[prefix] = None
            if len(self.own_prefixes) > LAUNCHED_REMEMBERED:
                self.own_prefixes.popitem(last=False)

    def claim_ended(self, prefix: str) -> None:
        with self.lock:
            self.claims_in_flight.discard(prefix)

    def schedule_locked(self, execution: JobExecution, due: float, epoch: int) -> None:
        """A claimed run into the timer heap, due at ``due`` (``lock`` held)."""
        self.claimed.add(execution.pk)
        self._seq += 1
        heapq.heappush(self.timer_heap, Scheduled(due, self._seq, execution, epoch))

    def wait(self, item: Scheduled, until: float) -> None:
        """Into the waiting room: looked at again at ``until`` (wall clock)."""
        with self.lock:
            self._seq += 1
            heapq.heappush(self.waiting, Waiting(until, self._seq, item))

    def due_batch(
        self, now: float, ahead_s: float, coalesce_s: float
    ) -> tuple[list[Scheduled], float | None]:
        """The claimed runs due within ``ahead_s`` and the waiting runs due for another look
        (within ``coalesce_s``), taken out together; and the next instant something is due."""
        batch: list[Scheduled] = []
        with self.lock:
            while self.timer_heap and self.timer_heap[0].due <= now + ahead_s:
                batch.append(heapq.heappop(self.timer_heap))
            while self.waiting and self.waiting[0].look_at <= now + coalesce_s:
                batch.append(heapq.heappop(self.waiting).item)
            instants = []
            if self.timer_heap:
                instants.append(self.timer_heap[0].due - ahead_s)
            if self.waiting:
                instants.append(self.waiting[0].look_at)
        return batch, (min(instants) if instants else None)

    def take_unstarted(self) -> list[JobExecution]:
        """Every claimed run in the heap or the waiting room, taken out (to be handed back)."""
        with self.lock:
            pending = [item.execution for item in self.timer_heap]
            pending += [waiting.item.execution for waiting in self.waiting]
            self.timer_heap.clear()
            self.waiting.clear()
        return pending

    def forget(self, execution_id: int) -> None:
        with self.lock:
            self.claimed.discard(execution_id)

    # --- active runs -----------------------------------------------------------------------------
    def track_active_locked(self, run: ActiveRun) -> None:
        """(``lock`` held.) The run may start its body from now on: it is active, and the
        self-audit will count it as having run if its row is ever left untracked."""
        pk = run.execution.pk
        self.claimed.discard(pk)
        self.active[pk] = run
        self.launched[pk] = None
        if len(self.launched) > LAUNCHED_REMEMBERED:
            self.launched.popitem(last=False)

    def running_count(self) -> int:
        with self.lock:
            return len(self.active)

    def running_ids(self) -> list[int]:
        with self.lock:
            return list(self.active)

    def running_runs(self) -> list[ActiveRun]:
        with self.lock:
            return list(self.active.values())

    def active_run(self, execution_id: int) -> ActiveRun | None:
        with self.lock:
            return self.active.get(execution_id)

    def body_ids(self) -> list[int]:
        """Runs whose bodies hold a slot (started, or starting now), and have not ended."""
        with self.lock:
            return [
                pk
                for pk, run in self.active.items()
                if run.body_slot and not run.completed and not run.released
            ]

    def held_locks(self) -> set[int]:
        """The job locks of running bodies (their watchdogs' ids)."""
        with self.lock:
            return {
                id(run.lock)
                for run in self.active.values()
                if run.lock is not None and run.body_slot and not run.completed
            }

    def give_up_body_locks(self) -> set[int]:
        """The job locks of running bodies (their watchdogs' ids), their runs noted as released:
        the caller stops keeping those locks. A released run stays active (its body runs on, and
        its outcome is queued when the body returns), but is no longer among ``body_ids``: the
        leader may end it lost."""
        with self.lock:
            runs = [
                run
                for run in self.active.values()
                if run.lock is not None and run.body_slot and not run.completed
            ]
            for run in runs:
                run.released = True
                self.released.add(run.execution.pk)
            return {id(run.lock) for run in runs}

    def released_ids(self) -> list[int]:
        """Runs whose job lock was given up while their body ran, outcome not yet written."""
        with self.lock:
            return sorted(self.released)

    def take_lock(self, run: ActiveRun) -> LockWatchdog | None:
        """The run's job lock, taken from it (atomically: whoever takes it releases it, once)."""
        with self.lock:
            lock, run.lock = run.lock, None
            self.finishing_locks.pop(run.execution.pk, None)
        return lock

    def locks_taken(self, watchdog: LockWatchdog) -> None:
        """An admission took this job lock (before the keeper extends it)."""
        with self.lock:
            self.admitting_locks[id(watchdog)] = watchdog

    def locks_settled(self, watchdogs: list[LockWatchdog]) -> None:
        """An admission is over: each lock it took was released or went to its run."""
        with self.lock:
            for watchdog in watchdogs:
                self.admitting_locks.pop(id(watchdog), None)

    def rightful_locks(self) -> set[int]:
        """The job locks this node holds for a reason (their watchdogs' ids): an active run's, an
        admission's in flight, a run's whose outcome is queued. Any other lock its keeper extends
        is held for nothing (a path that forgot to release it) and must go: it would block its
        job on every node for as long as this node lives."""
        with self.lock:
            return (
                {id(run.lock) for run in self.active.values() if run.lock is not None}
                | set(self.admitting_locks)
                | {id(lock) for lock in self.finishing_locks.values()}
            )

    # --- body slots -------------------------------------------------------------------------------
    def take_body_slot(self, run: ActiveRun) -> bool | None:
        """A body slot for ``run``: True once it has one, False if none freed within
        OVERFLOW_WAIT_S (from its instant, or from when it first asked if that is later), None if
        the run ended meanwhile (nothing is to start)."""
        with self.lock:
            if run.body_slot:
                return True
            if run.room_wait_from is None:
                run.room_wait_from = max(run.due, self.clock.now())
            give_up_at = run.room_wait_from + OVERFLOW_WAIT_S
            while not run.completed and self.bodies >= self.capacity:
                remaining = give_up_at - self.clock.now()
                if remaining <= 0:
                    return False
                # In steps: a cancel of this run (no body of it ends) is seen within one.
                self.body_ended.wait(min(remaining, BODY_WAIT_STEP_S))
            if run.completed:
                return None
            self.bodies += 1
            run.body_slot = True
            return True

    def body_room(self) -> bool:
        """Whether a body may start now without waiting for another to end."""
        with self.lock:
            return self.bodies < self.capacity

    def free_body_slot_locked(self, run: ActiveRun) -> None:
        """(``lock`` held.) The run's body slot, if it holds one, goes to a run waiting for it."""
        if run.body_slot:
            run.body_slot = False
            self.bodies -= 1
            self.body_ended.notify()

    def give_up_start(self, run: ActiveRun, *, refused: bool) -> bool:
        """A run whose body will not start after all: no longer active, its slot freed; with
        ``refused``, remembered as refused (the database was unreachable). False if it had
        already ended (an outcome was queued meanwhile)."""
        with self.lock:
            self.free_body_slot_locked(run)
            if run.completed:
                return False
            run.completed = True
            self.active.pop(run.execution.pk, None)
            self.released.discard(run.execution.pk)
            # No body of it ran: the self-audit hands its row back rather than ending it lost.
            self.launched.pop(run.execution.pk, None)
            if refused:
                self.refused[run.execution.pk] = None
                while len(self.refused) > REFUSED_REMEMBERED:
                    self.refused.popitem(last=False)
        return True

    def refused_ids(self) -> list[int]:
        """Runs refused at their start while the database was unreachable (newest last)."""
        with self.lock:
            return list(self.refused)

    def forget_refused(self) -> None:
        """The database answers again: refused runs are the self-audit's to hand back now."""
        with self.lock:
            self.refused.clear()

    # --- outcomes --------------------------------------------------------------------------------------
    def ended(
        self, run: ActiveRun, *, take_lock: Callable[[], bool]
    ) -> tuple[bool, LockWatchdog | None]:
        """The run's first outcome is queued: it is no longer active, its body slot frees, its
        outcome counts as unwritten. Returns (whether this was its first outcome, the job lock
        taken from it when ``take_lock()`` says the body is over)."""
        with self.lock:
            if run.completed:
                return False, None
            run.completed = True
            self.active.pop(run.execution.pk, None)
            self.free_body_slot_locked(run)
            self.unwritten += 1
            self.finishing.add(run.execution.pk)
            lock = None
            if take_lock():
                lock, run.lock = run.lock, None
            elif run.lock is not None:
                self.finishing_locks[run.execution.pk] = run.lock
            return True, lock

    def written(self, execution_ids: list[int]) -> None:
        with self.lock:
            self.unwritten -= len(execution_ids)
            self.finishing.difference_update(execution_ids)
            self.released.difference_update(execution_ids)

    def take_all_running(self) -> list[ActiveRun]:
        """Every run still going, ended here (a drain past its grace)."""
        with self.lock:
            runs = [run for run in self.active.values() if not run.completed]
            for run in runs:
                run.completed = True
                self.active.pop(run.execution.pk, None)
                self.released.discard(run.execution.pk)
                self.free_body_slot_locked(run)
        return runs

    # --- the self-audit's view ---------------------------------------------------------------------
    def tracked(self) -> tuple[set[int], set[str]]:
        """Every run this node tracks, and the prefixes of its claims in flight."""
        with self.lock:
            tracked = (
                set(self.claimed)
                | set(self.active)
                | self.finishing
                | {item.execution.pk for item in self.timer_heap}
                | {waiting.item.execution.pk for waiting in self.waiting}
            )
            return tracked, set(self.claims_in_flight)

    def launched_here(self, prefix: str, execution_id: int) -> tuple[bool, bool]:
        """(Claimed by this process, made active by it) for a row's claim prefix and id."""
        with self.lock:
            return prefix in self.own_prefixes, execution_id in self.launched

    def idle(self) -> bool:
        """Nothing running, nothing being prepared, every outcome written."""
        with self.lock:
            in_heap = {item.execution.pk for item in self.timer_heap}
            preparing = self.claimed - in_heap
            return (
                not self.active
                and self.unwritten == 0
                and not preparing
                and not self.claims_in_flight
            )
