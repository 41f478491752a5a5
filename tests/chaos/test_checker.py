"""The chaos checker on crafted histories: a clean history reports nothing, and each kind of
violation is reported with its evidence (table-driven, no database, no processes)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chaos import checker as c
from chaos.checker import check
from chaos.history import parse_term_claims, pause_windows, read_side_effects
from chaos.record import (
    ApiAnomaly,
    CheckConfig,
    Commit,
    Deletion,
    Execution,
    Fault,
    History,
    JobInfo,
    PauseWindow,
    Permit,
    Requested,
    ScheduleEdit,
    SideEffect,
    Term,
    TermClaim,
    history_from_dict,
    history_to_dict,
)
from chaos.rules.runs import interval_slots

T0 = 1_800_000_000.0  # a whole second
SLOTS = 10
FORBID_REASON = "forbid: previous run still active"


def _job(job_id: int) -> JobInfo:
    return JobInfo(
        id=job_id,
        name=f"job-{job_id}",
        schedule_type="interval",
        interval_seconds=1,
        start_at=None,
        concurrency_policy="forbid",
        timeout_seconds=10,
        max_retries=1,
        created_at=T0 - 30,
    )


def _execution(job: JobInfo, slot: float, **fields: object) -> Execution:
    term = 1 if slot < T0 + 5 else 2
    values: dict[str, object] = {
        "id": job.id * 1000 + int(slot - T0),
        "job_id": job.id,
        "job_name": job.name,
        "concurrency_policy": job.concurrency_policy,
        "timeout_seconds": job.timeout_seconds,
        "max_retries": job.max_retries,
        "interval_seconds": job.interval_seconds,
        "scheduled_for": slot,
        "attempt": 1,
        "trigger": "schedule",
        "status": "succeeded",
        "node": "n3",
        "term": term,
        "claim_token": None,
        "created_at": slot - (1.0 if term == 1 else 0.8),
        "claimed_at": slot - 0.9,
        "started_at": slot - 0.05,
        "finished_at": slot + 0.3,
        "reason": "",
    }
    values.update(fields)
    return Execution(**values)  # type: ignore[arg-type]


def _effects(row: Execution, start: float = 0.001, end: float | None = 0.2) -> list[SideEffect]:
    base = {
        "execution_id": row.id,
        "job_id": row.job_id,
        "scheduled_for": row.scheduled_for,
        "attempt": row.attempt,
        "node": row.node,
        "pid": 4242,
    }
    found = [SideEffect(event="start", at=row.scheduled_for + start, **base)]
    if end is not None:
        found.append(SideEffect(event="end", at=row.scheduled_for + end, **base))
    return found


def clean() -> History:
    """Two forbid jobs, ten 1 s slots each, every one run once; term 1 (n1) hands over to term 2
    (n2) by a SIGTERM at T0 + 4."""
    jobs = [_job(1), _job(2)]
    executions, effects = [], []
    for job in jobs:
        for k in range(SLOTS):
            row = _execution(job, T0 + k)
            executions.append(row)
            effects += _effects(row)
    return History(
        jobs=jobs,
        executions=executions,
        side_effects=effects,
        terms=[
            Term(1, "n1", T0 - 20, T0 + 4.0, "stepped_down"),
            Term(2, "n2", T0 + 4.1, None, ""),
        ],
        term_claims=[TermClaim("n1", 1, T0 - 20), TermClaim("n2", 2, T0 + 4.1)],
        faults=[Fault("sigterm_leader", "n1", T0 + 4.0, T0 + 4.0, pid=1111)],
        window_start=T0,
        window_end=T0 + SLOTS - 1,
        stop_at=T0 + SLOTS,
    )


# --- small editing helpers for the table ---------------------------------------------------------


def _find(h: History, job_id: int, k: int, attempt: int = 1) -> Execution:
    return next(
        e
        for e in h.executions
        if e.job_id == job_id and e.scheduled_for == T0 + k and e.attempt == attempt
    )


def _replace_row(h: History, job_id: int, k: int, **fields: object) -> Execution:
    old = _find(h, job_id, k)
    new = dataclasses.replace(old, **fields)
    h.executions[h.executions.index(old)] = new
    return new


def _drop_effects(h: History, execution_id: int, event: str | None = None) -> None:
    h.side_effects = [
        s
        for s in h.side_effects
        if not (s.execution_id == execution_id and (event is None or s.event == event))
    ]


def _move_effect(h: History, execution_id: int, event: str, at: float) -> None:
    h.side_effects = [
        dataclasses.replace(s, at=at) if s.execution_id == execution_id and s.event == event else s
        for s in h.side_effects
    ]


def _add_row(h: History, row: Execution, *, started: bool = True) -> None:
    h.executions.append(row)
    if started:
        h.side_effects += _effects(row, start=0.5, end=0.7)


# --- mutations: each returns nothing and edits the clean history ---------------------------------


def body_twice(h: History) -> None:
    row = _find(h, 1, 0)
    h.side_effects.append(_effects(row, start=0.05)[0])


def retry_of_a_success(h: History) -> None:
    first = _find(h, 1, 2)
    _add_row(h, dataclasses.replace(first, id=99_001, attempt=2, trigger="retry"))


def two_succeeded_rows(h: History) -> None:
    first = _find(h, 2, 3)
    h.executions.append(dataclasses.replace(first, id=99_002, attempt=2, trigger="retry"))


def manual_run_just_before_a_slot(h: History) -> None:
    """An operator's run now, 0.3 ms before a whole second: a run of its own (a chaos run once
    reported it as a second execution of that second's slot)."""
    slot = _find(h, 2, 3)
    _add_row(
        h,
        dataclasses.replace(
            slot,
            id=99_004,
            trigger="api",
            term=None,
            scheduled_for=slot.scheduled_for - 0.0003,
            run_after=slot.scheduled_for - 0.0003,
        ),
    )


def worker_killed(h: History, at: float) -> None:
    h.faults.append(Fault("sigkill_worker", "n3", at, at))


def retry_after_lost(h: History) -> None:
    lost = _replace_row(h, 1, 2, status="lost", reason="node n3 stopped heartbeating")
    worker_killed(h, T0 + 2.1)
    _drop_effects(h, lost.id, "end")
    _add_row(h, dataclasses.replace(lost, id=99_003, attempt=2, status="succeeded", reason=""))


def slot_without_row(h: History) -> None:
    row = _find(h, 2, 4)
    h.executions.remove(row)
    _drop_effects(h, row.id)


def skipped_without_reason(h: History) -> None:
    row = _replace_row(h, 2, 5, status="skipped", reason="")
    _drop_effects(h, row.id)


def left_pending(h: History) -> None:
    """Slot 6 still pending when the cluster stopped, long after it was due."""
    row = _replace_row(h, 1, 6, status="pending", started_at=None, finished_at=None)
    _drop_effects(h, row.id)
    h.stop_at = T0 + 6 + c.CheckConfig().pending_bound_s + 1
    h.terms[1] = dataclasses.replace(h.terms[1], ended_at=h.stop_at, end_reason="stepped_down")


def deferred_at_the_stop(h: History) -> None:
    """Slot 8 still pending at the stop, two seconds after it was due: deferred, not lost."""
    row = _replace_row(h, 1, 8, status="pending", started_at=None, finished_at=None)
    _drop_effects(h, row.id)


def lost_in_flight(h: History) -> None:
    row = _replace_row(h, 1, 3, status="lost", reason="node n3 stopped heartbeating")
    _drop_effects(h, row.id, "end")
    worker_killed(h, T0 + 3.1)


def lost_with_no_fault(h: History) -> None:
    row = _replace_row(h, 1, 3, status="lost", reason="node n3 stopped heartbeating")
    _drop_effects(h, row.id, "end")


def lost_long_after_its_fault(h: History) -> None:
    lost_with_no_fault(h)
    h.faults.append(Fault("sigstop_worker", "n3", T0 - 25.0, T0 - 20.0))


def lost_after_a_fault_on_another_node(h: History) -> None:
    lost_with_no_fault(h)
    h.faults.append(Fault("sigkill_worker", "n2", T0 + 3.1, T0 + 3.1))


def lost_on_a_worker_cut_one_way(h: History) -> None:
    """A fault dealt for the leader lands on a worker when nobody leads, logged with the role its
    target had (oneway_db_worker): a run lost on that worker is excused as on any cut node."""
    lost_with_no_fault(h)
    h.faults.append(Fault("oneway_db_worker", "n3", T0 + 3.1, T0 + 8.6))


def lost_on_a_worker_slowed(h: History) -> None:
    lost_with_no_fault(h)
    h.faults.append(Fault("slow_db_worker", "n3", T0 + 3.1, T0 + 8.6))


def paused_for_a_while(h: History) -> None:
    for k in (4, 5, 6):
        row = _find(h, 2, k)
        h.executions.remove(row)
        _drop_effects(h, row.id)
    h.paused.append(PauseWindow(job_id=2, start=T0 + 3.5, end=T0 + 5.2))


def forbid_runs_overlap(h: History) -> None:
    first = _find(h, 1, 0)
    _move_effect(h, first.id, "end", T0 + 1.1)


def _body_of_its_own_process(h: History, execution_id: int, pid: int) -> None:
    h.side_effects = [
        dataclasses.replace(s, pid=pid) if s.execution_id == execution_id else s
        for s in h.side_effects
    ]


def overlap_with_an_unknown_end(h: History) -> None:
    """Slot 0's body wrote no end line and its process was never killed: its end is unknown, so
    no overlap with slot 1's body can be shown."""
    first = _replace_row(h, 1, 0, status="lost", reason="node n3 is gone", finished_at=T0 + 1.5)
    _drop_effects(h, first.id, "end")
    _body_of_its_own_process(h, first.id, 5151)
    h.faults.append(Fault("partition_both_worker", "n3", T0 + 0.5, T0 + 1.2))


def overlap_with_a_killed_body(h: History) -> None:
    """Slot 0's body ran until its process was killed at T0 + 1.1: slot 1's body began at
    T0 + 1.001, beside it."""
    first = _replace_row(h, 1, 0, status="lost", reason="node n3 is gone", finished_at=T0 + 1.5)
    _drop_effects(h, first.id, "end")
    _body_of_its_own_process(h, first.id, 5151)
    h.faults.append(Fault("sigkill_worker", "n3", T0 + 1.1, T0 + 1.1, pid=5151))


def phantom_success(h: History) -> None:
    row = _find(h, 2, 6)
    _drop_effects(h, row.id)


def success_whose_body_ran_elsewhere(h: History) -> None:
    row = _find(h, 2, 6)
    h.side_effects = [
        dataclasses.replace(s, node="n1") if s.execution_id == row.id else s for s in h.side_effects
    ]


def too_many_attempts(h: History) -> None:
    """max_retries 1: attempts 1 and 2 may run, a third may not."""
    first = _replace_row(h, 2, 4, status="failed", reason="boom")
    second = dataclasses.replace(
        first, id=99_020, attempt=2, trigger="retry", finished_at=first.scheduled_for + 0.65
    )
    third = dataclasses.replace(
        second, id=99_021, attempt=3, status="succeeded", reason="", finished_at=T0 + 4.95
    )
    h.executions += [second, third]
    h.side_effects += _effects(second, start=0.5, end=0.6) + _effects(third, start=0.8, end=0.9)


def retry_before_its_backoff(h: History) -> None:
    """A 2 s backoff (no jitter) after attempt 1 ended at T0 + 4.3: attempt 2 began at T0 + 4.5."""
    h.jobs[1] = dataclasses.replace(
        h.jobs[1], retry_backoff_base=2.0, retry_backoff_max=60.0, retry_jitter=False
    )
    first = _replace_row(h, 2, 4, status="failed", reason="boom")
    _add_row(
        h, dataclasses.replace(first, id=99_022, attempt=2, trigger="retry", status="succeeded")
    )


def retry_after_its_backoff(h: History) -> None:
    """The same backoff with jitter: half of it (1 s) is the shortest wait; attempt 2 began
    1.2 s after attempt 1 ended."""
    h.jobs[1] = dataclasses.replace(h.jobs[1], retry_backoff_base=2.0, retry_backoff_max=60.0)
    first = _replace_row(h, 2, 4, status="failed", reason="boom")
    retry = dataclasses.replace(first, id=99_023, attempt=2, trigger="retry", status="succeeded")
    h.executions.append(retry)
    h.side_effects += _effects(retry, start=1.5, end=1.6)


def body_before_its_slot(h: History) -> None:
    row = _find(h, 2, 5)
    _move_effect(h, row.id, "start", T0 + 4.7)


def early_body_on_a_stepped_clock_is_still_early(h: History) -> None:
    """A worker whose clock ran 3 s ahead started slot 5 early: the log (the machine's clock) shows
    it, whatever the node believed."""
    body_before_its_slot(h)
    h.faults.append(Fault("clock_jump", "n3", T0 + 3.0, T0 + 8.0, magnitude=3.0))


def fired_while_paused(h: History) -> None:
    h.paused.append(PauseWindow(job_id=2, start=T0 + 3.5, end=T0 + 7.2))
    for k in (5, 6):  # written by the leader after the pause committed
        _replace_row(h, 2, k, created_at=T0 + k - 0.8)
    for k in (4, 7):
        row = _find(h, 2, k)
        h.executions.remove(row)
        _drop_effects(h, row.id)


def fired_as_the_resume_committed(h: History) -> None:
    """Job 2 paused from T0 + 3.5 to T0 + 6.006: the tick dated T0 + 6.0 began before the resume's
    audit row and read the job after its commit (it waited for the row lock), so its fire of slot
    6 stands."""
    h.paused.append(PauseWindow(job_id=2, start=T0 + 3.5, end=T0 + 6.006))
    _replace_row(h, 2, 6, created_at=T0 + 6.0)
    for k in (4, 5):
        row = _find(h, 2, k)
        h.executions.remove(row)
        _drop_effects(h, row.id)


def body_after_delete(h: History) -> None:
    """Job 2 deleted at T0 + 6.5 (its rows went with it): a body of it started at T0 + 8."""
    h.jobs = [j for j in h.jobs if j.id != 2]
    h.executions = [e for e in h.executions if e.job_id != 2 or e.scheduled_for < T0 + 6]
    h.side_effects = [
        s for s in h.side_effects if s.job_id != 2 or s.scheduled_for in (T0 + 8,) or s.at < T0 + 6
    ]
    h.deleted.append(Deletion(job_id=2, sent=T0 + 6.4, answered=T0 + 6.5))


def triggered_run_with_no_row(h: History) -> None:
    h.requested.append(Requested(77_777, 1, "api_trigger", T0 + 2.0, T0 + 2.1, T0 + 2.1))


def enqueued_run_left_pending(h: History) -> None:
    run = dataclasses.replace(
        _find(h, 1, 0),
        id=88_888,
        trigger="enqueue",
        scheduled_for=T0 - 15.0,
        run_after=T0 - 15.0,
        status="pending",
        started_at=None,
        finished_at=None,
    )
    h.executions.append(run)
    h.requested.append(Requested(run.id, 1, "api_enqueue", T0 - 15.1, T0 - 15.0, T0 - 15.0))


def enqueued_run_that_ran(h: History) -> None:
    run = dataclasses.replace(
        _find(h, 1, 0), id=88_889, trigger="enqueue", scheduled_for=T0 + 2.2, run_after=T0 + 2.2
    )
    _add_row(h, run)
    h.requested.append(Requested(run.id, 1, "api_enqueue", T0 + 2.1, T0 + 2.2, T0 + 2.2))


def start_after_declared_lost(h: History) -> None:
    row = _replace_row(h, 2, 7, status="lost", reason="node n3 stopped heartbeating")
    h.faults.append(Fault("partition_db_worker", "n3", T0 + 6.5, T0 + 7.0))
    _move_effect(h, row.id, "start", row.finished_at + 1.5)
    _move_effect(h, row.id, "end", row.finished_at + 1.7)


def start_of_an_unstarted_run(h: History) -> None:
    _replace_row(h, 2, 8, status="pending", started_at=None, finished_at=None)


def left_running(h: History) -> None:
    row = _replace_row(h, 1, 8, status="running", finished_at=None)
    _drop_effects(h, row.id, "end")


def left_claimed(h: History) -> None:
    row = _replace_row(
        h, 1, 9, status="pending", claim_token="tok", started_at=None, finished_at=None
    )
    _drop_effects(h, row.id)


def overran_its_timeout(h: History) -> None:
    row = _replace_row(h, 2, 1, status="timed_out", reason="running past its timeout")
    _replace_row(h, 2, 1, finished_at=row.started_at + 15)


def fire_from_a_stale_term(h: History) -> None:
    _replace_row(h, 1, 7, term=1, created_at=T0 + 6.0)


def term_claimed_by_two_nodes(h: History) -> None:
    h.term_claims.append(TermClaim("n3", 2, T0 + 4.2))


def term_row_names_another_node(h: History) -> None:
    h.term_claims = [TermClaim("n1", 1, T0 - 20), TermClaim("n3", 2, T0 + 4.1)]


def slow_handover(h: History) -> None:
    h.terms[1] = dataclasses.replace(h.terms[1], acquired_at=T0 + 9.5)
    h.executions = [
        dataclasses.replace(e, created_at=T0 + 9.6) if e.term == 2 else e for e in h.executions
    ]


def handover_during_a_redis_restart(h: History) -> None:
    slow_handover(h)
    h.faults.append(Fault("redis_restart", "redis", T0 + 4.0, T0 + 6.0))


def _interval_edited_to_2_s(h: History) -> None:
    """Job 2 ran every second since its creation; the operator set it to every 2 s at T0 + 3.1."""
    h.edits = [
        ScheduleEdit(2, T0 - 31.0, T0 - 30.0, 1),
        ScheduleEdit(2, T0 + 3.0, T0 + 3.1, 2),
    ]


def schedule_edit_followed(h: History) -> None:
    _interval_edited_to_2_s(h)
    for k in (7, 9):  # the old schedule's slots after the edit took effect: never fired
        row = _find(h, 2, k)
        h.executions.remove(row)
        _drop_effects(h, row.id)


def schedule_edit_ignored(h: History) -> None:
    _interval_edited_to_2_s(h)  # slots 7 and 9 still fired


def schedule_edit_misses_a_new_slot(h: History) -> None:
    """Slot 6 of the new schedule never fired, though the leader went on to fire slot 8."""
    schedule_edit_followed(h)
    row = _find(h, 2, 6)
    h.executions.remove(row)
    _drop_effects(h, row.id)


def schedule_edit_superseded_while_down(h: History) -> None:
    """No leader wrote anything for job 2 after slot 5 until the operator moved it to every 3 s at
    T0 + 7: slot 6 of the 2 s schedule was superseded by the edit (re-planned from now), not
    missed."""
    schedule_edit_misses_a_new_slot(h)
    h.edits.append(ScheduleEdit(2, T0 + 7.0, T0 + 7.05, 3))
    h.executions = [
        dataclasses.replace(e, created_at=T0 + 7.2)
        if e.job_id == 2 and e.scheduled_for > T0 + 6
        else e
        for e in h.executions
    ]


def commits_in_order(h: History) -> None:
    """Term 1 writes, term 2 raises the fence, then writes: nothing stale."""
    h.commits = [
        Commit(0, writer_term=1, fence_term=1, raised_to=None, fires=3),
        Commit(1, writer_term=None, fence_term=1, raised_to=2),
        Commit(2, writer_term=2, fence_term=2, raised_to=None, fires=2, lost=1),
    ]


def commit_of_a_stale_term(h: History) -> None:
    """After term 2 raised the fence, a transaction of term 1 committed lost declarations — its
    writer's clock says nothing here, the commit order does."""
    commits_in_order(h)
    h.commits.append(Commit(3, writer_term=1, fence_term=2, raised_to=None, lost=2, retries=1))


def fire_outside_a_fence(h: History) -> None:
    h.commits = [Commit(0, writer_term=None, fence_term=None, raised_to=None, fires=1)]


def jobs_stalled_after_a_kill(h: History) -> None:
    """A worker killed at T0 + 3.05: job 1's next body came 6 s after its last (bound: its 1 s
    interval + the lease 2 s + 1.5 s after the later SIGTERM of the leader, T0 + 8.5)."""
    worker_killed(h, T0 + 3.05)
    for k in (4, 5, 6, 7, 8):
        row = _replace_row(h, 1, k, status="skipped", reason="buffer_one: a run already waits")
        _drop_effects(h, row.id)


def _after_a_cluster_stop(h: History, policy: str, ran: tuple[int, ...]) -> None:
    """Job 1 (grace 2 s) had no leader from T0 + 2.5 to T0 + 7.4 (the cluster stopped): one tick
    at T0 + 7.5 wrote slots 3 to 7, running those in ``ran`` and skipping the others."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_policy=policy, misfire_grace_seconds=2)
    h.faults.append(Fault("cluster_restart", "n2", T0 + 2.5, T0 + 7.4))
    for k in range(3, 8):
        if k in ran:  # one after the other (forbid), from T0 + 7.51, before slot 8's
            row = _replace_row(h, 1, k, created_at=T0 + 7.5, term=2)
            _move_effect(h, row.id, "start", T0 + 7.51 + 0.09 * ran.index(k))
            _move_effect(h, row.id, "end", T0 + 7.59 + 0.09 * ran.index(k))
        else:
            row = _replace_row(
                h,
                1,
                k,
                term=2,
                created_at=T0 + 7.5,
                status="skipped",
                reason="misfire: coalesced into one run (run_once)",
                finished_at=T0 + 7.5,
            )
            _drop_effects(h, row.id)


def run_once_ran_the_newest(h: History) -> None:
    _after_a_cluster_stop(h, "run_once", ran=(7,))


def run_once_ran_two(h: History) -> None:
    _after_a_cluster_stop(h, "run_once", ran=(6, 7))


def run_once_ran_an_old_one(h: History) -> None:
    _after_a_cluster_stop(h, "run_once", ran=(3,))


def skip_ran_one(h: History) -> None:
    _after_a_cluster_stop(h, "skip", ran=(7,))


def run_all_ran_all(h: History) -> None:
    _after_a_cluster_stop(h, "run_all", ran=(3, 4, 5, 6, 7))


def run_all_under_its_bound(h: History) -> None:
    """run_all_max 7 and 5 missed slots: all 5 run (fewer than the bound)."""
    run_all_ran_all(h)
    h.jobs[0] = dataclasses.replace(h.jobs[0], run_all_max=7)


def run_all_beyond_its_bound(h: History) -> None:
    """run_all_max 3: the newest 3 of 5 missed slots run, the 2 older ones are skipped."""
    _after_a_cluster_stop(h, "run_all", ran=(5, 6, 7))
    h.jobs[0] = dataclasses.replace(h.jobs[0], run_all_max=3)


def run_all_paced_catch_up(h: History) -> None:
    """run_all_max 2: the tick at T0 + 7.5 wrote slots 6 and 7 as catch-up runs, paced on a slow
    budget: they started at T0 + 9.55 and 9.7, after the on-time slots 8 and 9 had run. A catch-up
    run is judged on the later catch-up fires of its job only."""
    _after_a_cluster_stop(h, "run_all", ran=(6, 7))
    h.jobs[0] = dataclasses.replace(h.jobs[0], run_all_max=2)
    for n, k in enumerate((6, 7)):
        start = T0 + 9.55 + 0.15 * n
        row = _replace_row(
            h,
            1,
            k,
            catch_up=True,
            run_after=start,
            claimed_at=start - 0.3,
            started_at=start,
            finished_at=start + 0.1,
        )
        _move_effect(h, row.id, "start", start + 0.001)
        _move_effect(h, row.id, "end", start + 0.05)


def run_all_late_runs_not_catch_up(h: History) -> None:
    """The same runs, not marked catch-up: slot 6 started with slots 7 and 8 due."""
    run_all_paced_catch_up(h)
    for k in (6, 7):
        _replace_row(h, 1, k, catch_up=False)


def run_all_skipped_some(h: History) -> None:
    _after_a_cluster_stop(h, "run_all", ran=(6, 7))


def _tick_on_the_grace(h: History, policy: str, ran: tuple[int, ...]) -> None:
    """Job 1 (grace 2 s): the leader ticked at T0 + 7.01, on a slot instant, and wrote
    slots 5 to 7 (slot 5 then 2.01 s old: late by the leader's clock, within the checker's
    tolerance of the grace), running those in ``ran`` and skipping the others."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_policy=policy, misfire_grace_seconds=2)
    for k in (5, 6, 7):
        fields = {"created_at": T0 + 7.01, "term": 2}
        if k not in ran:
            fields.update(status="skipped", reason=f"misfire: ({policy})", finished_at=T0 + 7.01)
        row = _replace_row(h, 1, k, **fields)
        if k in ran:
            _move_effect(h, row.id, "start", T0 + 7.02 + 0.09 * ran.index(k))
            _move_effect(h, row.id, "end", T0 + 7.10 + 0.09 * ran.index(k))
        else:
            _drop_effects(h, row.id)


def skip_on_the_grace(h: History) -> None:
    _tick_on_the_grace(h, "skip", ran=())


def run_once_on_the_grace(h: History) -> None:
    _tick_on_the_grace(h, "run_once", ran=(7,))


def on_the_grace_ran_all(h: History) -> None:
    """The same tick judged not late: every slot runs, no misfire skip."""
    _tick_on_the_grace(h, "skip", ran=(5, 6, 7))


def skip_on_the_grace_ran_one(h: History) -> None:
    _tick_on_the_grace(h, "skip", ran=(7,))


def misfire_at_run_time(h: History) -> None:
    """Slot 5 of job 1 (grace 2 s) was fired on time but could not start within its grace: the
    node skipped it at T0 + 7.2 — justified, and not the tick's doing."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_grace_seconds=2)
    row = _replace_row(
        h,
        1,
        5,
        status="skipped",
        reason="misfire: not started within the grace period (2 s)",
        finished_at=T0 + 7.2,
    )
    _drop_effects(h, row.id)


def misfire_skip_within_grace(h: History) -> None:
    row = _replace_row(h, 2, 6, status="skipped", reason="misfire: skipped by policy (skip)")
    _drop_effects(h, row.id)


SUPERSEDED = "misfire: superseded by a later fire already due ({policy})"


def _backlog(h: History, policy: str, *, skipped: tuple[int, ...], ran: tuple[int, ...]) -> None:
    """Job 1's slots 3 to 6 were fired on time but no node could start them until T0 + 6.3 (cut
    off): then the slots in ``skipped`` were skipped as superseded and those in ``ran`` started
    one after the other, 0.2 s apart."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_policy=policy, run_all_max=3)
    for k in skipped:
        row = _replace_row(
            h,
            1,
            k,
            status="skipped",
            reason=SUPERSEDED.format(policy=policy),
            claimed_at=T0 + 6.25,
            started_at=None,
            finished_at=T0 + 6.3,
        )
        _drop_effects(h, row.id)
    for n, k in enumerate(ran):
        start = T0 + 6.3 + 0.2 * n
        row = _replace_row(
            h, 1, k, claimed_at=T0 + 6.25, started_at=start, finished_at=start + 0.15
        )
        _move_effect(h, row.id, "start", start + 0.001)
        _move_effect(h, row.id, "end", start + 0.1)


def superseded_backlog(h: History) -> None:
    _backlog(h, "run_once", skipped=(3, 4, 5), ran=(6,))


def run_all_backlog_within_its_bound(h: History) -> None:
    _backlog(h, "run_all", skipped=(3,), ran=(4, 5, 6))


def backlog_run_one_after_the_other(h: History) -> None:
    _backlog(h, "run_once", skipped=(), ran=(3, 4, 5, 6))


def superseded_behind_a_deferred_fire(h: History) -> None:
    """The backlog superseded as above, but the newest fire had been handed back to wait (its
    run_after moved to T0 + 6.6, a lock service that could not answer): it was due all the same by
    its slot when the older ones were superseded at T0 + 6.3, and ran at T0 + 6.6."""
    _backlog(h, "run_once", skipped=(3, 4, 5), ran=())
    row = _replace_row(
        h, 1, 6, run_after=T0 + 6.6, claimed_at=T0 + 6.5, started_at=T0 + 6.6, finished_at=T0 + 6.7
    )
    _move_effect(h, row.id, "start", T0 + 6.601)
    _move_effect(h, row.id, "end", T0 + 6.65)


def catch_up_superseded_as_the_next_slot_fell_due(h: History) -> None:
    """The cluster stopped from T0 + 2.5 to T0 + 7.4; one tick at T0 + 7.9 wrote slots 3 to 8 of
    job 1 (run_once, grace 2 s): 3 to 6 coalesced, 7 to run, 8 on time. Slot 7 was admitted at
    T0 + 8.02, after slot 8 fell due, and superseded by it (0.12 s after the tick wrote it: not
    the tick's own skip); slot 8 ran."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_policy="run_once", misfire_grace_seconds=2)
    h.faults.append(Fault("cluster_restart", "n2", T0 + 2.5, T0 + 7.4))
    for k in range(3, 7):
        row = _replace_row(
            h,
            1,
            k,
            term=2,
            created_at=T0 + 7.9,
            status="skipped",
            reason="misfire: coalesced into one run (run_once)",
            claimed_at=None,
            started_at=None,
            finished_at=T0 + 7.9,
        )
        _drop_effects(h, row.id)
    row = _replace_row(
        h,
        1,
        7,
        term=2,
        created_at=T0 + 7.9,
        status="skipped",
        reason=SUPERSEDED.format(policy="run_once"),
        claimed_at=T0 + 8.0,
        started_at=None,
        finished_at=T0 + 8.02,
    )
    _drop_effects(h, row.id)
    row = _replace_row(h, 1, 8, term=2, created_at=T0 + 7.9, started_at=T0 + 8.05)
    _move_effect(h, row.id, "start", T0 + 8.051)


def enqueued_runs_keep_a_forbid_job_busy(h: History) -> None:
    """As ``jobs_stalled_after_a_kill``, but job 1's slots were skipped because runs an operator
    enqueued kept it busy (bodies at T0 + 4.5, 6 and 7.5): the job ran all along."""
    jobs_stalled_after_a_kill(h)
    job = h.jobs[0]
    for k, at in enumerate((4.5, 6.0, 7.5)):
        row = _execution(
            job,
            T0 + at,
            id=90_000 + k,
            trigger="enqueue",
            created_at=T0 + 3.5,
            claimed_at=T0 + at - 0.5,
            started_at=T0 + at,
            finished_at=T0 + at + 0.3,
            run_after=T0 + at,
        )
        _add_row(h, row, started=False)
        h.side_effects += _effects(row)


def superseded_with_nothing_due(h: History) -> None:
    """Slot 5 of job 1 skipped as superseded at T0 + 5.5, half a second before slot 6 fell due."""
    h.jobs[0] = dataclasses.replace(h.jobs[0], misfire_policy="run_once")
    row = _replace_row(
        h,
        1,
        5,
        status="skipped",
        reason=SUPERSEDED.format(policy="run_once"),
        started_at=None,
        finished_at=T0 + 5.5,
    )
    _drop_effects(h, row.id)


def cron_job(h: History) -> None:
    """Job 2 as a cron job every 2 s (its odd slots' rows are gone: it never had them)."""
    h.jobs[1] = dataclasses.replace(
        h.jobs[1], schedule_type="cron", cron="*/2 * * * * *", interval_seconds=None
    )
    odd = [e for e in h.executions if e.job_id == 2 and int(e.scheduled_for) % 2]
    h.executions = [e for e in h.executions if e not in odd]
    h.side_effects = [s for s in h.side_effects if s.execution_id not in {e.id for e in odd}]


def cron_job_missing_a_slot(h: History) -> None:
    cron_job(h)
    row = _find(h, 2, 4)
    h.executions.remove(row)
    _drop_effects(h, row.id)


def leader_killed_long_before_its_row_closed(h: History) -> None:
    h.terms[0] = dataclasses.replace(h.terms[0], ended_at=T0 + 9.0, end_reason="node_died")
    h.terms[1] = dataclasses.replace(h.terms[1], acquired_at=T0 + 9.0)
    h.executions = [
        dataclasses.replace(e, created_at=T0 + 9.1) if e.term == 2 else e for e in h.executions
    ]
    h.faults = [Fault("sigkill_leader", "n1", T0 + 3.0, T0 + 3.0, pid=1111)]


def no_leader_until_the_stop(h: History) -> None:
    h.terms = [Term(1, "n1", T0 - 20, T0 + 2.0, "lease_lost")]
    h.term_claims = h.term_claims[:1]
    h.faults = []
    h.executions = [dataclasses.replace(e, term=1) for e in h.executions]


def skip_with_no_active_blocker(h: History) -> None:
    row = _replace_row(h, 1, 2, status="skipped", reason=FORBID_REASON)
    _drop_effects(h, row.id)


def skip_behind_a_long_run(h: History) -> None:
    blocker = _find(h, 1, 1)
    _move_effect(h, blocker.id, "end", T0 + 2.1)
    skip_with_no_active_blocker(h)


def skip_behind_a_killed_body(h: History) -> None:
    blocker = _find(h, 1, 1)
    _drop_effects(h, blocker.id, "end")
    h.faults.append(Fault("sigkill_worker", "n3", T0 + 1.2, T0 + 1.2, pid=4242))
    skip_with_no_active_blocker(h)


def body_slowed_through_a_fault(h: History, status: str = "succeeded") -> None:
    """Job 1's slot 2 body on n3 runs 5 s (its write slowed by a slow database path from
    T0 + 2.05 to T0 + 6.9); its node records it at T0 + 7.05 (or the cluster ends it ``status``
    at T0 + 4.5). Slots 3 to 6 are skipped behind it; slot 7 starts at T0 + 7.1. (The leader's
    hand-over at T0 + 4 is a quiet one here: its SIGTERM would allow the gap by itself.)"""
    h.faults = [Fault("slow_db_leader", "n3", T0 + 2.05, T0 + 6.9, magnitude=0.4)]
    finished = T0 + 7.05 if status == "succeeded" else T0 + 4.5
    reason = "" if status == "succeeded" else "node n3 could not reach the database for 2 s"
    slowed = _replace_row(h, 1, 2, node="n3", status=status, finished_at=finished, reason=reason)
    _move_effect(h, slowed.id, "end", T0 + 7.0)
    for k in (3, 4, 5, 6):
        row = _replace_row(h, 1, k, status="skipped", reason=FORBID_REASON)
        _drop_effects(h, row.id)
    _move_effect(h, _find(h, 1, 7).id, "start", T0 + 7.1)


def operator_got_a_500(h: History) -> None:
    h.api_anomalies.append(ApiAnomaly(T0 + 3, "api_edit job-1", "HTTP 500"))


Mutation = Callable[[History], None]


def _fenced(h: History, job_id: int, outcomes: dict[int, tuple[int, str]]) -> None:
    """Job ``job_id``'s end lines carry fenced writes: slot k -> (token, outcome); the others
    accepted with their execution id as token."""
    fenced = {}
    for row in h.executions:
        if row.job_id == job_id:
            k = int(row.scheduled_for - T0)
            fenced[row.id] = outcomes.get(k, (row.id, "accepted"))
    h.side_effects = [
        dataclasses.replace(e, token=fenced[e.execution_id][0], fenced=fenced[e.execution_id][1])
        if e.event == "end" and e.execution_id in fenced
        else e
        for e in h.side_effects
    ]


def frozen_body_refused(h: History) -> None:
    """Slot 2's body of job 1 is frozen mid-run; a run with a newer token had written before it
    resumed (slot 0's line carries that token here): its own write was refused. Right."""
    h.faults.append(Fault("sigstop_worker", "n3", T0 + 2.05, T0 + 2.1))
    _fenced(h, 1, {0: (5000, "accepted"), 2: (1002, "refused")})


def frozen_body_stale_write(h: History) -> None:
    """The same, but the frozen body's stale write went through."""
    h.faults.append(Fault("sigstop_worker", "n3", T0 + 2.05, T0 + 2.1))
    _fenced(h, 1, {0: (5000, "accepted"), 2: (1002, "accepted")})


def stuck_in_a_fenced_write(
    h: History, outcome: str, *, ended: float = 6.0, declared: float = 4.3
) -> None:
    """Job 1's slot 2 body is stuck in its fenced write while its node (n3) is cut off from the
    database (from T0 + 2.1); declared lost at ``declared`` (s after T0; the dead threshold is
    2 s), it ends at ``ended`` with its write gone nowhere (or through). Slots 3 and 4 were
    skipped behind it; slot 5 runs at T0 + 5."""
    h.faults.append(Fault("partition_db_worker", "n3", T0 + 2.1, T0 + 6.0))
    for k in (3, 4):
        row = _replace_row(h, 1, k, status="skipped", reason=FORBID_REASON)
        _drop_effects(h, row.id)
    stuck = _replace_row(
        h,
        1,
        2,
        status="lost",
        reason="node n3 could not reach the database for 2 s",
        finished_at=T0 + declared,
    )
    _fenced(h, 1, {2: (stuck.id, outcome)})
    _move_effect(h, stuck.id, "end", T0 + ended)


def _limit_job(h: History, job_id: int, **fields: object) -> None:
    h.jobs = [dataclasses.replace(j, **fields) if j.id == job_id else j for j in h.jobs]


def over_the_job_limit(h: History) -> None:
    """Job 1 may run one at a time; its slot 3 run was recorded running before slot 2's ended."""
    _limit_job(h, 1, max_concurrent=1)
    _replace_row(h, 1, 3, started_at=T0 + 2.2)


def permits_for_job_1(h: History, shift: dict[int, float] | None = None) -> None:
    """Job 1 may start once a second; each run has its permit just before its body starts."""
    _limit_job(h, 1, rate_limit=1, rate_period_seconds=1)
    shift = shift or {}
    h.permits = [
        Permit("job:1", T0 + k - 0.01 + shift.get(k, 0.0), _find(h, 1, k).id)
        for k in range(SLOTS)
        if k not in shift or shift[k] is not None
    ]


CASES: list[tuple[str, Mutation | None, dict[str, str]]] = [
    ("within the job limit", lambda h: _limit_job(h, 1, max_concurrent=1), {}),
    ("over the job limit", over_the_job_limit, {c.FLOW_OVER_LIMIT: "2 runs running at once"}),
    ("within the rate", permits_for_job_1, {}),
    (
        "over the rate",
        lambda h: permits_for_job_1(h, {4: -0.5}),
        {c.FLOW_OVER_RATE: "2 runs released within 1 s"},
    ),
    (
        "a body without its permit",
        lambda h: permits_for_job_1(h, {4: None}),  # type: ignore[dict-item]
        {c.FLOW_NO_PERMIT: "started with no permit"},
    ),
    ("stuck fenced write", lambda h: stuck_in_a_fenced_write(h, "error: OperationalError"), {}),
    (
        "stuck write that landed after a newer one",
        lambda h: stuck_in_a_fenced_write(h, "accepted"),
        {c.FORBID_OVERLAP: "ran at the same time", c.STALE_FENCED_WRITE: "held by"},
    ),
    (
        "stuck write that landed before any newer one",
        lambda h: stuck_in_a_fenced_write(h, "accepted", ended=5.005),
        {},
    ),
    (
        "successor started before the stuck run was ended",
        lambda h: stuck_in_a_fenced_write(h, "error: OperationalError", declared=5.5),
        {c.FORBID_OVERLAP: "ran at the same time"},
    ),
    (
        "stuck run ended before its node had been cut off for the dead threshold",
        lambda h: stuck_in_a_fenced_write(h, "error: OperationalError", declared=3.0),
        {c.FORBID_OVERLAP: "ran at the same time"},
    ),
    ("fenced write refused", frozen_body_refused, {}),
    ("stale fenced write", frozen_body_stale_write, {c.STALE_FENCED_WRITE: "token 1002"}),
    ("clean", None, {}),
    ("body twice", body_twice, {c.DUPLICATE_EXECUTION: "its body started 2 times"}),
    (
        "retry of a success",
        retry_of_a_success,
        {c.DUPLICATE_EXECUTION: "attempt 2 started although attempt 1 ended succeeded"},
    ),
    (
        "two succeeded rows",
        two_succeeded_rows,
        {c.DUPLICATE_EXECUTION: "2 succeeded rows", c.PHANTOM_OUTCOME: "no body started there"},
    ),
    ("retry after lost", retry_after_lost, {}),
    ("manual run just before a slot", manual_run_just_before_a_slot, {}),
    ("slot without a row", slot_without_row, {c.MISSING_SLOT: "no execution row"}),
    (
        "skipped without a reason",
        skipped_without_reason,
        {c.MISSING_SLOT: "recorded skipped without a reason"},
    ),
    ("left pending", left_pending, {c.MISSING_SLOT: "never run (left pending 11.0 s after"}),
    ("deferred at the stop", deferred_at_the_stop, {}),
    ("lost in flight", lost_in_flight, {}),
    ("lost, no fault", lost_with_no_fault, {c.UNEXCUSED_LOST: "with no fault on that node"}),
    ("lost, fault long before", lost_long_after_its_fault, {c.UNEXCUSED_LOST: "within 15 s"}),
    ("lost, fault elsewhere", lost_after_a_fault_on_another_node, {c.UNEXCUSED_LOST: "on node n3"}),
    ("lost, worker cut one way", lost_on_a_worker_cut_one_way, {}),
    ("lost, worker slowed", lost_on_a_worker_slowed, {}),
    ("paused", paused_for_a_while, {}),
    ("forbid overlap", forbid_runs_overlap, {c.FORBID_OVERLAP: "ran at the same time"}),
    ("overlap, end unknown", overlap_with_an_unknown_end, {}),
    ("overlap, killed body", overlap_with_a_killed_body, {c.FORBID_OVERLAP: "at the same time"}),
    ("phantom success", phantom_success, {c.PHANTOM_OUTCOME: "recorded succeeded on n3"}),
    ("body elsewhere", success_whose_body_ran_elsewhere, {c.PHANTOM_OUTCOME: "on n3 but no"}),
    ("too many attempts", too_many_attempts, {c.TOO_MANY_ATTEMPTS: "3 attempts, max_retries 1"}),
    ("early retry", retry_before_its_backoff, {c.EARLY_RETRY: "before its backoff of at least"}),
    ("retry after backoff", retry_after_its_backoff, {}),
    ("early start", body_before_its_slot, {c.EARLY_START: "0.30 s before it was due"}),
    (
        "early start, stepped clock",
        early_body_on_a_stepped_clock_is_still_early,
        {c.EARLY_START: "before it was due"},
    ),
    ("fired while paused", fired_while_paused, {c.FIRED_WHILE_PAUSED: "while the job was paused"}),
    ("fired as the resume committed", fired_as_the_resume_committed, {}),
    ("body after delete", body_after_delete, {c.FIRED_AFTER_DELETE: "after the job was deleted"}),
    ("trigger, no row", triggered_run_with_no_row, {c.REQUEST_NOT_RUN: "which has no row"}),
    ("enqueue, left pending", enqueued_run_left_pending, {c.REQUEST_NOT_RUN: "left pending"}),
    ("enqueue, ran", enqueued_run_that_ran, {}),
    (
        "start after lost",
        start_after_declared_lost,
        {c.START_AFTER_LOST: "s after the run was recorded lost"},
    ),
    (
        "start of an unstarted run",
        start_of_an_unstarted_run,
        {c.START_AFTER_LOST: "recorded pending"},
    ),
    ("left running", left_running, {c.STUCK_RUNNING: "left running after the cluster stopped"}),
    ("left claimed", left_claimed, {c.STUCK_RUNNING: "left pending and claimed by n3"}),
    ("overran", overran_its_timeout, {c.STUCK_RUNNING: "past its timeout (10 s)"}),
    ("stale term", fire_from_a_stale_term, {c.STALE_TERM_WRITE: "created by term 1"}),
    ("term twice", term_claimed_by_two_nodes, {c.TERM_HELD_TWICE: "claimed by several nodes"}),
    ("term row", term_row_names_another_node, {c.TERM_HELD_TWICE: "but its row names n2"}),
    ("slow handover", slow_handover, {c.LEADER_GAP: "no leader for 5.50 s"}),
    ("gap excused", handover_during_a_redis_restart, {}),
    ("run_once after a stop", run_once_ran_the_newest, {}),
    ("run_once ran two", run_once_ran_two, {c.MISFIRE_POLICY: "wrote 5 missed slots and ran 2"}),
    ("run_once ran the oldest", run_once_ran_an_old_one, {c.MISFIRE_POLICY: "ran 1"}),
    ("skip ran one", skip_ran_one, {c.MISFIRE_POLICY: "expected the newest 0"}),
    ("run_all after a stop", run_all_ran_all, {}),
    ("run_all under its bound", run_all_under_its_bound, {}),
    ("run_all beyond its bound", run_all_beyond_its_bound, {}),
    ("run_all catch-up paced", run_all_paced_catch_up, {}),
    (
        "run_all late runs not catch-up",
        run_all_late_runs_not_catch_up,
        {
            c.MISFIRE_POLICY: "slot 08:00:06.000Z started (marked running) at 08:00:09.550Z "
            "with 2 later fires already due"
        },
    ),
    ("run_all skipped some", run_all_skipped_some, {c.MISFIRE_POLICY: "expected the newest 5"}),
    ("misfire at run time", misfire_at_run_time, {}),
    ("skip on the grace", skip_on_the_grace, {}),
    ("run_once on the grace", run_once_on_the_grace, {}),
    ("on the grace, ran all", on_the_grace_ran_all, {}),
    (
        "skip on the grace ran one",
        skip_on_the_grace_ran_one,
        {c.MISFIRE_POLICY: "expected the newest 0"},
    ),
    ("misfire within grace", misfire_skip_within_grace, {c.MISFIRE_POLICY: "within its grace"}),
    ("backlog superseded", superseded_backlog, {}),
    ("run_all backlog within its bound", run_all_backlog_within_its_bound, {}),
    (
        "backlog run one after the other",
        backlog_run_one_after_the_other,
        {
            c.MISFIRE_POLICY: "started (marked running) at 08:00:06.300Z with 2 later fires already due"
        },
    ),
    ("superseded behind a deferred fire", superseded_behind_a_deferred_fire, {}),
    (
        "catch-up superseded as the next slot fell due",
        catch_up_superseded_as_the_next_slot_fell_due,
        {},
    ),
    ("enqueued runs keep a forbid job busy", enqueued_runs_keep_a_forbid_job_busy, {}),
    (
        "superseded with nothing due",
        superseded_with_nothing_due,
        {c.MISFIRE_POLICY: "skipped as superseded at 08:00:05.500Z with 0 later fires"},
    ),
    ("cron job", cron_job, {}),
    ("cron slot missing", cron_job_missing_a_slot, {c.MISSING_SLOT: "slot 08:00:04.000Z"}),
    ("schedule edit followed", schedule_edit_followed, {}),
    (
        "schedule edit ignored",
        schedule_edit_ignored,
        {c.SCHEDULE_EDIT: "slot 08:00:07.000Z is not on the schedule of every 2 s"},
    ),
    (
        "schedule edit, new slot missing",
        schedule_edit_misses_a_new_slot,
        {c.SCHEDULE_EDIT: "no fire of slot 08:00:06.000Z of the schedule of every 2 s"},
    ),
    ("schedule edit superseded", schedule_edit_superseded_while_down, {}),
    ("commits in order", commits_in_order, {}),
    (
        "stale commit",
        commit_of_a_stale_term,
        {c.STALE_COMMIT: "commit #3 by term 1 after the fence had reached term 2 (commit #1)"},
    ),
    ("unfenced fire", fire_outside_a_fence, {c.STALE_COMMIT: "outside a fenced transaction"}),
    (
        "slow recovery",
        jobs_stalled_after_a_kill,
        {c.SLOW_RECOVERY: "no body started for 6.00 s after sigkill_worker on n3"},
    ),
    (
        "leader killed",
        leader_killed_long_before_its_row_closed,
        {c.LEADER_GAP: "no leader for 6.00 s between term 1 and term 2"},
    ),
    ("leader gone", no_leader_until_the_stop, {c.LEADER_GAP: "until the cluster stopped"}),
    ("a body slowed through a fault", body_slowed_through_a_fault, {}),
    (
        "a body the cluster ended, then a long gap",
        lambda h: body_slowed_through_a_fault(h, status="lost"),
        {c.SLOW_RECOVERY: "no body started for 5.10 s after slow_db_leader on n3"},
    ),
    ("unjustified skip", skip_with_no_active_blocker, {c.UNJUSTIFIED_SKIP: FORBID_REASON}),
    ("justified skip", skip_behind_a_long_run, {}),
    ("skip behind a killed body", skip_behind_a_killed_body, {c.UNJUSTIFIED_SKIP: "slot"}),
    ("api anomaly", operator_got_a_500, {c.API_ANOMALY: "HTTP 500"}),
]


@pytest.mark.parametrize(("name", "mutate", "expected"), CASES, ids=[case[0] for case in CASES])
def test_checker_reports_exactly_the_expected_kinds(
    name: str, mutate: Mutation | None, expected: dict[str, str]
) -> None:
    history = clean()
    if mutate is not None:
        mutate(history)
    report = check(history)
    found = report.by_kind()
    assert set(found) == set(expected), report.render()
    for kind, fragment in expected.items():
        assert any(fragment in v.message for v in found[kind]), report.render()
        assert all(v.evidence for v in found[kind])
    assert report.ok == (not expected)


def test_every_kind_is_covered_by_the_table() -> None:
    covered = {kind for _, _, expected in CASES for kind in expected}
    assert covered == set(c.VIOLATION_KINDS)


def test_the_fenced_writes_are_counted() -> None:
    report = check(frozen_body_refused(h := clean()) or h)
    assert report.fenced == {
        "writes": SLOTS,
        "refused": 1,
        "errors": 0,
        "frozen": 1,
        "frozen_refused": 1,
        "frozen_still_owner": 0,
    }
    assert "fenced writes: 10 (1 refused" in report.render()


def test_clean_report_counts() -> None:
    report = check(clean())
    assert report.slots_checked == 2 * SLOTS
    assert report.runs == 2 * SLOTS
    assert report.executions == 2 * SLOTS
    assert report.indeterminate == 0
    assert report.max_leader_gap_s == pytest.approx(0.1)
    assert report.faults_by_kind == {"sigterm_leader": 1}
    assert "violations: none" in report.render()


def test_lost_runs_are_indeterminate_not_violations() -> None:
    history = clean()
    lost_in_flight(history)
    report = check(history)
    assert report.ok
    assert report.indeterminate == 1


def test_render_groups_violations_by_kind_with_evidence() -> None:
    history = clean()
    body_twice(history)
    slot_without_row(history)
    text = check(history, CheckConfig(shown_per_kind=1)).render()
    assert f"  {c.DUPLICATE_EXECUTION}: 1" in text
    assert f"  {c.MISSING_SLOT}: 1" in text
    assert "evidence: " in text


def test_history_round_trips_through_json() -> None:
    history = clean()
    skip_behind_a_killed_body(history)
    paused_for_a_while(history)
    operator_got_a_500(history)
    again = history_from_dict(json.loads(json.dumps(history_to_dict(history))))
    assert again == history
    assert check(again).by_kind().keys() == check(history).by_kind().keys()


def test_interval_slots_are_aligned_to_the_epoch_or_start_at() -> None:
    job = _job(1)
    assert list(interval_slots(job, T0 - 0.5, T0 + 2)) == [T0, T0 + 1, T0 + 2]
    every_5 = dataclasses.replace(job, interval_seconds=5, start_at=T0 + 2)
    assert list(interval_slots(every_5, T0, T0 + 12)) == [T0 + 2, T0 + 7, T0 + 12]


# --- the history readers (pure parts) ------------------------------------------------------------


def test_term_claims_are_read_from_json_and_text_logs() -> None:
    json_log = "\n".join(
        [
            json.dumps({"ts": "2027-01-15T08:00:00.250+00:00", "msg": "started leading (term 7)"}),
            json.dumps(
                {"ts": "2027-01-15T08:00:00.100+00:00", "msg": "n1 started leading x in term 7"}
            ),
            "node n1 running (pid 12)",
            '{"ts": "2027-01-15T08:00:01',  # cut short by a SIGKILL
        ]
    )
    claims = parse_term_claims("n1", json_log, source="n1.0.log")
    assert [(cl.node_id, cl.term, cl.source) for cl in claims] == [("n1", 7, "n1.0.log")]
    assert claims[0].at == datetime(2027, 1, 15, 8, 0, 0, 250_000, tzinfo=UTC).timestamp()
    text_log = "2027-01-15 08:00:00,250 INFO cluster.node started leading (term 3)\n"
    assert [cl.term for cl in parse_term_claims("n2", text_log)] == [3]


def test_side_effect_log_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    line = {
        "event": "start",
        "execution_id": 5,
        "job_id": 1,
        "scheduled_for": T0,
        "attempt": 1,
        "node": "n1",
        "pid": 9,
        "at": T0 + 0.01,
    }
    path.write_text(json.dumps(line) + "\n" + '{"event": "end", "execution_id": 5, "at"')
    assert read_side_effects(path) == [SideEffect("start", 5, 1, T0, 1, "n1", 9, T0 + 0.01)]
    assert read_side_effects(tmp_path / "missing.jsonl") == []


def test_pause_windows_pair_pause_and_resume() -> None:
    events = [("resume", 1, 5.0), ("pause", 1, 2.0), ("pause", 2, 3.0), ("resume", 3, 1.0)]
    assert pause_windows(events, end=9.0) == [
        PauseWindow(job_id=1, start=2.0, end=5.0),
        PauseWindow(job_id=2, start=3.0, end=9.0),
    ]


# --- notes: worth reading, not violations ------------------------------------------------------


def _frozen_body_declared_lost(h: History) -> None:
    """n3 (pid 4242) frozen from T0 + 1.1 to T0 + 4.5 inside the body of job 1's slot 1, which
    the cluster declared lost at T0 + 3.3; the body ended when the node resumed."""
    row = _replace_row(h, 1, 1, status="lost", reason="node n3 is gone", finished_at=T0 + 3.3)
    _move_effect(h, row.id, "end", T0 + 4.6)
    h.faults.append(Fault("sigstop_worker", "n3", T0 + 1.1, T0 + 4.5, pid=4242))


def test_an_overlap_behind_a_body_frozen_inside_is_a_note_not_a_violation() -> None:
    history = clean()
    _frozen_body_declared_lost(history)
    report = check(history)
    assert report.ok, report.render()
    assert {n.kind for n in report.notes} == {c.FROZEN_BODY_OVERLAP}
    assert len(report.notes) == 3  # slots 2, 3 and 4 ran beside the resumed body
    assert "notes (not violations): 3" in report.render()


def test_the_same_overlap_without_a_freeze_is_a_violation() -> None:
    history = clean()
    _frozen_body_declared_lost(history)
    history.faults.pop()
    report = check(history)
    # Nor was a run lost while nothing happened to its node.
    assert set(report.by_kind()) == {c.FORBID_OVERLAP, c.UNEXCUSED_LOST}
    assert {n.kind for n in report.notes} == {c.LOST_WHILE_RUNNING}


def _body_slowed_past_the_control_limit(h: History, latency_s: float) -> None:
    """n3's database link slowed by ``latency_s`` each way from T0 + 0.4 to T0 + 4.5; the body of
    job 1's slot 1 ran on to T0 + 4.6, while the cluster declared its run lost at T0 + 1.9 and
    slots 2, 3 and 4 ran."""
    row = _replace_row(h, 1, 1, status="lost", reason="node n3 is gone", finished_at=T0 + 1.9)
    _move_effect(h, row.id, "end", T0 + 4.6)
    h.faults.append(Fault("slow_db_worker", "n3", T0 + 0.4, T0 + 4.5, magnitude=latency_s))


def test_a_body_on_a_link_slowed_past_the_control_limit_overlaps_as_a_cut_one_does() -> None:
    """A round trip of 1.2 s is past the 1 s control limit: the node counts its database as
    unreachable, gives its job locks up and the leader ends its runs, as after a partition."""
    history = clean()
    _body_slowed_past_the_control_limit(history, 0.6)
    report = check(history)
    assert report.ok, report.render()
    assert [n.kind for n in report.notes] == [c.CUT_BODY_OVERLAP] * 3
    # A node run with a looser control limit would have waited for its statements.
    loose = check(history, CheckConfig(db_control_limit_s=2.0))
    assert set(loose.by_kind()) == {c.FORBID_OVERLAP}


def test_a_body_on_a_link_slowed_within_the_control_limit_must_not_overlap() -> None:
    history = clean()
    _body_slowed_past_the_control_limit(history, 0.3)
    report = check(history)
    assert set(report.by_kind()) == {c.FORBID_OVERLAP}
    assert not [n for n in report.notes if n.kind == c.CUT_BODY_OVERLAP]


def test_a_run_declared_lost_while_its_node_ran_it_is_a_note() -> None:
    history = clean()
    row = _replace_row(history, 2, 3, status="lost", reason="node n3 is gone", finished_at=T0 + 3.1)
    # A fault on that node that neither stopped it nor cut it off (one of three lock masters).
    history.faults.append(Fault("clock_jump", "n3", T0 + 2.0, T0 + 2.5, magnitude=-0.2))
    report = check(history)
    assert report.ok, report.render()
    [note] = report.notes
    assert note.kind == c.LOST_WHILE_RUNNING
    assert f"execution {row.id}: declared lost at" in note.message
    # Cut off from the database, its presence really expired: nothing to note.
    history.faults.append(Fault("db_down", "database", T0 + 2.5, T0 + 5.0))
    assert check(history).notes == []


def test_a_pause_excuses_the_slots_the_lagging_leader_had_not_written() -> None:
    """Paused at T0 + 6.5 while the leader, behind, had written slots up to T0 + 4 only: slots 5
    and 6 were never created, and need not be."""
    history = clean()
    for k in (5, 6, 7):
        row = _find(history, 2, k)
        history.executions.remove(row)
        _drop_effects(history, row.id)
    history.executions = [
        dataclasses.replace(e, created_at=T0 + 7.0)
        if e.job_id == 2 and e.scheduled_for > T0 + 7
        else e
        for e in history.executions
    ]
    history.paused.append(PauseWindow(job_id=2, start=T0 + 6.5, end=T0 + 6.9))
    assert check(history).ok, check(history).render()
    # Without the pause, the three slots are missing.
    history.paused.clear()
    assert len(check(history).by_kind()[c.MISSING_SLOT]) == 3


def test_a_retry_skipped_by_forbid_is_judged_at_its_backoff_instant() -> None:
    """Attempt 2 of slot 2, due at T0 + 3.1 after its backoff, is skipped while slot 3's body runs:
    justified (at the slot's own instant nothing ran)."""
    history = clean()
    first = _replace_row(history, 1, 2, status="lost", reason="node n3 is gone")
    worker_killed(history, T0 + 2.1)
    retry = dataclasses.replace(
        first,
        id=99_010,
        attempt=2,
        trigger="retry",
        status="skipped",
        reason=FORBID_REASON,
        run_after=T0 + 3.1,
        finished_at=T0 + 3.1,
    )
    history.executions.append(retry)
    assert check(history).ok, check(history).render()
    history.executions[-1] = dataclasses.replace(retry, run_after=None, finished_at=T0 + 2.0)
    assert set(check(history).by_kind()) == {c.UNJUSTIFIED_SKIP}


def _frozen_at_start(h: History, *, start_after_resume: float, freeze_from: float) -> None:
    """Job 2's slot 7: its node froze (SIGSTOP) at ``freeze_from`` (relative to the slot), was
    declared lost 1.2 s after the slot, resumed 2.5 s after it; the body's first step came
    ``start_after_resume`` after the resume."""
    slot = T0 + 7
    row = _replace_row(
        h, 2, 7, status="lost", reason="node n3 stopped heartbeating", finished_at=slot + 1.2
    )
    pid = next(s.pid for s in h.side_effects if s.execution_id == row.id and s.event == "start")
    resumed = slot + 2.5
    h.faults.append(Fault("sigstop_worker", "n3", slot + freeze_from, resumed, pid=pid))
    _move_effect(h, row.id, "start", resumed + start_after_resume)
    _move_effect(h, row.id, "end", resumed + start_after_resume + 0.2)


def test_a_body_frozen_between_its_fence_and_its_first_step_is_a_note() -> None:
    """The freeze began at the slot (after the body's self-fence passed) and the first step came
    on resume: the one window no lease closes, reported as a note."""
    history = clean()
    _frozen_at_start(history, start_after_resume=0.0, freeze_from=0.001)
    report = check(history)
    assert report.ok, report.render()
    assert {n.kind for n in report.notes} == {c.FROZEN_AT_START}


@pytest.mark.parametrize(
    ("start_after_resume", "freeze_from"),
    [(2.0, 0.001), (0.0, 1.5)],
    ids=["started-long-after-the-resume", "frozen-only-after-it-was-declared-lost"],
)
def test_a_start_after_lost_not_explained_by_a_freeze_at_start_is_a_violation(
    start_after_resume: float, freeze_from: float
) -> None:
    history = clean()
    _frozen_at_start(history, start_after_resume=start_after_resume, freeze_from=freeze_from)
    report = check(history)
    expected = {c.START_AFTER_LOST}
    if freeze_from > 1.2:  # the freeze began after the run was declared lost: nothing excuses it
        expected.add(c.UNEXCUSED_LOST)
    assert set(report.by_kind()) == expected, report.render()


# --- scheduling partitions: leadership is judged per partition ------------------------------------


def _partitioned(h: History) -> History:
    """Job 2 is in partition 1, led by n2 in its own terms 1 (until T0 + 6) and 2 (n3, from
    T0 + 6.1): the same term numbers as partition 0's, at other times."""
    h.terms += [
        Term(1, "n2", T0 - 20, T0 + 6.0, "stepped_down", partition=1),
        Term(2, "n3", T0 + 6.1, None, "", partition=1),
    ]
    h.term_claims += [
        TermClaim("n2", 1, T0 - 20, partition=1),
        TermClaim("n3", 2, T0 + 6.1, partition=1),
    ]
    h.executions = [
        dataclasses.replace(
            e,
            partition=1,
            term=1 if e.scheduled_for < T0 + 7 else 2,
            created_at=e.scheduled_for - 0.8,
        )
        if e.job_id == 2
        else e
        for e in h.executions
    ]
    h.commits = [
        Commit(0, writer_term=1, fence_term=1, raised_to=None, fires=1),
        Commit(1, writer_term=1, fence_term=1, raised_to=None, fires=1, partition=1),
        Commit(2, writer_term=None, fence_term=1, raised_to=2),
        # Partition 1's term 1 still writes after partition 0's fence reached term 2: its own
        # fence is still at 1.
        Commit(3, writer_term=1, fence_term=1, raised_to=None, fires=1, partition=1),
        Commit(4, writer_term=None, fence_term=1, raised_to=2, partition=1),
        Commit(5, writer_term=2, fence_term=2, raised_to=None, fires=1, partition=1),
    ]
    return h


def test_partitions_sharing_term_numbers_are_not_mistaken_for_each_other() -> None:
    report = check(_partitioned(clean()))
    assert report.violations == [], [v.message for v in report.violations]
    assert report.terms == 4


def test_a_stale_write_in_one_partition_is_found_in_that_partition() -> None:
    h = _partitioned(clean())
    # Partition 1's old term 1 commits on its fence after term 2 raised it, and writes a fire
    # after its successor had begun.
    h.commits.append(Commit(6, writer_term=1, fence_term=2, raised_to=None, fires=1, partition=1))
    late = _find(h, 2, 8)
    h.executions[h.executions.index(late)] = dataclasses.replace(late, term=1)
    # Partition 1's term 2 claimed by a second node too.
    h.term_claims.append(TermClaim("n1", 2, T0 + 6.2, partition=1))
    kinds = Counter(v.kind for v in check(h).violations)
    assert kinds == {c.STALE_COMMIT: 1, c.STALE_TERM_WRITE: 1, c.TERM_HELD_TWICE: 2}


def test_term_claims_name_their_partition() -> None:
    text = "\n".join(
        [
            '{"ts": "2026-12-06T12:00:00+00:00", "msg": "started leading (term 3)"}',
            '{"ts": "2026-12-06T12:00:01+00:00", "msg": "started leading partition 5 (term 3)"}',
            "2026-12-06 12:00:02,000 INFO cluster.node started leading partition 2 (term 9)",
            '{"ts": "2026-12-06T12:00:03+00:00", "msg": "n1 started leading scheduler-leader-p5 in term 4"}',
        ]
    )
    claims = parse_term_claims("n1", text)
    assert [(c.partition, c.term) for c in claims] == [(0, 3), (5, 3), (2, 9)]
