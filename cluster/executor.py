"""Every node's work: claim pending executions, start each at its due instant, run, record.

Claim: one transaction takes up to ``limit`` due, unclaimed executions of the node's queues and stamps
each with a fresh claim token (``jobs.executions.claim_batch``). Every later write on that execution
is conditional on the token and the status it leaves (``jobs.executions`` owns them all), so a stale
worker (one declared dead, or paused past its claim) changes nothing; and no body starts unless the
node can show its claim still holds (the self-fence, ``cluster.membership``).

Run: ``thread`` isolation runs the task in a thread of this process (fast; a task that overruns its
timeout is marked ``timed_out`` and abandoned — it cannot be killed); ``process`` isolation runs it in
a child process that is killed on timeout or cancel.

``forbid`` jobs take the job's lock (Redlock on the Redis backend) before they start, held by a
watchdog while they run; if another run of the job holds it, the new run is recorded as skipped.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import logging
import multiprocessing
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from cluster import admission
from cluster.admission import Blocker, Decision, Facts, HandBack, Lock, Skip, Start, Wait
from cluster.child import run_task
from cluster.coordination import CoordinationBackend, CoordinationError, LockWatchdog
from cluster.membership import Liveness, Membership, node_liveness, renewed_at_ms
from cluster.models import NodeStatus, SchedulerNode
from jobs import executions, registry
from jobs.models import ConcurrencyPolicy, Isolation, JobExecution, Trigger
from jobs.schedules import spread_offset
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus
# A claimed execution's thread starts this long before it is due, to take locks and mark it running,
# so that the task itself starts on the due instant.
PREPARE_AHEAD_S = 0.25
# Event.wait may overshoot by a millisecond or so: sleep to this close to the instant, then spin.
SPIN_S = 0.0015
# Waiting runs whose next look falls within this window are looked at in one batch (seconds).
WAIT_COALESCE_S = 0.05
# A gated task also starts by itself this long after its instant if the gate never opens.
GATE_SLACK_S = 0.05
# A body starts only while its job lock stays valid at least this much longer (seconds).
LOCK_START_MARGIN_S = 0.2
SUPERVISE_INTERVAL_S = 0.05
CANCEL_GRACE_S = 2.0
PROCESS_REAP_S = 2.0
# Outcomes written in one transaction at most; one commit for many runs.
FINISH_BATCH = 200
HAND_BACK_ATTEMPTS = 5
# How long outcomes are retried while the database cannot be reached (seconds).
FINISH_RETRY_S = 60.0
REASON_TIMEOUT = "exceeded timeout of {seconds} s"
REASON_LOCK_LOST = "job lock lost while running"
REASON_CANCELLED = "cancelled"
REASON_SHUT_DOWN = "node {node} shut down before the run finished"
REASON_UNTRACKED = "node {node} lost track of the run (an error in its hot path)"
# A row this node holds but does not track is a leftover once it is this old (seconds).
RECONCILE_AFTER_S = 5.0
# A run whose admission batch failed (the database went away) is looked at again after this, up to
# ADMISSION_ATTEMPTS times; then it is left to ``reconcile``. Keeping it tracked means no other run of
# its job waits RECONCILE_AFTER_S behind a claim nobody would act on.
ADMISSION_RETRY_S = 0.5
ADMISSION_ATTEMPTS = 20
REASON_BLOCKER_GONE = "node {node} is gone (its presence expired) while the run was active"


def wait_until(instant: float) -> None:
    """Return at the wall-clock ``instant`` (to well under a millisecond)."""
    remaining = instant - time.time()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while time.time() < instant:
        pass


def due_instant(execution: JobExecution) -> datetime:
    """When the fire was due: its slot plus the job's spread for a scheduled fire (``run_after`` may
    since have moved, e.g. deferred while the lock service was down), else its ``run_after``."""
    if execution.trigger == Trigger.SCHEDULE:
        job = execution.job
        offset = spread_offset(job.name, job.spread_seconds) if job.spread_seconds else 0.0
        return execution.scheduled_for + timedelta(seconds=offset)
    return execution.run_after


def _open_gate(instant: float, gate: threading.Event) -> None:
    wait_until(instant)
    gate.set()


def _wait_for_start(run: ActiveRun) -> None:
    if run.gate is not None:
        run.gate.wait(max(0.0, run.due - time.time()) + GATE_SLACK_S)
    else:
        wait_until(run.due)


# --- running a task ---------------------------------------------------------------------------------


class _ThreadOutput(io.TextIOBase):
    """sys.stdout/stderr replacement that sends a task thread's prints to its own buffer.

    ``print("a", 1)`` arrives as several writes ("a", " ", "1", "\n"): text is kept per thread
    until a newline completes the line, so one print is one line of output."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.local = threading.local()

    def write(self, text: str) -> int:
        context = getattr(self.local, "context", None)
        if context is None:
            return self.original.write(text)
        pending = getattr(self.local, "pending", "") + text
        *lines, pending = pending.split("\n")
        for line in lines:
            if line.strip():
                context.log(line)
        self.local.pending = pending
        return len(text)

    def attach(self, context: registry.TaskContext) -> None:
        self.local.context = context
        self.local.pending = ""

    def detach(self) -> None:
        """The task ended: keep its last, unterminated line, then stop capturing."""
        context = getattr(self.local, "context", None)
        pending = getattr(self.local, "pending", "")
        if context is not None and pending.strip():
            context.log(pending)
        self.local.context = None
        self.local.pending = ""

    def flush(self) -> None:
        if getattr(self.local, "context", None) is None:
            self.original.flush()


_stdout: _ThreadOutput | None = None
_stdout_lock = threading.Lock()


def _install_output_capture() -> _ThreadOutput:
    global _stdout
    with _stdout_lock:
        if _stdout is None:
            _stdout = _ThreadOutput(sys.stdout)
        if sys.stdout is not _stdout:
            # Someone (a test runner, a library) put its own stream back: wrap that one.
            _stdout.original = sys.stdout
            sys.stdout = _stdout
        return _stdout


def _call_task(
    spec: registry.TaskSpec, args: list, kwargs: dict, context: registry.TaskContext
) -> Any:
    if spec.takes_context:
        return spec.func(*args, context=context, **kwargs)
    return spec.func(*args, **kwargs)


@dataclass(order=True)
class _Scheduled:
    due: float
    seq: int
    execution: JobExecution = field(compare=False)
    # The node's membership epoch when it claimed the run: a lapse since voids the claim.
    epoch: int = field(default=0, compare=False)
    # Admission batches that failed with this run in them (the database went away mid-batch).
    failures: int = field(default=0, compare=False)


@dataclass(order=True)
class _Waiting:
    """A claimed run admission told to wait (a job lock about to free, an older fire first)."""

    look_at: float
    seq: int
    item: _Scheduled = field(compare=False)


@dataclass
class ActiveRun:
    execution: JobExecution
    due: float
    cancel_event: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # monotonic; set when the body starts
    lock: LockWatchdog | None = None
    process: Any = None
    context: registry.TaskContext | None = None
    outcome_reason: str = ""
    # Opened at the due instant (shared by the runs due together); None: wait for ``due`` alone.
    gate: threading.Event | None = None
    # After a cancel request, a thread-mode task has until then to return (its output is kept).
    cancel_deadline: float | None = None
    # An outcome was queued: later ones (a late body, a timeout) are dropped.
    completed: bool = False
    epoch: int = 0


@dataclass
class _Outcome:
    run: ActiveRun
    status: str
    result: Any = None
    error: str = ""
    tb: str = ""
    output: str = ""
    reason: str = ""
    started: float | None = None


class Executor:
    """Claims and runs executions for one node, within ``capacity``.

    The hot path is batched: claims are one transaction per poll; executions due together are
    prepared together (one query for blocking runs, one conditional UPDATE to ``running``) shortly
    before they are due, and their task threads are released at the due instant; outcomes are
    written by one finisher thread, many per transaction. A supervisor thread enforces timeouts
    and cancel requests for every run.
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
    ) -> None:
        self.node_id = node_id
        self.queues = queues
        self.capacity = capacity
        self.backend = backend
        self.membership = membership
        self.heartbeat_s = heartbeat_s
        # A job lock lives as long as a presence: a dead node's locks free when it is declared dead.
        self.job_lock_ttl_ms = int(membership.ttl_s * 1000)
        self.lookahead_s = lookahead_s
        self._lock = threading.Lock()
        self._timer_heap: list[_Scheduled] = []
        self._waiting: list[_Waiting] = []
        self._seq = 0
        self._active: dict[int, ActiveRun] = {}
        self._claimed: set[int] = set()
        self._outcomes: queue.Queue[_Outcome] = queue.Queue()
        self._unwritten = 0
        # Runs whose outcome is queued for the finisher (still running in the database).
        self._finishing: set[int] = set()
        self._wake_starter = threading.Event()
        # Called when capacity frees (an outcome written, a claim given up): the node's claim
        # loop looks again at once instead of at its next poll.
        self.on_room: Callable[[], None] = lambda: None
        self.claiming = True
        _install_output_capture()

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
            waiting = len(self._waiting)
            return (
                len(self._claimed)
                - waiting
                + max(0, waiting - self.capacity)
                + len(self._active)
                + max(0, self._unwritten - self.capacity)
            )

    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._active)

    # --- claiming ---------------------------------------------------------------------------------
    def claim_once(self) -> int:
        """Claim what fits; returns the number claimed. Called by the node's claim loop."""
        if not self.claiming or not self.membership.confirmed():
            # A node that cannot show it is still a member claims nothing it could not start.
            return 0
        free = self.capacity - self.load
        if free <= 0:
            return 0
        epoch = self.membership.epoch
        horizon = timezone.now() + timedelta(seconds=self.lookahead_s)
        claimed = executions.claim_batch(
            node_id=self.node_id,
            queues=self.queues,
            limit=free,
            horizon=horizon,
            now=timezone.now(),
        )
        if claimed:
            with self._lock:
                # A drain that began while the claim waited for the database (SQLite's write
                # lock) has already emptied the heap: these go straight back, not into it.
                keep = self.claiming
                for execution in claimed if keep else ():
                    self._claimed.add(execution.pk)
                    self._seq += 1
                    heapq.heappush(
                        self._timer_heap,
                        _Scheduled(execution.run_after.timestamp(), self._seq, execution, epoch),
                    )
            if not keep:
                for execution in claimed:
                    executions.hand_back(execution)
                return 0
            self._wake_starter.set()
        return len(claimed)

    def reconcile(self, *, now: datetime | None = None) -> tuple[int, int]:
        """Self-audit: rows this node holds in the database but no longer tracks (an error in the
        hot path, a database outage in the middle of a batch) are given back: a claimed, unstarted
        run goes back to the queue, a running one nobody here runs is ended ``lost`` (retried per
        policy). Only rows older than RECONCILE_AFTER_S, so a claim or a start in flight is never
        mistaken for a leftover. Returns (handed back, ended lost)."""
        now = now or timezone.now()
        cutoff = now - timedelta(seconds=RECONCILE_AFTER_S)
        with self._lock:
            tracked = (
                set(self._claimed)
                | set(self._active)
                | self._finishing
                | {item.execution.pk for item in self._timer_heap}
                | {waiting.item.execution.pk for waiting in self._waiting}
            )
        mine = JobExecution.objects.select_related("job").filter(node=self.node_id)
        claims = list(
            mine.filter(status=S.PENDING, claim_token__isnull=False, claimed_at__lt=cutoff).exclude(
                pk__in=tracked
            )
        )
        handed_back = sum(executions.hand_back(execution) for execution in claims)
        lost = 0
        for execution in mine.filter(status=S.RUNNING, started_at__lt=cutoff).exclude(
            pk__in=tracked
        ):
            with transaction.atomic():
                lost += executions.end_running(
                    execution,
                    status=S.LOST,
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

    # --- starting at the due instant -------------------------------------------------------------
    def run_starter(self, stop: threading.Event) -> None:
        """Take the claimed executions due within PREPARE_AHEAD_S as one batch, prepare it, and
        let each task start at its due instant. Also runs the finisher and the supervisor."""
        for name, target in (("finisher", self._run_finisher), ("supervisor", self._supervise)):
            threading.Thread(
                target=target, args=(stop,), name=f"{self.node_id}:{name}", daemon=True
            ).start()
        while not stop.is_set():
            now = time.time()
            with self._lock:
                instants = []
                if self._timer_heap:
                    instants.append(self._timer_heap[0].due - PREPARE_AHEAD_S)
                if self._waiting:
                    instants.append(self._waiting[0].look_at)
            if not instants:
                self._wake_starter.wait(0.5)
                self._wake_starter.clear()
                continue
            if min(instants) > now:
                self._wake_starter.wait(min(instants) - now)
                self._wake_starter.clear()
                continue
            batch: list[_Scheduled] = []
            with self._lock:
                while self._timer_heap and self._timer_heap[0].due <= now + PREPARE_AHEAD_S:
                    batch.append(heapq.heappop(self._timer_heap))
                # Waiting runs due for another look soon are looked at together.
                while self._waiting and self._waiting[0].look_at <= now + WAIT_COALESCE_S:
                    batch.append(heapq.heappop(self._waiting).item)
            if batch:
                threading.Thread(
                    target=self._guarded,
                    args=(self._prepare_batch, batch),
                    name=f"{self.node_id}:prepare",
                    daemon=True,
                ).start()

    def _guarded(self, body: Callable[..., None], *args: Any) -> None:
        try:
            body(*args)
        except Exception:
            logger.exception("executor step %s failed", getattr(body, "__name__", body))
        finally:
            connection.close()

    def _prepare_batch(self, batch: list[_Scheduled]) -> None:
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
                    self._wait(item, time.time() + ADMISSION_RETRY_S)
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
        self, batch: list[_Scheduled], settled: set[int], held: dict[int, LockWatchdog]
    ) -> None:
        """Admission for a batch of claimed runs (new ones due within PREPARE_AHEAD_S and waiting
        ones due for another look): the facts are gathered for the whole batch (a job lock attempt
        per forbid run, one query for blocking runs, one read of live nodes, one query for older
        fires), each run is admitted, the ones to start are marked running in one statement per
        instant, and the ones told to wait go back to the waiting room, not to a thread of their
        own: a node that is behind pays less per run, not more."""
        now = time.time()
        candidates: list[_Scheduled] = []
        for item in batch:
            facts = self._facts(item.execution, item.due, now)
            if admission.is_stale(facts) or not self.claiming:
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
        blockers = self._blockers(guarded)
        older = self._older_waiting(forbid)
        # The job lock is tried only by a run that could start: runs behind an older fire would
        # only take it from the run they wait for (a lock taken and dropped ten times a second by
        # every waiting run starves the one that could go). A run behind a recorded blocker does
        # try: the lock says whether that blocker's body has really not ended.
        locks: dict[int, tuple[Lock, LockWatchdog | None]] = {
            item.execution.pk: self._try_job_lock(item.execution)
            if item.execution.pk not in older
            else (Lock.NOT_TRIED, None)
            for item in forbid
        }
        held.update((pk, lock) for pk, (_, lock) in locks.items() if lock is not None)
        starts: list[tuple[_Scheduled, LockWatchdog | None]] = []
        now = time.time()
        for item in candidates:
            execution = item.execution
            state, lock = locks.get(execution.pk, (Lock.NOT_NEEDED, None))
            decision = admission.admit(
                self._facts(
                    execution,
                    item.due,
                    now,
                    lock=state,
                    blocker=blockers.get(execution.job_id),
                    older_waiting=execution.pk in older,
                    older_unclaimed=older.get(execution.pk, False),
                )
            )
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
            self._start_fast(starts)
            settled.update(item.execution.pk for item, _ in starts)

    def _wait(self, item: _Scheduled, until: float) -> None:
        """Into the waiting room: the starter looks at it again at ``until`` (wall clock)."""
        with self._lock:
            self._seq += 1
            heapq.heappush(self._waiting, _Waiting(until, self._seq, item))
        self._wake_starter.set()

    def _start_fast(self, fast: list[tuple[_Scheduled, LockWatchdog | None]]) -> None:
        if not self.claiming:
            # Draining: nothing new starts; the batch goes back to the queue for another node.
            for item, lock in fast:
                if lock is not None:
                    self._release_lock(lock)
                executions.hand_back(item.execution)
                self._forget(item.execution.pk)
            return
        by_due: dict[float, list[tuple[_Scheduled, LockWatchdog | None]]] = {}
        for item, lock in fast:
            by_due.setdefault(item.due, []).append((item, lock))
        won: set[int] = set()
        for due, group in by_due.items():
            # Marked running just before the due instant, all in one statement; a row cancelled
            # or taken meanwhile does not match and its run does not start.
            won |= executions.start_batch(
                [item.execution for item, _ in group],
                planned=datetime.fromtimestamp(max(due, time.time()), tz=UTC),
            )
        # One gate per due instant: a single thread waits for the instant and opens it, and every
        # task due then is released together (many threads spinning on the clock would fight
        # over the GIL and delay each other).
        gates: dict[float, threading.Event] = {}
        for item, lock in fast:
            execution = item.execution
            if execution.pk not in won:
                logger.info("execution %s was cancelled or taken before it started", execution.pk)
                if lock is not None:
                    self._release_lock(lock)
                self._forget(execution.pk)
                continue
            run = ActiveRun(execution=execution, due=item.due, lock=lock, epoch=item.epoch)
            if item.due not in gates:
                gates[item.due] = threading.Event()
                threading.Thread(
                    target=_open_gate, args=(item.due, gates[item.due]), daemon=True
                ).start()
            run.gate = gates[item.due]
            self._activate(run)
            target = (
                self._body_in_process
                if execution.job.isolation == Isolation.PROCESS
                else self._body_in_thread
            )
            threading.Thread(
                target=target, args=(run,), name=f"task-{execution.pk}", daemon=True
            ).start()

    def _forget(self, execution_id: int) -> None:
        with self._lock:
            self._claimed.discard(execution_id)
        self.on_room()

    def _activate(self, run: ActiveRun) -> None:
        with self._lock:
            self._claimed.discard(run.execution.pk)
            self._active[run.execution.pk] = run

    # --- forbid and buffer_one ---------------------------------------------------------------------
    def _blockers(self, items: list[_Scheduled]) -> dict[int, Blocker]:
        """Per job of ``items``: the earliest other RUNNING run that may really be active.

        A run whose node's presence has expired is not active: it is ended as ``lost`` on the
        spot (retried per policy), so a dead node's leftovers never make a policy skip or wait.
        One query for the batch, and one read of the live nodes when any run blocks.
        """
        if not items:
            return {}
        others = list(
            JobExecution.objects.select_related("job")
            .filter(job_id__in={i.execution.job_id for i in items}, status=S.RUNNING)
            .exclude(pk__in=[i.execution.pk for i in items])
            .order_by("started_at", "pk")
        )
        if not others:
            return {}
        try:
            live = self.backend.live_nodes()
        except CoordinationError:
            live = None  # cannot tell: nothing is ended, nothing is certain
        now_ms = int(time.time() * 1000)
        # As for the reaper, an expired presence alone is not death: a coordination store that
        # lost its keys (a Redis restart) must not end live nodes' runs. The node's row must have
        # gone as silent (or say it stopped or died).
        silent_since = timezone.now() - timedelta(seconds=self.membership.ttl_s)
        rows = {
            node_id: (status in (NodeStatus.DEAD, NodeStatus.STOPPED) or beat < silent_since)
            for node_id, status, beat in SchedulerNode.objects.filter(
                node_id__in={o.node for o in others}
            ).values_list("node_id", "status", "last_heartbeat")
        }
        blockers: dict[int, Blocker] = {}
        gone: list[JobExecution] = []
        for other in others:
            state = (
                Liveness.SUSPECT
                if live is None
                else node_liveness(
                    live,
                    other.node,
                    now_ms=now_ms,
                    ttl_s=self.membership.ttl_s,
                    heartbeat_s=self.heartbeat_s,
                )
            )
            if state == Liveness.GONE and not rows.get(other.node, True):
                state = Liveness.SUSPECT
            if state == Liveness.GONE:
                gone.append(other)
            elif other.job_id not in blockers:
                started = other.started_at.timestamp() if other.started_at else None
                # Certain only if its node renewed since the run's start: a run marked running
                # ahead of an instant its node did not live to see (SIGKILLed just before) has
                # no body, though the presence has not expired yet.
                renewed = (
                    None
                    if live is None
                    else renewed_at_ms(live, other.node, ttl_s=self.membership.ttl_s)
                )
                blockers[other.job_id] = Blocker(
                    started_at=started,
                    certain=state == Liveness.ALIVE
                    and started is not None
                    and renewed is not None
                    and renewed >= started * 1000,
                )
        if gone:
            with transaction.atomic():
                for other in gone:
                    executions.end_running(
                        other,
                        status=S.LOST,
                        reason=REASON_BLOCKER_GONE.format(node=other.node or "?"),
                        now=timezone.now(),
                    )
        return blockers

    def _older_waiting(self, items: list[_Scheduled]) -> dict[int, bool]:
        """The runs of ``items`` behind an earlier fire of the same job that is due and not
        started: that one goes first (catch-up runs keep their order). Maps each such run to
        whether one of those earlier fires is held by no node. One query."""
        if not items:
            return {}
        pending = list(
            JobExecution.objects.filter(
                job_id__in={i.execution.job_id for i in items},
                status=S.PENDING,
                run_after__lte=timezone.now(),
            ).values_list("pk", "job_id", "scheduled_for", "claim_token")
        )
        older: dict[int, bool] = {}
        for item in items:
            execution = item.execution
            before = [
                token
                for pk, job_id, scheduled_for, token in pending
                if job_id == execution.job_id
                and scheduled_for < execution.scheduled_for
                and pk != execution.pk
            ]
            if before:
                older[execution.pk] = any(token is None for token in before)
        return older

    def _try_job_lock(self, execution: JobExecution) -> tuple[Lock, LockWatchdog | None]:
        """The job lock, kept alive by a watchdog while held."""
        try:
            handle = self.backend.acquire_lock(f"job:{execution.job_id}", self.job_lock_ttl_ms)
        except CoordinationError as exc:
            logger.warning(
                "job lock for execution %s unavailable (%s)",
                execution.pk,
                exc,
                extra={"execution": execution.pk},
            )
            return Lock.UNAVAILABLE, None
        if handle is None:
            return Lock.TAKEN, None
        return Lock.HELD, LockWatchdog(self.backend, handle, self.job_lock_ttl_ms).start()

    def _facts(self, execution: JobExecution, due: float, now: float, **gathered: Any) -> Facts:
        job = execution.job
        return Facts(
            policy=job.concurrency_policy,
            scheduled=execution.trigger == Trigger.SCHEDULE,
            now=now,
            due=due,
            due_instant=due_instant(execution).timestamp(),
            runnable_since=max(execution.run_after, execution.created_at).timestamp(),
            grace_s=job.misfire_grace_seconds,
            claiming=self.claiming,
            **gathered,
        )

    def _apply(self, execution: JobExecution, decision: Decision) -> None:
        """Carry out a decision other than Start for a claimed, unstarted run."""
        if isinstance(decision, Skip):
            executions.skip(execution, reason=decision.reason, now=timezone.now())
        elif isinstance(decision, HandBack):
            run_after = (
                None
                if decision.after_s is None
                else timezone.now() + timedelta(seconds=decision.after_s)
            )
            executions.hand_back(execution, run_after=run_after)
        self._forget(execution.pk)

    # --- running the task ----------------------------------------------------------------------------
    def _context(self, run: ActiveRun) -> registry.TaskContext:
        execution = run.execution
        return registry.TaskContext(
            execution_id=execution.pk,
            job_name=execution.job.name,
            attempt=execution.attempt,
            scheduled_for=execution.scheduled_for,
            cancel_event=run.cancel_event,
        )

    def _body_in_thread(self, run: ActiveRun) -> None:
        """Wait for the due instant, run the task here, queue the outcome."""
        job = run.execution.job
        context = self._context(run)
        run.context = context
        stdout = _install_output_capture()
        _wait_for_start(run)
        if not self._may_start(run):
            connection.close()
            return
        if job.timeout_seconds:
            run.deadline = time.monotonic() + job.timeout_seconds
        stdout.attach(context)
        started = time.time()
        try:
            try:
                spec = registry.get_task(job.task)
                value = _call_task(spec, list(job.args), dict(job.kwargs), context)
            finally:
                stdout.detach()  # the last, unterminated line belongs to the outcome's output
        except BaseException as exc:
            self._complete(
                _Outcome(
                    run,
                    S.FAILED,
                    error=f"{type(exc).__name__}: {exc}",
                    tb=traceback.format_exc(),
                    output=context.output,
                    started=started,
                ),
                body_ended=True,
            )
        else:
            if run.cancel_event.is_set() and run.outcome_reason:
                # Cancelled, with what the task wrote and returned while stopping.
                self._complete(
                    _Outcome(
                        run,
                        S.CANCELLED,
                        result=value,
                        output=context.output,
                        reason=run.outcome_reason,
                        started=started,
                    ),
                    body_ended=True,
                )
            else:
                self._complete(
                    _Outcome(
                        run, S.SUCCEEDED, result=value, output=context.output, started=started
                    ),
                    body_ended=True,
                )
        finally:
            connection.close()

    def _body_in_process(self, run: ActiveRun) -> None:
        """Run the task in a child process that the supervisor kills on timeout or cancel."""
        execution, job = run.execution, run.execution.job
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        meta = {
            "execution_id": execution.pk,
            "job_name": job.name,
            "attempt": execution.attempt,
            "scheduled_for": execution.scheduled_for,
        }
        process = ctx.Process(
            target=run_task,
            args=(job.task, list(job.args), dict(job.kwargs), meta, child_conn),
            daemon=True,
        )
        _wait_for_start(run)
        if not self._may_start(run):
            connection.close()
            return
        started = time.time()
        if job.timeout_seconds:
            run.deadline = time.monotonic() + job.timeout_seconds
        process.start()
        child_conn.close()
        run.process = process
        try:
            message = parent_conn.recv()
        except (EOFError, OSError):
            process.join(5)
            self._complete(
                _Outcome(
                    run,
                    S.FAILED,
                    error=f"task process exited with status {process.exitcode}",
                    started=started,
                )
            )
        else:
            if message.get("ok"):
                self._complete(
                    _Outcome(
                        run,
                        S.SUCCEEDED,
                        result=message.get("result"),
                        output=message.get("output", ""),
                        started=started,
                    )
                )
            else:
                self._complete(
                    _Outcome(
                        run,
                        S.FAILED,
                        error=message.get("error", "task failed"),
                        tb=message.get("traceback", ""),
                        output=message.get("output", ""),
                        started=started,
                    )
                )
        finally:
            if process.is_alive():
                process.kill()
            process.join(5)
            parent_conn.close()

    def _may_start(self, run: ActiveRun) -> bool:
        """The self-fence, checked on this node's own clock just before the body starts: its
        membership confirmed without a lapse since the run was claimed, and the job lock (if any)
        valid for a margin yet. Otherwise the run is given up: handed back to the queue if the
        cluster has not taken it already (the write is conditional on the claim)."""
        lock = run.lock
        lock_ok = lock is None or (
            not lock.lost.is_set()
            and lock.clock.monotonic() < lock.handle.valid_until() - LOCK_START_MARGIN_S
        )
        if lock_ok and self.membership.confirmed(run.epoch):
            return True
        with self._lock:
            if run.completed:
                return False
            run.completed = True
            self._active.pop(run.execution.pk, None)
        execution = run.execution
        handed_back = False
        try:
            # The body did not start: give the run back, retrying a database that does not
            # answer for a moment (otherwise the audit ends it lost though it never ran).
            for attempt in range(HAND_BACK_ATTEMPTS):
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
        logger.warning(
            "execution %s not started: %s (%s)",
            execution.pk,
            "lock no longer certain" if not lock_ok else "membership not confirmed",
            "handed back" if handed_back else "already taken by the cluster",
            extra={"node": self.node_id, "execution": execution.pk},
        )
        return False

    def _complete(self, outcome: _Outcome, *, body_ended: bool = False) -> bool:
        """Queue the first outcome of a run for the finisher; later ones are dropped.

        When the body is known to have ended (it returned, or its process is gone), the job lock
        is released now, before the outcome is written: the next run of a forbid job may start
        as soon as this body is over, however far behind the finisher is. A thread body given up
        on (timeout, cancel, lock lost) may still be running: its lock goes after the write."""
        run = outcome.run
        with self._lock:
            if run.completed:
                return False
            run.completed = True
            self._active.pop(run.execution.pk, None)
            self._unwritten += 1
            self._finishing.add(run.execution.pk)
        if run.process is not None:
            if run.process.is_alive():
                run.process.kill()
                run.process.join(PROCESS_REAP_S)  # reap it: no zombie left behind
            body_ended = body_ended or not run.process.is_alive()
        lock = self._take_lock(run) if body_ended else None
        self._outcomes.put(outcome)
        if lock is not None:
            self._release_lock(lock)
        return True

    def _take_lock(self, run: ActiveRun) -> LockWatchdog | None:
        """The run's job lock, taken from it (atomically: whoever takes it releases it, once)."""
        with self._lock:
            lock, run.lock = run.lock, None
        return lock

    # --- the supervisor: timeouts, cancel requests, lost locks ------------------------------------------
    def _supervise(self, stop: threading.Event) -> None:
        while not stop.wait(SUPERVISE_INTERVAL_S):
            with self._lock:
                runs = list(self._active.values())
            now = time.monotonic()
            for run in runs:
                output = run.context.output if run.context else ""
                if run.deadline is not None and now > run.deadline:
                    run.cancel_event.set()
                    reason = REASON_TIMEOUT.format(seconds=run.execution.job.timeout_seconds)
                    self._complete(
                        _Outcome(run, S.TIMED_OUT, error=reason, output=output, reason=reason)
                    )
                elif (
                    run.cancel_event.is_set()
                    and run.outcome_reason
                    and (run.cancel_deadline is None or now > run.cancel_deadline)
                ):
                    # The task did not return within its grace: the run is over all the same.
                    self._complete(
                        _Outcome(run, S.CANCELLED, output=output, reason=run.outcome_reason)
                    )
                elif (lock := run.lock) is not None and lock.lost.is_set():
                    # Read once: the body's own completion may take the lock meanwhile.
                    run.cancel_event.set()
                    self._complete(
                        _Outcome(
                            run,
                            S.FAILED,
                            error=REASON_LOCK_LOST,
                            output=output,
                            reason=REASON_LOCK_LOST,
                        )
                    )

    # --- the finisher: outcomes written in batches ------------------------------------------------------
    def _run_finisher(self, stop: threading.Event) -> None:
        while not (stop.is_set() and self._outcomes.empty()):
            try:
                first = self._outcomes.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < FINISH_BATCH:
                try:
                    batch.append(self._outcomes.get_nowait())
                except queue.Empty:
                    break
            self._write_outcomes(batch)

    def _write_outcomes(self, batch: list[_Outcome]) -> None:
        """All outcomes in one transaction. While the database cannot be reached, the batch is
        retried with backoff (for up to FINISH_RETRY_S): an outcome is not turned into a storage
        failure, nor left for the reaper, because of an outage of a few seconds. If the write
        fails otherwise, each outcome is written on its own (one bad outcome must not hold up the
        others), and one that still cannot be stored is recorded as failed with the storage error,
        so no run stays running."""
        written = False
        give_up = time.monotonic() + FINISH_RETRY_S
        attempt = 0
        while not written:
            attempt += 1
            try:
                now = timezone.now()
                with transaction.atomic():
                    for outcome in batch:
                        self._write_one(outcome, now)
                written = True
            except (OperationalError, InterfaceError) as exc:
                connection.close()  # reconnect on the next try
                if time.monotonic() > give_up:
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
        for outcome in batch:
            lock = self._take_lock(outcome.run)
            if lock is not None:
                self._release_lock(lock)
        with self._lock:
            self._unwritten -= len(batch)
            self._finishing.difference_update(o.run.execution.pk for o in batch)
        self.on_room()

    def _write_alone(self, outcome: _Outcome) -> None:
        try:
            with transaction.atomic():
                self._write_one(outcome, timezone.now())
            return
        except Exception as exc:
            logger.exception("outcome of execution %s cannot be stored", outcome.run.execution.pk)
            error = f"the outcome could not be stored: {type(exc).__name__}: {exc}"
        close_old_connections()
        try:
            with transaction.atomic():
                self._write_one(_Outcome(outcome.run, S.FAILED, error=error), timezone.now())
        except Exception:
            logger.exception(
                "gave up on execution %s; the reaper will recover it", outcome.run.execution.pk
            )

    def _write_one(self, outcome: _Outcome, now: datetime) -> bool:
        return executions.finish(
            outcome.run.execution,
            status=outcome.status,
            now=now,
            result=outcome.result,
            error=outcome.error,
            tb=outcome.tb,
            output=outcome.output,
            reason=outcome.reason,
            started=outcome.started,
        )

    def _release_lock(self, watchdog: LockWatchdog) -> None:
        handle = watchdog.stop()
        with contextlib.suppress(CoordinationError):
            self.backend.release_lock(handle)

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
                    # Recorded as cancelled first, then the child is killed (in _complete), so its
                    # death is not mistaken for a failure.
                    self._complete(_Outcome(run, S.CANCELLED, reason=run.outcome_reason))
                else:
                    # A task in a thread sees the event and returns with what it has done; the
                    # supervisor records the cancel without it after CANCEL_GRACE_S.
                    run.cancel_deadline = time.monotonic() + CANCEL_GRACE_S
        return len(wanted)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing runs and every outcome is written."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._idle():
                return True
            time.sleep(0.05)
        return self._idle()

    def _idle(self) -> bool:
        """Nothing running, nothing being prepared, every outcome written."""
        with self._lock:
            in_heap = {item.execution.pk for item in self._timer_heap}
            preparing = self._claimed - in_heap
            return not self._active and self._unwritten == 0 and not preparing

    def hand_back_running(self) -> int:
        """After the drain grace period: stop what still runs and record it as lost (retried)."""
        count = 0
        with self._lock:
            runs = [run for run in self._active.values() if not run.completed]
            for run in runs:
                run.completed = True
                self._active.pop(run.execution.pk, None)
        for run in runs:
            run.cancel_event.set()
            if run.process is not None and run.process.is_alive():
                run.process.kill()
            with transaction.atomic():
                if executions.end_running(
                    run.execution,
                    status=S.LOST,
                    reason=REASON_SHUT_DOWN.format(node=self.node_id),
                    now=timezone.now(),
                ):
                    count += 1
            lock = self._take_lock(run)
            if lock is not None:
                self._release_lock(lock)
        return count
