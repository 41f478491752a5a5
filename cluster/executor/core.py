"""The executor: claims a node's share of the due executions, admits each at its due instant, has a
runner execute it, supervises it and writes its outcome. The rooms it is built from:

    facts.py       what admission decides on, gathered per batch (lock, blockers, older fires)
    runners.py     how an admitted body runs (a thread; a child process) and waits for its instant
    supervisor.py  when a running run is over though its body has not said so
    finisher.py    outcomes written in batches
    output.py      a task thread's prints captured into its run's output
    runs.py        what is tracked about a run, and the reasons recorded

Every time it reads comes from an injected clock (``cluster.clock``), and every loop has a step
that does one pass (``starter_step``, ``supervise_once``, ``Finisher.flush``): threads for a node,
the steps themselves for a deterministic test harness.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)

from cluster import admission, node_metrics, tracing
from cluster.admission import Decision, HandBack, Lock, Skip, Start, Wait
from cluster.clock import Clock, SystemClock
from cluster.coordination import (
    CoordinationBackend,
    LockKeeper,
    LockWatchdog,
)
from cluster.executor import facts as gather
from cluster.executor.finisher import Finisher
from cluster.executor.output import install_output_capture
from cluster.executor.runners import Runner, ThreadRunner
from cluster.executor.runs import (
    REASON_CANCELLED,
    REASON_SHUT_DOWN,
    REASON_UNTRACKED,
    ActiveRun,
    Outcome,
    Scheduled,
    Waiting,
)
from cluster.executor.supervisor import verdict
from cluster.membership import Membership
from jobs import executions
from jobs.models import ConcurrencyPolicy, Isolation, JobExecution
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus
# A claimed execution is admitted this long before it is due, to take locks and mark it running,
# so that the task itself starts on the due instant.
PREPARE_AHEAD_S = 0.25
# Waiting runs whose next look falls within this window are looked at in one batch (seconds).
WAIT_COALESCE_S = 0.05
# A body starts only while its job lock stays valid at least this much longer (seconds).
LOCK_START_MARGIN_S = 0.2
SUPERVISE_INTERVAL_S = 0.05
CANCEL_GRACE_S = 2.0
PROCESS_REAP_S = 2.0
# How many runs refused for an unreachable database a presence names at most.
REFUSED_REMEMBERED = 256
HAND_BACK_ATTEMPTS = 5
# A row this node holds but does not track is a leftover once it is this old (seconds).
RECONCILE_AFTER_S = 5.0
# A run whose admission batch failed (the database went away) is looked at again after this, up to
# ADMISSION_ATTEMPTS times; then it is left to ``reconcile``. Keeping it tracked means no other run of
# its job waits RECONCILE_AFTER_S behind a claim nobody would act on.
ADMISSION_RETRY_S = 0.5
ADMISSION_ATTEMPTS = 20
# The starter's longest sleep when nothing is claimed (it is woken by a claim).
STARTER_IDLE_S = 0.5
# Threads admitting batches at once, at most (each holds one database connection while it runs).
# A thread is started per batch up to this many; beyond, batches queue for the next one free. Not
# a fixed pool of two: a batch stuck on a connection cut mid-query (up to the database read
# timeout) must not hold up the batches behind it (a chaos run saw runs 35 s late that way).
PREPARE_WORKERS = 4
# Policies whose runs look at other runs of their job (and forbid's at the job lock) before they
# start: never started in the claim's own transaction.
# How many of its latest active runs a node remembers for its self-audit (see reconcile).
LAUNCHED_REMEMBERED = 100_000
GUARDED_POLICIES = (ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE)
# A node behind (its last claim took all it asked for, of runs already due: more are waiting)
# claims again once this share of its capacity is free, or CLAIM_GATHER_S after the first slot
# freed, rather than at each slot: a claim costs about the same whatever its size (five round
# trips and the statements' own work), and in a burst of short runs a node that claimed a few
# at a time spent more of the machine on claiming than on running them.
CLAIM_GATHER_SHARE = 0.5
CLAIM_GATHER_S = 0.005
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


class Executor:
    """Claims and runs executions for one node, within ``capacity``.

    The hot path is batched: claims are one transaction per poll; executions due together are
    admitted together (one query for blocking runs, one conditional UPDATE to ``running``) shortly
    before they are due, and their bodies are released at the due instant; outcomes are written by
    the finisher, many per transaction. The supervisor enforces timeouts and cancel requests.
    """

    def __init__(
        self,
        *,
        node_id: str,
        queues: list[str],
        capacity: int,
        backend: CoordinationBackend,
        membership: Membership,
        heartbeat_s: float,
        lookahead_s: float = 1.0,
        clock: Clock | None = None,
        runner: Runner | None = None,
        inline: bool = False,
    ) -> None:
        self.node_id = node_id
        self.queues = queues
        self.capacity = capacity
        self.backend = backend
        self.membership = membership
        self.heartbeat_s = heartbeat_s
        self.clock = clock or SystemClock()
        self.runner = runner or ThreadRunner()
        # Admission batches run in the starter's caller rather than a thread of their own (a
        # stepped executor: everything happens in the test's thread, in order).
        self.inline = inline
        # A job lock lives as long as a presence: a dead node's locks free when it is declared dead.
        self.job_lock_ttl_ms = int(membership.ttl_s * 1000)
        self.lookahead_s = lookahead_s
        self._lock = threading.Lock()
        self._timer_heap: list[Scheduled] = []
        self._waiting: list[Waiting] = []
        self._seq = 0
        self._active: dict[int, ActiveRun] = {}
        self._claimed: set[int] = set()
        # Bodies started and not yet ended (at most ``capacity``), and the condition a run beyond
        # them waits on (see OVERFLOW_SHARE).
        self._bodies = 0
        self._body_ended = threading.Condition(self._lock)
        self.finisher = Finisher(self.clock, self._written, running=self._running_runs)
        # One thread keeps every job lock of this node alive (not one per lock).
        self.keeper = LockKeeper(backend)
        self.keeper.kept = self._kept_locks
        self._unwritten = 0
        # Runs whose outcome is queued for the finisher (still running in the database).
        self._finishing: set[int] = set()
        self._wake_starter = threading.Event()
        self._prepare_queue: queue.Queue[list[Scheduled]] = queue.Queue()
        self._preparers = 0  # admission threads running
        # Called when capacity frees (an outcome written, a claim given up): the node's claim
        # loop looks again at once instead of at its next poll.
        self.on_room: Callable[[], None] = lambda: None
        # Claim gathering (see CLAIM_GATHER_SHARE): whether the last claim left runs due behind
        # it, when room first freed since, and how long the claim loop may wait before it looks
        # again (None: until it is woken, or its poll).
        self._behind = False
        self._room_since: float | None = None
        self.next_claim_in: float | None = None
        self.claiming = True
        # Whether this node can write to its database now (the node's health). A body never
        # starts while it cannot: its node says which bodies run in its presence, and the leader
        # takes the rest of its work (cluster.reaper.read_cut_off).
        self.database_able: Callable[[], bool] = lambda: True
        # Runs made active but refused at their start while the database was unreachable (their
        # rows still say running): the presence names them so the leader hands them back.
        self._refused: OrderedDict[int, None] = OrderedDict()
        # Why this node claims nothing for now, when its node says so (a database path far
        # slower than a peer's); None: it claims.
        self.held_back: str | None = None
        # Why the last claim pass took nothing (None when it claimed, or failed).
        self.idle_reason: str | None = None
        # Claim token prefixes of claims in flight (their rows are not tracked yet).
        self._claims_in_flight: set[str] = set()
        # Runs this node made active (their bodies may have started), newest last.
        self._launched: OrderedDict[int, None] = OrderedDict()
        # Claim token prefixes of this process's own claims, newest last (not a previous process
        # that ran under the same node id: its bodies may have run).
        self._own_prefixes: OrderedDict[str, None] = OrderedDict()
        install_output_capture()

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=UTC)

    # --- bookkeeping ----------------------------------------------------------------------------
    @property
    def running_count(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def load(self) -> int:
        """Claimed + running (+ outcomes not yet written, see below): what counts against capacity.

        Runs in the waiting room count only beyond a second budget of ``capacity``: runs waiting
        their turn (an older fire of their job first, a lock about to free) must never fill a
        node so that the run they wait for cannot be claimed by anyone (a deadlock of capacity).
        Outcomes waiting for the finisher count only beyond a budget of ``capacity`` too: their
        bodies are over and their locks released, so a finisher a little behind (a batch in
        flight, a database slow for a moment) must not stop the node claiming; one far behind
        does."""
        with self._lock:
            return self._load_locked()

    def _overflow_locked(self) -> int:
        """How many runs beyond ``capacity`` the node may claim now (``_lock`` held): a share of
        it while no body runs (runs claimed ahead of an instant), none while any does (a node
        busy with long bodies must leave what it cannot start to nodes with room)."""
        if self._bodies:
            return 0
        return int(self.capacity * OVERFLOW_SHARE)

    def _load_locked(self) -> int:
        """``load``, with ``_lock`` held by the caller."""
        waiting = len(self._waiting)
        return (
            len(self._claimed)
            - waiting
            + max(0, waiting - self.capacity)
            + len(self._active)
            + max(0, self._unwritten - self.capacity)
        )

    def snapshot(self) -> dict[str, int]:
        """What is tracked, by kind (for a log line saying why a node claims nothing)."""
        with self._lock:
            return {
                "claimed": len(self._claimed),
                "waiting": len(self._waiting),
                "timed": len(self._timer_heap),
                "running": len(self._active),
                "bodies": self._bodies,
                "unwritten": self._unwritten,
                "admitting": self._preparers,
                "queued_batches": self._prepare_queue.qsize(),
            }

    def _kept_locks(self) -> set[int] | None:
        """The lock keeper's question. While the database is unreachable only the locks of
        running bodies are kept: a lock taken for a run that cannot be written to start (an
        admission stuck in a hung statement, a run waiting for its instant) would hold its job
        on every node for as long as the partition lasts."""
        if self.database_able():
            return None
        with self._lock:
            return {
                id(run.lock)
                for run in self._active.values()
                if run.lock is not None and run.body_slot and not run.completed
            }

    def body_ids(self) -> list[int]:
        """Runs whose bodies hold a slot (started, or starting now), and have not ended."""
        with self._lock:
            return [pk for pk, run in self._active.items() if run.body_slot and not run.completed]

    def refused_ids(self) -> list[int]:
        """Runs refused at their start while the database was unreachable (newest last)."""
        with self._lock:
            return list(self._refused)

    def forget_refused(self) -> None:
        """The database answers again: refused runs are the self-audit's to hand back now."""
        with self._lock:
            self._refused.clear()

    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._active)

    def _running_runs(self) -> list[ActiveRun]:
        with self._lock:
            return list(self._active.values())

    # --- claiming ---------------------------------------------------------------------------------
    def claim_once(self) -> int:
        """Claim what fits; returns the number claimed. Called by the node's claim loop. Why a
        pass took nothing is kept in ``idle_reason`` (the node logs one that lasts)."""
        node_metrics.claim_pass()
        self.next_claim_in = None
        if not self.claiming:
            self.idle_reason = "draining"
            return 0
        if not self.membership.confirmed():
            # A node that cannot show it is still a member claims nothing it could not start.
            self.idle_reason = "membership unconfirmed"
            return 0
        if self.held_back is not None:
            self.idle_reason = self.held_back
            return 0
        # Room and the gathering state change together, under the lock that a run's completion
        # takes to decide whether to wake this loop (``_room``): a wake-up cannot be lost between
        # them.
        with self._lock:
            free = self.capacity + self._overflow_locked() - self._load_locked()
            wait = self._gather_wait(free) if free > 0 else 0.0
            if free <= 0 or wait <= 0:
                self._room_since = None
        if free <= 0:
            self.idle_reason = "full"
            return 0
        if wait > 0:
            self.idle_reason = "gathering room"
            self.next_claim_in = wait
            return 0
        self.idle_reason = None
        prefix = executions.new_claim_prefix()
        with self._lock:
            # Until its rows are tracked, the self-audit leaves this claim's rows alone.
            self._claims_in_flight.add(prefix)
            self._own_prefixes[prefix] = None
            if len(self._own_prefixes) > LAUNCHED_REMEMBERED:
                self._own_prefixes.popitem(last=False)
        try:
            return self._claim(free, prefix)
        finally:
            with self._lock:
                self._claims_in_flight.discard(prefix)

    def _gather_threshold(self) -> int:
        return max(1, int(self.capacity * CLAIM_GATHER_SHARE))

    def _gather_wait(self, free: int) -> float:
        """Seconds the claim loop waits for more room before claiming ``free`` slots (0: now).
        With ``_lock`` held."""
        if not self._behind or free >= self._gather_threshold():
            return 0.0
        now = self.clock.monotonic()
        if self._room_since is None:
            self._room_since = now
        return max(0.0, self._room_since + CLAIM_GATHER_S - now)

    def _room(self) -> None:
        """Room freed: wake the claim loop, unless it is gathering and the room is not yet worth a
        claim (it comes back by itself within CLAIM_GATHER_S)."""
        with self._lock:
            gathering = (
                self._behind
                and self._room_since is not None
                and self.capacity - self._load_locked() < self._gather_threshold()
            )
        if not gathering:
            self.on_room()

    def _claim(self, free: int, prefix: str) -> int:
        epoch = self.membership.epoch
        now = self._now()
        began = time.monotonic()
        claimed = executions.claim_batch(
            node_id=self.node_id,
            queues=self.queues,
            limit=free,
            horizon=now + timedelta(seconds=self.lookahead_s),
            now=now,
            start_now=self._startable_at_claim,
            prefix=prefix,
        )
        node_metrics.claim(len(claimed), time.monotonic() - began)
        if claimed and tracing.enabled():
            tracing.claims(claimed, start=now, end=self.clock.now(), node=self.node_id)
        # Behind: every slot asked for was filled, and with runs due already (not claimed ahead
        # of their instant): more are likely waiting.
        behind = (
            len(claimed) == free
            and free > 0
            and max(execution.run_after for execution in claimed) <= now
        )
        with self._lock:
            self._behind = behind
        if not claimed:
            self.idle_reason = "nothing due"
            return 0
        started: list[ActiveRun] = []
        with self._lock:
            # A drain that began while the claim waited for the database (SQLite's write
            # lock) has already emptied the heap: these go straight back, not into it.
            keep = self.claiming
            for execution in claimed if keep else ():
                due = execution.run_after.timestamp()
                if execution.status == S.RUNNING:
                    run = ActiveRun(execution=execution, due=due, epoch=epoch)
                    self._track_active(run)
                    started.append(run)
                    continue
                self._claimed.add(execution.pk)
                self._seq += 1
                heapq.heappush(self._timer_heap, Scheduled(due, self._seq, execution, epoch))
        if not keep:
            for execution in claimed:
                if execution.status == S.RUNNING:
                    executions.hand_back_unstarted(execution)
                else:
                    executions.hand_back(execution)
            return 0
        if started:
            self.runner.launch(self, started)
        if len(started) < len(claimed):
            self._wake_starter.set()
        return len(claimed)

    def _trace_run(self, outcome: Outcome) -> None:
        """The start (claimed to body start) and run (the body) spans of a run's trace."""
        execution = outcome.run.execution
        attributes = {"scheduler.node": self.node_id, "scheduler.job": execution.job.name}
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
            end=outcome.ended or self.clock.now(),
            attributes={**attributes, "scheduler.outcome": outcome.status},
            error=outcome.error or None,
            parent_span_id=parent,
        )

    def _startable_at_claim(self, claimed: list[JobExecution]) -> list[JobExecution]:
        """The claimed runs that start in the claim's own transaction: due already, of a job
        with no concurrency guard (no job lock to take, no other run to look at), not so late that
        a later fire of its job may have overtaken it, and admitted on the facts of the run alone
        (not a stale misfire). The rest go to the starter."""
        if not self.claiming:
            return []
        now = self.clock.now()
        instant = datetime.fromtimestamp(now, tz=UTC)
        picks = []
        for execution in claimed:
            due = execution.run_after.timestamp()
            if due > now or execution.job.concurrency_policy in GUARDED_POLICIES:
                continue
            if gather.may_be_overtaken(execution, now=instant):
                continue
            decision = admission.admit(
                gather.facts(execution, due=due, now=now, claiming=self.claiming)
            )
            if isinstance(decision, Start):
                picks.append(execution)
        return picks

    def reconcile(self, *, now: datetime | None = None) -> tuple[int, int]:
        """Self-audit: rows this node holds in the database but no longer tracks (an error in the
        hot path, a database outage in the middle of a batch) are given back: a claimed, unstarted
        run goes back to the queue, a running one nobody here runs is ended ``lost`` (retried per
        policy). Only rows older than RECONCILE_AFTER_S, so a claim or a start in flight is never
        mistaken for a leftover. Returns (handed back, ended lost)."""
        now = now or self._now()
        cutoff = now - timedelta(seconds=RECONCILE_AFTER_S)
        with self._lock:
            tracked = (
                set(self._claimed)
                | set(self._active)
                | self._finishing
                | {item.execution.pk for item in self._timer_heap}
                | {waiting.item.execution.pk for waiting in self._waiting}
            )
            in_flight = set(self._claims_in_flight)

        def untracked(rows: Any) -> list[JobExecution]:
            return [
                row
                for row in rows.exclude(pk__in=tracked)
                if executions.claim_prefix_of(row.claim_token) not in in_flight
            ]

        # No order: the model's default (by fire slot) let MariaDB walk the whole table along the
        # (job, slot, attempt) index instead of taking this node's rows from (status, node).
        mine = JobExecution.objects.select_related("job").filter(node=self.node_id).order_by()
        claims = untracked(
            mine.filter(status=S.PENDING, claim_token__isnull=False, claimed_at__lt=cutoff)
        )
        handed_back = sum(executions.hand_back(execution) for execution in claims)
        lost = 0
        for execution in untracked(mine.filter(status=S.RUNNING, started_at__lt=cutoff)):
            with self._lock:
                never_started = (
                    executions.claim_prefix_of(execution.claim_token) in self._own_prefixes
                    and execution.pk not in self._launched
                )
            if never_started:
                # Claimed by this process and marked running (a claim's own start, a batch whose
                # commit's answer was lost), but never made active here: no body of it ran.
                # Back to the queue, not lost. (A row of an earlier process under this node id
                # may have run: it is lost, as before.)
                handed_back += executions.hand_back_unstarted(execution)
                continue
            with transaction.atomic():
                lost += executions.declare_lost(
                    execution,
                    reason=REASON_UNTRACKED.format(node=self.node_id),
                    now=now,
                )
        if handed_back or lost:
            logger.warning(
                "reconciled: %d untracked claims handed back, %d untracked runs ended lost",
                handed_back,
                lost,
                extra={"node": self.node_id},
            )
        return handed_back, lost

    def on_membership_lapse(self) -> int:
        """This node's presence had expired: the cluster may have taken what it claimed. Hand the
        unstarted claims back (conditionally); runs being prepared fail the epoch check at start."""
        return self.release_unstarted()

    def release_unstarted(self) -> int:
        """Hand every claimed-but-unstarted execution back (drain, shutdown)."""
        with self._lock:
            pending = [item.execution for item in self._timer_heap]
            pending += [waiting.item.execution for waiting in self._waiting]
            self._timer_heap.clear()
            self._waiting.clear()
        count = 0
        for execution in pending:
            if executions.hand_back(execution):
                count += 1
            with self._lock:
                self._claimed.discard(execution.pk)
        return count

    # --- the starter: admission shortly before the due instant -----------------------------------
    def run_starter(self, stop: threading.Event) -> None:
        """The starter loop (``starter_step`` until stopped); also starts the finisher, the
        supervisor and the lock keeper threads."""
        threads = [
            ("finisher", self.finisher.run),
            ("supervisor", self._supervise),
            ("locks", self.keeper.run),
        ]
        for name, target in threads:
            threading.Thread(
                target=target, args=(stop,), name=f"{self.node_id}:{name}", daemon=True
            ).start()
        while not stop.is_set():
            delay = self.starter_step()
            if delay > 0:
                self._wake_starter.wait(delay)
                self._wake_starter.clear()

    def _dispatch(self, batch: list[Scheduled]) -> None:
        """Admit ``batch`` in a thread of its own, or queue it when PREPARE_WORKERS threads are
        already admitting (the first of them to finish takes it)."""
        with self._lock:
            spawn = self._preparers < PREPARE_WORKERS
            if spawn:
                self._preparers += 1
            else:
                self._prepare_queue.put(batch)
        if spawn:
            threading.Thread(
                target=self._preparer, args=(batch,), name=f"{self.node_id}:prepare", daemon=True
            ).start()

    def _preparer(self, batch: list[Scheduled] | None) -> None:
        """Admit ``batch``, then whatever queued meanwhile; end (and close the connection) when
        nothing is left."""
        try:
            while batch is not None:
                try:
                    self._prepare_batch(batch)
                except Exception:
                    logger.exception("admission of a batch failed", extra={"node": self.node_id})
                    close_old_connections()
                try:
                    batch = self._prepare_queue.get_nowait()
                except queue.Empty:
                    batch = None
        finally:
            connection.close()
            with self._lock:
                self._preparers -= 1
                # A batch queued between our last look and this line has no thread yet.
                leftover = None
                if self._preparers < PREPARE_WORKERS:
                    try:
                        leftover = self._prepare_queue.get_nowait()
                    except queue.Empty:
                        leftover = None
                    if leftover is not None:
                        self._preparers += 1
            if leftover is not None:
                threading.Thread(
                    target=self._preparer,
                    args=(leftover,),
                    name=f"{self.node_id}:prepare",
                    daemon=True,
                ).start()

    def wake_starter(self) -> None:
        """Make the starter look now (new work; or its stop event was set and it should end)."""
        self._wake_starter.set()

    def starter_step(self) -> float:
        """Take the claimed runs due within PREPARE_AHEAD_S, and the waiting runs due for another
        look, as one batch and admit it (in a thread of its own, or here if ``inline``). Returns
        the seconds until the next batch is due."""
        now = self.clock.now()
        batch: list[Scheduled] = []
        with self._lock:
            while self._timer_heap and self._timer_heap[0].due <= now + PREPARE_AHEAD_S:
                batch.append(heapq.heappop(self._timer_heap))
            # Waiting runs due for another look soon are looked at together.
            while self._waiting and self._waiting[0].look_at <= now + WAIT_COALESCE_S:
                batch.append(heapq.heappop(self._waiting).item)
            instants = []
            if self._timer_heap:
                instants.append(self._timer_heap[0].due - PREPARE_AHEAD_S)
            if self._waiting:
                instants.append(self._waiting[0].look_at)
        if batch:
            if self.inline:
                self._prepare_batch(batch)
            else:
                self._dispatch(batch)
        if not instants:
            return STARTER_IDLE_S
        return max(0.0, min(instants) - now)

    def _prepare_batch(self, batch: list[Scheduled]) -> None:
        """``_admit_batch``; if it fails (the database or the lock service went away in the
        middle), the runs it had not settled go back to the waiting room and are admitted again
        ADMISSION_RETRY_S later, so they start as soon as the database answers. A run that keeps
        failing (ADMISSION_ATTEMPTS) stops counting against capacity: a failed batch must never
        leak capacity until the node claims nothing at all. Its row, still claimed by this node,
        is given back by ``reconcile``."""
        settled: set[int] = set()
        held: dict[int, LockWatchdog] = {}
        try:
            self._admit_batch(batch, settled, held)
        except Exception:
            unsettled = [item for item in batch if item.execution.pk not in settled]
            # A job lock kept alive by its watchdog for a run that will not start would block
            # every later run of the job for as long as this node lives.
            for item in unsettled:
                if item.execution.pk in held:
                    self._release_lock(held[item.execution.pk])
            retried = 0
            for item in unsettled:
                item.failures += 1
                if item.failures < ADMISSION_ATTEMPTS and self.claiming:
                    self._wait(item, self.clock.now() + ADMISSION_RETRY_S)
                    retried += 1
                else:
                    self._forget(item.execution.pk)
            logger.exception(
                "admission of %d runs failed; %d to try again, %d left to reconcile",
                len(batch),
                retried,
                len(unsettled) - retried,
                extra={"node": self.node_id},
            )

    def _admit_batch(
        self, batch: list[Scheduled], settled: set[int], held: dict[int, LockWatchdog]
    ) -> None:
        """Admission for a batch of claimed runs: the facts are gathered for the whole batch (a
        job lock attempt per forbid run, one query for blocking runs, one read of live nodes, one
        query for older fires), each run is admitted (``cluster.admission``), the ones to start are
        marked running in one statement per instant, and the ones told to wait go back to the
        waiting room, not to a thread of their own: a node that is behind pays less per run, not
        more."""
        now = self.clock.now()
        newer = gather.newer_due(batch, now=self._now())
        candidates: list[Scheduled] = []
        for item in batch:
            newer_due = newer.get(item.execution.pk, 0)
            facts = gather.facts(
                item.execution, due=item.due, now=now, claiming=self.claiming, newer_due=newer_due
            )
            if admission.decided_without_the_job(facts) or not self.claiming:
                self._apply(item.execution, admission.admit(facts))
                settled.add(item.execution.pk)
                continue
            candidates.append(item)
        guarded = [
            item
            for item in candidates
            if item.execution.job.concurrency_policy
            in (ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE)
        ]
        forbid = [
            item
            for item in guarded
            if item.execution.job.concurrency_policy == ConcurrencyPolicy.FORBID
        ]
        blockers = gather.blockers(
            guarded,
            backend=self.backend,
            ttl_s=self.membership.ttl_s,
            heartbeat_s=self.heartbeat_s,
            now=self._now(),
        )
        older = gather.older_waiting(forbid, now=self._now())
        # The job lock is tried only by a run that could start: runs behind an older fire would
        # only take it from the run they wait for (a lock taken and dropped ten times a second by
        # every waiting run starves the one that could go). A run behind a recorded blocker does
        # try: the lock says whether that blocker's body has really not ended.
        lockers = [item.execution for item in forbid if item.execution.pk not in older]
        locks: dict[int, tuple[Lock, LockWatchdog | None]] = dict.fromkeys(
            older, (Lock.NOT_TRIED, None)
        )
        locks.update(
            zip(
                (execution.pk for execution in lockers),
                gather.try_job_locks(self.backend, lockers, self.job_lock_ttl_ms, self.keeper),
                strict=True,
            )
        )
        held.update((pk, lock) for pk, (_, lock) in locks.items() if lock is not None)
        starts: list[tuple[Scheduled, LockWatchdog | None]] = []
        now = self.clock.now()
        for item in candidates:
            execution = item.execution
            state, lock = locks.get(execution.pk, (Lock.NOT_NEEDED, None))
            blocker = blockers.get(execution.job_id)
            decision = admission.admit(
                gather.facts(
                    execution,
                    due=item.due,
                    now=now,
                    claiming=self.claiming,
                    lock=state,
                    blocker=blocker,
                    older_waiting=execution.pk in older,
                    older_unclaimed=older.get(execution.pk, False),
                    seen_blocker=item.seen_blocker,
                    newer_due=newer.get(execution.pk, 0),
                )
            )
            item.seen_blocker = blocker.execution_id if blocker is not None else None
            if isinstance(decision, Start):
                starts.append((item, lock))
                continue
            if lock is not None:
                self._release_lock(lock)
            if isinstance(decision, Wait):
                self._wait(item, now + decision.seconds)
            else:
                self._apply(execution, decision)
            settled.add(execution.pk)
        if starts:
            self._start(starts)
            settled.update(item.execution.pk for item, _ in starts)

    def _wait(self, item: Scheduled, until: float) -> None:
        """Into the waiting room: the starter looks at it again at ``until`` (wall clock)."""
        with self._lock:
            self._seq += 1
            heapq.heappush(self._waiting, Waiting(until, self._seq, item))
        self._wake_starter.set()

    def _start(self, starts: list[tuple[Scheduled, LockWatchdog | None]]) -> None:
        """Mark the admitted runs running (one statement per due instant) and launch them."""
        if not self.claiming:
            # Draining: nothing new starts; the batch goes back to the queue for another node.
            for item, lock in starts:
                if lock is not None:
                    self._release_lock(lock)
                executions.hand_back(item.execution)
                self._forget(item.execution.pk)
            return
        # Marked running just before the due instant, one statement per planned start (runs
        # already due share one: now), all in one transaction: one commit per batch, not one per
        # run (runs enqueued together are due a microsecond apart, and a commit costs
        # milliseconds). A row cancelled or taken meanwhile does not match and does not start.
        now = self.clock.now()
        by_planned: dict[float, list[Scheduled]] = {}
        for item, _ in starts:
            by_planned.setdefault(max(item.due, now), []).append(item)
        won: set[int] = set()
        # One instant (the usual case) is one statement, committed by itself.
        with contextlib.nullcontext() if len(by_planned) == 1 else transaction.atomic():
            for planned, group in by_planned.items():
                won |= executions.start_batch(
                    [item.execution for item in group],
                    planned=datetime.fromtimestamp(planned, tz=UTC),
                )
        runs: list[ActiveRun] = []
        for item, lock in starts:
            execution = item.execution
            if execution.pk not in won:
                logger.info("execution %s was cancelled or taken before it started", execution.pk)
                if lock is not None:
                    self._release_lock(lock)
                self._forget(execution.pk)
                continue
            run = ActiveRun(execution=execution, due=item.due, lock=lock, epoch=item.epoch)
            with self._lock:
                self._claimed.discard(execution.pk)
                self._track_active(run)
            runs.append(run)
        if runs:
            self.runner.launch(self, runs)

    def _track_active(self, run: ActiveRun) -> None:
        """(Under the lock.) The run may start its body from now on: it is active, and the
        self-audit will count it as having run if its row is ever left untracked."""
        pk = run.execution.pk
        self._active[pk] = run
        self._launched[pk] = None
        if len(self._launched) > LAUNCHED_REMEMBERED:
            self._launched.popitem(last=False)

    def _forget(self, execution_id: int) -> None:
        with self._lock:
            self._claimed.discard(execution_id)
        self._room()

    def _apply(self, execution: JobExecution, decision: Decision) -> None:
        """Carry out a decision other than Start for a claimed, unstarted run."""
        if isinstance(decision, Skip):
            executions.skip(execution, reason=decision.reason, now=self._now())
        elif isinstance(decision, HandBack):
            run_after = (
                None
                if decision.after_s is None
                else self._now() + timedelta(seconds=decision.after_s)
            )
            executions.hand_back(execution, run_after=run_after)
        self._forget(execution.pk)

    # --- what runners call: the self-fence and the outcome --------------------------------------
    def may_start(self, run: ActiveRun) -> bool:
        """The self-fence, checked on this node's own clock just before the body starts: its
        membership confirmed without a lapse since the run was claimed, and the job lock (if any)
        valid for a margin yet. Otherwise the run is given up: handed back to the queue if the
        cluster has not taken it already (the write is conditional on the claim).

        First the run takes a body slot: a run claimed beyond capacity (OVERFLOW_SHARE) waits for
        one of the node's bodies to end, at most OVERFLOW_WAIT_S, and is given up if none does."""
        room = self._take_body_slot(run)
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
        database_ok = self.database_able()
        if room and lock_ok and database_ok and self.membership.confirmed(run.epoch):
            return True
        with self._lock:
            self._free_body_slot(run)
            if run.completed:
                return False
            run.completed = True
            self._active.pop(run.execution.pk, None)
            # No body of it ran: the self-audit hands its row back rather than ending it lost.
            self._launched.pop(run.execution.pk, None)
            if not database_ok:
                self._refused[run.execution.pk] = None
                while len(self._refused) > REFUSED_REMEMBERED:
                    self._refused.popitem(last=False)
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
                    time.sleep(0.2 * (attempt + 1))
        finally:
            if lock is not None:
                self._release_lock(lock)
        if not room:
            why = f"no body of this node ended within {OVERFLOW_WAIT_S} s (it is at capacity)"
        elif not database_ok:
            why = "the database is unreachable"
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
            extra={"node": self.node_id, "execution": execution.pk},
        )
        return False

    def _take_body_slot(self, run: ActiveRun) -> bool | None:
        """A body slot for ``run``: True once it has one, False if none freed within
        OVERFLOW_WAIT_S (from its instant, or from when it first asked if that is later), None if
        the run ended meanwhile (nothing is to start)."""
        with self._lock:
            if run.body_slot:
                return True
            if run.room_wait_from is None:
                run.room_wait_from = max(run.due, self.clock.now())
            give_up_at = run.room_wait_from + OVERFLOW_WAIT_S
            while not run.completed and self._bodies >= self.capacity:
                remaining = give_up_at - self.clock.now()
                if remaining <= 0:
                    return False
                # In steps: a cancel of this run (no body of it ends) is seen within one.
                self._body_ended.wait(min(remaining, BODY_WAIT_STEP_S))
            if run.completed:
                return None
            self._bodies += 1
            run.body_slot = True
            return True

    def body_room(self) -> bool:
        """Whether a body may start now without waiting for another to end."""
        with self._lock:
            return self._bodies < self.capacity

    def _free_body_slot(self, run: ActiveRun) -> None:
        """(Under the lock.) The run's body slot, if it holds one, goes to a run waiting for it."""
        if run.body_slot:
            run.body_slot = False
            self._bodies -= 1
            self._body_ended.notify()

    def complete(self, outcome: Outcome, *, body_ended: bool = False) -> bool:
        """Queue the first outcome of a run for the finisher; later ones are dropped.

        When the body is known to have ended (it returned, or its process is gone), the job lock
        is released now, before the outcome is written: the next run of a forbid job may start
        as soon as this body is over, however far behind the finisher is. A thread body given up
        on (timeout, cancel, lock lost) may still be running: its lock goes after the write."""
        run = outcome.run
        lock = None
        with self._lock:
            if run.completed:
                return False
            run.completed = True
            self._active.pop(run.execution.pk, None)
            self._free_body_slot(run)
            self._unwritten += 1
            self._finishing.add(run.execution.pk)
            if body_ended and run.process is None:
                lock, run.lock = run.lock, None
        if run.process is not None:
            if run.process.is_alive():
                run.process.kill()
                run.process.join(PROCESS_REAP_S)  # reap it: no zombie left behind
            body_ended = body_ended or not run.process.is_alive()
            lock = self._take_lock(run) if body_ended else None
        # Metrics and spans are recorded by the finisher's thread (``_written``): a body's thread
        # does as little as it can after the task returns, for the bodies due at the same instant
        # still waiting for the interpreter to start theirs.
        self.finisher.put(outcome)
        if lock is not None:
            self._release_lock(lock)
        # Room again (an outcome waiting for the finisher counts only beyond a budget): the
        # claim loop looks now, not after the outcome's write (runs beyond a full node's
        # capacity at a whole second waited for that write, then for their claim).
        self._room()
        return True

    def _take_lock(self, run: ActiveRun) -> LockWatchdog | None:
        """The run's job lock, taken from it (atomically: whoever takes it releases it, once)."""
        with self._lock:
            lock, run.lock = run.lock, None
        return lock

    def _written(self, batch: list[Outcome]) -> None:
        """The finisher wrote (or gave up on) ``batch``: its locks go, its capacity frees; its
        metrics and spans are recorded."""
        for outcome in batch:
            lock = self._take_lock(outcome.run)
            if lock is not None:
                self._release_lock(lock)
        with self._lock:
            self._unwritten -= len(batch)
            self._finishing.difference_update(o.run.execution.pk for o in batch)
        self._room()
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
                self._trace_run(outcome)

    def _release_lock(self, watchdog: LockWatchdog) -> None:
        self.keeper.release(watchdog)

    # --- the supervisor: timeouts, cancel requests, lost locks ----------------------------------
    def _supervise(self, stop: threading.Event) -> None:
        while not stop.wait(SUPERVISE_INTERVAL_S):
            self.supervise_once()

    def supervise_once(self) -> int:
        """One pass over the running runs; returns how many were judged over."""
        with self._lock:
            runs = list(self._active.values())
        now = self.clock.monotonic()
        ended = 0
        for run in runs:
            outcome = verdict(run, now)
            if outcome is not None:
                ended += self.complete(outcome)
        return ended

    def extend_locks(self) -> None:
        """One pass of the lock keeper (a stepped executor: the keeper has no thread)."""
        self.keeper.step()

    # --- cancel requests and shutdown ------------------------------------------------------------
    def apply_cancel_requests(self) -> int:
        """Signal the runs an operator asked to cancel (one query over this node's running runs)."""
        ids = self.running_ids()
        if not ids:
            return 0
        wanted = list(
            JobExecution.objects.filter(
                pk__in=ids, status=S.RUNNING, cancel_requested=True
            ).values_list("pk", "reason")
        )
        for pk, reason in wanted:
            with self._lock:
                run = self._active.get(pk)
            if run is not None and not run.cancel_event.is_set():
                run.outcome_reason = reason or REASON_CANCELLED
                run.cancel_event.set()
                if run.execution.job.isolation == Isolation.PROCESS:
                    # Recorded as cancelled first, then the child is killed (in complete), so its
                    # death is not mistaken for a failure.
                    self.complete(Outcome(run, S.CANCELLED, reason=run.outcome_reason))
                else:
                    # A task in a thread sees the event and returns with what it has done; the
                    # supervisor records the cancel without it after CANCEL_GRACE_S.
                    run.cancel_deadline = self.clock.monotonic() + CANCEL_GRACE_S
        return len(wanted)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing runs and every outcome is written (real time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.05)
        return self.idle()

    def idle(self) -> bool:
        """Nothing running, nothing being prepared, every outcome written."""
        with self._lock:
            in_heap = {item.execution.pk for item in self._timer_heap}
            preparing = self._claimed - in_heap
            return (
                not self._active
                and self._unwritten == 0
                and not preparing
                and not self._claims_in_flight
            )

    def hand_back_running(self) -> int:
        """After the drain grace period: stop what still runs and record it as lost (retried)."""
        count = 0
        with self._lock:
            runs = [run for run in self._active.values() if not run.completed]
            for run in runs:
                run.completed = True
                self._active.pop(run.execution.pk, None)
                self._free_body_slot(run)
        for run in runs:
            run.cancel_event.set()
            if run.process is not None and run.process.is_alive():
                run.process.kill()
            with transaction.atomic():
                if executions.declare_lost(
                    run.execution,
                    reason=REASON_SHUT_DOWN.format(node=self.node_id),
                    now=self._now(),
                ):
                    count += 1
            lock = self._take_lock(run)
            if lock is not None:
                self._release_lock(lock)
        return count
