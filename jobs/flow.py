"""Flow control across the cluster: how many runs of a job or a queue may be running at once, how
many may start in any period, and whether a queue is paused.

The database enforces it, with the run rows as the count: a run that is held back is never
refused, it waits (handed back with the reason on its row, "waiting: queue reports limit 4
reached") and is claimed again when it may go.

- ``max_concurrent`` (job, queue): the runs marked running count (a row is running from just
  before its instant until its outcome is written, so a body is always inside that span). A
  node's admission locks the limit's row (the job's, the queue's), counts, and marks the runs it
  lets through running in the same transaction: two nodes' admissions cannot both see room for
  the last slot. A run whose node died stays running until the cluster declares it lost, and
  holds its slot until then.
- ``rate_limit`` per ``rate_period_seconds`` (job, queue): each start of a rate-limited run is
  recorded as a ``FlowPermit`` at the instant it is released, in the same transaction; a run may
  be released at ``t`` only while fewer than ``rate_limit`` permits lie in
  ``(t - period - RATE_MARGIN_S, +inf)``, which keeps every window of that length at or under the
  limit: exactly over the release instants, and over the bodies' starts too while each body
  starts within RATE_MARGIN_S of its release (never before it). A held run is handed back until
  the instant the window frees.
- ``paused`` (queue): a node claims nothing from a paused queue; a run claimed before the pause
  and not yet started goes back. On resume the runs are claimed again and the job's misfire
  policy applies to fires that waited past their turn.

Every run of a limited job or queue goes through this gate (scheduled fires, manual runs,
enqueued runs, retries); runs of jobs and queues without limits never touch it. A node reads the
queues' settings at most once a second (``CONFIG_TTL_S``): a change applies within that.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import Count

from jobs.models import FlowPermit, Job, JobExecution, Queue
from jobs.states import ExecutionStatus

S = ExecutionStatus

# How long a node keeps the queues' settings before it reads them again (seconds).
CONFIG_TTL_S = 1.0
# A run held back by a concurrency limit is due again after this (seconds): longer than a node's
# claim look-ahead, so it is not claimed back at once to sit in a node's timer heap.
CONCURRENCY_RECHECK_S = 1.0
# Permits are kept this long after their instant, or their limit's period if longer (seconds),
# then deleted as new ones of their key are written.
PERMITS_KEPT_S = 3600
# A rate limit counts each window a little longer than its period (seconds): the limit is kept
# over the release instants exactly, and over the bodies' own starts as long as a body starts
# within this of its release (a body never starts before it).
RATE_MARGIN_S = 0.1
WAITING = "waiting: "


@dataclass(frozen=True)
class QueueFlow:
    name: str
    max_concurrent: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: int = 60
    paused: bool = False

    @property
    def limited(self) -> bool:
        return self.max_concurrent is not None or self.rate_limit is not None or self.paused


@dataclass(frozen=True)
class Held:
    """A run the gate holds back: why, and when it may be looked at again (None: unchanged)."""

    reason: str
    run_after: datetime | None


@dataclass
class Gate:
    allowed: list[JobExecution] = field(default_factory=list)
    held: dict[int, Held] = field(default_factory=dict)
    # The rate limits each allowed run counts against (its permits' keys), by run id.
    permits: dict[int, list[str]] = field(default_factory=dict)
    # Each run's release instant (read once the limits' rows were locked), and that moment.
    planned: dict[int, datetime] = field(default_factory=dict)
    now: datetime | None = None
    # Each rate limit's period, by key: how long its permits must be kept.
    periods: dict[str, timedelta] = field(default_factory=dict)


class _Config:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._queues: dict[str, QueueFlow] = {}

    def get(self) -> dict[str, QueueFlow]:
        with self._lock:
            if time.monotonic() - self._read_at < CONFIG_TTL_S:
                return self._queues
        queues = {
            row.name: QueueFlow(
                name=row.name,
                max_concurrent=row.max_concurrent,
                rate_limit=row.rate_limit,
                rate_period_seconds=row.rate_period_seconds,
                paused=row.paused,
            )
            for row in Queue.objects.all()
        }
        with self._lock:
            self._queues, self._read_at = queues, time.monotonic()
        return queues

    def forget(self) -> None:
        with self._lock:
            self._read_at = float("-inf")


_config = _Config()


def queues() -> dict[str, QueueFlow]:
    """The queues with settings, by name (read at most once a second)."""
    return _config.get()


def forget_config() -> None:
    """The next ``queues()`` reads the database (a queue was just changed in this process)."""
    _config.forget()


def unpaused(names: Iterable[str]) -> list[str]:
    config = queues()
    return [name for name in names if not (name in config and config[name].paused)]


def limited(execution: JobExecution, config: dict[str, QueueFlow]) -> bool:
    """Whether the run must pass the gate before it starts."""
    job = execution.job
    if job.max_concurrent is not None or job.rate_limit is not None:
        return True
    queue = config.get(execution.queue)
    return queue is not None and queue.limited


def job_key(job_id: int) -> str:
    return f"job:{job_id}"


def queue_key(name: str) -> str:
    return f"queue:{name}"


class _Window:
    """The permits of one key from ``since`` on, with those granted in this gate."""

    def __init__(self, limit: int, period: timedelta, instants: list[datetime]) -> None:
        self.limit = limit
        self.period = period
        self.instants = sorted(instants)

    def free_at(self, at: datetime) -> datetime | None:
        """None if a permit may be granted at ``at``; else the first instant one may be."""
        span = self.period + timedelta(seconds=RATE_MARGIN_S)
        inside = [instant for instant in self.instants if instant > at - span]
        if len(inside) < self.limit:
            return None
        # The window from ``t - span`` holds fewer than ``limit`` once the oldest of the
        # ``limit`` newest permits has left it.
        return inside[len(inside) - self.limit] + span + timedelta(milliseconds=1)

    def grant(self, at: datetime) -> None:
        self.instants.append(at)
        self.instants.sort()


def gate(runs: list[JobExecution], *, due: dict[int, float], clock: Callable[[], float]) -> Gate:
    """Which of ``runs`` (claimed, admitted, of limited jobs or queues) may start, each at its due
    instant or now if that is later (``clock``: wall-clock seconds, read once the limits' rows
    are locked), and why the others wait. Must run in the transaction that marks the allowed ones
    running (at ``result.planned``) and then ``record``s them: it locks the limits' rows until
    that commits."""
    config = queues()
    result = Gate()
    queue_names = sorted(
        {run.queue for run in runs if run.queue in config and config[run.queue].limited}
    )
    job_ids = sorted(
        {
            run.job_id
            for run in runs
            if run.job.max_concurrent is not None or run.job.rate_limit is not None
        }
    )
    # The rows are locked in one order (queues, then jobs, each sorted) by every node: no two
    # admissions wait on each other. The rows read are the truth, not the cached settings.
    locked_queues = {
        row.name: row for row in Queue.objects.select_for_update().filter(name__in=queue_names)
    }
    locked_jobs = {
        row.pk: row
        for row in Job.objects.select_for_update()
        .filter(pk__in=job_ids)
        .only("pk", "max_concurrent", "rate_limit", "rate_period_seconds")
        .order_by("pk")
    }
    # The moment of the decision: after the locks, however long they took.
    instant = clock()
    now = datetime.fromtimestamp(instant, tz=UTC)
    planned = {run.pk: datetime.fromtimestamp(max(due[run.pk], instant), tz=UTC) for run in runs}
    result.planned, result.now = planned, now
    running_jobs = _running("job_id", [pk for pk, job in locked_jobs.items() if job.max_concurrent])
    running_queues = _running(
        "queue", [name for name, queue in locked_queues.items() if queue.max_concurrent]
    )
    windows = _windows(locked_jobs, locked_queues, now)
    result.periods = {key: window.period for key, window in windows.items()}
    for run in sorted(runs, key=lambda run: (planned[run.pk], run.pk)):
        at = planned[run.pk]
        queue = locked_queues.get(run.queue)
        job = locked_jobs.get(run.job_id)
        held = _hold(run, at, now, queue, job, running_jobs, running_queues, windows)
        if held is not None:
            result.held[run.pk] = held
            continue
        result.allowed.append(run)
        if job is not None and job.max_concurrent:
            running_jobs[run.job_id] += 1
        if queue is not None and queue.max_concurrent:
            running_queues[run.queue] += 1
        result.permits[run.pk] = _rate_keys(run, queue, job)
        for key in result.permits[run.pk]:
            windows[key].grant(at)
    return result


def _hold(
    run: JobExecution,
    at: datetime,
    now: datetime,
    queue: Queue | None,
    job: Job | None,
    running_jobs: dict,
    running_queues: dict,
    windows: dict[str, _Window],
) -> Held | None:
    if queue is not None and queue.paused:
        return Held(f"{WAITING}queue {queue.name} paused", None)
    recheck = now + timedelta(seconds=CONCURRENCY_RECHECK_S)
    if job is not None and job.max_concurrent and running_jobs[run.job_id] >= job.max_concurrent:
        return Held(f"{WAITING}job limit {job.max_concurrent} reached", recheck)
    if (
        queue is not None
        and queue.max_concurrent
        and running_queues[run.queue] >= queue.max_concurrent
    ):
        return Held(f"{WAITING}queue {queue.name} limit {queue.max_concurrent} reached", recheck)
    for key in _rate_keys(run, queue, job):
        window = windows[key]
        free_at = window.free_at(at)
        if free_at is not None:
            owner = "job" if key == job_key(run.job_id) else f"queue {run.queue}"
            period = int(window.period.total_seconds())
            return Held(f"{WAITING}{owner} rate {window.limit} per {period} s reached", free_at)
    return None


def _rate_keys(run: JobExecution, queue: Queue | None, job: Job | None) -> list[str]:
    keys = []
    if job is not None and job.rate_limit:
        keys.append(job_key(run.job_id))
    if queue is not None and queue.rate_limit:
        keys.append(queue_key(queue.name))
    return keys


def _running(column: str, values: list) -> dict:
    counts: dict = defaultdict(int)
    if not values:
        return counts
    rows = (
        JobExecution.objects.filter(status=S.RUNNING, **{f"{column}__in": values})
        .values(column)
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts[row[column]] = row["n"]
    return counts


def _windows(jobs: dict[int, Job], queues_: dict[str, Queue], now: datetime) -> dict[str, _Window]:
    limits: dict[str, tuple[int, timedelta]] = {}
    for pk, job in jobs.items():
        if job.rate_limit:
            limits[job_key(pk)] = (job.rate_limit, timedelta(seconds=job.rate_period_seconds))
    for name, queue in queues_.items():
        if queue.rate_limit:
            limits[queue_key(name)] = (
                queue.rate_limit,
                timedelta(seconds=queue.rate_period_seconds),
            )
    if not limits:
        return {}
    # Runs are released at most a look-ahead after ``now``; a window reaching back one period
    # (and the margin) before now covers every permit that can count.
    longest = max(period for _, period in limits.values()) + timedelta(seconds=RATE_MARGIN_S)
    instants: dict[str, list[datetime]] = defaultdict(list)
    for key, released_at in FlowPermit.objects.filter(
        key__in=list(limits), released_at__gt=now - longest - timedelta(seconds=5)
    ).values_list("key", "released_at"):
        instants[key].append(released_at)
    return {key: _Window(limit, period, instants[key]) for key, (limit, period) in limits.items()}


def record(gate: Gate, won: set[int]) -> None:
    """In the gate's transaction, for the runs it allowed that were marked running (``won``):
    their permits (rate limits), a key's permits older than its period (and PERMITS_KEPT_S)
    deleted, and the waiting reason cleared."""
    started = [run.pk for run in gate.allowed if run.pk in won]
    if not started or gate.now is None:
        return
    permits = [
        FlowPermit(key=key, released_at=gate.planned[pk], execution_id=pk)
        for pk in started
        for key in gate.permits.get(pk, ())
    ]
    if permits:
        FlowPermit.objects.bulk_create(permits)
        for key in sorted({permit.key for permit in permits}):
            kept = max(
                gate.periods[key] + timedelta(seconds=RATE_MARGIN_S),
                timedelta(seconds=PERMITS_KEPT_S),
            )
            FlowPermit.objects.filter(key=key, released_at__lt=gate.now - kept).delete()
    JobExecution.objects.filter(pk__in=started, reason__startswith=WAITING).update(reason="")


def waiting_reason(execution: JobExecution, config: dict[str, QueueFlow] | None = None) -> str:
    """What a pending run waits for, as shown to an operator: its row's reason, or its queue's
    pause."""
    if execution.status != S.PENDING:
        return ""
    config = queues() if config is None else config
    queue = config.get(execution.queue)
    if queue is not None and queue.paused:
        return f"{WAITING}queue {queue.name} paused"
    return execution.reason if execution.reason.startswith(WAITING) else ""
