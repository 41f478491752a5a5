"""How long the cluster took to recover from each fault, and whether it took too long.

For every fault the nemesis injected:

- the *leader gap*: the longest time without a leader that began while the fault lasted (a term
  ends at its row's end, or earlier when its node was killed, frozen, stopped or cut off);
- the *takeover*: from the fault's start to the next term, when the fault took the leader;
- the *job gap*: for each job, from its last body start before the fault to its first after,
  the longest over the jobs (a 1 s job that keeps its pace shows 1 s).

A job gap that spans a fault may last the job's interval plus the fault's recovery bound
(:func:`chaos.faults.recovery_bound_s`: a lease TTL and a margin; an outage's counts
from its end) and no longer: past that, the cluster did not recover in time (``slow_recovery``).
A gap that spans several faults may last until the latest of their bounds.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import asdict, dataclass

from chaos import faults
from chaos.record import (
    CANCELLED,
    FAILED,
    FORBID,
    SUCCEEDED,
    CheckConfig,
    Fault,
    History,
    Index,
    Term,
    Violation,
    when,
)
from chaos.rules.schedule import slot_step

SLOW_RECOVERY = "slow_recovery"
MSG_SLOW_RECOVERY = (
    "job {job_id}: no body started for {gap_s:.2f} s after {kind} on {target} at {at} "
    "(bound {bound_s:.2f} s: its interval + {recovery_s:.2f} s)"
)
OPERATOR_PREFIX = "api_"
# A forbid job whose body ran on through a fault starts again within its interval of that body's
# end, plus this (s): the settle time, a claim and an admission.
BUSY_RESTART_S = 1.0
RECORDED_BY_ITS_NODE = frozenset({SUCCEEDED, FAILED, CANCELLED})
# The executor's reason for a run whose job lock was lost under it
# (cluster.executor.runs.REASON_LOCK_LOST, repeated: no Django here).
LOCK_LOST_REASON = "job lock lost"
# A body's end line is written just before its row's outcome; the clocks differ a little (s).
ORDER_SLACK_S = 0.05


@dataclass(frozen=True)
class Leaderless:
    start: float
    end: float
    before: int  # the term that ended
    after: int | None  # the next one (None: none until the cluster stopped)


@dataclass
class KindRecovery:
    faults: int = 0
    longest_leader_gap_s: float = 0.0
    longest_takeover_s: float | None = None
    longest_job_gap_s: float = 0.0
    bound_s: float = 0.0


def effective_end(term: Term, history: History) -> float | None:
    """When a term really ended: its row's end, or earlier the instant its node was killed,
    frozen, stopped or cut off (the successor closes a dead leader's row only when it takes
    over)."""
    end = term.ended_at
    for fault in history.faults:
        if (
            fault.kind in faults.NODE_FAULTS
            and fault.target == term.node_id
            and fault.start >= term.acquired_at
            and (end is None or fault.start < end)
        ):
            end = fault.start
    return end


def leaderless(history: History) -> list[Leaderless]:
    """Every stretch without a leader, between a term's effective end and the next term."""
    terms = sorted(history.terms, key=lambda t: t.term)
    found = []
    for before, after in itertools.pairwise(terms):
        end = effective_end(before, history)
        if end is not None and after.acquired_at > end:
            found.append(Leaderless(end, after.acquired_at, before.term, after.term))
    if terms and history.stop_at:
        end = effective_end(terms[-1], history)
        if end is not None and end < history.stop_at:
            found.append(Leaderless(end, history.stop_at, terms[-1].term, None))
    return found


def _recovers_by(fault: Fault, config: CheckConfig) -> float:
    """The instant by which the cluster must be running every job again (before their interval)."""
    outage = fault.kind in config.leadership_blocking_faults or fault.kind in faults.OUTAGE_FAULTS
    since = fault.end if outage else fault.start
    return since + faults.recovery_bound_s(fault.kind, lease_ttl_s=config.lease_ttl_s)


def _holder_at(history: History, instant: float) -> Term | None:
    held = [t for t in history.terms if t.acquired_at <= instant]
    if not held:
        return None
    term = max(held, key=lambda t: t.term)
    end = effective_end(term, history)
    return term if end is None or end >= instant else None


def _job_starts(history: History, index: Index) -> dict[int, list[tuple[float, int]]]:
    """Each job's body starts (instant, execution id), in time order: its fires, and the runs an
    operator triggered or enqueued (a forbid job busy with those skips its fires, rightly, and is
    running all the same; a fire that never ran is ``missing_slot``'s business)."""
    starts: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for execution_id, effects in index.starts.items():
        row = index.rows.get(execution_id)
        if row is not None:
            starts[row.job_id].append((effects[0].at, execution_id))
    for values in starts.values():
        values.sort()
    return starts


def _busy_until(index: Index, execution_id: int, forbid: set[int]) -> float | None:
    """When the body of a forbid run ended, if its node ran it to the end and recorded it (not
    lost nor timed out): until then the job rightly started nothing else (a body slowed by the
    fault itself, a fenced write over a slow database path, is the task's time, not recovery's).
    None for other runs."""
    row = index.rows.get(execution_id)
    span = index.interval(execution_id)
    if row is None or row.job_id not in forbid or span is None or span[1] is None:
        return None
    # Recorded by its node once the body had ended: a run the cluster ended (lost, timed out, its
    # lock given up) has its row ended before the body, or never by it.
    if row.status not in RECORDED_BY_ITS_NODE or row.finished_at is None:
        return None
    if row.reason.startswith(LOCK_LOST_REASON):
        return None  # its node ended it when it lost the job lock, not when the body returned
    return span[1] if row.finished_at >= span[1] - ORDER_SLACK_S else None


def _paused(history: History, job_id: int, start: float, end: float) -> bool:
    return any(
        w.job_id == job_id and w.start <= end and (w.end is None or w.end >= start)
        for w in history.paused
    )


def recovery(
    history: History, index: Index, config: CheckConfig
) -> tuple[dict[str, KindRecovery], list[Violation]]:
    """The recovery figures by fault kind, and the gaps past their bound."""
    table: dict[str, KindRecovery] = {}
    nemesis = sorted(
        (f for f in history.faults if not f.kind.startswith(OPERATOR_PREFIX)),
        key=lambda f: f.start,
    )
    starts = _job_starts(history, index)
    forbid = {j.id for j in history.jobs if j.concurrency_policy == FORBID}
    intervals = {job.id: slot_step(job) for job in history.jobs}
    for edit in history.edits:  # a job whose interval was edited: its longest one
        intervals[edit.job_id] = max(intervals.get(edit.job_id, 0.0), float(edit.interval_seconds))
    stretches = leaderless(history)
    terms = sorted(history.terms, key=lambda t: t.acquired_at)
    acquired = [t.acquired_at for t in terms]
    found: list[Violation] = []
    reported: set[tuple[int, float]] = set()
    for fault in nemesis:
        entry = table.setdefault(fault.kind, KindRecovery())
        entry.faults += 1
        deadline = _recovers_by(fault, config)
        entry.bound_s = max(entry.bound_s, deadline - fault.start)
        for stretch in stretches:
            if fault.start - 0.05 <= stretch.start <= fault.end + 0.05:
                entry.longest_leader_gap_s = max(
                    entry.longest_leader_gap_s, stretch.end - stretch.start
                )
        holder = _holder_at(history, fault.start - 1e-6)
        # A takeover is measured for faults that took leadership (not a clock step, a slow lock
        # master or an operator's action): the leader's term ended within the fault's recovery
        # time. A leader that kept leading through it (a slowed link its renewals still fit) needed
        # no takeover: a term that ends long after is another story.
        ended = effective_end(holder, history) if holder is not None else None
        if (
            holder is not None
            and fault.kind in faults.LOSS_FAULTS
            and (holder.node_id == fault.target or fault.kind in faults.OUTAGE_FAULTS)
            and ended is not None
            and ended <= deadline
        ):
            later = bisect.bisect_right(acquired, fault.start)
            if later < len(terms) and terms[later].term > holder.term:
                takeover = terms[later].acquired_at - fault.start
                entry.longest_takeover_s = max(entry.longest_takeover_s or 0.0, takeover)
        for job_id, runs in starts.items():
            times = [at for at, _ in runs]
            step = intervals.get(job_id, 0.0)
            after = bisect.bisect_right(times, fault.start)
            if after == 0 or after >= len(times) or not step:
                continue
            last, first = times[after - 1], times[after]
            if first < history.window_start or _paused(history, job_id, last, first):
                continue
            gap = first - last
            entry.longest_job_gap_s = max(entry.longest_job_gap_s, gap)
            causes = [f for f in nemesis if last <= f.start <= first]
            allowed_until = max(_recovers_by(f, config) for f in causes) + step
            busy = _busy_until(index, runs[after - 1][1], forbid)
            if busy is not None:
                allowed_until = max(allowed_until, busy + step + BUSY_RESTART_S)
            if first > allowed_until and (job_id, last) not in reported:
                reported.add((job_id, last))
                found.append(
                    Violation(
                        SLOW_RECOVERY,
                        MSG_SLOW_RECOVERY.format(
                            job_id=job_id,
                            gap_s=gap,
                            kind=fault.kind,
                            target=fault.target,
                            at=when(fault.start),
                            bound_s=allowed_until - last,
                            recovery_s=allowed_until - step - fault.start,
                        ),
                        {
                            "last_start": last,
                            "next_start": first,
                            "faults": [asdict(f) for f in causes],
                        },
                    )
                )
    return table, found
