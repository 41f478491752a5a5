"""The flow-control rule of the chaos checker: runs at once against a concurrency limit (in commit
order from the database's log, or on the rows' instants), permits in every rate window, a body
with no permit or ahead of it; and the database log's running steps."""

from __future__ import annotations

import dataclasses

from chaos.binlog import parse, running_steps
from chaos.record import (
    Execution,
    History,
    Index,
    JobInfo,
    Permit,
    QueueLimits,
    RunningStep,
    SideEffect,
)
from chaos.rules.flow import (
    FLOW_BODY_OVERLAP,
    FLOW_NO_PERMIT,
    FLOW_OVER_LIMIT,
    FLOW_OVER_RATE,
    flow,
)

T0 = 1_796_000_000.0


def job(job_id: int, **fields: object) -> JobInfo:
    values: dict[str, object] = {
        "id": job_id,
        "name": f"flow-{job_id}",
        "schedule_type": "once",
        "interval_seconds": None,
        "start_at": None,
        "concurrency_policy": "allow",
        "timeout_seconds": None,
        "max_retries": 0,
        "created_at": T0 - 60,
        "queue": "q",
    }
    values.update(fields)
    return JobInfo(**values)  # type: ignore[arg-type]


def row(pk: int, job_id: int, start: float, end: float, **fields: object) -> Execution:
    values: dict[str, object] = {
        "id": pk,
        "job_id": job_id,
        "job_name": f"flow-{job_id}",
        "concurrency_policy": "allow",
        "timeout_seconds": None,
        "max_retries": 0,
        "interval_seconds": None,
        "scheduled_for": start - 0.5,
        "attempt": 1,
        "trigger": "enqueue",
        "status": "succeeded",
        "node": "n1",
        "term": None,
        "claim_token": None,
        "created_at": start - 1,
        "claimed_at": start - 0.5,
        "started_at": start,
        "finished_at": end,
        "reason": "",
    }
    values.update(fields)
    return Execution(**values)  # type: ignore[arg-type]


def effects(r: Execution, start: float | None = None, end: float | None = None) -> list:
    base = {
        "execution_id": r.id,
        "job_id": r.job_id,
        "scheduled_for": r.scheduled_for,
        "attempt": 1,
        "node": r.node,
        "pid": 1,
    }
    return [
        SideEffect(event="start", at=start if start is not None else r.started_at, **base),
        SideEffect(event="end", at=end if end is not None else r.finished_at, **base),
    ]


def history(jobs, rows, **fields) -> History:
    values = {
        "jobs": jobs,
        "executions": rows,
        "side_effects": [e for r in rows for e in effects(r)],
        "terms": [],
        "term_claims": [],
        "faults": [],
        "window_start": T0,
        "window_end": T0 + 60,
        "stop_at": T0 + 61,
    }
    values.update(fields)
    return History(**values)  # type: ignore[arg-type]


def kinds(h: History) -> list[str]:
    found, notes, _ = flow(h, Index(h))
    return sorted(v.kind for v in found) + sorted(n.kind for n in notes)


def test_runs_within_the_job_limit_pass_and_one_more_at_once_is_found() -> None:
    limited = job(1, max_concurrent=2)
    rows = [row(1, 1, T0, T0 + 2), row(2, 1, T0 + 0.5, T0 + 2.5), row(3, 1, T0 + 2, T0 + 3)]
    h = history([limited], rows)
    assert kinds(h) == []
    _, _, stats = flow(h, Index(h))
    assert stats.at_once == {"job:1": [2, 2]} and stats.judged_on == "row instants"
    rows[2] = row(3, 1, T0 + 1.9, T0 + 3)
    assert kinds(history([limited], rows)) == [FLOW_OVER_LIMIT, FLOW_BODY_OVERLAP]


def test_a_queue_limit_counts_every_job_of_the_queue() -> None:
    jobs = [job(1), job(2), job(3, queue="other")]
    rows = [row(1, 1, T0, T0 + 2), row(2, 2, T0 + 1, T0 + 3), row(3, 3, T0 + 1, T0 + 3)]
    limits = [QueueLimits("q", max_concurrent=2)]
    assert kinds(history(jobs, rows, queues=limits)) == []
    assert kinds(history(jobs, rows, queues=[QueueLimits("q", max_concurrent=1)])) == [
        FLOW_OVER_LIMIT,
        FLOW_BODY_OVERLAP,
    ]


def test_the_commit_order_is_the_judge_when_the_log_is_there() -> None:
    limited = job(1, max_concurrent=1)
    # The rows' instants overlap (two nodes' clocks apart), the commits do not: no violation.
    rows = [row(1, 1, T0, T0 + 2), row(2, 1, T0 + 1.9, T0 + 3)]
    steps = [
        RunningStep(1, 1, 1, "q", True),
        RunningStep(2, 1, 1, "q", False),
        RunningStep(2, 2, 1, "q", True),  # one commit ends the one and starts the next
        RunningStep(3, 2, 1, "q", False),
    ]
    h = history([limited], rows, running_steps=steps)
    found, _, stats = flow(h, Index(h))
    assert found == [] and stats.judged_on == "commit order"
    overlapping = [
        RunningStep(1, 1, 1, "q", True),
        RunningStep(2, 2, 1, "q", True),
        RunningStep(3, 1, 1, "q", False),
    ]
    h = history([limited], rows, running_steps=overlapping)
    assert [v.kind for v in flow(h, Index(h))[0]] == [FLOW_OVER_LIMIT]


def test_permits_are_judged_over_every_window_and_each_body_needs_its_own() -> None:
    rated = job(1, rate_limit=2, rate_period_seconds=3)
    rows = [row(pk, 1, T0 + at, T0 + at + 0.1) for pk, at in ((1, 0), (2, 1), (3, 3.0), (4, 4))]
    permits = [Permit("job:1", r.started_at - 0.01, r.id) for r in rows]
    h = history([rated], rows, permits=permits)
    assert kinds(h) == []
    assert flow(h, Index(h))[2].in_window == {"job:1": [2, 2]}
    # The third 0.1 s early: three permits within 3 s.
    squeezed = [*permits[:2], dataclasses.replace(permits[2], released_at=T0 + 2.9), permits[3]]
    assert kinds(history([rated], rows, permits=squeezed)) == [FLOW_OVER_RATE]
    # A body with no permit, and one that started well before its permit.
    assert kinds(history([rated], rows, permits=permits[:3])) == [FLOW_NO_PERMIT]
    late = [*permits[:3], dataclasses.replace(permits[3], released_at=T0 + 4.5)]
    assert kinds(history([rated], rows, permits=late)) == [FLOW_NO_PERMIT]


COLUMNS = {"jobs_jobexecution": ["id", "job_id", "status", "queue"]}


def update(pk: int, before: str, after: str) -> str:
    image = "\n".join(["###   @1={pk}", "###   @2=7", "###   @3='{s}'", "###   @4='q'"])
    return (
        "### UPDATE `chaos`.`jobs_jobexecution`\n### WHERE\n"
        + image.format(pk=pk, s=before)
        + "\n### SET\n"
        + image.format(pk=pk, s=after)
        + "\n"
    )


def test_the_log_gives_each_row_entering_and_leaving_running_in_commit_order() -> None:
    log = (
        "START TRANSACTION\n"
        + update(1, "pending", "running")
        + update(2, "pending", "pending")
        + "COMMIT/*!*/;\nSTART TRANSACTION\n"
        + update(1, "running", "succeeded")
        + update(2, "pending", "running")
        + "COMMIT/*!*/;\n"
    )
    steps = running_steps(parse(log, COLUMNS))
    assert steps == [
        RunningStep(0, 1, 7, "q", True),
        RunningStep(1, 1, 7, "q", False),
        RunningStep(1, 2, 7, "q", True),
    ]
