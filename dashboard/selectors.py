"""The dashboard's reads: every query its pages make, so that views only parse, call and render.

List filters go through the API's own filter sets (``jobs.api.filters``): a page filters with the
same lookups and bounds as ``/api/``, except that a value the API would refuse with a 400 is
dropped here (a page shows its list unfiltered by it rather than an error).
"""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone
from django.utils.datastructures import MultiValueDict

from cluster import conf
from cluster.models import LeadershipTerm, SchedulerNode
from dashboard import live
from jobs import registry
from jobs import selectors as job_selectors
from jobs.api.filters import AuditEventFilter, ExecutionFilter, JobFilter
from jobs.api.pagination import capped_count
from jobs.models import RECENT_FIRST, AuditEvent, Job, JobExecution
from jobs.states import ACTIVE_STATES, TERMINAL_STATES, ExecutionStatus

S = ExecutionStatus
# The overview charts: one bucket per minute over the last hour.
CHART_WINDOW_MINUTES = 60
JOBS_COUNT_CAP = 10_000
OUTCOME_STATUSES = (S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.LOST, S.CANCELLED, S.SKIPPED)
FAILED_STATUSES = (S.FAILED, S.TIMED_OUT, S.LOST)
# Success rate and the duration chart of a job look at its latest finished executions.
JOB_STATS_EXECUTIONS = 100
JOB_DURATION_CHART_POINTS = 50
NEVER_RUN = "never"  # the job list's outcome filter for jobs that have not finished a run
# The cluster message of docs/live-protocol.md carries the newest 20 terms; the pages show the same.
TIMELINE_TERMS = 20


def node_pks() -> dict[str, int]:
    """node_id -> primary key, for links to node pages (executions name their node by node_id)."""
    return dict(SchedulerNode.objects.values_list("node_id", "pk"))


def _filtered(filterset: type, params: dict[str, Any], queryset: QuerySet) -> QuerySet:
    """``queryset`` through the API's ``filterset`` with the page's ``params`` (empty ones left
    out; one the filter set refuses is not applied)."""
    data = MultiValueDict()
    for name, value in params.items():
        if value is None or value == "":
            continue
        data.setlist(name, [value.isoformat() if isinstance(value, datetime) else str(value)])
    return filterset(data, queryset=queryset).qs


# --- lists ------------------------------------------------------------------------------------


def job_rows(
    *, search: str, enabled: str, task: str, schedule_type: str, outcome: str, tag: str = ""
) -> QuerySet[Job]:
    """The job list's rows: text search over name, description and task, the API's filters (a
    tag among them), and the outcome of each job's latest finished run (``never``: none yet)."""
    rows = Job.objects.all()
    if tag:
        rows = rows.filter(job_selectors.tagged(tag))
    if search:
        rows = rows.filter(
            Q(name__icontains=search) | Q(description__icontains=search) | Q(task__icontains=search)
        )
    rows = with_last_outcome(
        _filtered(
            JobFilter,
            {
                "enabled": {"yes": "true", "no": "false"}.get(enabled),
                "task": task,
                "schedule_type": schedule_type,
            },
            rows,
        )
    )
    if outcome == NEVER_RUN:
        rows = rows.filter(last_outcome__isnull=True)
    elif outcome in TERMINAL_STATES:
        rows = rows.filter(last_outcome=outcome)
    return rows


def job_list_choices() -> dict[str, Any]:
    """What the job list's filters offer, and the totals it shows."""
    return {
        # The distinct tasks through the task index (not every job's row: a million of them).
        "tasks": sorted(
            set(registry.task_names())
            | set(Job.objects.order_by("task").values_list("task", flat=True).distinct())
        ),
        # Counted no further than JOBS_COUNT_CAP (a count of a million jobs reads them all).
        "total": min(total := capped_count(Job.objects.all(), JOBS_COUNT_CAP), JOBS_COUNT_CAP),
        "total_capped": total > JOBS_COUNT_CAP,
        # Jobs created later have larger ids: the page tells them apart from edits.
        "max_job_id": Job.objects.aggregate(Max("id"))["id__max"] or 0,
    }


def execution_rows(
    *,
    job: int | None,
    status: str,
    node: str,
    since: datetime | None,
    until: datetime | None,
    search: str,
) -> QuerySet[JobExecution]:
    """The execution list's rows, newest first: the text search of ``jobs.selectors`` (a run's
    number, or words of its job, node, reason or error), then the API's filters."""
    return _filtered(
        ExecutionFilter,
        {
            "job": job,
            "status": status,
            "node": node,
            "scheduled_after": since,
            "scheduled_before": until,
        },
        job_selectors.execution_list(search=search),
    ).order_by(*RECENT_FIRST)


def job_names() -> QuerySet:
    return Job.objects.order_by("name").values_list("pk", "name")


def job_id_named(name: str) -> int | None:
    return Job.objects.filter(name=name).values_list("pk", flat=True).first()


def audit_events(
    *, search: str, fields: dict[str, str], since: datetime | None, until: datetime | None
) -> QuerySet[AuditEvent]:
    """The audit log's rows, newest first: text search over what was changed, the API's filters."""
    events = AuditEvent.objects.all()
    if search:
        events = events.filter(Q(object_repr__icontains=search) | Q(object_id=search))
    return _filtered(AuditEventFilter, {**fields, "since": since, "until": until}, events)


def audit_choices() -> dict[str, Any]:
    """The values the audit log's filters offer: those that occur."""
    distinct = AuditEvent.objects.order_by()
    return {
        "actors": distinct.values_list("actor_name", flat=True).distinct().order_by("actor_name"),
        "actions": distinct.values_list("action", flat=True).distinct().order_by("action"),
        "object_types": distinct.values_list("object_type", flat=True)
        .distinct()
        .order_by("object_type"),
    }


def existing_job_ids(ids: list[int]) -> set[int]:
    return set(Job.objects.filter(pk__in=ids).values_list("pk", flat=True))


# --- one object -------------------------------------------------------------------------------


def job_recent_executions(job: Job, limit: int) -> QuerySet[JobExecution]:
    return job.executions.order_by(*RECENT_FIRST)[:limit]


def job_running_count(job: Job) -> int:
    return job.executions.filter(status=S.RUNNING).count()


def job_execution_counts(job: Job) -> dict[str, int]:
    """What deleting a job takes with it: all its executions, of which these are still active."""
    return {
        "execution_count": job.executions.count(),
        "active_count": job.executions.filter(status__in=ACTIVE_STATES).count(),
    }


def execution_chain(execution: JobExecution) -> list[JobExecution]:
    """Every attempt at the same slot of the same job, first attempt first."""
    return list(
        JobExecution.objects.filter(
            job_id=execution.job_id, scheduled_for=execution.scheduled_for
        ).order_by("attempt")
    )


def execution_chained_runs(execution: JobExecution) -> list[JobExecution]:
    """The runs this run's final outcome made through its job's chains, oldest first."""
    return list(execution.chained_runs.select_related("job").order_by("id"))


def job_chain_targets(job: Job) -> list[tuple[str, list[tuple[str, int | None]]]]:
    """A job's chains for its page: (outcome label, [(job name, its id or None)]) for each list
    that names a job. One query for the ids."""
    lists = [
        ("On success", job.on_success),
        ("On failure", job.on_failure),
        ("On end", job.on_end),
    ]
    names = {name for _, names in lists for name in names}
    ids = dict(Job.objects.filter(name__in=names).values_list("name", "pk")) if names else {}
    return [(label, [(name, ids.get(name)) for name in names]) for label, names in lists if names]


def nodes() -> list[SchedulerNode]:
    return list(SchedulerNode.objects.order_by("node_id"))


def node_recent_executions(node: SchedulerNode, limit: int) -> QuerySet[JobExecution]:
    return job_selectors.execution_list(node=node.node_id).order_by(*RECENT_FIRST)[:limit]


def node_terms(node: SchedulerNode) -> QuerySet[LeadershipTerm]:
    return LeadershipTerm.objects.filter(node_id=node.node_id)[:TIMELINE_TERMS]


def recent_executions(limit: int) -> QuerySet[JobExecution]:
    return JobExecution.objects.prefetch_related("job").order_by(*RECENT_FIRST)[:limit]


def dashboard_counts(*, now: datetime) -> dict[str, int]:
    """The overview counters: the live ``counts`` message itself."""
    return live.counts_payload(now=now)


def _epoch_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _ms(value: timedelta | float | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        return value.total_seconds() * 1000
    return float(value)


class SettledMinutes:
    """The chart buckets of minutes that are over (finished more than SETTLED_AFTER_S ago), kept
    by this process: a run finishing or starting in a minute is written within seconds of it, so
    once settled a minute's bucket does not change, and the overview reads from the database only
    the minutes since the last settled one. At a thousand runs a second the last hour is 3.6
    million rows; a page reads about a minute of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[int, dict[str, Any] | None] = {}  # minute (epoch ms) -> bucket

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()

    def known(self, keys: list[int]) -> dict[int, dict[str, Any] | None]:
        with self._lock:
            for key in [k for k in self._buckets if k < keys[0]]:
                del self._buckets[key]  # out of the window
            return {k: copy.deepcopy(self._buckets[k]) for k in keys if k in self._buckets}

    def settle(self, buckets: dict[int, dict[str, Any] | None]) -> None:
        with self._lock:
            self._buckets.update(copy.deepcopy(buckets))


SETTLED_AFTER_S = 15.0
settled_minutes = SettledMinutes()


def _empty_bucket(key: int) -> dict[str, Any]:
    return {
        "t": key,
        "outcomes": {},
        "dur_sum": 0.0,
        "dur_n": 0,
        "dur_max": 0.0,
        "lag_sum": 0.0,
        "lag_n": 0,
        "lag_max": 0.0,
    }


def _read_minutes(since: datetime) -> dict[int, dict[str, Any]]:
    """Buckets of every minute from ``since`` on, read from the runs (minutes with none absent)."""
    buckets: dict[int, dict[str, Any]] = {}

    def bucket(minute: datetime) -> dict[str, Any]:
        key = _epoch_ms(minute)
        return buckets.setdefault(key, _empty_bucket(key))

    finished = (
        JobExecution.objects.filter(finished_at__gte=since, status__in=OUTCOME_STATUSES)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute", "status")
        .annotate(
            n=Count("id"),
            dur_sum=Sum("duration_ms"),
            dur_n=Count("duration_ms"),
            dur_max=Max("duration_ms"),
        )
        .order_by()
    )
    for row in finished:
        entry = bucket(row["minute"])
        entry["outcomes"][row["status"]] = entry["outcomes"].get(row["status"], 0) + row["n"]
        entry["dur_sum"] += _ms(row["dur_sum"])
        entry["dur_n"] += row["dur_n"]
        entry["dur_max"] = max(entry["dur_max"], _ms(row["dur_max"]))

    lag = ExpressionWrapper(F("started_at") - F("run_after"), output_field=DurationField())
    started = (
        # Rows are found through indexed columns (finished_at, status) rather than started_at.
        JobExecution.objects.filter(Q(finished_at__gte=since) | Q(status=S.RUNNING))
        .filter(started_at__gte=since)
        .annotate(minute=TruncMinute("started_at"))
        .values("minute")
        .annotate(lag_sum=Sum(lag), lag_n=Count("id"), lag_max=Max(lag))
        .order_by()
    )
    for row in started:
        entry = bucket(row["minute"])
        entry["lag_sum"] += _ms(row["lag_sum"])
        entry["lag_n"] += row["lag_n"]
        entry["lag_max"] = max(entry["lag_max"], _ms(row["lag_max"]))
    return buckets


def execution_minutes(*, now: datetime) -> dict[str, Any]:
    """Per-minute buckets of the last hour: outcomes and duration by finish minute, due-to-start lag
    by start minute. Sums and counts (not averages) so the page can add live executions to them.
    Minutes already settled come from ``settled_minutes``; the rest are read."""
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_WINDOW_MINUTES - 1)
    keys = [_epoch_ms(first + timedelta(minutes=k)) for k in range(CHART_WINDOW_MINUTES)]
    known = settled_minutes.known(keys)
    unknown = [key for key in keys if key not in known]
    read: dict[int, dict[str, Any]] = {}
    if unknown:
        read = _read_minutes(datetime.fromtimestamp(unknown[0] / 1000, tz=UTC))
        settled_until = _epoch_ms(now) - (60 + SETTLED_AFTER_S) * 1000
        settled_minutes.settle({key: read.get(key) for key in unknown if key <= settled_until})
    buckets = [
        bucket
        for key in keys
        if (bucket := known[key] if key in known else read.get(key)) is not None
    ]
    return {
        "first": _epoch_ms(first),
        "window_minutes": CHART_WINDOW_MINUTES,
        "buckets": buckets,
    }


def cluster_payload() -> dict[str, Any]:
    """The live ``cluster`` message itself, so the page renders first what the socket sends next."""
    return live.cluster_payload()


def liveness_thresholds() -> dict[str, float]:
    """Heartbeat ages (seconds) at which the page marks a node late, then presumed dead, for a
    node that has not recorded its own timing: this installation's settings (SCHEDULER)."""
    knobs = conf.knobs()
    return {"late_s": knobs["HEARTBEAT_S"] * 2, "dead_s": knobs["DEAD_AFTER_S"]}


def dashboard_stats(*, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    return {
        "as_of": now.isoformat(),
        "counts": dashboard_counts(now=now),
        "minutes": execution_minutes(now=now),
        "cluster": cluster_payload(),
    }


def with_last_outcome(jobs: QuerySet[Job]) -> QuerySet[Job]:
    latest_finished = JobExecution.objects.filter(
        job=OuterRef("pk"), status__in=TERMINAL_STATES
    ).order_by(*RECENT_FIRST)
    # Each a subquery on one job's index range (its newest finished run, its running ones), not
    # a count over a join of all its runs: the page costs the same however long the history.
    running = (
        JobExecution.objects.filter(job=OuterRef("pk"), status=S.RUNNING)
        .order_by()
        .values("job")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return jobs.annotate(
        last_outcome=Subquery(latest_finished.values("status")[:1]),
        last_execution_id=Subquery(latest_finished.values("id")[:1]),
        running=Coalesce(Subquery(running), 0),
    )


def job_stats(job: Job) -> dict[str, Any]:
    finished = list(
        job.executions.filter(status__in=TERMINAL_STATES)
        .order_by(*RECENT_FIRST)
        .values("id", "status", "duration_ms", "finished_at")[:JOB_STATS_EXECUTIONS]
    )
    judged = [e for e in finished if e["status"] in (S.SUCCEEDED, *FAILED_STATUSES)]
    succeeded = sum(1 for e in judged if e["status"] == S.SUCCEEDED)
    durations = sorted(e["duration_ms"] for e in finished if e["duration_ms"] is not None)
    chart = [
        {
            "id": e["id"],
            "status": e["status"],
            "duration_ms": e["duration_ms"],
            "finished_at": e["finished_at"].isoformat() if e["finished_at"] else None,
        }
        for e in reversed(finished[:JOB_DURATION_CHART_POINTS])
        if e["duration_ms"] is not None
    ]
    return {
        "judged": len(judged),
        "succeeded": succeeded,
        "success_rate": round(100 * succeeded / len(judged), 1) if judged else None,
        "avg_ms": sum(durations) / len(durations) if durations else None,
        "p95_ms": durations[min(len(durations) - 1, int(len(durations) * 0.95))]
        if durations
        else None,
        "chart": chart,
        # The page recomputes the rate and the chart from these as runs finish.
        "recent": [
            {"id": e["id"], "status": e["status"], "duration_ms": e["duration_ms"]}
            for e in finished
        ],
    }
