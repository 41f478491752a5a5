"""One poll of the database, in the poller's database thread: what changed since the last one,
as frames for the group, the catch-up of new dashboards, subscribed outputs and revocations."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.utils import timezone

from dashboard.live.access import revocations
from dashboard.live.feed import ChangeFeed, Throttle, chunks
from dashboard.live.payloads import (
    LiveExecutionSerializer,
    LiveJobSerializer,
    cluster_payload,
    counts_payload,
)
from dashboard.live.protocol import LiveConfig, OutputSent, frame
from jobs.models import AuditEvent, Job, JobExecution

# Rows may commit after a newer row was already seen (a slow transaction, a writer whose clock lags):
# every SWEEP_INTERVAL_S the poller re-reads the (id, updated_at) pairs of the last lookback window,
# at most SWEEP_LIMIT of them, and sends any it has not sent yet.
SWEEP_INTERVAL_S = 0.2
# A dashboard that just connected gets what changed in the last CATCHUP_S, which covers the moment
# between rendering its page and opening the socket.
CATCHUP_S = 3.0
COUNTS_IDLE_S = 1.0  # recount this often even when no execution changed (see LiveState.poll)
JOB_DELETE_ACTION = "job.delete"


@dataclass
class PollRequest:
    """A snapshot of the event loop's registry, handed to the database thread."""

    catchup: list[str] = field(default_factory=list)
    # execution id -> {channel: what it was last sent (None: nothing yet)}
    subscriptions: dict[int, dict[str, OutputSent]] = field(default_factory=dict)
    # channel -> (user id, session key); None when no re-check is due
    recheck: dict[str, tuple[Any, str | None]] | None = None


@dataclass
class PollResult:
    broadcast: list[str] = field(default_factory=list)
    direct: dict[str, list[str]] = field(default_factory=dict)
    # (channel, execution id, its updated_at, the execution_output frame): sent only if the
    # channel is still subscribed when the poll's frames go out.
    outputs_sent: list[tuple[str, int, OutputSent, str]] = field(default_factory=list)
    revoke: dict[str, int] = field(default_factory=dict)
    more: bool = False


def _execution_rows() -> QuerySet:
    # Never load output, traceback or result here: up to 64 KB each, and not part of the message.
    fields = [
        f for f in LiveExecutionSerializer.Meta.fields if f not in {"job_name", "lag_ms", "waiting"}
    ]
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
        self._outputs_read: dict[int, str] = {}  # subscribed execution -> its output last read
        self._sweep = Throttle(SWEEP_INTERVAL_S)
        self._jobs_probe = Throttle(config.poll_s)
        self._counts_probe = Throttle(config.poll_s, idle_s=COUNTS_IDLE_S)
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
        for rows in chunks(executions):
            result.broadcast.append(
                frame("executions", LiveExecutionSerializer(rows, many=True).data)
            )

        # Jobs before deletions: a job deleted in between is then listed first and removed after.
        if self._jobs_probe.due(started):
            probe_started = time.monotonic()
            jobs, more = self.jobs.poll(sweep=sweep)
            self._jobs_probe.ran(probe_started)
            result.more |= more
            for rows in chunks(jobs):
                result.broadcast.append(frame("jobs", LiveJobSerializer(rows, many=True).data))
        deletions, more = self.deletions.poll(sweep=sweep)
        result.more |= more
        if deleted := _deleted_ids(deletions):
            result.broadcast.append(frame("jobs_deleted", deleted))

        cluster = cluster_payload()
        fingerprint = self._fingerprint(cluster)
        if fingerprint != self._cluster_fingerprint:
            self._cluster_fingerprint = fingerprint
            result.broadcast.append(frame("cluster", cluster))

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
                result.broadcast.append(frame("counts", counts))

        if request.subscriptions:
            self._outputs(request.subscriptions, result)
        if request.recheck:
            result.revoke = revocations(request.recheck, now=now)
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

    def _outputs(self, subscriptions: dict[int, dict[str, OutputSent]], result: PollResult) -> None:
        """``execution_output`` for each subscribed execution that changed since its channel's last
        one: the output as an append (``output_from``: the length, in characters, the channel
        already has) while it only grew, else whole (``output_from`` 0)."""
        for pk in set(self._outputs_read) - set(subscriptions):
            del self._outputs_read[pk]
        stamps = dict(
            JobExecution.objects.filter(pk__in=list(subscriptions)).values_list("pk", "updated_at")
        )
        wanted = {
            pk
            for pk, sent in subscriptions.items()
            if pk in stamps and any(at is None or at[0] != stamps[pk] for at in sent.values())
        }
        if not wanted:
            return
        rows = JobExecution.objects.filter(pk__in=wanted).values(
            "id", "status", "output", "error", "traceback", "updated_at"
        )
        for row in rows:
            pk, updated_at, output = row["id"], row.pop("updated_at"), row.pop("output") or ""
            previous = self._outputs_read.get(pk)
            grew = previous is not None and output.startswith(previous)
            self._outputs_read[pk] = output
            marker = (updated_at, len(output))
            texts: dict[int, str] = {}
            for channel, sent in subscriptions[pk].items():
                if sent is not None and sent[0] == updated_at:
                    continue
                # A channel's length is that of a text this state read (all of them prefixes
                # of ``previous`` while the output only grows); any doubt sends it whole.
                start = sent[1] if sent is not None and grew and sent[1] <= len(previous) else 0
                if start not in texts:
                    texts[start] = frame(
                        "execution_output", {**row, "output_from": start, "output": output[start:]}
                    )
                result.outputs_sent.append((channel, pk, marker, texts[start]))
