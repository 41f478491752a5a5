"""Flow control, judged from the database's own records (``jobs.flow``):

- ``flow_over_limit``: more runs of a job (or a queue) with ``max_concurrent`` N recorded running
  at once than N. Judged on the rows entering and leaving ``running`` in commit order (the
  private MariaDB's log): no writer's clock is involved. Without that log (SQLite), on the rows'
  recorded start and end instants, a node's clock against another's.
- ``flow_over_rate``: more permits of a job (or a queue) with ``rate_limit`` N per P seconds
  released within one window of P seconds than N (over every window).
- ``flow_no_permit``: a body of a rate-limited job or queue that started with no permit, or
  before its permit's instant (beyond the clocks' slack).

A body that outlives its row (frozen inside it, declared lost, resumed) may run beside the run
that replaced it, as any lease allows: a note (``flow_body_overlap``), as for forbid.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from chaos.record import History, Index, Violation, effect_evidence

FLOW_OVER_LIMIT = "flow_over_limit"
FLOW_OVER_RATE = "flow_over_rate"
FLOW_NO_PERMIT = "flow_no_permit"
KINDS = (FLOW_OVER_LIMIT, FLOW_OVER_RATE, FLOW_NO_PERMIT)
FLOW_BODY_OVERLAP = "flow_body_overlap"  # a note
# A body's start line against its permit's instant (the same machine's clocks, read apart).
PERMIT_SLACK_S = 0.05
MSG_OVER_LIMIT = "{key}: {count} runs running at once (limit {limit}): executions {ids}"
MSG_OVER_RATE = (
    "{key}: {count} runs released within {period} s from {at:.3f} (limit {limit}): executions {ids}"
)
MSG_NO_PERMIT = "{key}: the body of execution {execution_id} started with no permit"
MSG_BEFORE_PERMIT = (
    "{key}: the body of execution {execution_id} started {early_s:.3f} s before its permit"
)
MSG_BODY_OVERLAP = (
    "{key}: {count} bodies at once (limit {limit}) at {at:.3f}: execution(s) {ids} outlived "
    "their rows (frozen or cut off, declared over, resumed)"
)


@dataclass
class FlowStats:
    # key -> [most at once seen, limit]; key -> [most released in one window, limit]
    at_once: dict[str, list[int]] = field(default_factory=dict)
    in_window: dict[str, list[int]] = field(default_factory=dict)
    permits: int = 0
    judged_on: str = ""  # "commit order" | "row instants" | "" (no limit in the run)


def _limits(history: History) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Concurrency limits and rate limits (limit, period) by key."""
    concurrency: dict[str, int] = {}
    rates: dict[str, tuple[int, int]] = {}
    for job in history.jobs:
        if job.max_concurrent:
            concurrency[f"job:{job.id}"] = job.max_concurrent
        if job.rate_limit:
            rates[f"job:{job.id}"] = (job.rate_limit, job.rate_period_seconds)
    for queue in history.queues:
        if queue.max_concurrent:
            concurrency[f"queue:{queue.name}"] = queue.max_concurrent
        if queue.rate_limit:
            rates[f"queue:{queue.name}"] = (queue.rate_limit, queue.rate_period_seconds)
    return concurrency, rates


def _keys(job_id: int, queue: str) -> tuple[str, str]:
    return f"job:{job_id}", f"queue:{queue}"


def flow(history: History, index: Index) -> tuple[list[Violation], list[Violation], FlowStats]:
    """(violations, notes, stats)."""
    stats = FlowStats()
    concurrency, rates = _limits(history)
    found: list[Violation] = []
    notes: list[Violation] = []
    if concurrency:
        found += _at_once(history, concurrency, stats)
        notes += _bodies_at_once(history, index, concurrency)
    if rates:
        found += _rates(history, index, rates, stats)
    return found, notes, stats


def _at_once(history: History, limits: dict[str, int], stats: FlowStats) -> list[Violation]:
    jobs = {job.id: job for job in history.jobs}
    if history.running_steps:
        stats.judged_on = "commit order"
        events = [
            (step.seq, 0 if not step.entered else 1, step.execution_id, step.job_id, step.queue)
            for step in history.running_steps
        ]
    else:
        stats.judged_on = "row instants"
        events = []
        end = history.stop_at or history.window_end
        for row in history.executions:
            if row.started_at is None:
                continue
            queue = jobs[row.job_id].queue if row.job_id in jobs else ""
            events.append((row.started_at, 1, row.id, row.job_id, queue))
            events.append((row.finished_at or end, 0, row.id, row.job_id, queue))
    # Leaving before entering at one instant (one commit may end a run and start the next).
    events.sort(key=lambda event: (event[0], event[1]))
    running: dict[str, set[int]] = defaultdict(set)
    reported: set[str] = set()
    found = []
    for key in limits:
        stats.at_once[key] = [0, limits[key]]
    for _, entered, execution_id, job_id, queue in events:
        for key in _keys(job_id, queue):
            if key not in limits:
                continue
            if entered:
                running[key].add(execution_id)
            else:
                running[key].discard(execution_id)
            count = len(running[key])
            stats.at_once[key][0] = max(stats.at_once[key][0], count)
            if count > limits[key] and key not in reported:
                reported.add(key)
                found.append(
                    Violation(
                        FLOW_OVER_LIMIT,
                        MSG_OVER_LIMIT.format(
                            key=key, count=count, limit=limits[key], ids=sorted(running[key])
                        ),
                        {"executions": sorted(running[key])},
                    )
                )
    return found


def _bodies_at_once(history: History, index: Index, limits: dict[str, int]) -> list[Violation]:
    jobs = {job.id: job for job in history.jobs}
    ends = {e.execution_id: e.at for e in history.side_effects if e.event == "end"}
    end_of_run = history.stop_at or history.window_end
    events = []
    for effect in history.side_effects:
        if effect.event != "start" or effect.job_id not in jobs:
            continue
        job = jobs[effect.job_id]
        # A body with no end line was killed with its node: it ended by the time its run was
        # declared over.
        row = index.rows.get(effect.execution_id)
        stop = ends.get(effect.execution_id) or (row.finished_at if row else None) or end_of_run
        events.append((effect.at, 1, effect.execution_id, job.id, job.queue))
        events.append((stop, 0, effect.execution_id, job.id, job.queue))
    events.sort(key=lambda event: (event[0], event[1]))
    running: dict[str, set[int]] = defaultdict(set)
    notes = []
    noted: set[str] = set()
    for at, entered, execution_id, job_id, queue in events:
        for key in _keys(job_id, queue):
            if key not in limits:
                continue
            (running[key].add if entered else running[key].discard)(execution_id)
            if len(running[key]) > limits[key] and key not in noted:
                outlived = [
                    pk
                    for pk in sorted(running[key])
                    if (row := index.rows.get(pk)) is not None
                    and row.finished_at is not None
                    and row.finished_at < at
                ]
                noted.add(key)
                notes.append(
                    Violation(
                        FLOW_BODY_OVERLAP,
                        MSG_BODY_OVERLAP.format(
                            key=key,
                            count=len(running[key]),
                            limit=limits[key],
                            at=at,
                            ids=outlived or sorted(running[key]),
                        ),
                        {"executions": sorted(running[key])},
                    )
                )
    return notes


def _rates(
    history: History, index: Index, rates: dict[str, tuple[int, int]], stats: FlowStats
) -> list[Violation]:
    found = []
    by_key: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for permit in history.permits:
        by_key[permit.key].append((permit.released_at, permit.execution_id))
    stats.permits = len(history.permits)
    for key, (limit, period) in rates.items():
        permits = sorted(by_key.get(key, []))
        most = 0
        reported = False
        start = 0
        for end in range(len(permits)):
            while permits[end][0] - permits[start][0] >= period:
                start += 1
            count = end - start + 1
            most = max(most, count)
            if count > limit and not reported:
                reported = True
                found.append(
                    Violation(
                        FLOW_OVER_RATE,
                        MSG_OVER_RATE.format(
                            key=key,
                            count=count,
                            period=period,
                            at=permits[start][0],
                            limit=limit,
                            ids=[pk for _, pk in permits[start : end + 1]],
                        ),
                        {"permits": permits[start : end + 1]},
                    )
                )
        stats.in_window[key] = [most, limit]
    released: dict[tuple[str, int], float] = {
        (p.key, p.execution_id): p.released_at for p in history.permits
    }
    jobs = {job.id: job for job in history.jobs}
    for effect in history.side_effects:
        if effect.event != "start" or effect.job_id not in jobs:
            continue
        job = jobs[effect.job_id]
        for key in _keys(job.id, job.queue):
            if key not in rates:
                continue
            at = released.get((key, effect.execution_id))
            if at is None:
                found.append(
                    Violation(
                        FLOW_NO_PERMIT,
                        MSG_NO_PERMIT.format(key=key, execution_id=effect.execution_id),
                        {"start": effect_evidence(effect)},
                    )
                )
            elif effect.at < at - PERMIT_SLACK_S:
                found.append(
                    Violation(
                        FLOW_NO_PERMIT,
                        MSG_BEFORE_PERMIT.format(
                            key=key, execution_id=effect.execution_id, early_s=at - effect.at
                        ),
                        {"start": effect_evidence(effect), "permit": at},
                    )
                )
    return found
