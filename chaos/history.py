"""Collect a chaos run's history: the database (jobs, executions, terms, pause/resume audit rows),
the side-effect log written by ``chaos.record`` and the "started leading (term N)" lines of every
node's log. The result is the plain :class:`chaos.record.History` the checker reads.

Parsing the logs is pure (and tolerant: a line cut by a SIGKILL is skipped); only
:func:`collect_history` touches the ORM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from chaos.record import (
    ApiAnomaly,
    Deletion,
    Execution,
    Fault,
    History,
    JobInfo,
    PauseWindow,
    Permit,
    QueueLimits,
    Requested,
    ScheduleEdit,
    SideEffect,
    Term,
    TermClaim,
)

# The node runner's line once a new term is recorded (cluster.node: "started leading (term %s)").
# Anchored at the start of the message: the elector's own "<node> started leading <lease> in term
# N" (the lease was won, the term not yet accepted by the fence) is a different line.
TERM_CLAIM_RE = re.compile(r"^started leading(?: partition (\d+))? \(term (\d+)\)")
# The text log format: "2026-11-29 12:00:00,123 INFO cluster.node started leading (term 3)".
TEXT_LINE_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+ "
    r"(started leading(?: partition \d+)? \(term \d+\).*)$"
)
PAUSE_ACTIONS = {"job.pause": "pause", "job.resume": "resume"}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def read_side_effects(path: Path) -> list[SideEffect]:
    """Every complete line of the side-effect log (a line cut short by a kill is skipped)."""
    if not path.exists():
        return []
    effects = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            data = json.loads(line)
            effects.append(
                SideEffect(
                    event=str(data["event"]),
                    execution_id=int(data["execution_id"]),
                    job_id=data.get("job_id"),
                    scheduled_for=data.get("scheduled_for"),
                    attempt=int(data.get("attempt", 1)),
                    node=str(data.get("node", "")),
                    pid=int(data.get("pid", 0)),
                    at=float(data["at"]),
                    token=data.get("token"),
                    still_owner=data.get("still_owner"),
                    fenced=str(data.get("fenced") or ""),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return effects


def parse_term_claims(node_id: str, text: str, source: str = "") -> list[TermClaim]:
    """The terms a node says it led, from its log (JSON lines, or the text format)."""
    claims = []
    for line in text.splitlines():
        line = line.strip()
        message, at = "", None
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            message = str(data.get("msg", ""))
            try:
                at = datetime.fromisoformat(data["ts"]).timestamp()
            except (KeyError, TypeError, ValueError):
                at = None
        else:
            match = TEXT_LINE_RE.match(line)
            if not match:
                continue
            message = match.group(2)
            # asctime is local time without a zone: good enough to order lines, not for the checker
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        found = TERM_CLAIM_RE.match(message)
        if found:
            claims.append(
                TermClaim(
                    node_id=node_id,
                    term=int(found.group(2)),
                    at=at,
                    source=source,
                    partition=int(found.group(1) or 0),
                )
            )
    return claims


def read_term_claims(node_logs: Mapping[str, Sequence[Path]]) -> list[TermClaim]:
    """Term claims from every log of every node (a restarted node has one log per incarnation)."""
    claims = []
    for node_id, paths in node_logs.items():
        for path in paths:
            if path.exists():
                claims += parse_term_claims(
                    node_id, path.read_text(errors="replace"), source=path.name
                )
    return claims


def pause_windows(
    events: Iterable[tuple[str, int, float]], end: float | None = None
) -> list[PauseWindow]:
    """(action, job id, at) audit events, in time order, as the windows each job was paused."""
    windows = []
    open_since: dict[int, float] = {}
    for action, job_id, at in sorted(events, key=lambda e: e[2]):
        if action == "pause":
            open_since.setdefault(job_id, at)
        elif action == "resume" and job_id in open_since:
            windows.append(PauseWindow(job_id=job_id, start=open_since.pop(job_id), end=at))
    windows += [PauseWindow(job_id=j, start=s, end=end) for j, s in open_since.items()]
    return windows


def collect_history(
    *,
    side_effects_path: Path,
    node_logs: Mapping[str, Sequence[Path]],
    faults: Sequence[Fault],
    window_start: float,
    window_end: float,
    stop_at: float,
    api_anomalies: Sequence[ApiAnomaly] = (),
    requested: Sequence[Requested] = (),
    deleted: Sequence[Deletion] = (),
    edits: Sequence[ScheduleEdit] = (),
    meta: Mapping[str, Any] | None = None,
) -> History:
    """Read the whole history of a run from its database (the default connection) and files."""
    from cluster.models import LeadershipTerm
    from jobs.models import AuditEvent, FlowPermit, Job, JobExecution, Queue

    jobs = {job.pk: job for job in Job.objects.all()}
    job_infos = [
        JobInfo(
            id=job.pk,
            name=job.name,
            schedule_type=job.schedule_type,
            interval_seconds=job.interval_seconds,
            start_at=_epoch(job.start_at),
            concurrency_policy=job.concurrency_policy,
            timeout_seconds=job.timeout_seconds,
            max_retries=job.max_retries,
            created_at=job.created_at.timestamp(),
            retry_backoff_base=job.retry_backoff_base,
            retry_backoff_factor=job.retry_backoff_factor,
            retry_backoff_max=job.retry_backoff_max,
            retry_jitter=job.retry_jitter,
            misfire_policy=job.misfire_policy,
            misfire_grace_seconds=job.misfire_grace_seconds,
            run_all_max=job.run_all_max,
            cron=job.cron_expression or "",
            timezone=str(job.timezone or "UTC"),
            queue=job.queue,
            max_concurrent=job.max_concurrent,
            rate_limit=job.rate_limit,
            rate_period_seconds=job.rate_period_seconds,
        )
        for job in jobs.values()
    ]
    executions = []
    for row in JobExecution.objects.order_by("pk").iterator(chunk_size=2000):
        job = jobs[row.job_id]
        executions.append(
            Execution(
                id=row.pk,
                job_id=row.job_id,
                job_name=job.name,
                concurrency_policy=job.concurrency_policy,
                timeout_seconds=job.timeout_seconds,
                max_retries=job.max_retries,
                interval_seconds=job.interval_seconds,
                scheduled_for=row.scheduled_for.timestamp(),
                attempt=row.attempt,
                trigger=row.trigger,
                status=row.status,
                node=row.node,
                term=row.term,
                claim_token=row.claim_token,
                created_at=row.created_at.timestamp(),
                claimed_at=_epoch(row.claimed_at),
                started_at=_epoch(row.started_at),
                finished_at=_epoch(row.finished_at),
                reason=row.reason,
                run_after=_epoch(row.run_after),
                partition=job.partition,
                catch_up=row.catch_up,
            )
        )
    terms = [
        Term(
            term=t.term,
            node_id=t.node_id,
            acquired_at=t.acquired_at.timestamp(),
            ended_at=_epoch(t.ended_at),
            end_reason=t.end_reason,
            partition=t.partition,
        )
        for t in LeadershipTerm.objects.order_by("partition", "term")
    ]
    audit = [
        (PAUSE_ACTIONS[e.action], int(e.object_id), e.created_at.timestamp())
        for e in AuditEvent.objects.filter(object_type="job", action__in=list(PAUSE_ACTIONS))
    ]
    return History(
        jobs=job_infos,
        executions=executions,
        side_effects=read_side_effects(side_effects_path),
        terms=terms,
        term_claims=read_term_claims(node_logs),
        faults=list(faults),
        paused=pause_windows(audit),
        api_anomalies=list(api_anomalies),
        requested=list(requested),
        deleted=list(deleted),
        edits=list(edits),
        window_start=window_start,
        window_end=window_end,
        stop_at=stop_at,
        meta=dict(meta or {}),
        permits=[
            Permit(p.key, p.released_at.timestamp(), p.execution_id)
            for p in FlowPermit.objects.order_by("released_at")
        ],
        queues=[
            QueueLimits(q.name, q.max_concurrent, q.rate_limit, q.rate_period_seconds)
            for q in Queue.objects.all()
        ],
    )
