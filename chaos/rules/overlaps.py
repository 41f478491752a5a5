"""Rules on forbid jobs and on bodies against their rows: no two bodies of a forbid job at once, no
body started after its run was declared over, no forbid skip while nothing of the job was active;
and the notes that explain a lease's inherent limits (bodies frozen inside their run)."""

from __future__ import annotations

from collections import defaultdict

from chaos import faults
from chaos.record import (
    ENDED_BY_DECISION,
    FORBID,
    FORBID_SKIP_PREFIX,
    LOST,
    NOT_STARTED,
    SKIPPED,
    TIMED_OUT,
    CheckConfig,
    Execution,
    Fault,
    History,
    Index,
    SideEffect,
    Violation,
    effect_evidence,
    row_evidence,
    when,
)

FORBID_OVERLAP = "forbid_overlap"  # two bodies of a forbid job ran at the same time
START_AFTER_LOST = "start_after_lost"  # a body started after its run was declared over
UNJUSTIFIED_SKIP = "unjustified_skip"  # a forbid skip while no run of the job was really active

# Notes: worth reading, not violations of a guarantee.
FROZEN_BODY_OVERLAP = "frozen_body_overlap"  # a forbid overlap caused by a body frozen mid-run
# A forbid overlap caused by a body that ran on while its node was cut off from the database, after
# the cluster had ended its run (the node gave its job lock up).
CUT_BODY_OVERLAP = "cut_body_overlap"
LOST_WHILE_RUNNING = "lost_while_running"  # declared lost while its node was up and running it
# Frozen between its self-fence and its first step, before being declared over: it starts on resume.
FROZEN_AT_START = "frozen_at_start"
# A body whose first step comes this soon after its process resumed was past its self-fence when
# the freeze began: a fence checked after the resume fails (the node's monotonic clock shows the
# freeze), so only a body already through it starts at once.
RESUME_START_S = 0.25
MSG_OVERLAP = "job {job_id} (forbid): executions {first} and {second} ran at the same time"
MSG_START_AFTER_END = (
    "execution {execution_id}: body started {late_s:.3f} s after the run was recorded {status}"
)
MSG_START_NOT_RECORDED = "execution {execution_id}: body started but the run is recorded {status}"
MSG_FROZEN_OVERLAP = (
    "job {job_id} (forbid): execution {first} was frozen inside its body (SIGSTOP), declared "
    "{status} and resumed while execution {second} ran"
)
MSG_CUT_OVERLAP = (
    "job {job_id} (forbid): execution {first} ran on while its node was cut off from the "
    "database, was declared {status} before execution {second} started, and ended beside it "
    "({fenced})"
)
# The rows' instants and the bodies' lines come from different clocks (the database's, the
# nodes' true time): a successor counts as started after a declaration within this much (s).
DECLARED_SLACK_S = 0.05
# The leader reads a cut-off node's state from its presence, renewed every heartbeat: a
# declaration may come this long (s) after the cut healed.
PRESENCE_LAG_S = 1.0
# A node's presence lives the dead threshold from its last renewal, which may precede the cut by
# a heartbeat (s): a node cut off from both services is declared gone that much sooner.
RENEWED_BEFORE_CUT_S = 0.5
# Cut-off faults that reach every node, not only their target.
ALL_NODES_CUT = frozenset({faults.DB_DOWN, faults.MARIADB_RESTART})
# Faults that cut a node off from its database (its own link, or every node's).
DB_CUT_FAULTS = frozenset(
    {
        faults.PARTITION_DB_LEADER,
        faults.PARTITION_DB_WORKER,
        faults.ONEWAY_DB_LEADER,
        faults.ONEWAY_DB_WORKER,
        faults.PARTITION_BOTH_LEADER,
        faults.PARTITION_BOTH_WORKER,
        faults.DB_DOWN,
        faults.MARIADB_RESTART,
    }
)
# Slowed database links: past the control limit they cut their node off as a partition does.
SLOW_DB_FAULTS = frozenset({faults.SLOW_DB_LEADER, faults.SLOW_DB_WORKER})


def cuts_database(fault: Fault, *, control_limit_s: float) -> bool:
    """Whether ``fault`` cut its node (or every node) off from the database as the node itself
    judges it: a partition, a one-way link, an outage, or a link slowed so far that a statement's
    round trip alone takes the control limit. A node counts a control statement unanswered a
    little past that limit as an outage, and its reconnects (several round trips, under a client
    timeout a second above the limit) fail before that, so such a node gives its job locks up
    and the leader ends its runs, exactly as after a cut."""
    if fault.kind in DB_CUT_FAULTS:
        return True
    return fault.kind in SLOW_DB_FAULTS and 2 * fault.magnitude >= control_limit_s


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


def forbid_overlaps(
    history: History,
    index: Index,
    *,
    dead_after_s: float = 2.0,
    control_limit_s: float = 1.0,
) -> tuple[list[Violation], list[Violation]]:
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
    ends = {e.execution_id: e for e in history.side_effects if e.event == "end" and e.fenced}
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
                elif _cut_off_body(
                    history,
                    ends.get(first.id),
                    first,
                    span[0],
                    dead_after_s=dead_after_s,
                    control_limit_s=control_limit_s,
                ):
                    notes.append(
                        Violation(
                            CUT_BODY_OVERLAP,
                            MSG_CUT_OVERLAP.format(
                                job_id=job_id,
                                first=first.id,
                                status=first.status,
                                fenced=_fenced_outcome(ends.get(first.id)),
                                second=span[2],
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


def _fenced_outcome(end: SideEffect | None) -> str:
    return f"its fenced write {end.fenced}" if end is not None and end.fenced else "no fenced write"


def _cut_off_body(
    history: History,
    end: SideEffect | None,
    first: Execution,
    successor_start: float,
    *,
    dead_after_s: float,
    control_limit_s: float,
) -> bool:
    """Whether a body ran on beside its successor only because its node could not do its work:
    the cluster ended the run lost before the successor started, while the node had been cut off
    from the database for at least the dead threshold (the node gives its job locks up then, and
    the leader ends its runs), and the body's fenced write, if it made one, did not land after a
    newer run's (``stale_fenced_write`` judges that). The lease's limit, as for a frozen body:
    fencing keeps what the body does."""
    if first.status != LOST or first.finished_at is None:
        return False
    declared = first.finished_at
    if successor_start < declared - DECLARED_SLACK_S:
        return False
    if end is not None and end.fenced == "accepted" and end.token is not None:
        newer_first = any(
            other.job_id == end.job_id
            and other.fenced == "accepted"
            and other.token is not None
            and other.token > end.token
            and other.at < end.at
            for other in history.side_effects
            if other.event == "end"
        )
        if newer_first:
            return False
    return any(
        cuts_database(f, control_limit_s=control_limit_s)
        and (f.target == first.node or f.kind in ALL_NODES_CUT)
        and f.start + dead_after_s - RENEWED_BEFORE_CUT_S <= declared + DECLARED_SLACK_S
        and f.end >= declared - PRESENCE_LAG_S
        for f in history.faults
    )


def lost_while_running(history: History, index: Index) -> list[Violation]:
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


def starts_after_end(history: History, index: Index) -> list[Violation]:
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


def unjustified_skips(history: History, index: Index, config: CheckConfig) -> list[Violation]:
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
