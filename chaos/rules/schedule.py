"""Rules on when the leader fires, judged from the rows it wrote:

- the slots of a job, computed here on their own (not by the product's schedule code, which is
  what is being checked): interval jobs, and cron jobs whose expression is a whole-minute pattern
  of seconds (``*/N * * * * *`` or ``S1,S2 * * * * *``, seconds first);
- ``misfire_policy``: a tick that wrote a job's fires more than its grace after the oldest of them
  (no leader for a while, a whole cluster stopped) must do what the policy names: ``run_once``
  runs exactly the newest missed slot and records the others skipped, ``skip`` runs none of
  them, ``run_all`` runs the newest ``run_all_max`` of them; a misfire skip in a tick that was
  not late (nor decided at run time past the grace) is a violation too;
- ``misfire_policy`` at run time: a fire still unstarted when later fires of its job are due has
  misfired too; the policy keeps the newest due fires (one for ``run_once`` and ``skip``,
  ``run_all_max`` for ``run_all``) and the older are skipped as superseded. A superseded skip needs
  that many later fires due when it was decided (whatever became of them), and a fire whose body
  started while that many were due (beyond the moment an admission takes) should have been
  superseded. A catch-up run (``run_all``'s run for a slot missed past the grace, released on the
  catch-up budget) is judged on the later catch-up fires of its job alone: the on-time fires that
  fall due while it waits for its turn do not supersede it;
- ``schedule_edit``: after an operator changes a job's interval, from the first slot after the
  edit's commit, the job fires exactly the slots of the new interval (none of the old one).

A tick's rows carry the instant it decided at (their ``created_at`` and a skip's ``finished_at``
are both the tick's "now", however long its statements then take) on the leader's clock; ticks
written by a leader whose clock the nemesis stepped are not judged.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable

from chaos.record import (
    SCHEDULE_TRIGGER,
    SKIPPED,
    CheckConfig,
    Execution,
    History,
    Index,
    JobInfo,
    ScheduleEdit,
    Violation,
    effect_evidence,
    row_evidence,
    slot_key,
    when,
)
from chaos.rules.attempts import clock_off

MISFIRE_POLICY = "misfire_policy"
KINDS = (MISFIRE_POLICY,)
MISFIRE_REASON_PREFIX = "misfire"
RUN_ONCE, SKIP, RUN_ALL = "run_once", "skip", "run_all"
# Rows of one job written within this of each other belong to one tick.
TICK_S = 0.25

MSG_MISFIRE = (
    "job {job_id} ({policy}, grace {grace_s} s): the tick at {at} wrote {missed} missed slots "
    "and ran {ran} ({expected})"
)
MSG_EARLY_MISFIRE = (
    "job {job_id}: slot {slot} skipped as a misfire although decided {late_s:.2f} s after it, "
    "within its grace of {grace_s} s"
)

_SECONDS_CRON = re.compile(r"^(\*/(\d+)|\d+(,\d+)*)( \*){5}$")


def cron_seconds(expression: str) -> tuple[int, ...] | None:
    """The seconds of each minute a whole-minute cron pattern fires at; None for any other."""
    expression = " ".join(expression.split())
    match = _SECONDS_CRON.match(expression)
    if not match:
        return None
    if match.group(2):
        step = int(match.group(2))
        return tuple(range(0, 60, step)) if 0 < step < 60 else None
    seconds = sorted({int(s) for s in expression.split()[0].split(",")})
    return tuple(seconds) if all(0 <= s < 60 for s in seconds) else None


def slot_step(job: JobInfo) -> float:
    """The longest wait between two slots of the job (0: not a schedule the checker follows)."""
    if job.schedule_type == "interval" and job.interval_seconds:
        return float(job.interval_seconds)
    seconds = cron_seconds(job.cron) if job.schedule_type == "cron" else None
    if not seconds:
        return 0.0
    gaps = [b - a for a, b in itertools.pairwise(seconds)] + [60 - seconds[-1] + seconds[0]]
    return float(max(gaps))


def job_slots(job: JobInfo, start: float, end: float) -> Iterable[float]:
    """The nominal slots of a job in [start, end] (none for a schedule the checker cannot follow)."""
    if job.schedule_type == "interval" and job.interval_seconds:
        step = job.interval_seconds
        anchor = job.start_at if job.start_at is not None else 0.0
        k = math.ceil((start - anchor) / step - 1e-9)
        slot = anchor + k * step
        while slot <= end + 1e-9:
            yield slot
            k += 1
            slot = anchor + k * step
        return
    seconds = cron_seconds(job.cron) if job.schedule_type == "cron" else None
    if not seconds or job.timezone not in ("UTC", "Etc/UTC"):
        return
    minute = math.floor(start / 60) * 60
    while minute <= end:
        for second in seconds:
            slot = minute + second
            if start - 1e-9 <= slot <= end + 1e-9:
                yield float(slot)
        minute += 60


MSG_SUPERSEDED_EARLY = (
    "job {job_id} ({policy}): slot {slot} skipped as superseded at {at} with {due} later fires "
    "due (the policy keeps {kept})"
)
MSG_RAN_SUPERSEDED = (
    "job {job_id} ({policy}): slot {slot} started (marked running) at {at} with {due} later fires "
    "already due "
    "(the policy keeps {kept}): it should have been skipped as superseded"
)
SUPERSEDED_PREFIX = "misfire: superseded"
# An admission reads a job's later due fires, then takes its locks and looks at its blockers
# before the fires it keeps start: a later fire falling due within this much of a start is one the
# decision could not see (seconds).
SUPERSEDE_TOLERANCE_S = 1.0
# A node whose own links were cut or slowed, or whose process was frozen, this long before a run
# was marked running may have admitted it on facts read before (a statement held by the
# partition, answered at the heal; a process stopped mid-admission): not judged.
LINK_FAULT_LOOKBACK_S = 30.0


def _superseded_skip(row: Execution) -> bool:
    return row.status == SKIPPED and row.reason.startswith(SUPERSEDED_PREFIX)


def fires_kept(job: JobInfo) -> int:
    """How many of a job's due, unstarted fires its misfire policy runs (the product's rule, stated
    here on its own)."""
    return max(1, job.run_all_max) if job.misfire_policy == RUN_ALL else 1


def _tick_instant(row: Execution) -> float:
    return row.created_at


def _misfire_skip(row: Execution) -> bool:
    return row.status == SKIPPED and row.reason.startswith(MISFIRE_REASON_PREFIX)


def _tick_skip(row: Execution) -> bool:
    """Written skipped by the tick for its misfire policy. A run not started within its grace is
    skipped later, at run time (its ``finished_at`` then trails its creation): the tick wrote it
    to run. So did it a fire superseded at run time, however soon after the tick (a catch-up fire
    whose next slot fell due a moment later)."""
    return (
        _misfire_skip(row)
        and not _superseded_skip(row)
        and (row.finished_at or row.created_at) - row.created_at <= TICK_S
    )


def _ticks(rows: list[Execution]) -> list[list[Execution]]:
    rows = sorted(rows, key=_tick_instant)
    groups: list[list[Execution]] = []
    for row in rows:
        if groups and _tick_instant(row) - _tick_instant(groups[-1][-1]) <= TICK_S:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def misfires(history: History, config: CheckConfig) -> list[Violation]:
    jobs = {job.id: job for job in history.jobs}
    fires: dict[int, list[Execution]] = defaultdict(list)
    for row in history.executions:
        if row.trigger == SCHEDULE_TRIGGER and row.attempt == 1 and row.job_id in jobs:
            fires[row.job_id].append(row)
    writers = {t.term: t.node_id for t in history.terms}
    found = []
    for job_id, rows in fires.items():
        job = jobs[job_id]
        grace = job.misfire_grace_seconds
        for tick in _ticks(rows):
            at = _tick_instant(tick[0])
            writer = writers.get(tick[0].term or -1, "")
            if clock_off(history, writer, at - 10.0, at + 10.0):
                continue
            missed = sorted(
                (r for r in tick if r.scheduled_for <= at), key=lambda r: r.scheduled_for
            )
            # The leader judges a tick late by its own "now" against the job's next slot, to the
            # microsecond; a tick taken on a slot instant lands within the tolerance of the grace
            # whenever the grace is a whole number of intervals. There either decision is right,
            # and the tick's skips say which one it took.
            gap = at - missed[0].scheduled_for if missed else 0.0
            tol = config.timing_tolerance_s
            late = gap > grace + tol or (gap > grace - tol and any(map(_tick_skip, missed)))
            if not late:
                for row in tick:
                    # A misfire skip is decided when it is written (its finished_at): past the
                    # grace, whether by a tick or at run time.
                    early = (row.finished_at or at) - row.scheduled_for
                    if _superseded_skip(row):
                        continue  # judged on the later fires it had (``superseded``)
                    if _misfire_skip(row) and early < grace - config.timing_tolerance_s:
                        found.append(
                            Violation(
                                MISFIRE_POLICY,
                                MSG_EARLY_MISFIRE.format(
                                    job_id=job_id,
                                    slot=when(row.scheduled_for),
                                    late_s=early,
                                    grace_s=grace,
                                ),
                                {"row": row_evidence(row)},
                            )
                        )
                continue
            ran = [r for r in missed if not _tick_skip(r)]
            keep = {RUN_ONCE: 1, SKIP: 0}.get(job.misfire_policy, job.run_all_max)
            wanted = missed[max(0, len(missed) - keep) :] if keep else []
            if [r.id for r in ran] == [r.id for r in wanted]:
                continue
            found.append(
                Violation(
                    MISFIRE_POLICY,
                    MSG_MISFIRE.format(
                        job_id=job_id,
                        policy=job.misfire_policy,
                        grace_s=grace,
                        at=when(at),
                        missed=len(missed),
                        ran=len(ran),
                        expected=f"expected the newest {min(keep, len(missed))}",
                    ),
                    {"rows": [row_evidence(r) for r in missed]},
                )
            )
    return found


def superseded(history: History, index: Index, config: CheckConfig) -> list[Violation]:
    """Run-time misfires: each superseded skip had as many later fires of its job due as the
    policy keeps when it was decided; no fire started while that many were due (beyond
    SUPERSEDE_TOLERANCE_S)."""
    jobs = {job.id: job for job in history.jobs}
    fires: dict[int, list[Execution]] = defaultdict(list)
    for row in history.executions:
        if row.trigger == SCHEDULE_TRIGGER and row.attempt == 1 and row.job_id in jobs:
            fires[row.job_id].append(row)
    tol = config.timing_tolerance_s
    found = []
    for job_id, rows in fires.items():
        job = jobs[job_id]
        kept = fires_kept(job)
        rows.sort(key=lambda r: r.scheduled_for)

        def due_later(row: Execution, due_by: float, rows: list[Execution] = rows) -> int:
            """Later fires of the job written and due by ``due_by``, whatever became of them. A
            fire is due at its slot (the chaos jobs have no spread), whatever its run_after
            became: a fire handed back to wait for a lock service is due all the same. A
            catch-up run counts the later catch-up fires only."""
            return sum(
                1
                for later in rows
                if later.scheduled_for > row.scheduled_for
                and later.scheduled_for <= due_by
                and later.created_at <= due_by
                and (later.catch_up or not row.catch_up)
            )

        for row in rows:
            if _superseded_skip(row) and row.finished_at is not None:
                at = row.finished_at
                if clock_off(history, row.node, at - 10.0, at + 10.0):
                    continue
                due = due_later(row, at + tol)
                if due < kept:
                    found.append(
                        Violation(
                            MISFIRE_POLICY,
                            MSG_SUPERSEDED_EARLY.format(
                                job_id=job_id,
                                policy=job.misfire_policy,
                                slot=when(row.scheduled_for),
                                at=when(at),
                                due=due,
                                kept=kept,
                            ),
                            {"row": row_evidence(row)},
                        )
                    )
                continue
            starts = index.starts.get(row.id)
            if not starts:
                continue
            start = starts[0]
            # Judged at the instant the run was marked running (its admission: the decision),
            # not at its body's first step, which a freeze of the process may hold back.
            marked = row.started_at if row.started_at is not None else start.at
            instant = marked - SUPERSEDE_TOLERANCE_S
            if (
                clock_off(history, start.node, instant - 10.0, marked)
                or index.frozen(start.pid, marked - LINK_FAULT_LOOKBACK_S, marked)
                or any(
                    who == start.node and a <= marked and b >= marked - LINK_FAULT_LOOKBACK_S
                    for who, a, b in index.cut_off
                )
            ):
                continue
            due = due_later(row, instant)
            if due >= kept:
                found.append(
                    Violation(
                        MISFIRE_POLICY,
                        MSG_RAN_SUPERSEDED.format(
                            job_id=job_id,
                            policy=job.misfire_policy,
                            slot=when(row.scheduled_for),
                            at=when(marked),
                            due=due,
                            kept=kept,
                        ),
                        {"row": row_evidence(row), "start": effect_evidence(start)},
                    )
                )
    return found


# --- schedule edits ----------------------------------------------------------------------------------

SCHEDULE_EDIT = "schedule_edit"
KINDS = (*KINDS, SCHEDULE_EDIT)
# An edit takes effect from the first slot after its commit; the fires the leader had written ahead
# (its lookahead, a tick early) before the commit may still follow the old schedule.
EDIT_SETTLE_S = 2.5

MSG_OLD_SLOT = (
    "job {job_id}: slot {slot} is not on the schedule of every {step} s committed at {at} "
    "(fired on an older schedule after the edit took effect)"
)
MSG_NEW_SLOT_MISSING = (
    "job {job_id}: no fire of slot {slot} of the schedule of every {step} s committed at {at}"
)


def edited_jobs(history: History) -> set[int]:
    return {edit.job_id for edit in history.edits}


def _on_grid(instant: float, step: int) -> bool:
    return abs(instant / step - round(instant / step)) < 1e-6 / step


def edits_followed(history: History, index: Index) -> list[Violation]:
    """Each segment between two edits of a job (from the first's commit + EDIT_SETTLE_S to the
    next one's request) fires exactly the slots of its own interval."""
    by_job: dict[int, list[ScheduleEdit]] = defaultdict(list)
    for edit in history.edits:
        by_job[edit.job_id].append(edit)
    fires: dict[int, list[Execution]] = defaultdict(list)
    for row in history.executions:
        if row.trigger == SCHEDULE_TRIGGER and row.attempt == 1 and row.job_id in by_job:
            fires[row.job_id].append(row)
    deleted = {d.job_id: d.sent for d in history.deleted}
    found = []
    for job_id, edits in by_job.items():
        edits.sort(key=lambda e: e.sent)
        for k, edit in enumerate(edits):
            start = max(edit.answered + EDIT_SETTLE_S, history.window_start)
            end = min(
                edits[k + 1].sent if k + 1 < len(edits) else history.window_end,
                history.window_end,
                deleted.get(job_id, float("inf")),
            )
            if end <= start:
                continue
            step = edit.interval_seconds
            at = when(edit.answered)
            for row in fires[job_id]:
                if start <= row.scheduled_for <= end and not _on_grid(row.scheduled_for, step):
                    found.append(
                        Violation(
                            SCHEDULE_EDIT,
                            MSG_OLD_SLOT.format(
                                job_id=job_id, slot=when(row.scheduled_for), step=step, at=at
                            ),
                            {"row": row_evidence(row), "edit": [edit.sent, edit.answered, step]},
                        )
                    )
            # A slot is owed once the leader wrote a later fire of the job under this schedule (an
            # edit committed while the cluster was down re-plans from now: the slots it left behind
            # are superseded, not missed).
            superseded_at = edits[k + 1].sent if k + 1 < len(edits) else float("inf")
            passed = [r.scheduled_for for r in fires[job_id] if r.created_at < superseded_at]
            slot = math.ceil(start / step) * step
            while slot <= end:
                if not any(later > slot for later in passed):
                    slot += step
                    continue
                paused = any(
                    w.job_id == job_id
                    and w.start <= slot + step
                    and (w.end is None or w.end >= slot - step)
                    for w in history.paused
                )
                if not paused and (job_id, slot_key(slot)) not in index.by_slot:
                    found.append(
                        Violation(
                            SCHEDULE_EDIT,
                            MSG_NEW_SLOT_MISSING.format(
                                job_id=job_id, slot=when(slot), step=step, at=at
                            ),
                            {"edit": [edit.sent, edit.answered, step]},
                        )
                    )
                slot += step
    return found
