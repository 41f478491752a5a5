"""Every node's work: claim pending executions, start each at its due instant, run, record.

Claim: one transaction takes up to ``limit`` due, unclaimed executions of the node's queues
(``SELECT ... FOR UPDATE SKIP LOCKED`` on MySQL/MariaDB; on SQLite the IMMEDIATE transaction holds the
database write lock, which serialises claimers) and stamps each with a fresh claim token. Every later
write on that execution is conditional on the token and the status it leaves, so a stale worker (one
declared dead, or paused past its claim) changes nothing.

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
import random
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.db.models import Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from cluster.coordination import CoordinationBackend, CoordinationError, LockWatchdog
from jobs import events, registry
from jobs.models import MAX_OUTPUT_CHARS, ConcurrencyPolicy, Isolation, Job, JobExecution, Trigger
from jobs.states import ExecutionStatus, transition

logger = logging.getLogger(__name__)

S = ExecutionStatus
# A claimed execution's thread starts this long before it is due, to take locks and mark it running,
# so that the task itself starts on the due instant.
PREPARE_AHEAD_S = 0.1
# Event.wait may overshoot by a millisecond or so: sleep to this close to the instant, then spin.
SPIN_S = 0.0015
# The watchdog extends it every ttl/3 while the run lasts; a dead node's lock frees within this.
JOB_LOCK_TTL_MS = 3_000
LOCK_WAIT_POLL_S = 0.1
LOCK_UNAVAILABLE_RETRY_S = 1.0
PROCESS_POLL_S = 0.05
REASON_FORBID = "forbid: previous run still active"
REASON_TIMEOUT = "exceeded timeout of {seconds} s"
REASON_LOCK_LOST = "job lock lost while running"
REASON_CANCELLED = "cancelled"
RESULT_MAX_CHARS = 64 * 1024


def wait_until(instant: float) -> None:
    """Return at the wall-clock ``instant`` (to well under a millisecond)."""
    remaining = instant - time.time()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while time.time() < instant:
        pass


# --- storage operations (each one conditional, each one small) -------------------------------------


def claim_executions(
    *, node_id: str, queues: list[str], limit: int, horizon: datetime
) -> list[JobExecution]:
    """Claim up to ``limit`` pending, unclaimed executions due before ``horizon``."""
    if limit <= 0:
        return []
    prefix = f"{uuid.uuid4().hex[:16]}-"
    now = timezone.now()
    due = JobExecution.objects.filter(
        status=S.PENDING, claim_token__isnull=True, queue__in=queues, run_after__lte=horizon
    )
    # Look before taking locks: most polls find nothing, and on SQLite a write transaction takes
    # the one database-wide write lock.
    if not due.exists():
        return []
    with transaction.atomic():
        candidates = due.order_by("-priority", "run_after", "pk")
        if connection.features.has_select_for_update_skip_locked:
            candidates = candidates.select_for_update(skip_locked=True)
        ids = list(candidates.values_list("pk", flat=True)[:limit])
        if not ids:
            return []
        # One UPDATE for the batch; each row gets its own token "<batch>-<id>". The claim_token IS
        # NULL condition makes a row claimed by someone else in the meantime drop out.
        JobExecution.objects.filter(pk__in=ids, status=S.PENDING, claim_token__isnull=True).update(
            claim_token=Concat(
                Value(prefix), Cast("pk", output_field=JobExecution._meta.get_field("node"))
            ),
            node=node_id,
            claimed_at=now,
        )
        return list(
            JobExecution.objects.select_related("job").filter(
                pk__in=ids, claim_token__startswith=prefix, node=node_id
            )
        )


def unclaim(execution: JobExecution) -> bool:
    """Hand a claimed, unstarted execution back to the queue."""
    return bool(
        JobExecution.objects.filter(
            pk=execution.pk, status=S.PENDING, claim_token=execution.claim_token
        ).update(claim_token=None, node="", claimed_at=None)
    )


def backoff_delay(job: Job, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before attempt ``attempt + 1``: base * factor^(attempt-1), capped, with full jitter
    between half and all of it when enabled."""
    delay = min(
        job.retry_backoff_max, job.retry_backoff_base * job.retry_backoff_factor ** (attempt - 1)
    )
    if job.retry_jitter:
        delay *= 0.5 + (rng or random).random() * 0.5
    return delay


def create_retry_if_allowed(execution: JobExecution, *, now: datetime) -> JobExecution | None:
    """After a failure/timeout/loss: the next attempt, in ``retry_scheduled``, if policy allows."""
    job = execution.job
    if execution.attempt > job.max_retries:
        return None
    delay = backoff_delay(job, execution.attempt)
    retry, created = JobExecution.objects.get_or_create(
        job_id=execution.job_id,
        scheduled_for=execution.scheduled_for,
        attempt=execution.attempt + 1,
        defaults={
            "trigger": Trigger.RETRY,
            "status": S.RETRY_SCHEDULED,
            "run_after": now + timedelta(seconds=delay),
            "queue": job.queue,
            "priority": job.priority,
            "term": execution.term,
        },
    )
    return retry if created else None


def _bounded(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "\n...[truncated]"


def _jsonable_result(value: Any) -> Any:
    import json

    try:
        encoded = json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": _bounded(repr(value), RESULT_MAX_CHARS)}
    if len(encoded) > RESULT_MAX_CHARS:
        return {"truncated": encoded[:RESULT_MAX_CHARS]}
    return value


def finish_execution(
    execution: JobExecution,
    *,
    status: str,
    now: datetime,
    result: Any = None,
    error: str = "",
    tb: str = "",
    output: str = "",
    reason: str = "",
    started: float | None = None,
) -> bool:
    """running -> status (conditional on the claim token); schedules a retry in the same transaction
    when the outcome allows one. False when this worker no longer owns the run (fenced).
    ``started`` is the wall time the task body actually began, when known."""
    started_at = datetime.fromtimestamp(started, tz=UTC) if started else execution.started_at
    started_at = started_at or now
    with transaction.atomic():
        won = transition(
            execution.pk,
            source=S.RUNNING,
            target=status,
            claim_token=execution.claim_token,
            started_at=started_at,
            finished_at=now,
            duration_ms=(now - started_at).total_seconds() * 1000,
            result=_jsonable_result(result),
            error=_bounded(error, 8192),
            traceback=_bounded(tb),
            output=_bounded(output),
            reason=reason[:255],
        )
        if won and status in (S.FAILED, S.TIMED_OUT):
            create_retry_if_allowed(execution, now=now)
        if won:
            events.send_after_commit(
                events.execution_changed,
                execution_id=execution.pk,
                job_id=execution.job_id,
                status=status,
            )
    if not won:
        logger.warning(
            "fenced: execution %s is no longer ours (claim %s); outcome %s dropped",
            execution.pk,
            execution.claim_token,
            status,
            extra={"execution": execution.pk, "claim_token": execution.claim_token},
        )
    return won


# --- running a task ---------------------------------------------------------------------------------


class _ThreadOutput(io.TextIOBase):
    """sys.stdout/stderr replacement that sends a task thread's prints to its own buffer."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.local = threading.local()

    def write(self, text: str) -> int:
        context = getattr(self.local, "context", None)
        if context is not None:
            if text.strip():
                context.log(text.rstrip("\n"))
            return len(text)
        return self.original.write(text)

    def flush(self) -> None:
        self.original.flush()


_stdout: _ThreadOutput | None = None
_stdout_lock = threading.Lock()


def _install_output_capture() -> _ThreadOutput:
    global _stdout
    with _stdout_lock:
        if _stdout is None:
            _stdout = _ThreadOutput(sys.stdout)
            sys.stdout = _stdout
        return _stdout


def _call_task(
    spec: registry.TaskSpec, args: list, kwargs: dict, context: registry.TaskContext
) -> Any:
    if spec.takes_context:
        return spec.func(*args, context=context, **kwargs)
    return spec.func(*args, **kwargs)


def _child_main(task_name: str, args: list, kwargs: dict, meta: dict, conn: Any) -> None:
    """Entry point of a process-isolated run (a fresh interpreter: set Django up first)."""
    import django

    django.setup()
    from jobs import registry as child_registry

    context = child_registry.TaskContext(
        execution_id=meta["execution_id"],
        job_name=meta["job_name"],
        attempt=meta["attempt"],
        scheduled_for=None,
        cancel_event=threading.Event(),
    )
    try:
        spec = child_registry.get_task(task_name)
        value = _call_task(spec, args, kwargs, context)
        conn.send({"ok": True, "result": _jsonable_result(value), "output": context.output})
    except BaseException as exc:  # report everything, including SystemExit, to the parent
        conn.send(
            {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
                "output": context.output,
            }
        )
    finally:
        conn.close()


@dataclass(order=True)
class _Scheduled:
    due: float
    seq: int
    execution: JobExecution = field(compare=False)


@dataclass
class ActiveRun:
    execution: JobExecution
    cancel_event: threading.Event
    deadline: float | None  # monotonic
    lock: LockWatchdog | None = None
    process: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    outcome_reason: str = ""


class Executor:
    """Claims and runs executions for one node, within ``capacity``."""

    def __init__(
        self,
        *,
        node_id: str,
        queues: list[str],
        capacity: int,
        backend: CoordinationBackend,
        lookahead_s: float = 1.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.queues = queues
        self.capacity = capacity
        self.backend = backend
        self.lookahead_s = lookahead_s
        self.on_change = on_change
        self._lock = threading.Lock()
        self._timer_heap: list[_Scheduled] = []
        self._seq = 0
        self._active: dict[int, ActiveRun] = {}
        self._claimed: set[int] = set()
        self._wake_starter = threading.Event()
        self.claiming = True
        _install_output_capture()

    # --- bookkeeping ----------------------------------------------------------------------------
    @property
    def running_count(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def load(self) -> int:
        """Claimed + running: what counts against capacity."""
        with self._lock:
            return len(self._claimed) + len(self._active)

    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._active)

    # --- claiming ---------------------------------------------------------------------------------
    def claim_once(self) -> int:
        """Claim what fits; returns the number claimed. Called by the node's claim loop."""
        if not self.claiming:
            return 0
        free = self.capacity - self.load
        if free <= 0:
            return 0
        horizon = timezone.now() + timedelta(seconds=self.lookahead_s)
        claimed = claim_executions(
            node_id=self.node_id, queues=self.queues, limit=free, horizon=horizon
        )
        if claimed:
            with self._lock:
                for execution in claimed:
                    self._claimed.add(execution.pk)
                    self._seq += 1
                    heapq.heappush(
                        self._timer_heap,
                        _Scheduled(execution.run_after.timestamp(), self._seq, execution),
                    )
            self._wake_starter.set()
        return len(claimed)

    def release_unstarted(self) -> int:
        """Hand every claimed-but-unstarted execution back (drain, shutdown)."""
        with self._lock:
            pending = [item.execution for item in self._timer_heap]
            self._timer_heap.clear()
        count = 0
        for execution in pending:
            if unclaim(execution):
                count += 1
            with self._lock:
                self._claimed.discard(execution.pk)
        return count

    # --- starting at the due instant -------------------------------------------------------------
    def run_starter(self, stop: threading.Event) -> None:
        """Hand each claimed execution to its own thread PREPARE_AHEAD_S before it is due; that
        thread takes locks and marks it running, then starts the task at the due instant."""
        while not stop.is_set():
            with self._lock:
                head = self._timer_heap[0] if self._timer_heap else None
            if head is None:
                self._wake_starter.wait(0.5)
                self._wake_starter.clear()
                continue
            delay = head.due - PREPARE_AHEAD_S - time.time()
            if delay > 0:
                self._wake_starter.wait(delay)
                self._wake_starter.clear()
                continue
            with self._lock:
                if not self._timer_heap or self._timer_heap[0] is not head:
                    continue
                heapq.heappop(self._timer_heap)
            threading.Thread(
                target=self._run_guarded,
                args=(head.execution, head.due),
                name=f"exec-{head.execution.pk}",
                daemon=True,
            ).start()

    def _run_guarded(self, execution: JobExecution, due: float) -> None:
        try:
            self._run(execution, due)
        except Exception:
            logger.exception(
                "execution %s crashed the worker thread",
                execution.pk,
                extra={"execution": execution.pk},
            )
        finally:
            with self._lock:
                self._claimed.discard(execution.pk)
                self._active.pop(execution.pk, None)
            close_old_connections()
            connection.close()
            if self.on_change:
                self.on_change()

    def _take_job_lock(self, execution: JobExecution) -> LockWatchdog | bool | None:
        """forbid jobs: the job lock, kept alive by a watchdog. False if someone else holds it."""
        if execution.job.concurrency_policy != ConcurrencyPolicy.FORBID:
            return None
        try:
            handle = self.backend.acquire_lock(f"job:{execution.job_id}", JOB_LOCK_TTL_MS)
        except CoordinationError as exc:
            logger.warning("job lock for %s unavailable: %s", execution.job_id, exc)
            return False
        if handle is None:
            return False
        return LockWatchdog(self.backend, handle, JOB_LOCK_TTL_MS).start()

    def _blocking_start(self, execution: JobExecution) -> datetime | None:
        """When the earliest other RUNNING run of the job started, or None if there is none."""
        return (
            JobExecution.objects.filter(job_id=execution.job_id, status=S.RUNNING)
            .exclude(pk=execution.pk)
            .order_by("started_at")
            .values_list("started_at", flat=True)
            .first()
        )

    def _forbid_blocked(self, execution: JobExecution) -> bool:
        return self._blocking_start(execution) is not None

    def _acquire_forbid_lock(self, execution: JobExecution, due: float) -> LockWatchdog | None:
        """The job lock for a ``forbid`` run, or None when the run must be skipped.

        forbid skips a run when the previous run was already running at the instant this one
        became due. A previous run that started *after* that instant (both were late, e.g. catching
        up after a failover) is waited for instead: the runs go one after the other. A lock held
        while no run is visible belongs to a run about to start, or to a node that died before
        starting it (the lock expires within JOB_LOCK_TTL_MS). Waiting ends at the job's misfire
        grace. Raises CoordinationError when the lock service cannot answer.
        """
        give_up = due + max(execution.job.misfire_grace_seconds, 1)
        while True:
            taken = self._take_job_lock(execution)
            blocker_started = self._blocking_start(execution)
            if blocker_started is None and isinstance(taken, LockWatchdog):
                return taken
            if isinstance(taken, LockWatchdog):
                self._release_lock(taken)
            if blocker_started is not None and blocker_started <= execution.run_after:
                return None
            if time.time() > give_up or not self.claiming:
                return None
            time.sleep(LOCK_WAIT_POLL_S)

    def _run(self, execution: JobExecution, due: float) -> None:
        job = execution.job
        lock: LockWatchdog | None = None
        if job.concurrency_policy == ConcurrencyPolicy.FORBID:
            try:
                lock = self._acquire_forbid_lock(execution, due)
            except CoordinationError as exc:
                self._defer(execution, exc)
                return
            if lock is None:
                self._skip(execution, REASON_FORBID)
                return
        elif job.concurrency_policy == ConcurrencyPolicy.BUFFER_ONE and self._forbid_blocked(
            execution
        ):
            # Wait for the running one: hand it back; it is claimed again when it can start.
            unclaim(execution)
            return
        # Marked running at the due instant, not while preparing: a node killed before its run
        # starts leaves a claimed pending row (handed to another node when the node is declared
        # dead), not a phantom running one that blocks the job.
        wait_until(due)
        planned_start = datetime.fromtimestamp(max(due, time.time()), tz=UTC)
        if not transition(
            execution.pk,
            source=S.PENDING,
            target=S.RUNNING,
            claim_token=execution.claim_token,
            started_at=planned_start,
        ):
            logger.info("execution %s was cancelled or taken before it started", execution.pk)
            if lock is not None:
                self._release_lock(lock)
            return
        execution.started_at = planned_start
        events.send_after_commit(
            events.execution_changed, execution_id=execution.pk, job_id=job.pk, status=S.RUNNING
        )
        timeout = job.timeout_seconds
        run = ActiveRun(
            execution=execution,
            cancel_event=threading.Event(),
            deadline=time.monotonic() + timeout if timeout else None,
            lock=lock,
        )
        with self._lock:
            self._claimed.discard(execution.pk)
            self._active[execution.pk] = run
        if self.on_change:
            self.on_change()
        try:
            if job.isolation == Isolation.PROCESS:
                outcome = self._run_in_process(run)
            else:
                outcome = self._run_in_thread(run)
            if outcome is not None:
                finish_execution(execution, now=timezone.now(), **outcome)
        finally:
            # Released only after the outcome is written: the next run's row check must not see
            # this one still running once it holds the lock.
            if run.lock is not None:
                self._release_lock(run.lock)

    def _skip(self, execution: JobExecution, reason: str) -> None:
        if transition(
            execution.pk,
            source=S.PENDING,
            target=S.SKIPPED,
            claim_token=execution.claim_token,
            finished_at=timezone.now(),
            reason=reason,
        ):
            events.send_after_commit(
                events.execution_changed,
                execution_id=execution.pk,
                job_id=execution.job_id,
                status=S.SKIPPED,
            )

    def _context(self, run: ActiveRun) -> registry.TaskContext:
        execution = run.execution
        return registry.TaskContext(
            execution_id=execution.pk,
            job_name=execution.job.name,
            attempt=execution.attempt,
            scheduled_for=execution.scheduled_for,
            cancel_event=run.cancel_event,
        )

    def _run_in_thread(self, run: ActiveRun) -> dict[str, Any] | None:
        """Run in a helper thread so this one can enforce the timeout and cancel requests."""
        execution, job = run.execution, run.execution.job
        context = self._context(run)
        box: dict[str, Any] = {}

        def body() -> None:
            assert _stdout is not None
            _stdout.local.context = context
            box["started"] = time.time()
            try:
                spec = registry.get_task(job.task)
                box["result"] = _call_task(spec, list(job.args), dict(job.kwargs), context)
            except BaseException as exc:
                box["error"] = f"{type(exc).__name__}: {exc}"
                box["traceback"] = traceback.format_exc()
            finally:
                _stdout.local.context = None
                connection.close()
                run.done.set()

        worker = threading.Thread(target=body, name=f"task-{execution.pk}", daemon=True)
        worker.start()
        return self._await(run, context_output=lambda: context.output, box=box)

    def _await(
        self, run: ActiveRun, *, context_output: Callable[[], str], box: dict[str, Any]
    ) -> dict[str, Any] | None:
        execution = run.execution
        while not run.done.wait(PROCESS_POLL_S):
            if run.deadline is not None and time.monotonic() > run.deadline:
                run.cancel_event.set()
                if run.process is not None:
                    run.process.kill()
                return {
                    "status": S.TIMED_OUT,
                    "error": REASON_TIMEOUT.format(seconds=execution.job.timeout_seconds),
                    "output": context_output(),
                    "reason": REASON_TIMEOUT.format(seconds=execution.job.timeout_seconds),
                }
            if run.cancel_event.is_set():
                if run.process is not None:
                    run.process.kill()
                # A thread-mode task sees the event and may stop by itself; do not wait for it.
                return {
                    "status": S.CANCELLED,
                    "output": context_output(),
                    "reason": run.outcome_reason or REASON_CANCELLED,
                }
            if run.lock is not None and run.lock.lost.is_set():
                run.cancel_event.set()
                if run.process is not None:
                    run.process.kill()
                return {
                    "status": S.FAILED,
                    "error": REASON_LOCK_LOST,
                    "output": context_output(),
                    "reason": REASON_LOCK_LOST,
                }
        if run.cancel_event.is_set() and "error" not in box and run.outcome_reason:
            return {"status": S.CANCELLED, "output": context_output(), "reason": run.outcome_reason}
        if "error" in box:
            return {
                "status": S.FAILED,
                "error": box["error"],
                "tb": box.get("traceback", ""),
                "output": context_output(),
            }
        return {
            "status": S.SUCCEEDED,
            "result": box.get("result"),
            "output": context_output(),
            "started": box.get("started"),
        }

    def _run_in_process(self, run: ActiveRun) -> dict[str, Any] | None:
        execution, job = run.execution, run.execution.job
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        meta = {"execution_id": execution.pk, "job_name": job.name, "attempt": execution.attempt}
        process = ctx.Process(
            target=_child_main,
            args=(job.task, list(job.args), dict(job.kwargs), meta, child_conn),
            daemon=True,
        )
        process.start()
        child_conn.close()
        run.process = process
        box: dict[str, Any] = {}
        output = {"text": ""}

        def reader() -> None:
            try:
                message = parent_conn.recv()
                output["text"] = message.get("output", "")
                if message.get("ok"):
                    box["result"] = message.get("result")
                else:
                    box["error"] = message.get("error", "task failed")
                    box["traceback"] = message.get("traceback", "")
            except EOFError:
                if process.exitcode not in (None, 0) or not box:
                    process.join(1)
                    box["error"] = f"task process exited with status {process.exitcode}"
            finally:
                run.done.set()

        threading.Thread(target=reader, daemon=True).start()
        try:
            return self._await(run, context_output=lambda: output["text"], box=box)
        finally:
            if process.is_alive():
                process.kill()
            process.join(5)
            parent_conn.close()

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
        return len(wanted)

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.running_count == 0:
                return True
            time.sleep(0.05)
        return self.running_count == 0

    def hand_back_running(self) -> int:
        """After the drain grace period: cancel what still runs and record it as lost (retried)."""
        count = 0
        with self._lock:
            runs = list(self._active.values())
        for run in runs:
            run.cancel_event.set()
            if run.process is not None:
                run.process.kill()
            now = timezone.now()
            with transaction.atomic():
                won = transition(
                    run.execution.pk,
                    source=S.RUNNING,
                    target=S.LOST,
                    claim_token=run.execution.claim_token,
                    finished_at=now,
                    reason=f"node {self.node_id} shut down before the run finished",
                )
                if won:
                    create_retry_if_allowed(run.execution, now=now)
                    count += 1
        return count
