"""Whether the schedule keeps up, said out loud: the leader measures how far behind the cluster
is, about once a second, and says so once when it falls behind and once when it catches up.

Two lags, each read through an index and bounded (their cost depends on neither the number of
jobs nor the backlog):

- *fires*: how long past its due instant the earliest fire the leader has not yet written is
  (``Job.next_fire_at`` of the earliest enabled job); a leader that keeps up writes each fire
  ahead of it, so this stays at 0. With several scheduling partitions the reason names that
  job's partition and the node leading it;
- *claims*: how long the oldest run due and pending has waited unclaimed, and how many have
  waited past the threshold (the read looks at no more than ``SAMPLE_LIMIT`` unclaimed runs).

Past ``threshold_s`` (the node knob ``BEHIND_WARN_S``) the leader logs one WARNING saying how far
behind and why (the leader's tick, the claims, the database path, a queue no live node serves),
sets ``scheduler_node_behind_seconds``, puts the figures in its presence (the dashboard's
overview shows them) and its readiness text. When both lags are back under half the threshold it
logs one INFO with how long it was behind and the worst lag seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cluster import node_metrics
from cluster.clock import Clock
from cluster.models import LeadershipTerm, NodeStatus
from cluster.scheduler import earliest_fire_and_partition, earliest_next_fire
from jobs import partitioning
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
SAMPLE_LIMIT = 1_000
# A database round trip this slow (seconds) is named among the reasons.
SLOW_ROUND_TRIP_S = 0.02


@dataclass(frozen=True)
class Lag:
    fires_s: float = 0.0
    claims_s: float = 0.0
    waiting: int = 0  # due runs unclaimed past the threshold (at most SAMPLE_LIMIT)
    queue: str = ""  # the queue of the oldest of them
    # With several scheduling partitions: the partition of the most overdue fire, and its leader
    # ("" when nobody leads it).
    partition: int | None = None
    partition_leader: str = ""

    @property
    def worst_s(self) -> float:
        return max(self.fires_s, self.claims_s)


def measure(*, now: datetime, threshold_s: float) -> Lag:
    """The cluster's lags at ``now`` (two indexed reads on the leader's connection).

    The unclaimed runs are read in the claim index's own order (queue, priority, due instant),
    at most SAMPLE_LIMIT of them, so the read stops there however long the backlog (runs
    enqueued for later included); within each queue and priority the oldest come first, so the
    lag it finds is the true one unless the first SAMPLE_LIMIT belong to one queue and priority,
    and then it is a lower bound."""
    earliest = earliest_fire_and_partition()
    fires_s = max(0.0, (now - earliest[0]).total_seconds()) if earliest is not None else 0.0
    partition: int | None = None
    partition_leader = ""
    if fires_s >= threshold_s and earliest is not None and partitioning.count() > 1:
        partition = earliest[1]
        partition_leader = (
            LeadershipTerm.objects.filter(partition=partition, ended_at__isnull=True)
            .order_by("-term")
            .values_list("node_id", flat=True)
            .first()
            or ""
        )
    behind = {"partition": partition, "partition_leader": partition_leader}
    rows = list(
        JobExecution.objects.filter(status=ExecutionStatus.PENDING, claim_token__isnull=True)
        .order_by("queue", "-priority", "run_after", "id")
        .values_list("run_after", "queue")[:SAMPLE_LIMIT]
    )
    due = [(run_after, queue) for run_after, queue in rows if run_after <= now]
    if not due:
        return Lag(fires_s=fires_s, **behind)
    oldest, queue = min(due)
    cutoff = now - timedelta(seconds=threshold_s)
    return Lag(
        fires_s=fires_s,
        claims_s=(now - oldest).total_seconds(),
        waiting=sum(run_after <= cutoff for run_after, _ in due),
        queue=queue,
        **behind,
    )


def reasons(
    lag: Lag,
    *,
    threshold_s: float,
    round_trip_s: float | None,
    served_queues: Mapping[str, str] | None,
) -> list[str]:
    """Why the cluster is behind, most telling first (pure: the figures are passed in)."""
    why = []
    if lag.fires_s >= threshold_s and lag.partition is not None:
        leader = f"led by {lag.partition_leader}" if lag.partition_leader else "no leader"
        why.append(
            f"partition {lag.partition}'s tick ({leader}): fires written {lag.fires_s:.1f} s "
            "after they were due"
        )
    elif lag.fires_s >= threshold_s:
        why.append(f"the leader's tick: fires written {lag.fires_s:.1f} s after they were due")
    if lag.claims_s >= threshold_s:
        queue = f" in queue {lag.queue!r}" if lag.queue else ""
        waiting = f"{lag.waiting}+" if lag.waiting >= SAMPLE_LIMIT else str(lag.waiting)
        why.append(
            f"claims: {waiting} due runs{queue} waiting unclaimed, the oldest {lag.claims_s:.1f} s"
        )
        if lag.queue and served_queues is not None:
            unserved = _unserved(lag.queue, served_queues)
            if unserved:
                why.append(unserved)
    if round_trip_s is not None and round_trip_s >= SLOW_ROUND_TRIP_S:
        why.append(f"the database: a round trip takes {round_trip_s * 1000:.0f} ms from the leader")
    return why


def _unserved(queue: str, served_queues: Mapping[str, str]) -> str | None:
    """Why no node claims from ``queue``, if that is why (None when an active node serves it).
    ``served_queues`` maps each queue to the liveliest status of the nodes that serve it
    (``selectors.served_queues``)."""
    status = served_queues.get(queue)
    if status == NodeStatus.ACTIVE:
        return None
    if status == NodeStatus.DRAINING:
        return f"every node that serves queue {queue!r} is draining"
    if status == NodeStatus.DEAD:
        # Declared dead, not gone for good: a node starved of CPU, paused or cut off misses its
        # heartbeats and rejoins when it beats again. Not a queue nobody is configured for.
        return (
            f"every node that serves queue {queue!r} is declared dead (missed heartbeats: "
            "stopped, paused, starved of CPU or cut off)"
        )
    return f"no live node serves queue {queue!r}"


class BehindWatch:
    """The leader's judgement of its lags: one WARNING on falling behind, one INFO on catching up,
    the metric, and the state its presence and readiness show (None while it keeps up)."""

    def __init__(
        self,
        *,
        node_id: str,
        clock: Clock,
        threshold_s: float,
        round_trip_s: Callable[[], float | None] = lambda: None,
        served_queues: Callable[[], Mapping[str, str] | None] = lambda: None,
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.threshold_s = threshold_s
        self._round_trip_s = round_trip_s
        self._served_queues = served_queues
        self._checked = float("-inf")
        self._since: float | None = None  # monotonic, while behind
        self._worst_s = 0.0
        self.state: dict[str, Any] | None = None
        self._log_extra = {"node": node_id}

    def due(self) -> bool:
        return self.clock.monotonic() - self._checked >= CHECK_EVERY_S

    def check(self, *, now: datetime) -> Lag:
        """Measure (see ``measure``) and judge; the caller's database errors propagate."""
        self._checked = self.clock.monotonic()
        lag = measure(now=now, threshold_s=self.threshold_s)
        self.judge(lag)
        return lag

    def judge(self, lag: Lag) -> None:
        node_metrics.behind(fires_s=lag.fires_s, claims_s=lag.claims_s, waiting=lag.waiting)
        worst = lag.worst_s
        if self._since is None:
            if worst < self.threshold_s:
                return
            self._since = self.clock.monotonic()
            self._worst_s = worst
            why = reasons(
                lag,
                threshold_s=self.threshold_s,
                round_trip_s=self._round_trip_s(),
                served_queues=self._served_queues(),
            )
            self.state = _state(lag, why, since=self.clock.now())
            logger.warning(
                "behind schedule by %.1f s: %s",
                worst,
                "; ".join(why),
                extra=self._log_extra,
            )
            return
        self._worst_s = max(self._worst_s, worst)
        if worst >= self.threshold_s / 2:
            why = reasons(
                lag,
                threshold_s=self.threshold_s / 2,
                round_trip_s=self._round_trip_s(),
                served_queues=self._served_queues(),
            )
            since = self.state["since"] if self.state else self.clock.now()
            self.state = _state(lag, why, since=since)
            return
        self.caught_up()

    def caught_up(self, *, leading: bool = True) -> None:
        """Back under half the threshold (or no longer the one who measures: ``leading=False``)."""
        if self._since is not None:
            behind_for = self.clock.monotonic() - self._since
            if leading:
                logger.info(
                    "caught up with the schedule after %.1f s behind (at worst %.1f s)",
                    behind_for,
                    self._worst_s,
                    extra=self._log_extra,
                )
        self._since = None
        self._worst_s = 0.0
        self.state = None
        if not leading:
            node_metrics.behind(fires_s=0.0, claims_s=0.0, waiting=0)


def _state(lag: Lag, why: list[str], *, since: float) -> dict[str, Any]:
    """What the presence carries (whole seconds and tenths, so a live view changes rarely)."""
    return {
        "since": since,
        "fires_s": round(lag.fires_s),
        "claims_s": round(lag.claims_s),
        "waiting": lag.waiting,
        "why": why,
    }


def describe(state: dict[str, Any] | None) -> str:
    """One line for readiness and the CLI ("" while the cluster keeps up)."""
    if not state:
        return ""
    return (
        f"behind schedule (fires {state.get('fires_s', 0)} s, claims {state.get('claims_s', 0)} s): "
        + "; ".join(state.get("why") or [])
    )


# --- each partition leader's own partitions ---------------------------------------------------------


def partition_lags(partitions: Iterable[int], *, now: datetime) -> dict[int, float]:
    """How long past its due instant the earliest fire not yet written is, in each of
    ``partitions`` (one read of the partition index each: its cost depends on neither the jobs
    nor the backlog)."""
    lags: dict[int, float] = {}
    for partition in partitions:
        earliest = earliest_next_fire(partition)
        lags[partition] = max(0.0, (now - earliest).total_seconds()) if earliest else 0.0
    return lags


class PartitionWatch:
    """With several scheduling partitions, each node judges the partitions it leads: one WARNING
    when any falls ``threshold_s`` behind (which ones, by how much, and why), one INFO once they
    are all back under half of it; the gauge ``scheduler_partition_behind_seconds`` per partition
    led; and ``state``, the lag of every partition it leads in whole seconds, which its presence
    carries to the dashboard's overview and readiness shows. Partition 0's leader still judges
    the whole cluster (``BehindWatch``): claims, queues, the database."""

    def __init__(
        self,
        *,
        node_id: str,
        clock: Clock,
        threshold_s: float,
        round_trip_s: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.threshold_s = threshold_s
        self._round_trip_s = round_trip_s
        self._checked = float("-inf")
        self._since: float | None = None  # monotonic, while behind
        self._worst_s = 0.0
        self._behind: set[int] = set()  # the partitions behind in this episode
        self._led: set[int] = set()
        self.lags: dict[int, float] = {}
        self._log_extra = {"node": node_id}

    def due(self) -> bool:
        return self.clock.monotonic() - self._checked >= CHECK_EVERY_S

    def check(self, partitions: Iterable[int], *, now: datetime) -> dict[int, float]:
        """Measure the partitions this node leads now and judge; database errors propagate."""
        self._checked = self.clock.monotonic()
        lags = partition_lags(sorted(partitions), now=now)
        self.judge(lags)
        return lags

    @property
    def state(self) -> dict[str, int]:
        """The lag of each partition led, in whole seconds (keys are strings: JSON's)."""
        return {str(p): round(s) for p, s in sorted(self.lags.items())}

    def behind(self) -> dict[int, float]:
        """The partitions led that are behind now (at or past half the threshold while an
        episode lasts, at or past the threshold otherwise)."""
        floor = self.threshold_s / 2 if self._since is not None else self.threshold_s
        return {p: s for p, s in self.lags.items() if s >= floor}

    def judge(self, lags: dict[int, float]) -> None:
        for partition in self._led - set(lags):
            node_metrics.partition_behind(partition, None)  # no longer led here
        for partition, seconds in lags.items():
            node_metrics.partition_behind(partition, seconds)
        self._led = set(lags)
        self.lags = dict(lags)
        worst = max(lags.values(), default=0.0)
        if self._since is None:
            if worst < self.threshold_s:
                return
            self._since = self.clock.monotonic()
            self._worst_s = worst
            self._behind = set(self.behind())
            logger.warning(
                "partitions led here behind schedule: %s",
                self.describe(),
                extra=self._log_extra,
            )
            return
        self._worst_s = max(self._worst_s, worst)
        self._behind |= set(self.behind())
        if worst < self.threshold_s / 2:
            caught_up = self._behind & set(lags)
            logger.info(
                "partitions led here %s after %.1f s behind (at worst %.1f s)",
                "caught up with the schedule" if caught_up else "handed over (led elsewhere now)",
                self.clock.monotonic() - self._since,
                self._worst_s,
                extra=self._log_extra,
            )
            self._since = None
            self._worst_s = 0.0

    def forget(self) -> None:
        """The lags could not be measured (the database did not answer): say nothing stale (no
        gauge, no presence figure) until the next measure."""
        for partition in self._led:
            node_metrics.partition_behind(partition, None)
        self._led = set()
        self.lags = {}

    def describe(self) -> str:
        """One line naming the partitions behind, by how much and why ("" while none is)."""
        behind = self.behind()
        if not behind:
            return ""
        which = ", ".join(f"partition {p} by {s:.1f} s" for p, s in sorted(behind.items()))
        why = "this node's leader passes write their fires after they are due"
        round_trip = self._round_trip_s()
        if round_trip is not None and round_trip >= SLOW_ROUND_TRIP_S:
            why += f"; the database: a round trip takes {round_trip * 1000:.0f} ms from this node"
        return f"{which}: {why}"


def partitions_line(described: str) -> str:
    """The readiness line of a node whose partitions are behind ("" while none is)."""
    return f"partitions led here behind schedule: {described}" if described else ""
