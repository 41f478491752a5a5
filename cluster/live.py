"""The dashboard's live feed: one poller per web process turns database changes into messages.

The database is the source of truth (docs/live-protocol.md): executions are written by node processes,
often on other machines, so in-process signals cannot see them. While at least one dashboard is
connected to this process, a single asyncio task polls the database every ``SCHEDULER_LIVE_POLL_S``
and fans what changed out to a channel-layer group local to this process; ``DashboardConsumer``
forwards the frames to the browsers. Each web process polls for its own clients only, so this works
the same with the in-memory layer and with channels-redis behind a load balancer.

The database work runs in one dedicated thread (one connection, not one per pool thread) and keeps
its state there (``LiveState``); the event loop keeps the registry of connected clients
(``LivePoller``). Frames are JSON-encoded once per poll, not once per client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections, connections
from django.db.models import Model, QuerySet
from django.utils import timezone
from rest_framework import serializers

from cluster.api import NodeSerializer, TermSerializer
from cluster.models import LeadershipTerm, SchedulerNode
from cluster.selectors import current_term
from jobs.api.serializers import ExecutionSerializer, JobSerializer
from jobs.models import AuditEvent, Job, JobExecution
from jobs.roles import ROLES, user_role
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

# WebSocket close codes of the protocol.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403

BATCH_SIZE = 500  # rows per `executions` / `jobs` message (the protocol's bound), and per query
# Rows may commit after a newer row was already seen (a slow transaction, a writer whose clock lags):
# every SWEEP_INTERVAL_S the poller re-reads the (id, updated_at) pairs of the last lookback window,
# at most SWEEP_LIMIT of them, and sends any it has not sent yet.
SWEEP_INTERVAL_S = 0.2
SWEEP_LIMIT = 2000
# A dashboard that just connected gets what changed in the last CATCHUP_S, which covers the moment
# between rendering its page and opening the socket.
CATCHUP_S = 3.0
NODES_LIMIT = 200  # the most recently seen nodes; dead nodes of old deployments fall off
TERMS_LIMIT = 20
LATE_AFTER_S = 5.0  # a pending execution this far past its run_after is "late"
COUNTS_IDLE_S = 1.0  # recount this often even when no execution changed (see LiveState.poll)
FAILED_WINDOW = timedelta(hours=1)
FAILED_STATES = (ExecutionStatus.FAILED, ExecutionStatus.TIMED_OUT, ExecutionStatus.LOST)
# Counts and jobs are not backed by a covering index: a probe that got slow (a big table) is spaced
# out so that it takes at most 1/PROBE_DUTY of the time.
PROBE_DUTY = 10
MAX_SUBSCRIPTIONS = 20  # per connection; a new one beyond this drops the oldest
# Channel layers forget group members after a day (and the in-memory one drops a channel whose
# message expired): the poller adds its clients again this often.
GROUP_REFRESH_S = 60.0
ERROR_BACKOFF_S = 0.5
MAX_ERROR_BACKOFF_S = 10.0
CONNECTION_RECYCLE_S = 10.0  # the poller's connection is closed this often (close_old_connections)
STOP_WAIT_S = 2.0  # how long stopping waits for the database thread to finish its current poll
JOB_DELETE_ACTION = "job.delete"
SESSION_DB_ENGINES = {
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
}
OUTPUT_FIELDS = ("result", "error", "traceback", "output")
_GROUP_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass(frozen=True)
class LiveConfig:
    poll_s: float
    recheck_s: float
    lookback_s: float

    @classmethod
    def from_settings(cls) -> LiveConfig:
        config = cls(
            poll_s=float(getattr(settings, "SCHEDULER_LIVE_POLL_S", 0.05)),
            recheck_s=float(getattr(settings, "SCHEDULER_LIVE_RECHECK_S", 2.0)),
            lookback_s=float(getattr(settings, "SCHEDULER_LIVE_LOOKBACK_S", 5.0)),
        )
        if min(config.poll_s, config.recheck_s) <= 0 or config.lookback_s < 0:
            raise ValueError(f"invalid live dashboard timing: {config}")
        return config


_group: tuple[int, str] | None = None


def group_name() -> str:
    """The channel-layer group of this web process's dashboards (valid channels group name).

    The random part keeps two processes apart that share host name and pid (containers)."""
    global _group
    pid = os.getpid()
    if _group is None or _group[0] != pid:
        host = _GROUP_NAME_CHARS.sub("_", socket.gethostname())[:60]
        _group = (pid, f"dashboard-{host}-{pid}-{secrets.token_hex(3)}")
    return _group[1]


def frame(kind: str, data: Any) -> str:
    """One server message, JSON-encoded: ``{"type", "data", "ts"}``."""
    return json.dumps(
        {"type": kind, "data": data, "ts": round(time.time(), 3)},
        cls=DjangoJSONEncoder,
        separators=(",", ":"),
    )


# --- payloads (reads) -----------------------------------------------------------------------------


class LiveExecutionSerializer(ExecutionSerializer):
    """The API's execution fields minus the bulky result, error, traceback and output."""

    class Meta(ExecutionSerializer.Meta):
        fields = [f for f in ExecutionSerializer.Meta.fields if f not in OUTPUT_FIELDS]
        read_only_fields = fields


class LiveJobSerializer(JobSerializer):
    created_by = None
    updated_by = None

    class Meta(JobSerializer.Meta):
        # updated_at beyond the protocol's list: lets a client drop a frame older than what it shows.
        fields = [
            "id",
            "name",
            "task",
            "schedule_type",
            "enabled",
            "next_fire_at",
            "last_fire_at",
            "version",
            "schedule_description",
            "updated_at",
        ]
        read_only_fields = fields


def cluster_payload() -> dict[str, Any]:
    nodes = sorted(
        SchedulerNode.objects.order_by("-last_heartbeat")[:NODES_LIMIT], key=lambda n: n.node_id
    )
    terms = list(LeadershipTerm.objects.order_by("-term")[:TERMS_LIMIT])
    # The current term is the newest open one (cluster.selectors.current_term); it is almost always
    # among the newest few, which saves a query per poll.
    term = next((t for t in terms if t.ended_at is None), None)
    if term is None and len(terms) == TERMS_LIMIT:
        term = current_term()
    return {
        "leader": term.node_id if term else None,
        "term": term.term if term else None,
        "leader_since": serializers.DateTimeField().to_representation(term.acquired_at)
        if term
        else None,
        "nodes": NodeSerializer(nodes, many=True).data,
        "terms": TermSerializer(terms, many=True).data,
    }


def counts_payload(*, now: datetime) -> dict[str, int]:
    """Four indexed counts (not one aggregate, which would scan the table)."""
    executions = JobExecution.objects
    pending = executions.filter(status=ExecutionStatus.PENDING)
    return {
        "running": executions.filter(status=ExecutionStatus.RUNNING).count(),
        "queued": pending.count(),
        "late": pending.filter(run_after__lt=now - timedelta(seconds=LATE_AFTER_S)).count(),
        "failed_last_hour": executions.filter(
            status__in=FAILED_STATES, finished_at__gte=now - FAILED_WINDOW
        ).count(),
    }


def snapshot_frames() -> list[str]:
    """What a dashboard gets right after ``hello``: the cluster and the counts."""
    return [
        frame("cluster", cluster_payload()),
        frame("counts", counts_payload(now=timezone.now())),
    ]


def dashboard_access(user: Any, session: Any) -> tuple[int | None, str | None]:
    """(close code, None) for a connection to refuse, else (None, role)."""
    if user is None or not user.is_authenticated:
        # Django resolves an inactive user's session to AnonymousUser: tell that case apart, since
        # logging in again will not help (4403, not 4401).
        try:
            user_id = session.get(SESSION_KEY) if session is not None else None
            if user_id is not None and (
                get_user_model()._default_manager.filter(pk=user_id, is_active=False).exists()
            ):
                return CLOSE_FORBIDDEN, None
        except (ValueError, TypeError):
            pass
        return CLOSE_UNAUTHENTICATED, None
    role = user_role(user)
    if role is None:
        return CLOSE_FORBIDDEN, None
    return None, role


def _chunks(items: list[Any], size: int = BATCH_SIZE) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# --- change feeds (sync, in the poller's database thread) -----------------------------------------


class ChangeFeed:
    """Rows of one table changed since the last poll, by a timestamp column.

    Each poll first reads only (id, stamp) pairs, which the stamp's index answers; full rows are
    fetched only for pairs not sent yet, so an idle poll is one small query. The forward read pages
    by the key (stamp, id), so more rows with one stamp than fit a page cannot stall it. A row may
    commit after a newer one was read (its transaction was slow, or its writer's clock lags):
    ``sweep`` re-reads the pairs of the last ``lookback`` before the cursor; ``seen`` holds the pairs
    already sent in that window.
    """

    def __init__(
        self,
        changes: Callable[[], QuerySet],
        *,
        rows: Callable[[], QuerySet] | None = None,
        stamp: str,
        lookback: timedelta,
        batch: int = BATCH_SIZE,
        sweep_limit: int = SWEEP_LIMIT,
    ) -> None:
        self._changes = changes  # filtered to the rows of interest; read for (id, stamp) only
        self._rows = rows or changes  # the rows sent (select_related, only the fields needed)
        self.stamp = stamp
        self.lookback = lookback
        self.batch = batch
        self.sweep_limit = sweep_limit
        self.cursor: tuple[datetime, int] | None = None
        self.seen: set[tuple[int, datetime]] = set()

    def _window(self, low: datetime, high: datetime) -> QuerySet:
        return (
            self._changes()
            .filter(**{f"{self.stamp}__gte": low, f"{self.stamp}__lte": high})
            .order_by(f"-{self.stamp}")
            .values_list("pk", self.stamp)[: self.sweep_limit]
        )

    def seed(self, *, now: datetime) -> None:
        """Start at ``now``: rows already in the lookback window count as sent."""
        self.cursor = (now, 0)
        self.seen = set(self._window(now - self.lookback, now))

    def poll(self, *, sweep: bool) -> tuple[list[Model], bool]:
        """Rows changed since the last poll, oldest first; and whether more are waiting."""
        assert self.cursor is not None, "seed() first"
        stamp_at, pk = self.cursor
        forward = list(
            self._changes()
            .filter(**{f"{self.stamp}__gte": stamp_at})
            .exclude(**{self.stamp: stamp_at, "pk__lte": pk})
            .order_by(self.stamp, "pk")
            .values_list("pk", self.stamp)[: self.batch]
        )
        if forward:
            self.cursor = (forward[-1][1], forward[-1][0])
        wanted = {pk for pk, at in forward if (pk, at) not in self.seen}
        if sweep:
            wanted.update(
                pk
                for pk, at in self._window(self.cursor[0] - self.lookback, self.cursor[0])
                if (pk, at) not in self.seen
            )
        rows = self._fetch(wanted)
        # The row may have changed again since its pair was read: what is sent is what was fetched.
        self.seen.update((row.pk, getattr(row, self.stamp)) for row in rows)
        if sweep:
            self._prune()
        rows.sort(key=lambda row: (getattr(row, self.stamp), row.pk))
        return rows, len(forward) == self.batch

    def recent(self, *, since: datetime) -> list[Model]:
        """The newest rows (at most one batch) changed since ``since``, oldest first."""
        pairs = (
            self._changes()
            .filter(**{f"{self.stamp}__gte": since})
            .order_by(f"-{self.stamp}", "-pk")
            .values_list("pk", flat=True)[: self.batch]
        )
        rows = self._fetch(set(pairs))
        return sorted(rows, key=lambda row: (getattr(row, self.stamp), row.pk))

    def _fetch(self, pks: set[int]) -> list[Model]:
        ordered = sorted(pks)
        rows: list[Model] = []
        for chunk in _chunks(ordered):  # bounded IN lists
            rows.extend(self._rows().filter(pk__in=chunk).order_by())
        return rows

    def _prune(self) -> None:
        assert self.cursor is not None
        low = self.cursor[0] - self.lookback
        self.seen = {pair for pair in self.seen if pair[1] >= low}


class _Throttle:
    """Due every ``min_s``; a probe that took long is spaced out to 1/PROBE_DUTY of the time."""

    def __init__(self, min_s: float, idle_s: float = 0.0) -> None:
        self.min_s = min_s
        self.idle_s = idle_s
        self.next_at = 0.0
        self.last_at = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def idle_due(self, now: float) -> bool:
        return now >= self.last_at + self.idle_s

    def ran(self, started: float) -> None:
        elapsed = time.monotonic() - started
        self.last_at = started
        self.next_at = started + max(self.min_s, elapsed * PROBE_DUTY)


@dataclass
class PollRequest:
    """A snapshot of the event loop's registry, handed to the database thread."""

    catchup: list[str] = field(default_factory=list)
    # execution id -> {channel: updated_at last sent to it (None: nothing yet)}
    subscriptions: dict[int, dict[str, datetime | None]] = field(default_factory=dict)
    # channel -> (user id, session key); None when no re-check is due
    recheck: dict[str, tuple[Any, str | None]] | None = None


@dataclass
class PollResult:
    group_frames: list[str] = field(default_factory=list)
    direct: dict[str, list[str]] = field(default_factory=dict)
    # (channel, execution id, its updated_at, the execution_output frame): sent only if the
    # channel is still subscribed when the poll's frames go out.
    outputs_sent: list[tuple[str, int, datetime, str]] = field(default_factory=list)
    revoke: dict[str, int] = field(default_factory=dict)
    more: bool = False


def _execution_rows() -> QuerySet:
    # Never load output, traceback or result here: up to 64 KB each, and not part of the message.
    fields = [f for f in LiveExecutionSerializer.Meta.fields if f not in {"job_name", "lag_ms"}]
    return JobExecution.objects.select_related("job", "triggered_by").only(
        *fields, "job__name", "triggered_by__username"
    )


def _job_rows() -> QuerySet:
    return Job.objects.defer("description", "args", "kwargs")


def _deletions() -> QuerySet:
    return AuditEvent.objects.filter(action=JOB_DELETE_ACTION)


def _deletion_rows() -> QuerySet:
    return AuditEvent.objects.only("id", "object_id", "created_at")


def _deleted_ids(events: Iterable[AuditEvent]) -> list[int]:
    return [int(e.object_id) for e in events if e.object_id.isdigit()]


class LiveState:
    """What the poller has sent so far, and the reads of one poll. Used from one thread only."""

    def __init__(self, config: LiveConfig) -> None:
        lookback = timedelta(seconds=config.lookback_s)
        self.config = config
        self.executions = ChangeFeed(
            JobExecution.objects.all, rows=_execution_rows, stamp="updated_at", lookback=lookback
        )
        self.jobs = ChangeFeed(
            Job.objects.all, rows=_job_rows, stamp="updated_at", lookback=lookback
        )
        self.deletions = ChangeFeed(
            _deletions, rows=_deletion_rows, stamp="created_at", lookback=lookback
        )
        self._cluster_fingerprint: str | None = None
        self._counts: dict[str, int] | None = None
        self._counts_stale = True
        self._sweep = _Throttle(SWEEP_INTERVAL_S)
        self._jobs_probe = _Throttle(config.poll_s)
        self._counts_probe = _Throttle(config.poll_s, idle_s=COUNTS_IDLE_S)
        self.started = False

    def start(self) -> None:
        now = timezone.now()
        for feed in (self.executions, self.jobs, self.deletions):
            feed.seed(now=now)
        # The cluster and the counts are not seeded: the first poll sends them, since they may have
        # changed after the first dashboard read its own snapshot.
        self.started = True

    @staticmethod
    def _fingerprint(payload: dict[str, Any]) -> str:
        return json.dumps(payload, cls=DjangoJSONEncoder, sort_keys=True)

    def poll(self, request: PollRequest) -> PollResult:
        if not self.started:
            self.start()
        result = PollResult()
        now = timezone.now()
        started = time.monotonic()
        if request.catchup:
            # Read before this poll's feeds, so a client never gets it after a newer frame.
            catchup = self._catchup(now=now)
            for channel in request.catchup:
                result.direct.setdefault(channel, []).extend(catchup)

        sweep = self._sweep.due(started)
        if sweep:
            self._sweep.ran(started)
        executions, more = self.executions.poll(sweep=sweep)
        result.more |= more
        for rows in _chunks(executions):
            result.group_frames.append(
                frame("executions", LiveExecutionSerializer(rows, many=True).data)
            )

        # Jobs before deletions: a job deleted in between is then listed first and removed after.
        if self._jobs_probe.due(started):
            probe_started = time.monotonic()
            jobs, more = self.jobs.poll(sweep=sweep)
            self._jobs_probe.ran(probe_started)
            result.more |= more
            for rows in _chunks(jobs):
                result.group_frames.append(frame("jobs", LiveJobSerializer(rows, many=True).data))
        deletions, more = self.deletions.poll(sweep=sweep)
        result.more |= more
        if deleted := _deleted_ids(deletions):
            result.group_frames.append(frame("jobs_deleted", deleted))

        cluster = cluster_payload()
        fingerprint = self._fingerprint(cluster)
        if fingerprint != self._cluster_fingerprint:
            self._cluster_fingerprint = fingerprint
            result.group_frames.append(frame("cluster", cluster))

        # Counts move when executions change, or with the clock alone (a pending row becomes late,
        # a failure leaves the last hour): recount on a change, else every COUNTS_IDLE_S.
        self._counts_stale |= bool(executions)
        stale = self._counts_stale or self._counts_probe.idle_due(started)
        if stale and self._counts_probe.due(started):
            self._counts_stale = False
            probe_started = time.monotonic()
            counts = counts_payload(now=now)
            self._counts_probe.ran(probe_started)
            if counts != self._counts:
                self._counts = counts
                result.group_frames.append(frame("counts", counts))

        if request.subscriptions:
            self._outputs(request.subscriptions, result)
        if request.recheck:
            result.revoke = self._recheck(request.recheck, now=now)
        return result

    def _catchup(self, *, now: datetime) -> list[str]:
        since = now - timedelta(seconds=CATCHUP_S)
        frames = []
        if executions := self.executions.recent(since=since):
            frames.append(frame("executions", LiveExecutionSerializer(executions, many=True).data))
        if jobs := self.jobs.recent(since=since):
            frames.append(frame("jobs", LiveJobSerializer(jobs, many=True).data))
        if deleted := _deleted_ids(self.deletions.recent(since=since)):
            frames.append(frame("jobs_deleted", deleted))
        return frames

    def _outputs(
        self, subscriptions: dict[int, dict[str, datetime | None]], result: PollResult
    ) -> None:
        stamps = dict(
            JobExecution.objects.filter(pk__in=list(subscriptions)).values_list("pk", "updated_at")
        )
        wanted = {
            pk
            for pk, sent in subscriptions.items()
            if pk in stamps and any(at != stamps[pk] for at in sent.values())
        }
        if not wanted:
            return
        rows = JobExecution.objects.filter(pk__in=wanted).values(
            "id", "status", "output", "error", "traceback", "updated_at"
        )
        for row in rows:
            updated_at = row.pop("updated_at")
            text = frame("execution_output", row)
            for channel, sent in subscriptions[row["id"]].items():
                if sent != updated_at:
                    result.outputs_sent.append((channel, row["id"], updated_at, text))

    def _recheck(
        self, clients: dict[str, tuple[Any, str | None]], *, now: datetime
    ) -> dict[str, int]:
        """Close codes for clients whose session ended (4401) or whose user lost access (4403)."""
        user_model = get_user_model()
        user_ids = {user_id for user_id, _ in clients.values()}
        active = dict(
            user_model._default_manager.filter(pk__in=user_ids, is_active=True).values_list(
                "pk", "is_superuser"
            )
        )
        with_role = set(
            user_model.groups.through.objects.filter(
                user_id__in=user_ids, group__name__in=ROLES
            ).values_list("user_id", flat=True)
        )
        allowed = {pk for pk, superuser in active.items() if superuser or pk in with_role}
        live_sessions = self._live_sessions({key for _, key in clients.values() if key}, now=now)
        revoke = {}
        for channel, (user_id, session_key) in clients.items():
            if session_key not in live_sessions:
                revoke[channel] = CLOSE_UNAUTHENTICATED
            elif user_id not in allowed:
                revoke[channel] = CLOSE_FORBIDDEN
        return revoke

    @staticmethod
    def _live_sessions(keys: set[str], *, now: datetime) -> set[str]:
        if settings.SESSION_ENGINE in SESSION_DB_ENGINES:
            from django.contrib.sessions.models import Session

            return set(
                Session.objects.filter(session_key__in=keys, expire_date__gt=now).values_list(
                    "session_key", flat=True
                )
            )
        store = import_module(settings.SESSION_ENGINE).SessionStore
        return {key for key in keys if store().exists(key)}


# --- the poller (event loop side) -----------------------------------------------------------------


@dataclass
class LiveClient:
    user_id: Any
    session_key: str | None
    needs_catchup: bool = True
    # execution id -> updated_at of the last execution_output sent (None: nothing sent yet)
    subscriptions: dict[int, datetime | None] = field(default_factory=dict)


class LivePoller:
    """The one polling task of this process, and the registry of its connected dashboards."""

    def __init__(self, config: LiveConfig, clients: dict[str, LiveClient] | None = None) -> None:
        self.config = config
        self.group = group_name()
        self.layer = get_channel_layer()
        self.loop = asyncio.get_running_loop()
        self.clients: dict[str, LiveClient] = clients if clients is not None else {}
        self.state = LiveState(config)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-live")
        self._poll = sync_to_async(
            self._poll_in_db_thread, thread_sensitive=False, executor=self._executor
        )
        self._recycle_at = time.monotonic() + CONNECTION_RECYCLE_S
        self._next_recheck = time.monotonic() + config.recheck_s
        self._next_group_refresh = time.monotonic() + GROUP_REFRESH_S
        self.task = self.loop.create_task(self._run(), name="dashboard-live-poller")

    def _poll_in_db_thread(self, request: PollRequest) -> PollResult:
        # Not database_sync_to_async: it closes the connection around every call, and with SQLite
        # (CONN_MAX_AGE=0) reconnecting 20 times a second costs more than the poll itself. The one
        # connection of this thread is closed after an error instead, and recycled regularly.
        try:
            return self.state.poll(request)
        except Exception:
            connections.close_all()
            raise
        finally:
            if time.monotonic() >= self._recycle_at:
                self._recycle_at = time.monotonic() + CONNECTION_RECYCLE_S
                close_old_connections()

    async def _run(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            if not self.clients:  # all revoked, their disconnects (which stop this task) pending
                await asyncio.sleep(self.config.poll_s)
                continue
            try:
                request = self._request(started)
                result = await self._poll(request)
                self._applied(request, result)
                await self._deliver(result)
                if time.monotonic() >= self._next_group_refresh:
                    self._next_group_refresh = time.monotonic() + GROUP_REFRESH_S
                    for channel in list(self.clients):
                        await self.layer.group_add(self.group, channel)
            except Exception:
                failures += 1
                delay = min(ERROR_BACKOFF_S * 2 ** (failures - 1), MAX_ERROR_BACKOFF_S)
                logger.exception(
                    "dashboard live poll failed (%d in a row); retrying in %.1f s", failures, delay
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            if result.more:
                await asyncio.sleep(0)  # behind: read the next page at once
            else:
                await asyncio.sleep(max(0.0, self.config.poll_s - (time.monotonic() - started)))

    def _request(self, now: float) -> PollRequest:
        request = PollRequest(
            catchup=[channel for channel, c in self.clients.items() if c.needs_catchup]
        )
        for channel, client in self.clients.items():
            for execution_id, sent in client.subscriptions.items():
                request.subscriptions.setdefault(execution_id, {})[channel] = sent
        if now >= self._next_recheck and self.clients:
            request.recheck = {ch: (c.user_id, c.session_key) for ch, c in self.clients.items()}
        return request

    def _applied(self, request: PollRequest, result: PollResult) -> None:
        """Record what the poll sent (only after it succeeded: a failed one is retried in full)."""
        for channel in request.catchup:
            if channel in self.clients:
                self.clients[channel].needs_catchup = False
        for channel, execution_id, updated_at, _text in result.outputs_sent:
            client = self.clients.get(channel)
            if client is not None and execution_id in client.subscriptions:
                client.subscriptions[execution_id] = updated_at
        if request.recheck is not None:
            self._next_recheck = time.monotonic() + self.config.recheck_s
        for channel in result.revoke:
            self.clients.pop(channel, None)

    async def _deliver(self, result: PollResult) -> None:
        # Direct frames (catch-up, output) were read first: they go out before the group's. An
        # output frame goes only to a dashboard still subscribed: one that unsubscribed while the
        # poll was reading must get nothing more of that execution.
        direct = {channel: list(frames) for channel, frames in result.direct.items()}
        for channel, execution_id, _updated_at, text in result.outputs_sent:
            client = self.clients.get(channel)
            if client is not None and execution_id in client.subscriptions:
                direct.setdefault(channel, []).append(text)
        for channel, frames in direct.items():
            await self._send(channel, {"type": "live.frames", "frames": frames})
        if result.group_frames:
            await self.layer.group_send(
                self.group, {"type": "live.frames", "frames": result.group_frames}
            )
        for channel, code in result.revoke.items():
            await self._send(channel, {"type": "live.revoke", "code": code})

    async def _send(self, channel: str, message: dict[str, Any]) -> None:
        try:
            await self.layer.send(channel, message)
        except ChannelFull:
            logger.warning("dashboard channel %s is full; dropped a live message", channel)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.wait({self.task}, timeout=STOP_WAIT_S)
        # Close this thread's connection, then let the thread end (after any poll in flight).
        self._executor.submit(connections.close_all)
        waiting = self.loop.run_in_executor(None, partial(self._executor.shutdown, wait=True))
        await asyncio.wait({waiting}, timeout=STOP_WAIT_S)

    def abandon(self) -> None:
        """Forget a poller whose event loop is gone (tests run one loop each)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.task.cancel)
        self._executor.submit(connections.close_all)
        self._executor.shutdown(wait=False)


_poller: LivePoller | None = None


def _current_poller(*, create: bool) -> LivePoller | None:
    global _poller
    loop = asyncio.get_running_loop()
    clients = None
    if _poller is not None and (_poller.loop is not loop or _poller.task.done()):
        if _poller.loop is loop:
            clients = _poller.clients  # the task died (it should not): keep its clients
        _poller.abandon()
        _poller = None
    if _poller is None and create:
        _poller = LivePoller(LiveConfig.from_settings(), clients)
    return _poller


async def register(channel_name: str, *, user_id: Any, session_key: str | None) -> None:
    """Add a dashboard (already in ``group_name()``); starts the poller for the first one."""
    poller = _current_poller(create=True)
    assert poller is not None
    poller.clients[channel_name] = LiveClient(user_id=user_id, session_key=session_key)


async def unregister(channel_name: str) -> None:
    """Remove a dashboard; stops the poller when it was the last one."""
    global _poller
    poller = _current_poller(create=False)
    if poller is None:
        return
    poller.clients.pop(channel_name, None)
    if not poller.clients:
        _poller = None
        await poller.stop()


async def shutdown() -> None:
    """Stop the poller whatever its clients (process shutdown, tests)."""
    global _poller
    poller = _current_poller(create=False)
    _poller = None
    if poller is not None:
        await poller.stop()


def subscribe(channel_name: str, execution_id: int) -> None:
    """Stream ``execution_output`` of one execution to one dashboard (from the next poll)."""
    poller = _current_poller(create=False)
    client = poller.clients.get(channel_name) if poller else None
    if client is None:
        return
    client.subscriptions.pop(execution_id, None)
    client.subscriptions[execution_id] = None  # (re)subscribing sends the current state again
    while len(client.subscriptions) > MAX_SUBSCRIPTIONS:
        del client.subscriptions[next(iter(client.subscriptions))]


def unsubscribe(channel_name: str, execution_id: int) -> None:
    poller = _current_poller(create=False)
    client = poller.clients.get(channel_name) if poller else None
    if client is not None:
        client.subscriptions.pop(execution_id, None)


def is_running() -> bool:
    poller = _poller
    return poller is not None and not poller.task.done()
