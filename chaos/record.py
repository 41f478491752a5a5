"""The history of a chaos run, as plain data, and what every rule of the checker reads from it.

A history is every execution row (with its job's policy), the side-effect log the test task writes
(one ``start`` line as the first thing its body does, one ``end`` line as the last), the leadership
terms (database rows, and the "started leading (term N)" lines of each node's log), the faults the
nemesis injected, and the windows in which an operator had paused a job. Times are Unix seconds
(floats) throughout: the nodes, the database writers and the nemesis share one clock (one
machine), so instants taken by different processes compare directly.

No Django here: a saved history (``history_to_dict`` / ``history_from_dict``) can be checked
anywhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from chaos import faults

# Fault kinds that make leadership impossible for a while (the coordination store or the database
# is gone): a leader gap overlapping one of them is excused for its length plus the recovery time.
LEADERSHIP_BLOCKING_FAULTS = faults.OUTAGE_FAULTS

# Execution statuses (the values of jobs.states.ExecutionStatus, repeated: no Django here).
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
LOST = "lost"
SKIPPED = "skipped"
PENDING = "pending"
RUNNING = "running"
RETRY_SCHEDULED = "retry_scheduled"
EXECUTED = frozenset({SUCCEEDED, FAILED, TIMED_OUT})
# Ends a run may be given without its body having run (or while it may still be running).
ENDED_BY_DECISION = frozenset({LOST, TIMED_OUT, CANCELLED, SKIPPED})
# Outcomes after which a further attempt of the same slot is a retry, not a duplicate.
RETRYABLE = frozenset({FAILED, TIMED_OUT, LOST})
NOT_STARTED = frozenset({PENDING, RETRY_SCHEDULED})
SCHEDULE_TRIGGER = "schedule"
FORBID = "forbid"
# The executor's forbid skips begin with this (cluster.executor.REASON_FORBID).
FORBID_SKIP_PREFIX = "forbid"

# --- the history -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    id: int
    name: str
    schedule_type: str
    interval_seconds: int | None
    start_at: float | None  # interval slots are start_at + k * interval (epoch-aligned when None)
    concurrency_policy: str
    timeout_seconds: int | None
    max_retries: int
    created_at: float
    # A retry waits at least base * factor^(attempt-1) (capped), half of that with jitter.
    retry_backoff_base: float = 0.0
    retry_backoff_factor: float = 1.0
    retry_backoff_max: float = 0.0
    retry_jitter: bool = True
    misfire_policy: str = "run_once"
    misfire_grace_seconds: int = 60
    run_all_max: int = 10
    cron: str = ""
    timezone: str = "UTC"
    # Flow control (jobs.flow): the job's own limits, and its queue (whose limits are in the
    # history's ``queues``).
    queue: str = "default"
    max_concurrent: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: int = 60

    def min_backoff_s(self, attempt: int) -> float:
        """The shortest wait allowed before attempt ``attempt + 1``."""
        delay = min(
            self.retry_backoff_max,
            self.retry_backoff_base * self.retry_backoff_factor ** (attempt - 1),
        )
        return delay * 0.5 if self.retry_jitter else delay


@dataclass(frozen=True)
class Execution:
    id: int
    job_id: int
    job_name: str
    concurrency_policy: str
    timeout_seconds: int | None
    max_retries: int
    interval_seconds: int | None
    scheduled_for: float
    attempt: int
    trigger: str
    status: str
    node: str
    term: int | None
    claim_token: str | None
    created_at: float
    claimed_at: float | None
    started_at: float | None
    finished_at: float | None
    reason: str
    # Not before this instant (a retry's backoff): when a retry's forbid decision is taken.
    run_after: float | None = None
    # The scheduling partition of its job: whose terms fenced its fire.
    partition: int = 0
    # A run_all run for a slot missed past the grace, released on the catch-up budget.
    catch_up: bool = False


@dataclass(frozen=True)
class SideEffect:
    """One line of the side-effect log: the body of ``execution_id`` started or ended at ``at``."""

    event: str  # "start" | "end"
    execution_id: int
    job_id: int | None
    scheduled_for: float | None
    attempt: int
    node: str
    pid: int
    at: float
    # An end line of a fenced job's body: its token, whether it still held its claim, and what
    # became of its fenced write ("accepted", "refused", "error: ..."; "" when it made none).
    token: int | None = None
    still_owner: bool | None = None
    fenced: str = ""


@dataclass(frozen=True)
class Permit:
    """A flow-control permit: a run of a rate-limited job or queue released at ``released_at``."""

    key: str  # "job:<id>" | "queue:<name>"
    released_at: float
    execution_id: int


@dataclass(frozen=True)
class RunningStep:
    """A run's row entering or leaving the ``running`` status, in commit order (``seq``), from the
    database's own log: what a concurrency limit counts, with no writer's clock involved."""

    seq: int
    execution_id: int
    job_id: int
    queue: str
    entered: bool


@dataclass(frozen=True)
class QueueLimits:
    name: str
    max_concurrent: int | None = None
    rate_limit: int | None = None
    rate_period_seconds: int = 60


@dataclass(frozen=True)
class Term:
    term: int
    node_id: str
    acquired_at: float
    ended_at: float | None
    end_reason: str
    partition: int = 0


@dataclass(frozen=True)
class TermClaim:
    """A node's own log line "started leading (term N)", or "started leading partition P (term
    N)" (its term recorded, leading from now)."""

    node_id: str
    term: int
    at: float | None
    source: str = ""  # the log file it came from
    partition: int = 0


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str  # a node id, "redis", "redlock-1", "database", a job name for operator actions
    start: float
    end: float
    pid: int | None = None
    detail: str = ""
    magnitude: float = 0.0  # a slow link's latency, a clock step (seconds)


@dataclass(frozen=True)
class PauseWindow:
    job_id: int
    start: float
    end: float | None  # None: still paused at the end


@dataclass(frozen=True)
class Requested:
    """A run the operator asked for through the API (trigger or enqueue), answered between
    ``sent`` and ``answered``: the cluster owes it a row that ran or says why not."""

    execution_id: int
    job_id: int
    action: str
    sent: float
    answered: float
    due: float  # not before this instant (an enqueue's run_at, else the answer)


@dataclass(frozen=True)
class ScheduleEdit:
    """The operator set a job's interval to ``interval_seconds``: committed between ``sent`` and
    ``answered``."""

    job_id: int
    sent: float
    answered: float
    interval_seconds: int


@dataclass(frozen=True)
class Deletion:
    """A job the operator deleted: committed between ``sent`` and ``answered``."""

    job_id: int
    sent: float
    answered: float


@dataclass(frozen=True)
class Commit:
    """One committed transaction that touched the fence or the runs, from the database's own log
    (chaos.binlog), in commit order (``seq``)."""

    seq: int
    writer_term: int | None  # a fenced transaction's writer; None: not fenced
    fence_term: int | None  # the fence's term when it began (None: the fence was not touched)
    raised_to: int | None  # a new leader raised the fence to this term
    fires: int = 0
    lost: int = 0
    skipped: int = 0
    retries: int = 0
    execution_ids: list[int] = field(default_factory=list)
    partition: int = 0  # whose fence row it touched (each partition has its own)


@dataclass(frozen=True)
class ApiAnomaly:
    at: float
    action: str
    detail: str


@dataclass
class History:
    jobs: list[JobInfo]
    executions: list[Execution]
    side_effects: list[SideEffect]
    terms: list[Term]
    term_claims: list[TermClaim]
    faults: list[Fault]
    paused: list[PauseWindow] = field(default_factory=list)
    api_anomalies: list[ApiAnomaly] = field(default_factory=list)
    requested: list[Requested] = field(default_factory=list)
    deleted: list[Deletion] = field(default_factory=list)
    edits: list[ScheduleEdit] = field(default_factory=list)
    # Empty unless the run's database keeps a row-based log (a private MariaDB).
    commits: list[Commit] = field(default_factory=list)
    permits: list[Permit] = field(default_factory=list)
    queues: list[QueueLimits] = field(default_factory=list)
    # Empty unless the run's database keeps a row-based log (a private MariaDB).
    running_steps: list[RunningStep] = field(default_factory=list)
    # Slots due in [window_start, window_end] must be accounted for; stop_at: the graceful stop began.
    window_start: float = 0.0
    window_end: float = 0.0
    stop_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


_LIST_TYPES: dict[str, type] = {
    "jobs": JobInfo,
    "executions": Execution,
    "side_effects": SideEffect,
    "terms": Term,
    "term_claims": TermClaim,
    "faults": Fault,
    "paused": PauseWindow,
    "api_anomalies": ApiAnomaly,
    "requested": Requested,
    "deleted": Deletion,
    "edits": ScheduleEdit,
    "commits": Commit,
    "permits": Permit,
    "queues": QueueLimits,
    "running_steps": RunningStep,
}


def history_to_dict(history: History) -> dict[str, Any]:
    """Plain JSON-able data (``json.dump`` it to keep a run for offline checking)."""
    return asdict(history)


def history_from_dict(data: Mapping[str, Any]) -> History:
    """The inverse of :func:`history_to_dict`; unknown keys of a record are ignored."""
    values: dict[str, Any] = {}
    for name, kind in _LIST_TYPES.items():
        known = {f.name for f in fields(kind)}
        values[name] = [
            kind(**{k: v for k, v in item.items() if k in known}) for item in data.get(name, [])
        ]
    return History(
        **values,
        window_start=float(data.get("window_start", 0.0)),
        window_end=float(data.get("window_end", 0.0)),
        stop_at=float(data.get("stop_at", 0.0)),
        meta=dict(data.get("meta", {})),
    )


@dataclass(frozen=True)
class CheckConfig:
    # The presence TTL of the nodes (runnode --dead-after-s).
    dead_after_s: float = 2.0
    # The nodes' database control limit (runnode --db-control-limit-s): a control statement
    # unanswered past it (and a stall margin) is an outage to its node.
    db_control_limit_s: float = 1.0
    # The leader lease (runnode --lease-ttl-ms): the unit of the recovery bounds.
    lease_ttl_s: float = 2.0
    # Longest acceptable time without a leader outside excused windows. The design's failover is
    # lease + retry + jitter (about 2.3 s); on a loaded 2-core machine the fault tests allow 4.5 s.
    leader_gap_bound_s: float = 5.0
    # After a fault that made leadership impossible ends, this long is still excused (reconnects,
    # the lease of the previous leader expiring).
    recovery_s: float = 4.0
    # A slot still waiting (pending) when the cluster stopped is deferred, not lost, unless it was
    # due this long before the stop: a cluster that far behind has stopped running it.
    pending_bound_s: float = 10.0
    # Writes of an outcome may trail the instant the run overran by this much (a finisher batch).
    running_slack_s: float = 2.0
    # Fault kinds during which the cluster could not elect a leader (the runner adds SIGSTOP on
    # SQLite, where a process frozen inside a write holds the database-wide lock).
    leadership_blocking_faults: frozenset[str] = LEADERSHIP_BLOCKING_FAULTS
    # A node decides a forbid skip shortly before the slot's instant (when it prepares the batch):
    # a blocker that ended this little before the instant still justifies it.
    skip_tolerance_s: float = 0.5
    # A run may be declared lost this long after the end of a fault on its node (a restart, the
    # presence TTL, the reaper's pass, a leader to take over and a margin on a loaded machine).
    lost_bound_s: float = 15.0
    # Times taken by different processes of one machine agree to within this.
    timing_tolerance_s: float = 0.05
    # Evidence entries printed per kind (the report keeps them all).
    shown_per_kind: int = 8


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    evidence: dict[str, Any]


def when(instant: float) -> str:
    """An instant for people: UTC time of day to the millisecond (the run lasts minutes)."""
    return datetime.fromtimestamp(instant, tz=UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def slot_key(instant: float) -> int:
    """Slots compared in microseconds, what the databases store (a float of an epoch instant holds
    them to a fraction of a microsecond). Not milliseconds: a manual run triggered 0.3 ms before a
    whole second is a run of its own, not a second execution of that second's slot (a chaos run
    reported one as a duplicate)."""
    return round(instant * 1_000_000)


def row_evidence(execution: Execution) -> dict[str, Any]:
    """An execution as evidence."""
    return {
        "id": execution.id,
        "attempt": execution.attempt,
        "status": execution.status,
        "node": execution.node,
        "term": execution.term,
        "trigger": execution.trigger,
        "scheduled_for": execution.scheduled_for,
        "run_after": execution.run_after,
        "finished_at": execution.finished_at,
        "reason": execution.reason,
    }


def effect_evidence(effect: SideEffect) -> dict[str, Any]:
    return {"event": effect.event, "node": effect.node, "pid": effect.pid, "at": effect.at}


class Index:
    """What several checks look up: rows by id and by slot, side effects by execution."""

    def __init__(self, history: History) -> None:
        self.rows = {e.id: e for e in history.executions}
        self.by_slot: dict[tuple[int, int], list[Execution]] = defaultdict(list)
        for e in history.executions:
            self.by_slot[(e.job_id, slot_key(e.scheduled_for))].append(e)
        for rows in self.by_slot.values():
            rows.sort(key=lambda e: (e.attempt, e.id))
        self.starts: dict[int, list[SideEffect]] = defaultdict(list)
        self.ends: dict[int, list[SideEffect]] = defaultdict(list)
        for effect in sorted(history.side_effects, key=lambda s: s.at):
            (self.starts if effect.event == "start" else self.ends)[effect.execution_id].append(
                effect
            )
        # When each killed pid died (a body of it with no end line ended there).
        self.killed_at: dict[int, float] = {}
        self.frozen_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for fault in history.faults:
            if fault.kind in faults.KILL_FAULTS and fault.pid is not None:
                self.killed_at.setdefault(fault.pid, fault.start)
            if fault.kind in faults.FREEZE_FAULTS and fault.pid is not None:
                self.frozen_spans[fault.pid].append((fault.start, fault.end))
        # (node or None for every node, start, end): a node cut off from what keeps its presence
        # or its outcomes may have a run declared lost while its body goes on.
        self.cut_off = [
            (None if f.kind in faults.OUTAGE_FAULTS else f.target, f.start, f.end)
            for f in history.faults
            if f.kind in faults.OUTAGE_FAULTS
            or f.kind in faults.PARTITION_KINDS
            or f.kind in faults.SLOW_KINDS
        ]

    def was_cut_off(self, node: str, start: float, end: float) -> bool:
        return any(
            (who is None or who == node) and a <= end and b >= start for who, a, b in self.cut_off
        )

    def frozen(self, pid: int, start: float, end: float) -> bool:
        """Whether process ``pid`` was stopped (SIGSTOP) at some point of [start, end]."""
        return any(a <= end and b >= start for a, b in self.frozen_spans.get(pid, ()))

    def interval(self, execution_id: int) -> tuple[float, float | None] | None:
        """(start, end) of a body from its side effects; end None when it wrote no end line."""
        starts = self.starts.get(execution_id)
        if not starts:
            return None
        ends = self.ends.get(execution_id)
        return starts[0].at, (ends[-1].at if ends else None)
