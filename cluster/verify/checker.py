"""The pure checker of the cluster's guarantees over a chaos run's history (cluster.verify.record).

:func:`check` reads nothing but its argument and returns a :class:`Report` of violations by kind,
each with the evidence that shows it. Runs recorded ``lost`` are *indeterminate* (the body may or
may not have run), never violations by themselves, as long as a fault on their node explains them.
Rule families live in modules of their own (``recovery``: time to recover after each fault;
``attempts``: lost runs' excuses, outcomes without a body, retries and early starts; ``intent``:
what the operator asked for — pauses, deletions, triggered and enqueued runs); this
module holds the report and the rules on slots, duplicates, overlaps and terms. No Django here.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from cluster.verify import attempts, intent
from cluster.verify.attempts import (
    EARLY_RETRY,
    EARLY_START,
    PHANTOM_OUTCOME,
    TOO_MANY_ATTEMPTS,
    UNEXCUSED_LOST,
)
from cluster.verify.commit_order import STALE_COMMIT, stale_commits
from cluster.verify.intent import FIRED_AFTER_DELETE, FIRED_WHILE_PAUSED, REQUEST_NOT_RUN
from cluster.verify.record import (
    CANCELLED,
    ENDED_BY_DECISION,
    EXECUTED,
    FORBID,
    FORBID_SKIP_PREFIX,
    LOST,
    NOT_STARTED,
    PENDING,
    RETRYABLE,
    RUNNING,
    SCHEDULE_TRIGGER,
    SKIPPED,
    SUCCEEDED,
    TIMED_OUT,
    CheckConfig,
    Execution,
    History,
    Index,
    JobInfo,
    PauseWindow,
    TermClaim,
    Violation,
    effect_evidence,
    row_evidence,
    slot_key,
    when,
)
from cluster.verify.recovery import SLOW_RECOVERY, leaderless, recovery
from cluster.verify.schedule_rules import (
    MISFIRE_POLICY,
    SCHEDULE_EDIT,
    edited_jobs,
    edits_followed,
    job_slots,
    misfires,
    slot_step,
    superseded,
)

# --- the kinds of violation --------------------------------------------------------------------------
DUPLICATE_EXECUTION = "duplicate_execution"  # a slot executed twice (rows or side effects)
MISSING_SLOT = "missing_slot"  # a slot neither executed nor recorded with a reason
FORBID_OVERLAP = "forbid_overlap"  # two bodies of a forbid job ran at the same time
START_AFTER_LOST = "start_after_lost"  # a body started after its run was declared over
STUCK_RUNNING = "stuck_running"  # a run left running (or claimed) past timeout + dead threshold
STALE_TERM_WRITE = "stale_term_write"  # a fire written by a leader after a newer term began
TERM_HELD_TWICE = "term_held_twice"  # one term held by two nodes
LEADER_GAP = "leader_gap"  # no leader for longer than the bound, with no fault to excuse it
UNJUSTIFIED_SKIP = "unjustified_skip"  # a forbid skip while no run of the job was really active
API_ANOMALY = "api_anomaly"  # an operator action answered unexpectedly (5xx, a lost update)

# Notes: worth reading, not violations of a guarantee.
FROZEN_BODY_OVERLAP = "frozen_body_overlap"  # a forbid overlap caused by a body frozen mid-run
LOST_WHILE_RUNNING = "lost_while_running"  # declared lost while its node was up and running it
# Frozen between its self-fence and its first step, before being declared over: it starts on resume.
FROZEN_AT_START = "frozen_at_start"
NOTE_KINDS = (FROZEN_BODY_OVERLAP, LOST_WHILE_RUNNING, FROZEN_AT_START)
# A body whose first step comes this soon after its process resumed was past its self-fence when
# the freeze began: a fence checked after the resume fails (the node's monotonic clock shows the
# freeze), so only a body already through it starts at once.
RESUME_START_S = 0.25

VIOLATION_KINDS = (
    DUPLICATE_EXECUTION,
    MISSING_SLOT,
    FORBID_OVERLAP,
    START_AFTER_LOST,
    STUCK_RUNNING,
    STALE_TERM_WRITE,
    TERM_HELD_TWICE,
    LEADER_GAP,
    UNJUSTIFIED_SKIP,
    SLOW_RECOVERY,
    API_ANOMALY,
    UNEXCUSED_LOST,
    PHANTOM_OUTCOME,
    TOO_MANY_ATTEMPTS,
    EARLY_RETRY,
    EARLY_START,
    FIRED_WHILE_PAUSED,
    FIRED_AFTER_DELETE,
    REQUEST_NOT_RUN,
    MISFIRE_POLICY,
    STALE_COMMIT,
    SCHEDULE_EDIT,
)

# Messages (tests assert on them).
MSG_TWO_STARTS_ONE_EXECUTION = "execution {execution_id}: its body started {count} times"
MSG_TWO_STARTS_ONE_SLOT = (
    "job {job_id} slot {slot}: attempt {later} started although attempt {earlier} ended "
    "{status} (only a failed, timed-out or lost attempt may be retried)"
)
MSG_TWO_SUCCEEDED = "job {job_id} slot {slot}: {count} succeeded rows"
MSG_NO_ROW = "job {job_id} slot {slot}: no execution row (neither run nor recorded with a reason)"
MSG_NO_REASON = "job {job_id} slot {slot}: recorded {status} without a reason"
MSG_NOT_RUN = (
    "job {job_id} slot {slot}: never run (left {status} {late_s:.1f} s after its slot, when the "
    "cluster stopped)"
)
MSG_OVERLAP = "job {job_id} (forbid): executions {first} and {second} ran at the same time"
MSG_START_AFTER_END = (
    "execution {execution_id}: body started {late_s:.3f} s after the run was recorded {status}"
)
MSG_START_NOT_RECORDED = "execution {execution_id}: body started but the run is recorded {status}"
MSG_LEFT_RUNNING = "execution {execution_id}: left {status} after the cluster stopped"
MSG_LEFT_CLAIMED = "execution {execution_id}: left pending and claimed by {node} after the stop"
MSG_OVERRAN = (
    "execution {execution_id}: running {duration_s:.1f} s, past its timeout ({timeout_s} s) plus "
    "the dead threshold"
)
MSG_STALE_WRITE = (
    "execution {execution_id}: created by term {term} {late_s:.3f} s after term {newer} began"
)
MSG_TERM_TWO_NODES = "term {term} claimed by several nodes: {nodes}"
MSG_TERM_ROW_OTHER_NODE = "term {term}: node {node} led it but its row names {row_node}"
MSG_LEADER_GAP = "no leader for {gap_s:.2f} s between term {before} and term {after}"
MSG_LEADER_GONE = "no leader for {gap_s:.2f} s after term {before} until the cluster stopped"
MSG_FROZEN_OVERLAP = (
    "job {job_id} (forbid): execution {first} was frozen inside its body (SIGSTOP), declared "
    "{status} and resumed while execution {second} ran"
)
MSG_LOST_WHILE_RUNNING = (
    "execution {execution_id}: declared lost at {at} while node {node} was running its body "
    "(neither killed, frozen nor cut off from the database)"
)
MSG_FROZEN_AT_START = (
    "execution {execution_id}: its process was frozen (SIGSTOP) just after the body passed its "
    "self-fence, before its first step; declared {status} meanwhile, the body started on resume, "
    "{late_s:.3f} s after (the window between the last check and the call, which no lease closes)"
)
MSG_UNJUSTIFIED_SKIP = (
    "job {job_id} slot {slot} attempt {attempt}: skipped ({reason}) at {at} while no other run "
    "of the job was active"
)

# Fault kinds that make leadership impossible for a while (the coordination store or the database
# is gone): a leader gap overlapping one of them is excused for its length plus the recovery time.


# --- the report --------------------------------------------------------------------------------------


@dataclass
class Report:
    violations: list[Violation]
    notes: list[Violation]
    slots_checked: int
    executions: int
    runs: int  # bodies started (side-effect starts)
    indeterminate: int  # slots whose last attempt is lost: the body may or may not have run
    statuses: dict[str, int]
    faults_by_kind: dict[str, int]
    terms: int
    max_leader_gap_s: float
    window_s: float
    # Why slots in the window were not run: "skipped: <reason>" / "lost: <reason>" -> count.
    not_run: dict[str, int] = field(default_factory=dict)
    # Body start - slot of the scheduled first attempts in the window: p50, p99, max (ms).
    lag_ms: dict[str, float] = field(default_factory=dict)
    # Fault kind -> how the cluster recovered (recovery.KindRecovery as a dict).
    recovery: dict[str, dict[str, Any]] = field(default_factory=dict)
    shown_per_kind: int = 8
    # Committed transactions read from the database's own log (0: the database keeps none).
    commits_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, list[Violation]]:
        grouped: dict[str, list[Violation]] = {}
        for violation in self.violations:
            grouped.setdefault(violation.kind, []).append(violation)
        return grouped

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["violations_by_kind"] = {k: len(v) for k, v in self.by_kind().items()}
        data["notes_by_kind"] = dict(Counter(n.kind for n in self.notes))
        return data

    def render(self) -> str:
        lines = [
            f"window: {self.window_s:.1f} s; slots checked: {self.slots_checked}; executions: "
            f"{self.executions}; bodies started: {self.runs}; indeterminate (lost): "
            f"{self.indeterminate}",
            "statuses: " + _counts(self.statuses),
            f"leadership terms: {self.terms}; longest leader gap: {self.max_leader_gap_s:.2f} s; "
            + (
                f"commits checked in commit order: {self.commits_checked}"
                if self.commits_checked
                else "no commit log (stale writes judged by their timestamps)"
            ),
            "start lag (body start - slot): "
            + (", ".join(f"{k} {v:.0f} ms" for k, v in self.lag_ms.items()) or "no runs"),
            "faults: " + (_counts(self.faults_by_kind) or "none"),
        ]
        if self.recovery:
            lines.append(
                "recovery by fault kind (longest): leader gap / takeover / job gap (bound)"
            )
            for kind, entry in self.recovery.items():
                takeover = entry["longest_takeover_s"]
                lines.append(
                    f"  {kind:<22} x{entry['faults']:<3} {entry['longest_leader_gap_s']:6.2f} s"
                    f" / {'-' if takeover is None else f'{takeover:.2f} s':>7}"
                    f" / {entry['longest_job_gap_s']:6.2f} s ({entry['bound_s']:.1f} s + interval)"
                )
        if self.not_run:
            lines.append("not run, with their reasons:")
            lines += [f"  {n:5d}  {reason}" for reason, n in sorted(self.not_run.items())]
        if self.notes:
            lines.append(f"notes (not violations): {len(self.notes)}")
            lines += self._grouped(self.notes, NOTE_KINDS)
        grouped = self.by_kind()
        if not grouped:
            lines.append("violations: none")
            return "\n".join(lines)
        kinds = Counter(v.kind for v in self.violations)
        lines.append(f"violations: {len(self.violations)} ({_counts(kinds)})")
        lines += self._grouped(self.violations, VIOLATION_KINDS)
        return "\n".join(lines)

    def _grouped(self, entries: list[Violation], order: Iterable[str]) -> list[str]:
        grouped: dict[str, list[Violation]] = defaultdict(list)
        for entry in entries:
            grouped[entry.kind].append(entry)
        lines = []
        for kind in order:
            found = grouped.get(kind, [])
            if not found:
                continue
            lines.append(f"  {kind}: {len(found)}")
            for entry in found[: self.shown_per_kind]:
                lines.append(f"    - {entry.message}")
                lines.append(f"      evidence: {_short(entry.evidence)}")
            if len(found) > self.shown_per_kind:
                lines.append(f"    ... {len(found) - self.shown_per_kind} more")
        return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _short(evidence: Mapping[str, Any], limit: int = 600) -> str:
    text = ", ".join(f"{k}={_fmt(v)}" for k, v in evidence.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return "[" + "; ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


# --- the checker -------------------------------------------------------------------------------------


def check(history: History, config: CheckConfig | None = None) -> Report:
    """Every violation of the guarantees in ``history``, by kind, with evidence."""
    config = config or CheckConfig()
    index = Index(history)
    violations: list[Violation] = []
    violations += _duplicates(history, index)
    slots_checked, indeterminate, missing = _slots(history, index, config)
    violations += missing
    overlaps, notes = _forbid_overlaps(history, index)
    violations += overlaps
    notes += _lost_while_running(history, index)
    late_starts = _starts_after_end(history, index)
    violations += [v for v in late_starts if v.kind == START_AFTER_LOST]
    notes += [v for v in late_starts if v.kind == FROZEN_AT_START]
    violations += _stuck(history, config)
    violations += _stale_writes(history)
    violations += _terms_held_twice(history)
    gaps, max_gap = _leader_gaps(history, config)
    violations += gaps
    violations += _unjustified_skips(history, index, config)
    recovered, slow = recovery(history, index, config)
    violations += slow
    violations += attempts.unexcused_lost(history, config)
    violations += attempts.phantom_outcomes(history, index)
    violations += attempts.attempts(history, index, config)
    violations += attempts.early_starts(history, index, config)
    violations += intent.fired_while_paused(history, config)
    violations += intent.fired_after_delete(history, config)
    violations += intent.requests_not_run(history, index, config)
    violations += misfires(history, config)
    violations += superseded(history, index, config)
    violations += stale_commits(history)
    violations += edits_followed(history, index)
    violations += [
        Violation(API_ANOMALY, f"{a.action}: {a.detail}", {"at": a.at})
        for a in history.api_anomalies
    ]
    return Report(
        violations=violations,
        notes=notes,
        slots_checked=slots_checked,
        executions=len(history.executions),
        runs=len(index.starts),
        indeterminate=indeterminate,
        statuses=dict(Counter(e.status for e in history.executions)),
        faults_by_kind=dict(Counter(f.kind for f in history.faults)),
        terms=len(history.terms),
        max_leader_gap_s=max_gap,
        window_s=max(0.0, history.window_end - history.window_start),
        lag_ms=_lag(history, index),
        not_run=_not_run(history),
        recovery={kind: asdict(entry) for kind, entry in sorted(recovered.items())},
        shown_per_kind=config.shown_per_kind,
        commits_checked=len(history.commits),
    )


NODE_NAME_RE = re.compile(r"\bnode \S+")


def _not_run(history: History) -> dict[str, int]:
    """Skipped and lost rows of the window by reason (node names folded, so reasons group)."""
    return dict(
        Counter(
            f"{e.status}: " + NODE_NAME_RE.sub("node *", e.reason or "(no reason)")
            for e in history.executions
            if e.status in (SKIPPED, LOST)
            and history.window_start <= e.scheduled_for <= history.window_end
        )
    )


def _lag(history: History, index: Index) -> dict[str, float]:
    """How late bodies started after their slot (not a guarantee: a symptom worth printing)."""
    lags = sorted(
        (index.starts[e.id][0].at - e.scheduled_for) * 1000
        for e in history.executions
        if e.trigger == SCHEDULE_TRIGGER
        and e.attempt == 1
        and e.id in index.starts
        and history.window_start <= e.scheduled_for <= history.window_end
    )
    if not lags:
        return {}

    def pct(p: float) -> float:
        return lags[min(len(lags) - 1, math.ceil(p / 100 * len(lags)) - 1)]

    return {"p50": pct(50), "p99": pct(99), "max": lags[-1]}


def _duplicates(history: History, index: Index) -> list[Violation]:
    """(a) A slot executed twice: one execution's body started twice; two bodies of one slot unless
    the earlier attempt ended failed/timed out/lost and the later is its retry; two successes."""
    found = []
    for execution_id, starts in index.starts.items():
        if len(starts) > 1:
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_STARTS_ONE_EXECUTION.format(
                        execution_id=execution_id, count=len(starts)
                    ),
                    {"starts": [effect_evidence(s) for s in starts]},
                )
            )
    started_by_slot: dict[tuple[int, int], list[Execution]] = defaultdict(list)
    for execution_id in index.starts:
        row = index.rows.get(execution_id)
        if row is not None:
            started_by_slot[(row.job_id, slot_key(row.scheduled_for))].append(row)
    for (job_id, _), rows in started_by_slot.items():
        rows.sort(key=lambda e: (e.attempt, e.id))
        for earlier, later in itertools.pairwise(rows):
            if earlier.status in RETRYABLE and later.attempt > earlier.attempt:
                continue
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_STARTS_ONE_SLOT.format(
                        job_id=job_id,
                        slot=when(earlier.scheduled_for),
                        earlier=earlier.attempt,
                        later=later.attempt,
                        status=earlier.status,
                    ),
                    {
                        "earlier": row_evidence(earlier),
                        "earlier_starts": [effect_evidence(s) for s in index.starts[earlier.id]],
                        "later": row_evidence(later),
                        "later_starts": [effect_evidence(s) for s in index.starts[later.id]],
                    },
                )
            )
    for (job_id, _), rows in index.by_slot.items():
        succeeded = [e for e in rows if e.status == SUCCEEDED]
        if len(succeeded) > 1:
            found.append(
                Violation(
                    DUPLICATE_EXECUTION,
                    MSG_TWO_SUCCEEDED.format(
                        job_id=job_id, slot=when(succeeded[0].scheduled_for), count=len(succeeded)
                    ),
                    {"rows": [row_evidence(e) for e in succeeded]},
                )
            )
    return found


def interval_slots(job: JobInfo, start: float, end: float) -> Iterable[float]:
    """The nominal slots of a job in [start, end] (interval jobs, and the cron patterns the
    checker follows on its own: schedule_rules.job_slots)."""
    return job_slots(job, start, end)


def _pause_spans(
    history: History, windows: list[PauseWindow], step: float
) -> list[tuple[float, float]]:
    """The slots a pause excuses: from the first slot the leader had not yet written when the job
    was paused (a pause drops every fire not yet created, which is behind the pause instant when
    the leader lags) to the resume plus one interval (a resumed job fires from its next slot)."""
    spans = []
    for window in windows:
        written = [
            e.scheduled_for
            for e in history.executions
            if e.job_id == window.job_id
            and e.trigger == SCHEDULE_TRIGGER
            and e.attempt == 1
            and e.created_at <= window.start
        ]
        first = min(window.start, max(written) + step) if written else window.start
        end = math.inf if window.end is None else window.end + step
        spans.append((first, end))
    return spans


def _slots(history: History, index: Index, config: CheckConfig) -> tuple[int, int, list[Violation]]:
    """(b) Every slot of an interval job inside the window has a row that ran or that says why not.

    Returns (slots checked, indeterminate slots, violations)."""
    pauses: dict[int, list[PauseWindow]] = defaultdict(list)
    for window in history.paused:
        pauses[window.job_id].append(window)
    checked = indeterminate = 0
    found = []
    edited = edited_jobs(history)  # followed edit by edit (schedule_rules.edits_followed)
    for job in history.jobs:
        if job.id in edited:
            continue
        step = slot_step(job)
        # A job's slots count from its first whole interval after it was defined.
        start = max(history.window_start, job.created_at + step)
        paused = _pause_spans(history, pauses[job.id], step)
        for slot in interval_slots(job, start, history.window_end):
            if any(a - 1e-6 <= slot <= b for a, b in paused):
                continue
            checked += 1
            rows = index.by_slot.get((job.id, slot_key(slot)), [])
            if not rows:
                found.append(
                    Violation(
                        MISSING_SLOT,
                        MSG_NO_ROW.format(job_id=job.id, slot=when(slot)),
                        {"job": job.name, "slot": slot},
                    )
                )
                continue
            if any(e.status in EXECUTED for e in rows):
                continue
            if any(e.status == RUNNING or (e.status == PENDING and e.claim_token) for e in rows):
                continue  # left in flight: reported as stuck
            accounted = [e for e in rows if e.status in (SKIPPED, LOST, CANCELLED)]
            if accounted:
                unexplained = [e for e in accounted if not e.reason.strip()]
                if unexplained:
                    found.append(
                        Violation(
                            MISSING_SLOT,
                            MSG_NO_REASON.format(
                                job_id=job.id, slot=when(slot), status=unexplained[0].status
                            ),
                            {"job": job.name, "rows": [row_evidence(e) for e in rows]},
                        )
                    )
                elif rows[-1].status == LOST:
                    indeterminate += 1
                continue
            # Recorded and waiting (pending, a retry's backoff): deferred, not lost, unless it had
            # waited far longer than a healthy cluster ever lets a due run wait.
            late = (history.stop_at or history.window_end) - slot
            if late <= config.pending_bound_s:
                continue
            found.append(
                Violation(
                    MISSING_SLOT,
                    MSG_NOT_RUN.format(
                        job_id=job.id, slot=when(slot), status=rows[-1].status, late_s=late
                    ),
                    {"job": job.name, "rows": [row_evidence(e) for e in rows]},
                )
            )
    return checked, indeterminate, found


def _forbid_overlaps(history: History, index: Index) -> tuple[list[Violation], list[Violation]]:
    """(c) Two bodies of one forbid job overlapping, where both intervals are known.

    An overlap whose earlier body was frozen (SIGSTOP) while it ran and declared lost or timed
    out meanwhile is a note, not a violation: a lease cannot stop a process that is already inside
    the body, the cluster rightly took the slot's lock back, and the run is recorded as
    indeterminate. Returns (violations, notes)."""
    forbid = {j.id for j in history.jobs if j.concurrency_policy == FORBID}
    forbid |= {e.job_id for e in history.executions if e.concurrency_policy == FORBID}
    intervals: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for execution_id in index.starts:
        row = index.rows.get(execution_id)
        span = index.interval(execution_id)
        if row is None or row.job_id not in forbid or span is None:
            continue
        end = span[1]
        if end is None:
            # No end line: a killed body ended when its process died; any other is unknown.
            end = index.killed_at.get(index.starts[execution_id][0].pid)
            if end is None or end < span[0]:
                continue
        intervals[row.job_id].append((span[0], end, execution_id))
    found: list[Violation] = []
    notes: list[Violation] = []
    for job_id, spans in intervals.items():
        spans.sort()
        latest: tuple[float, float, int] | None = None  # the known interval ending last so far
        for span in spans:
            if latest is not None and span[0] < latest[1]:
                first = index.rows[latest[2]]
                evidence = {
                    "first": {"start": latest[0], "end": latest[1], **row_evidence(first)},
                    "second": {
                        "start": span[0],
                        "end": span[1],
                        **row_evidence(index.rows[span[2]]),
                    },
                    "overlap_s": min(latest[1], span[1]) - span[0],
                }
                pid = index.starts[first.id][0].pid
                if first.status in (LOST, TIMED_OUT) and index.frozen(pid, latest[0], latest[1]):
                    notes.append(
                        Violation(
                            FROZEN_BODY_OVERLAP,
                            MSG_FROZEN_OVERLAP.format(
                                job_id=job_id, first=first.id, status=first.status, second=span[2]
                            ),
                            evidence,
                        )
                    )
                else:
                    found.append(
                        Violation(
                            FORBID_OVERLAP,
                            MSG_OVERLAP.format(job_id=job_id, first=latest[2], second=span[2]),
                            evidence,
                        )
                    )
            if latest is None or span[1] > latest[1]:
                latest = span
    return found, notes


def _lost_while_running(history: History, index: Index) -> list[Violation]:
    """A run declared lost whose body ran on, and ended normally, on a node that was neither
    killed, frozen nor cut off from the database: the node was alive, only its presence looked
    expired (a note: lost runs are indeterminate, but with retries this one runs twice)."""
    found = []
    for row in history.executions:
        span = index.interval(row.id)
        if row.status != LOST or row.finished_at is None or span is None or span[1] is None:
            continue
        start, end = span
        pid = index.starts[row.id][0].pid
        if end <= row.finished_at or index.frozen(pid, start, end):
            continue
        if index.was_cut_off(row.node, start, row.finished_at):
            continue
        found.append(
            Violation(
                LOST_WHILE_RUNNING,
                MSG_LOST_WHILE_RUNNING.format(
                    execution_id=row.id, at=when(row.finished_at), node=row.node
                ),
                {"row": row_evidence(row), "body_start": start, "body_end": end},
            )
        )
    return found


def _starts_after_end(history: History, index: Index) -> list[Violation]:
    """(d) A body started after its run was declared lost/timed out/cancelled/skipped, or a body
    started for a run the database says never started."""
    found = []
    for execution_id, starts in index.starts.items():
        row = index.rows.get(execution_id)
        if row is None:
            continue
        first = starts[0]
        if row.status in ENDED_BY_DECISION and row.finished_at is not None:
            late = [s for s in starts if s.at > row.finished_at]
            if late:
                # Whether the process was frozen before it started (the body may have passed its
                # self-fence just before the freeze: the one window a lease cannot close).
                freezes = [
                    (a, b)
                    for a, b in index.frozen_spans.get(late[0].pid, ())
                    if a <= late[0].at and b >= (row.claimed_at or late[0].at - 60)
                ]
                # Frozen before it was declared over, and its first step came on resume: it was
                # past its fence when the freeze began (a note); anything else is a violation.
                at_start = any(
                    a <= row.finished_at and abs(late[0].at - b) <= RESUME_START_S
                    for a, b in freezes
                )
                found.append(
                    Violation(
                        FROZEN_AT_START if at_start else START_AFTER_LOST,
                        (MSG_FROZEN_AT_START if at_start else MSG_START_AFTER_END).format(
                            execution_id=execution_id,
                            late_s=late[0].at - row.finished_at,
                            status=row.status,
                        ),
                        {
                            "row": row_evidence(row),
                            "start": effect_evidence(late[0]),
                            "frozen": freezes,
                        },
                    )
                )
        elif row.status in NOT_STARTED:
            found.append(
                Violation(
                    START_AFTER_LOST,
                    MSG_START_NOT_RECORDED.format(execution_id=execution_id, status=row.status),
                    {"row": row_evidence(row), "start": effect_evidence(first)},
                )
            )
    return found


def _overlaps(start: float, end: float, windows: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in windows)


def _blocking_windows(history: History, config: CheckConfig) -> list[tuple[float, float]]:
    return [
        (f.start, f.end + config.recovery_s)
        for f in history.faults
        if f.kind in config.leadership_blocking_faults
    ]


def _stuck(history: History, config: CheckConfig) -> list[Violation]:
    """(e) Nothing running or claimed once the cluster stopped gracefully, and no run in the
    running state longer than its timeout plus the dead threshold."""
    found = []
    blocked = _blocking_windows(history, config)
    for row in history.executions:
        if row.status == RUNNING:
            found.append(
                Violation(
                    STUCK_RUNNING,
                    MSG_LEFT_RUNNING.format(execution_id=row.id, status=row.status),
                    {"row": row_evidence(row), "started_at": row.started_at},
                )
            )
        elif row.status == PENDING and row.claim_token:
            found.append(
                Violation(
                    STUCK_RUNNING,
                    MSG_LEFT_CLAIMED.format(execution_id=row.id, node=row.node or "?"),
                    {"row": row_evidence(row), "claimed_at": row.claimed_at},
                )
            )
        elif (
            row.timeout_seconds
            and row.started_at is not None
            and row.finished_at is not None
            and row.status != SKIPPED
        ):
            duration = row.finished_at - row.started_at
            bound = row.timeout_seconds + config.dead_after_s + config.running_slack_s
            # An outage of the database delays the write of the outcome, not the run.
            if duration > bound and not _overlaps(row.started_at, row.finished_at, blocked):
                found.append(
                    Violation(
                        STUCK_RUNNING,
                        MSG_OVERRAN.format(
                            execution_id=row.id,
                            duration_s=duration,
                            timeout_s=row.timeout_seconds,
                        ),
                        {"row": row_evidence(row), "started_at": row.started_at},
                    )
                )
    return found


def _stale_writes(history: History) -> list[Violation]:
    """(f) A fire created by a leader after a newer term had been acquired (the fence must have
    refused it). Retries copy their original's term and operator runs carry none: only the
    leader's own fires (schedule trigger, attempt 1) name the term that wrote them. A fire's
    ``created_at`` is the instant its tick began: a tick begun before the newer term and committed
    after it is the commit-order check's to find (``commit_order``, from the binlog)."""
    terms = sorted(history.terms, key=lambda t: t.term)
    numbers = [t.term for t in terms]
    # suffix[i]: the earliest acquisition among terms[i:], and which term it was.
    suffix: list[tuple[float, int]] = [(math.inf, 0)] * (len(terms) + 1)
    for i in range(len(terms) - 1, -1, -1):
        suffix[i] = min((terms[i].acquired_at, terms[i].term), suffix[i + 1])
    found = []
    for row in history.executions:
        if row.term is None or row.trigger != SCHEDULE_TRIGGER or row.attempt != 1:
            continue
        first_newer = bisect.bisect_right(numbers, row.term)
        acquired, newer = suffix[first_newer]
        if row.created_at > acquired:
            found.append(
                Violation(
                    STALE_TERM_WRITE,
                    MSG_STALE_WRITE.format(
                        execution_id=row.id,
                        term=row.term,
                        late_s=row.created_at - acquired,
                        newer=newer,
                    ),
                    {
                        "row": row_evidence(row),
                        "created_at": row.created_at,
                        "newer_acquired_at": acquired,
                    },
                )
            )
    return found


def _terms_held_twice(history: History) -> list[Violation]:
    """(g) One term claimed by two nodes in their logs, or led by a node its row does not name."""
    found = []
    claims: dict[int, list[TermClaim]] = defaultdict(list)
    for claim in history.term_claims:
        claims[claim.term].append(claim)
    rows = {t.term: t for t in history.terms}
    for term, held in sorted(claims.items()):
        nodes = sorted({c.node_id for c in held})
        if len(nodes) > 1:
            found.append(
                Violation(
                    TERM_HELD_TWICE,
                    MSG_TERM_TWO_NODES.format(term=term, nodes=", ".join(nodes)),
                    {"claims": [asdict(c) for c in held]},
                )
            )
        row = rows.get(term)
        for node in nodes:
            if row is not None and row.node_id != node:
                found.append(
                    Violation(
                        TERM_HELD_TWICE,
                        MSG_TERM_ROW_OTHER_NODE.format(term=term, node=node, row_node=row.node_id),
                        {"row": asdict(row), "claims": [asdict(c) for c in held]},
                    )
                )
    return found


def _leader_gaps(history: History, config: CheckConfig) -> tuple[list[Violation], float]:
    """(h) Time without a leader beyond the bound, outside windows a fault made leaderless."""
    blocked = _blocking_windows(history, config)
    terms = {t.term: t for t in history.terms}
    found = []
    longest = 0.0
    for stretch in leaderless(history):
        if stretch.start < history.window_start:
            continue
        gap = stretch.end - stretch.start
        counted = gap - _overlaps(stretch.start, stretch.end, blocked)
        longest = max(longest, counted)
        if counted <= config.leader_gap_bound_s:
            continue
        before = asdict(terms[stretch.before])
        if stretch.after is None:
            message = MSG_LEADER_GONE.format(gap_s=gap, before=stretch.before)
            evidence = {"before": before, "effective_end": stretch.start, "stop_at": stretch.end}
        else:
            message = MSG_LEADER_GAP.format(gap_s=gap, before=stretch.before, after=stretch.after)
            evidence = {
                "before": before,
                "effective_end": stretch.start,
                "after": asdict(terms[stretch.after]),
                "excused_s": gap - counted,
            }
        found.append(Violation(LEADER_GAP, message, evidence))
    return found, longest


def _unjustified_skips(history: History, index: Index, config: CheckConfig) -> list[Violation]:
    """A forbid skip is taken on the truth: some other run of the job must really have been active
    at the skipped slot's instant — its body started before and had not ended (or it wrote no end
    line and its process had not been killed by then). A run marked running by a node that died
    before starting its body blocks nothing."""
    runs_by_job: dict[int, list[int]] = defaultdict(list)
    for execution_id in index.starts:
        row = index.rows.get(execution_id)
        if row is not None:
            runs_by_job[row.job_id].append(execution_id)
    found = []
    for row in history.executions:
        if row.status != SKIPPED or not row.reason.startswith(FORBID_SKIP_PREFIX):
            continue
        # Decided at the run's instant (a retry's is after its backoff), recorded at finished_at.
        due = row.run_after if row.run_after is not None else row.scheduled_for
        decided_by = max(due, row.finished_at or due)
        if any(
            _active_at(index, other, due - config.skip_tolerance_s, decided_by)
            for other in runs_by_job[row.job_id]
            if other != row.id
        ):
            continue
        found.append(
            Violation(
                UNJUSTIFIED_SKIP,
                MSG_UNJUSTIFIED_SKIP.format(
                    job_id=row.job_id,
                    slot=when(row.scheduled_for),
                    attempt=row.attempt,
                    reason=row.reason,
                    at=when(decided_by),
                ),
                {"row": row_evidence(row), "job": row.job_name},
            )
        )
    return found


def _active_at(index: Index, execution_id: int, since: float, until: float) -> bool:
    """Whether a body was running at some point of [since, until]."""
    span = index.interval(execution_id)
    if span is None or span[0] > until:
        return False
    if span[1] is not None:
        return span[1] >= since
    killed = index.killed_at.get(index.starts[execution_id][0].pid)
    return killed is None or killed >= since
