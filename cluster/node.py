"""A scheduler node: register, heartbeat, campaign, lead (schedule + reap), claim and execute.

``NodeRunner.run()`` starts the independent loops, each in a thread that logs an exception and keeps
going, waits on the stop event instead of sleeping, and closes stale DB connections every pass:

  election   the LeaderElector (lease acquire / renew / step down);
  presence   the node's presence in the coordination backend (a TTL key / lease row), and nothing
             else, so a slow database never makes a live node look dead; it also keeps the node's
             own proof of membership (cluster/membership.py) that every start is checked against;
  heartbeat  SchedulerNode row (ages for the dashboard); cancel requests; operator drain requests;
  leader     while leading: scheduler_tick (sleeping until the earliest next_fire_at minus the
             look-ahead, woken early by a Redis "wake" message when jobs change) and the reaper;
  claim      claims due executions within capacity (woken by "wake", else a short poll);
  starter    starts each claimed execution at its due instant;
  notifier   while leading: failure notifications (a slow webhook never delays a fire);
  dbwatch    judges whether the database answers the node's calls (cluster/dbhealth.py): the
             heartbeat, leader and notifier loops run their statements under tight bounds, and a
             node whose database does not answer neither leads nor campaigns.

``tick()`` runs one pass of everything in the calling thread, for tests.

Why this file is longer than the others: ``NodeRunner`` is where the loops meet, and each loop's
pass is a short method here that hands the work to the module that owns it (``cluster.services``
for the node's and the terms' rows, ``cluster.scheduler`` and ``cluster.reaper`` for the leader's
work, ``cluster.pace`` for whether this node's path keeps up, ``cluster.executor`` for claims and
runs, ``cluster.dbhealth`` for the database's reachability). Splitting the passes from the loops
that run them would only scatter the order in which a node starts, leads and drains.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from cluster import announce, conf, node_metrics, partitions, reaper, scheduler, selectors, services
from cluster.behind import BehindWatch, PartitionWatch
from cluster.clock import Clock, ReferenceClock, SystemClock
from cluster.coordination import CoordinationBackend, CoordinationError, Lease, get_backend
from cluster.dbhealth import UNREACHABLE, DatabaseHealth, Reachability, is_connection_error
from cluster.elector import LEASE_LOST, STEPPED_DOWN, UNABLE, ElectionConfig, LeaderElector
from cluster.executor import PREPARE_WORKERS, RECONCILE_AFTER_S, Executor, NodeRow, Runner
from cluster.fencing import Fenced, fence_current, fence_raise, tenure
from cluster.logcontext import process_context, set_process_context
from cluster.membership import Membership
from cluster.models import NodeStatus, SchedulerNode, TermEndReason
from cluster.pace import SLOW_PATH, Pace
from cluster.partitions import Seat
from cluster.services import Beat
from cluster.timesync import TimeKeeper
from jobs import notifications, partitioning

logger = logging.getLogger(__name__)

VERSION = "0.1.0"
# Partition 0's lease: the cluster leader's (cluster.partitions).
LEASE_NAME = partitions.LEADER_LEASE
# The node's knobs' defaults live in cluster.conf (the one home of each, checked there).
HEARTBEAT_INTERVAL_S: float = conf.default("HEARTBEAT_S")
# The presence TTL: a node that has not renewed its presence for this long is dead to the cluster
# (its work is reaped), and a node that cannot show a renewal this recent starts nothing.
DEAD_AFTER_S: float = conf.default("DEAD_AFTER_S")
LOOKAHEAD_S: float = conf.default("LOOKAHEAD_S")
# The server-side limit of one statement on a node's control path (seconds; SCHEDULER_DB_CONTROL_
# LIMIT_S): the leader's calls answer within it or count as the database unreachable past it.
DB_CONTROL_LIMIT_S: float = conf.default("DB_CONTROL_LIMIT_S")
# How far ahead nodes claim (at most the leader's look-ahead). Less than a second: the claims of
# a whole-second schedule's next fires come a quarter second after the instant its current fires
# start, not at that instant, when the node is starting its bodies and the database is busiest
# (runs beyond the cluster's capacity, claimed as the first bodies end, waited behind those
# claims: W1's lag p99 went from 45-62 ms to 31-41 ms in this change's runs).
CLAIM_LOOKAHEAD_S = 0.75
# The leader claims runs not yet due only this far ahead (more than the executor's prepare window,
# 0.25 s): the other nodes, claiming 0.75 s ahead, take a slot's runs first when they have room.
# A leader SIGKILLed just before an instant then holds none of that instant's runs (each would be
# lost: marked running ahead, indeterminate), and the next slot's runs, claimed by the others, run
# on time while no leader exists. Runs already due are claimed by any node, the leader included.
LEADER_CLAIM_LOOKAHEAD_S = 0.35
CLAIM_POLL_S = 0.1
# A claim pass that asked the database and took less than it had room for is followed by the next
# no sooner than this (seconds), even when new fires wake the claim loop meanwhile. The fires of
# a schedule are written and claimed ahead of their instant (LOOKAHEAD_S, CLAIM_LOOKAHEAD_S), so
# this costs them nothing; it costs a run enqueued to start at once on a busy node at most this
# much. Without it, every node answered every leader's wake-up with a claim of the same few rows:
# ten nodes under eight partition leaders at 2,000 fires/s spent more on the race than on runs.
CLAIM_SPACING_S = 0.05
# The claim passes, and the empty polls, that the whole cluster makes per second at most: each
# node spaces its own by the live claimers' count (itself included) over these, and never by less
# than CLAIM_SPACING_S or its claim poll. Up to four nodes nothing changes; past that, each node
# claims less often and takes more in each pass. Every claim pass costs about the same whatever
# it takes (five round trips, and the candidates' read), and all nodes read the same first
# candidates: ten nodes each at CLAIM_SPACING_S made 200 passes a second for the same work that
# three did in 60, and ten idle nodes polled the empty queue 100 times a second. Staggered as the
# nodes are, the cluster still looks at the queue as often as four nodes do.
CLUSTER_CLAIM_PASSES_PER_S = 80.0
CLUSTER_CLAIM_POLLS_PER_S = 40.0
# Longest the leader sleeps without looking at the earliest next_fire_at again. With Redis, job
# changes wake it at once; on the database backend this bound is how fast it notices an edit.
LEADER_MAX_SLEEP_S = 0.25
# How often the leader looks for expired presences (one backend read when nobody died).
REAP_INTERVAL_S = 0.25
# How often a node looks at which nodes can lead (the share of partitions it should lead), and
# how often partition 0's leader moves jobs whose partition is out of range (seconds).
BALANCE_VIEW_S = 0.5
SWEEP_INTERVAL_S = 5.0
# How often a node checks that the cluster's partition count is still the one it started with.
PARTITION_CHECK_S = 5.0
# How often the leader's notifier looks for runs that ended badly and sends what is due.
NOTIFY_INTERVAL_S = 1.0
LEADER_TICK_EARLY_S = 0.4
# A leader whose fires fall due continuously (thousands of jobs spread over their interval) writes
# them in passes at most this often, each carrying what fell due meanwhile, rather than a pass per
# fire or two: the look-ahead (LOOKAHEAD_S + LEADER_TICK_EARLY_S) still writes every fire more than
# a second before it is due with the default look-ahead.
LEADER_PASS_MIN_S = 0.2
# How often a node audits the rows it holds against what it tracks (executor.reconcile).
RECONCILE_INTERVAL_S = 2.0
# A node that has claimed nothing for this long because it is full or cannot confirm its
# membership says so in its log, and again every this often while it lasts (seconds).
CLAIM_IDLE_LOG_S = 5.0
DEFAULT_GRACE_S: float = conf.default("DRAIN_GRACE_S")
STOP_MARK_ATTEMPTS = 5
STOP_MARK_BACKOFF_S = 0.5
LOOP_ERROR_BACKOFF_S = 0.5
# Registering at start while the database or the coordination backend cannot be reached: the first
# retry after this, doubling up to REGISTER_RETRY_MAX_S (seconds).
REGISTER_RETRY_FIRST_S = 0.5
REGISTER_RETRY_MAX_S = 5.0


# Database connections a node's own threads hold at most: heartbeat, leader, notifier, claim, the
# admission threads (PREPARE_WORKERS at most), the finisher, and one for its main thread or a drain; with the
# database coordination backend also the election, presence and lock-keeper threads. It does not
# grow with --capacity: task bodies hold none unless the task itself uses the ORM (and then close it
# when the run ends).
NODE_DB_CONNECTIONS = {"redis": 6 + PREPARE_WORKERS, "database": 9 + PREPARE_WORKERS}
ERR_CONNECTIONS = (
    "the database allows {limit} connections, and {nodes} running node(s) x {budget} + this "
    "node's {budget} + {reserve} kept for web processes (SCHEDULER_WEB_DB_CONNECTIONS) need "
    "{needed}: raise the server's max_connections or run fewer nodes"
)


# Why a node claims nothing before its first reading of the database's clock.
CLOCK_UNSYNCED = "clock not yet read from the database"
# How often a node judges whether its database answers (seconds; cluster.dbhealth).
DB_WATCH_S = 0.1
# The presence payload's mark of a node that cannot reach its database.
DATABASE_UNREACHABLE = UNREACHABLE


# Why this node's own term ended, by the elector's reason (UNABLE is decided in _record_term_end).
TERM_END_REASONS = {STEPPED_DOWN: TermEndReason.STEPPED_DOWN, LEASE_LOST: TermEndReason.LEASE_LOST}


def _end_reason(presence: dict[str, object] | None) -> TermEndReason:
    """Why an older leader's term ended, from its presence now (None: it has none)."""
    if presence is None:
        return TermEndReason.NODE_DIED
    if presence.get("database") == DATABASE_UNREACHABLE:
        return TermEndReason.UNABLE
    return TermEndReason.LEASE_LOST


def connection_budget_problem(
    *, node_id: str, coordination: str, reserve: int, dead_after_s: float = DEAD_AFTER_S
) -> str | None:
    """On MySQL/MariaDB: why this node cannot start without risking "Too many connections", or
    None if the running nodes' budgets, this one's and the web reserve fit max_connections.
    Running nodes are those whose row heartbeated within ``dead_after_s``: the rows of nodes that
    died (a host rebooted; the default node id changes with the pid) hold no connection, and
    counting them could lock every node out until a leader reaps them."""
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_connections")
        limit = int(cursor.fetchone()[0])
    budget = NODE_DB_CONNECTIONS[coordination]
    running = (
        SchedulerNode.objects.filter(
            status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING],
            last_heartbeat__gte=timezone.now() - timedelta(seconds=dead_after_s),
        )
        .exclude(node_id=node_id)
        .count()
    )
    needed = (running + 1) * budget + reserve
    if needed <= limit:
        return None
    return ERR_CONNECTIONS.format(
        limit=limit, nodes=running, budget=budget, reserve=reserve, needed=needed
    )


@dataclass
class NodeConfig:
    node_id: str
    queues: list[str] = field(default_factory=lambda: conf.default("QUEUES"))
    capacity: int = conf.default("CAPACITY")
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    dead_after_s: float = DEAD_AFTER_S
    lookahead_s: float = LOOKAHEAD_S
    claim_poll_s: float = CLAIM_POLL_S
    grace_s: float = DEFAULT_GRACE_S
    election: ElectionConfig = field(default_factory=ElectionConfig)
    # The server-side limit of one database statement on the node's control path (the leader,
    # the reaper, the heartbeat, the notifier); see cluster.dbhealth.
    db_control_limit_s: float = DB_CONTROL_LIMIT_S
    # The leader warns once when fires or claims fall this far behind (cluster.behind).
    behind_warn_s: float = conf.default("BEHIND_WARN_S")
    # Runs released a second from misfire catch-up across the cluster (0: no bound); each
    # partition's leader paces its jobs' at its share of it.
    catch_up_per_s: float = conf.default("CATCH_UP_PER_S")

    def __post_init__(self) -> None:
        problem = conf.values_problem(
            {
                "CAPACITY": self.capacity,
                "QUEUES": self.queues,
                "HEARTBEAT_S": self.heartbeat_interval_s,
                "DEAD_AFTER_S": self.dead_after_s,
                "LOOKAHEAD_S": self.lookahead_s,
                "DRAIN_GRACE_S": self.grace_s,
                "DB_CONTROL_LIMIT_S": self.db_control_limit_s,
                "BEHIND_WARN_S": self.behind_warn_s,
                "CATCH_UP_PER_S": self.catch_up_per_s,
                "LEASE_TTL_MS": self.election.lease_ttl_ms,
                "RENEW_DEADLINE_MS": self.election.renew_deadline_ms,
                "RETRY_PERIOD_MS": self.election.retry_period_ms,
            }
        )
        if problem:
            raise ValueError(problem)


def _loop(
    name: str,
    stop: threading.Event,
    body: Callable[[], float],
    health: DatabaseHealth | None = None,
    *,
    control: bool = False,
    watch: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> None:
    """Run ``body`` until stopped; it returns how long to wait before the next pass. With
    ``health``, the pass's database calls are watched (see cluster.dbhealth), as a control thread
    or as work, or within ``watch()`` when given; a pass that failed because the database could
    not be reached is not logged here: the node's health says it once for the whole outage."""
    if watch is None:
        watch = (
            (lambda: health.thread(control=control))
            if health is not None
            else contextlib.nullcontext
        )
    while not stop.is_set():
        try:
            with watch():
                delay = body()
        except Exception as exc:
            if health is not None and is_connection_error(exc):
                health.failed(exc, f"the {name} loop")
                logger.debug("%s loop: database unreachable (%s)", name, exc)
            else:
                logger.exception("%s loop failed; retrying", name)
            delay = LOOP_ERROR_BACKOFF_S
        finally:
            close_old_connections()
        if delay > 0:
            stop.wait(delay)


def claim_pace(claimers: int, poll_s: float) -> tuple[float, float]:
    """A node's least wait after a claim pass that found less than it had room for, and its wait
    after one that found nothing, with ``claimers`` live nodes claiming (itself included) and its
    own claim poll ``poll_s`` (see CLUSTER_CLAIM_PASSES_PER_S)."""
    claimers = max(1, claimers)
    return (
        max(CLAIM_SPACING_S, claimers / CLUSTER_CLAIM_PASSES_PER_S),
        max(poll_s, claimers / CLUSTER_CLAIM_POLLS_PER_S),
    )


def _claims(presence: dict[str, object]) -> bool:
    """Whether a live node's presence says it claims: not cut off from its database, not
    draining, not holding its claims back on a slow path."""
    return not (
        presence.get("database") == DATABASE_UNREACHABLE
        or presence.get("draining")
        or presence.get("claims_held_back")
    )


def wait_after_pass(
    delay: float, least: float, *, stop: threading.Event, wake: threading.Event
) -> None:
    """A loop's wait after a pass: ``delay`` seconds or until ``wake`` is set, but at least
    ``least`` (when the pass asked for a wait at all: ``delay`` > 0) unless ``stop`` is set. A
    wake-up that comes during ``least`` is kept for after it."""
    if delay <= 0:
        return
    spacing = min(delay, least)
    if spacing > 0:
        stop.wait(spacing)
    if delay > spacing:
        wake.wait(delay - spacing)
    wake.clear()


class NodeRunner:
    def __init__(
        self,
        config: NodeConfig,
        backend: CoordinationBackend | None = None,
        *,
        clock: Clock | None = None,
        runner: Runner | None = None,
        inline: bool = False,
    ) -> None:
        """``clock``, ``runner`` and ``inline`` are for a stepped, deterministic test cluster: a
        node process uses the system clock, the thread runner and threads for its loops."""
        self.config = config
        self.backend = backend or get_backend()
        self.clock = clock or getattr(self.backend, "clock", None) or SystemClock()
        # A node on the database's time (runnode's clock) reads it now and then.
        self.timekeeper = (
            TimeKeeper(config.node_id, self.clock)
            if isinstance(self.clock, ReferenceClock)
            else None
        )
        self.stop_event = threading.Event()
        # The election loop stops first on drain, so the node never campaigns again while it
        # finishes its work.
        self._election_stop = threading.Event()
        self.draining = False
        self._term_events_lock = threading.Lock()
        # Every elector of this node steps in one election loop, woken by this.
        self._election_poked = threading.Event()
        self.partition_count = 1
        self.seats: list[Seat] = []
        self._balance: tuple[float, int, int | None, int] = (float("-inf"), 1, None, 0)
        # When the live claimers were last counted, and how many there were (_claimers).
        self._claimers_view: tuple[float, int] = (float("-inf"), 1)
        self._next_hand_back = 0.0
        self._last_sweep = float("-inf")
        self._last_partition_check = self.clock.monotonic()
        self._wake_leader = threading.Event()
        self._wake_claim = threading.Event()
        self._last_reap = 0.0
        # Set by a wake-up from outside (a job changed): every led partition passes at once.
        self._woken = False
        # Set by a partition's pass that wrote fires or promoted retries (leader_once wakes the
        # claimers once for all of them).
        self._fired = False
        self._notifier: notifications.Notifier | None = None
        self._last_reconcile = self.clock.monotonic()
        self._idle_since: tuple[str, float] | None = None
        self._idle_logged = float("-inf")
        # The least wait after the last claim pass (CLAIM_SPACING_S, or 0).
        self.claim_spacing_s = 0.0
        self._threads: list[threading.Thread] = []
        self.membership = Membership(
            self.backend, config.node_id, ttl_s=config.dead_after_s, clock=self.clock
        )
        self.database = DatabaseHealth(
            node_id=config.node_id,
            limit_s=config.db_control_limit_s,
            clock=self.clock,
            on_change=self._database_changed,
        )
        self.executor = Executor(
            node_id=config.node_id,
            queues=config.queues,
            capacity=config.capacity,
            backend=self.backend,
            membership=self.membership,
            heartbeat_s=config.heartbeat_interval_s,
            lookahead_s=min(config.lookahead_s, CLAIM_LOOKAHEAD_S),
            clock=self.clock,
            runner=runner,
            inline=inline,
        )
        self.executor.on_room = self._wake_claim.set
        self.executor.database_able = self.database.able
        self.executor.row = NodeRow(write=self._write_row, reachable=self.database.able)
        self.executor.database_cut_for = self._database_cut_for
        self.executor.starter.watch = self.bounded_work
        self._add_seats(1)
        self.pace = Pace(
            node_id=config.node_id,
            clock=self.clock,
            database=self.database,
            executor=self.executor,
            live_nodes=self._live_nodes,
            is_leader=lambda: self.is_leader,
            hand_over=self._election_poked.set,
        )
        self.behind = BehindWatch(
            node_id=config.node_id,
            clock=self.clock,
            threshold_s=config.behind_warn_s,
            round_trip_s=self.database.round_trip_s,
            served_queues=selectors.served_queues,
        )
        self.partition_watch = PartitionWatch(
            node_id=config.node_id,
            clock=self.clock,
            threshold_s=config.behind_warn_s,
            round_trip_s=self.database.round_trip_s,
        )
        self._log_extra = {"node": config.node_id}

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=UTC)

    # --- registration and heartbeat ------------------------------------------------------------------
    def _add_seats(self, total: int) -> None:
        """An elector for each partition up to ``total`` (partition 0's exists from the start)."""
        for partition in range(len(self.seats), total):
            seat = Seat(partition, elector=None)  # type: ignore[arg-type]
            seat.elector = LeaderElector(
                self.backend,
                partitions.lease_name(partition),
                self.config.node_id,
                self.config.election,
                clock=self.clock,
                on_started_leading=lambda lease, seat=seat: self._started_leading(seat, lease),
                on_stopped_leading=lambda lease, why, seat=seat: self._stopped_leading(
                    seat, lease, why
                ),
                can_lead=self._can_lead,
                can_campaign=self._can_campaign,
                poked=self._election_poked,
            )
            self.seats.append(seat)
        self.partition_count = max(self.partition_count, total)

    def _can_lead(self) -> bool:
        """Able to do a leader's work: its path keeps up (cluster.pace), and its clock is the
        database's (a node started during a step of its machine's clock would date fires wrong)."""
        return self.clock_synced() and self.pace.can_lead()

    def _can_campaign(self) -> bool:
        """Whether to take a lease now: not while this node claims nothing because its database
        path is far slower than a peer's (``cluster.pace``). A partition taken then stayed
        without a working leader for as long as recording its term took on that path (6.7 s in
        a chaos run, its peers having handed it over to the slow node); a peer that is quick
        takes it instead."""
        return self.executor.held_back != SLOW_PATH

    def bounded_work(self) -> contextlib.AbstractContextManager[None]:
        """The scope of this node's admissions and claims: watched as work, with the bounded
        work thread's limits (``cluster.dbhealth.bounded_limit_s``). A claim or an admission
        statement that no answer comes back to (a connection left over from a server killed
        mid-statement behind a proxy, a path that hangs) fails within seconds; with the driver's
        default read timeout (20 s) a chaos run's database restarts kept nodes claiming nothing
        for 20 s while their peers ran everything."""
        return self.database.thread(control=False, bounded=True)

    def clock_synced(self) -> bool:
        return self.timekeeper is None or self.timekeeper.synced

    @property
    def elector(self) -> LeaderElector:
        """Partition 0's elector: the cluster leader's."""
        return self.seats[0].elector

    def register(self) -> SchedulerNode:
        # The cluster's partition count, before this node campaigns for any of them.
        self._add_seats(partitioning.count(fresh=True))
        # The database's time before anything is claimed or fired (the heartbeat keeps trying).
        if self.timekeeper is not None and not self.timekeeper.first_sync():
            logger.warning(
                "could not read the database's clock yet; claiming and leading wait for it",
                extra=self._log_extra,
            )
        # Present in the backend before the row says "active": the reaper never sees an active
        # node without a presence unless it is dead.
        self.presence_once()
        node = services.node_register(
            node_id=self.config.node_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=VERSION,
            queues=self.config.queues,
            capacity=self.config.capacity,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            dead_after_s=self.config.dead_after_s,
            now=self._now(),
        )
        logger.info(
            "registered node %s (pid %s)", self.config.node_id, os.getpid(), extra=self._log_extra
        )
        return node

    def _write_row(self) -> Beat:
        """This node's row says it is alive now: the heartbeat's write, also made before a run
        starts after a database outage (``NodeRow``)."""
        beat = services.node_heartbeat(
            node_id=self.config.node_id,
            now=self._now(),
            running_count=self.executor.running_count,
            draining=self.draining,
            rejoin=not self.stop_event.is_set(),
        )
        if beat == Beat.REJOINED:
            # Declared dead while we were paused or cut off: our running work was marked lost and
            # retried elsewhere (our own writes on it are fenced by the claim token).
            logger.warning(
                "node %s was declared dead; rejoining", self.config.node_id, extra=self._log_extra
            )
        return beat

    def heartbeat_once(self) -> float:
        if self.timekeeper is not None:
            self.timekeeper.maybe_sync()
        beat = self.executor.row.write()
        if beat == Beat.GONE and not self.stop_event.is_set():
            # An operator removed this node's row while it was dead or stopped: register again.
            logger.warning(
                "node %s was removed from the list; registering again",
                self.config.node_id,
                extra=self._log_extra,
            )
            self.register()
        self.executor.apply_cancel_requests()
        if self.clock.monotonic() - self._last_reconcile >= RECONCILE_INTERVAL_S:
            self._last_reconcile = self.clock.monotonic()
            self.executor.reconcile()
        self._check_partition_count()
        if not self.draining and selectors.node_drain_requested(self.config.node_id):
            logger.info("drain requested by an operator", extra=self._log_extra)
            threading.Thread(target=self.shutdown, name="drain", daemon=True).start()
        return self.config.heartbeat_interval_s

    def _check_partition_count(self) -> None:
        """A node keeps the partition count it started with: the count changed under it (an
        operator ran ``partitions --set`` without stopping the cluster) means it leads partitions
        the others no longer agree on, so it says so and drains; started again, it takes the new
        count."""
        if self.draining or self.clock.monotonic() - self._last_partition_check < PARTITION_CHECK_S:
            return
        self._last_partition_check = self.clock.monotonic()
        stored = partitioning.count(fresh=True)
        if stored != self.partition_count:
            logger.error(
                "the cluster's partition count changed from %d to %d while this node ran; "
                "draining (start the node again to take the new count)",
                self.partition_count,
                stored,
                extra=self._log_extra,
            )
            threading.Thread(target=self.shutdown, name="drain", daemon=True).start()

    def presence_once(self) -> float:
        """Renew this node's presence; on a lapse, give up what was claimed under it."""
        began = time.monotonic()
        database = self.database.observe()
        payload: dict[str, object] = {"pid": os.getpid(), "running": self.executor.running_count}
        round_trip = self.database.round_trip_s()
        if round_trip is not None:
            payload["db_rtt_ms"] = round(round_trip * 1000, 2)
        if self.executor.held_back is not None:
            payload["claims_held_back"] = self.executor.held_back
        if self.pace.yielding():
            payload["yielding"] = True  # handed leadership over: it takes no partition a while
        if self.partition_count > 1:
            payload["leads"] = self.led_partitions()  # read by the dashboard and by peers
            if self.partition_watch.lags:
                payload["partition_lag"] = self.partition_watch.state  # the overview's
        if self.draining:
            payload["draining"] = True  # not counted among the nodes that share the partitions
        # The bodies running here, and when they were listed (the cluster's time, taken before
        # the list): a forbid run is skipped behind a predecessor only once its node lists that
        # body at or after the run's due instant. A lock or a row that is late to say the body
        # ended (a slow path of this node) is not evidence that it runs.
        listed_at_ms = int(self.clock.now() * 1000)
        bodies = self.executor.body_ids()
        if bodies:
            payload["bodies"] = bodies
            payload["bodies_at_ms"] = listed_at_ms
        released = self.executor.released_ids()
        if released:
            # Bodies whose job lock this node gave up (it could not do their work): a successor
            # waits until the cluster has ended their runs, and the leader ends them lost.
            payload["released"] = released
        behind = self.behind.state
        if behind is not None and self.is_leader:
            payload["behind"] = behind  # read by the dashboard's overview
        if not database.reachable:
            # Read by the dashboard (a node alive here but cut off from the database is degraded)
            # and by the next leader (why this node's term ended).
            payload["database"] = DATABASE_UNREACHABLE
            payload["database_reason"] = database.reason
            # For the leader, which takes a cut-off node's work after a while (the node cannot
            # write its own rows): since when, in the cluster's time, and what it still runs.
            since = database.since if database.since is not None else self.clock.monotonic()
            payload["database_since_ms"] = int(
                (self.clock.now() - (self.clock.monotonic() - since)) * 1000
            )
            payload["unstarted"] = self.executor.refused_ids()
        try:
            continuous = self.membership.renew(payload)
            node_metrics.presence(time.monotonic() - began)
        except Exception as exc:
            node_metrics.presence(None)
            logger.warning(
                "presence renewal failed (%s); %.2f s of confirmed membership left",
                exc,
                max(0.0, self.membership.remaining_s()),
                extra=self._log_extra,
            )
            return self.config.heartbeat_interval_s
        if not continuous:
            handed_back = self.executor.on_membership_lapse()
            logger.warning(
                "presence had lapsed (paused or cut off): %d unstarted claims handed back",
                handed_back,
                extra=self._log_extra,
            )
        return self.config.heartbeat_interval_s

    def _live_nodes(self) -> dict[str, dict[str, object]]:
        try:
            return self.backend.live_nodes()
        except Exception as exc:
            logger.warning("could not read live nodes: %s", exc, extra=self._log_extra)
            return {}

    def _database_cut_for(self) -> float:
        """How long this node has been unable to reach its database (0 while it can)."""
        state = self.database.observe()
        if state.reachable or state.since is None:
            return 0.0
        return max(0.0, self.clock.monotonic() - state.since)

    def watch_database_once(self) -> float:
        """Judge the database's reachability often: a control call that stalls (an answer held by
        a partition) is noticed within DB_WATCH_S of its bound, whatever the other loops do."""
        self.database.observe()
        self.pace.judge_overrun()
        return DB_WATCH_S

    def _database_changed(self, state: Reachability) -> None:
        """Cut off from the database: a leader gives its lease up now, not at its next renewal, and
        the node's row is owed a write before its next start (``NodeRow``)."""
        node_metrics.database(state.reachable)
        if not state.reachable:
            self.executor.row.outage()
            self.elector.poke()
        else:
            self.executor.forget_refused()

    # --- leadership ----------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """Whether this node leads partition 0: the cluster leader (reaping, notifications)."""
        return self.seats[0].is_leader

    @property
    def term(self) -> int | None:
        return self.seats[0].term

    def led_partitions(self) -> list[int]:
        return [seat.partition for seat in self.seats if seat.is_leader]

    # The elector's callbacks only queue what happened: the database work of a new term (raising
    # the fence, recording the term) runs in the leader loop, so a slow or blocked database never
    # stops the election thread from renewing the lease.
    def _started_leading(self, seat: Seat, lease: Lease) -> None:
        seat.events.put(("start", lease, ""))
        self._wake_leader.set()

    def _stopped_leading(self, seat: Seat, lease: Lease, reason: str) -> None:
        seat.leading.clear()
        if seat.partition == 0:
            self.behind.caught_up(leading=False)  # the next leader measures
        seat.events.put(("stop", lease, reason))
        self._wake_leader.set()

    def _seat_of(self, lease: Lease) -> Seat:
        for seat in self.seats:
            if seat.elector.name == lease.name:
                return seat
        raise LookupError(lease.name)

    def _apply_term_events(self) -> None:
        with self._term_events_lock:
            for seat in self.seats:
                while True:
                    try:
                        kind, lease, reason = seat.events.get_nowait()
                    except queue.Empty:
                        break
                    if kind == "start":
                        self._record_new_term(lease)
                    else:
                        self._record_term_end(lease, reason)

    def _leads_text(self, seat: Seat) -> str:
        return partitions.label(seat.partition, self.partition_count)

    def _record_new_term(self, lease: Lease) -> None:
        seat = self._seat_of(lease)
        extra = {**self._log_extra, "term": lease.term, "partition": seat.partition}
        current = seat.elector.lease
        if current is None or current.term != lease.term:
            return  # already lost again before it could be recorded
        fence = partitions.fence_name(seat.partition)
        try:
            if not fence_raise(lease.term, tenure(self.config.node_id, lease.token), fence=fence):
                # Storage has seen this term or a newer one (Redis restarted without persistence
                # and minted it again): lift the backend's counter past it and campaign again.
                stored = fence_current(fence)
                logger.warning(
                    "term %s%s is not above the fenced term %s; raising the term floor and "
                    "stepping down",
                    lease.term,
                    self._leads_text(seat),
                    stored,
                    extra=extra,
                )
                self.backend.raise_term_floor(lease.name, stored)
                seat.elector.release()
                return
            read: list[dict[str, dict[str, object]]] = []

            def end_reason_of(node_id: str) -> TermEndReason:
                if not read:  # the presences, read once and only if an older term is still open
                    read.append(self._live_nodes())
                return _end_reason(read[0].get(node_id))

            services.term_begin(
                term=lease.term,
                node_id=self.config.node_id,
                now=self._now(),
                end_reason_of=end_reason_of,
                partition=seat.partition,
            )
        except Exception:
            logger.exception("could not record term %s; stepping down", lease.term, extra=extra)
            close_old_connections()
            seat.elector.release()
            return
        seat.term = lease.term
        seat.next_pass_at = 0.0
        seat.leading.set()
        if seat.partition == 0:
            node_metrics.leading(lease.term, "started")
            self._term_in_logs(lease.term)
            logger.info("started leading (term %s)", lease.term, extra=extra)
        else:
            logger.info(
                "started leading partition %s (term %s)", seat.partition, lease.term, extra=extra
            )

    def _term_in_logs(self, term: int | None) -> None:
        """While this process's node leads, every log line of the process carries its term."""
        if process_context().get("node") == self.config.node_id:
            set_process_context(term=term)

    def _record_term_end(self, lease: Lease, reason: str) -> None:
        seat = self._seat_of(lease)
        if seat.ended_term == lease.term:
            return  # already recorded (a drain records its step-down before releasing)
        seat.ended_term = lease.term
        extra = {**self._log_extra, "term": lease.term, "partition": seat.partition}
        if seat.partition == 0:
            self._term_in_logs(None)
            node_metrics.leading(None, reason)
        logger.info(
            "stopped leading%s (term %s): %s",
            self._leads_text(seat),
            lease.term,
            reason,
            extra=extra,
        )
        if reason == UNABLE and not self.pace.yielding():
            # This node cannot reach the database now; the next leader closes the term.
            return
        end_reason = (
            TermEndReason.FELL_BEHIND
            if reason == UNABLE
            else TERM_END_REASONS.get(reason, TermEndReason.LEASE_LOST)
        )
        try:
            services.term_end(
                term=lease.term, reason=end_reason, now=self._now(), partition=seat.partition
            )
        except Exception:
            logger.exception("could not close term %s", lease.term, extra=extra)
            close_old_connections()

    # --- the election loop: every partition's elector, and the balance between nodes ------------------
    def election_once(self) -> float:
        """One step of every partition's elector; returns seconds until the next is due. A node
        campaigns for a partition while it leads fewer than its share (cluster.partitions), gives
        one back when it leads more, and takes any partition left unled for ORPHAN_AFTER_S."""
        if self._election_stop.is_set():
            return self.config.election.retry_period_ms / 1000  # draining: campaigns no more
        if self.partition_count == 1:
            return self.seats[0].elector.tick()
        now = self.clock.monotonic()
        able, fewest, room = self._balance_view()
        quota = partitions.share(self.partition_count, able)
        held = [seat for seat in self.seats if seat.holds_lease]
        if (
            partitions.gives_back(len(held), self.partition_count, able, fewest)
            and now >= self._next_hand_back
            and not self.draining
        ):
            self._next_hand_back = now + partitions.HAND_BACK_EVERY_S
            count = partitions.hand_back_count(len(held), self.partition_count, able, room)
            # Partition 0 (the cluster's leader) last, then the highest numbers first.
            extras = sorted(held, key=lambda seat: (seat.partition != 0, seat.partition))[-count:]
            logger.info(
                "handing partition%s %s over: leading %d, a share is %d",
                "s" if len(extras) > 1 else "",
                ", ".join(str(seat.partition) for seat in extras),
                len(held),
                quota,
                extra=self._log_extra,
            )
            # The leader loop gives them back between two of its passes: a pass under way is
            # never cut short by a fence raised meanwhile.
            for extra in extras:
                extra.give_back = True
                held.remove(extra)
            self._wake_leader.set()
        delay = self.config.election.retry_period_ms / 1000
        for seat in self.seats:
            if not seat.holds_lease and len(held) >= quota and not self._orphaned(seat, now):
                continue
            delay = min(delay, seat.elector.tick())
            if seat.holds_lease and seat not in held:
                held.append(seat)
        return delay

    def _orphaned(self, seat: Seat, now: float) -> bool:
        """Whether ``seat``'s partition has had no leader for ORPHAN_AFTER_S (read every retry
        period while this node is not campaigning for it)."""
        if now - seat.looked_at < self.config.election.retry_period_ms / 1000:
            return (
                seat.free_since is not None and now - seat.free_since >= partitions.ORPHAN_AFTER_S
            )
        seat.looked_at = now
        try:
            held = self.backend.current_lease(seat.elector.name) is not None
        except Exception as exc:
            logger.warning(
                "could not read lease %s: %s", seat.elector.name, exc, extra=self._log_extra
            )
            return False
        if held:
            seat.free_since = None
            return False
        if seat.free_since is None:
            seat.free_since = now
        return now - seat.free_since >= partitions.ORPHAN_AFTER_S

    def _balance_view(self) -> tuple[int, int | None, int]:
        """How many live nodes can lead (not cut off from the database, not draining, not holding
        its claims back on a slow path, not yielding after it fell behind; this one included), the
        fewest partitions another of them leads (None: no other), and how many more the others
        could lead before each reaches its share; from the presences, read at most every
        BALANCE_VIEW_S."""
        now = self.clock.monotonic()
        if now - self._balance[0] < BALANCE_VIEW_S:
            return self._balance[1:]
        counts = []
        for node_id, presence in self._live_nodes().items():
            if node_id == self.config.node_id:
                continue
            if not _claims(presence) or presence.get("yielding"):
                # Cut off, leaving, on a path too slow to claim, or holding back from campaigning
                # after it fell behind (it takes no partition then): a partition handed over to
                # it would wait for it, and two nodes each over a share that counted it handed
                # one partition back and forth, unled for a moment at each pass.
                continue
            leads = presence.get("leads")
            counts.append(len(leads) if isinstance(leads, list) else 0)
        able = 1 + len(counts)
        quota = partitions.share(self.partition_count, able)
        room = sum(max(0, quota - count) for count in counts)
        self._balance = (now, able, min(counts, default=None), room)
        return able, min(counts, default=None), room

    def run_elections(self, stop: threading.Event) -> None:
        """The election thread: step every elector until ``stop`` is set, then release every
        lease still held (as LeaderElector.run does for one)."""
        try:
            while not stop.is_set():
                try:
                    delay = self.election_once()
                except Exception:  # a bug here must not end the election loop
                    logger.exception("election step failed", extra=self._log_extra)
                    delay = self.config.election.retry_period_ms / 1000
                self._election_poked.wait(self.elector._jittered(delay))
                self._election_poked.clear()
        finally:
            for seat in self.seats:
                seat.elector.release()

    def _poke_elections(self) -> None:
        self._election_poked.set()

    def _record_step_down(self, seat: Seat) -> None:
        """Record a graceful step-down before the lease is released: the next leader closes any
        term still open when it records its own, and would call this one "lease lost"."""
        seat.leading.clear()
        lease = seat.elector.lease
        if lease is not None and seat.term == lease.term:
            self._record_term_end(lease, STEPPED_DOWN)

    # --- the leader loop: every partition this node leads ---------------------------------------------
    def leader_once(self) -> float:
        """One pass of the leader's work for every partition this node leads whose pass is due;
        returns seconds until the next is due."""
        self._apply_term_events()
        for seat in self.seats:
            if seat.give_back:
                seat.give_back = False
                if seat.holds_lease:
                    self._record_step_down(seat)
                    if seat.elector.release():
                        self._publish_wake(announce.LEASE_RELEASED)
        # Taken before the passes: a wake-up that comes during them is for the next call.
        woken, self._woken = self._woken, False
        self._fired = False
        now_m = self.clock.monotonic()
        wait = LEADER_MAX_SLEEP_S
        for seat in self.seats:
            if not seat.is_leader or seat.term is None:
                continue
            if seat.next_pass_at > now_m + 1e-3 and not woken:
                wait = min(wait, seat.next_pass_at - now_m)
                continue
            delay = self._partition_pass(seat)
            seat.next_pass_at = self.clock.monotonic() + delay
            wait = min(wait, delay)
        if self.partition_count > 1 and self.partition_watch.due():
            self._watch_partitions()
        if self._fired:
            # One wake-up for the fires of every partition passed now, not one per partition:
            # eight partitions' wake-ups had every claimer take eight small batches.
            self._publish_wake()
            self._wake_claim.set()
        return wait

    def _watch_partitions(self) -> None:
        """How far behind each partition this node leads is (with several partitions)."""
        try:
            self.partition_watch.check(self.led_partitions(), now=self._now())
        except DatabaseError as exc:
            # Once per outage (the database's health says the rest); nothing stale is shown.
            if self.partition_watch.lags:
                logger.warning(
                    "could not measure the partitions' lag: %s", exc, extra=self._log_extra
                )
            self.partition_watch.forget()

    def _partition_pass(self, seat: Seat) -> float:
        """One pass of one partition's leader: its fires; and for partition 0 the cluster-wide
        work (the reaper, jobs out of range, the behind watch)."""
        term = seat.term
        assert term is not None
        now = self._now()
        self.pace.pass_began = self.clock.monotonic()
        try:
            result = scheduler.scheduler_tick(
                term=term,
                now=now,
                lookahead=timedelta(seconds=self.config.lookahead_s + LEADER_TICK_EARLY_S),
                partition=seat.partition,
                catch_up_per_s=self.config.catch_up_per_s / max(1, self.partition_count),
            )
            if seat.partition == 0:
                self._cluster_work(term)
        except Fenced as exc:
            logger.error(
                "fenced, stepping down%s: %s",
                self._leads_text(seat),
                exc,
                extra={**self._log_extra, "term": term},
            )
            seat.leading.clear()
            seat.elector.release()
            return LEADER_MAX_SLEEP_S
        finally:
            self.pace.pass_began = None
        if result.fired or result.promoted:
            self._fired = True  # the claimers are woken once, after every partition's pass
        self.pace.judge_tick(result.late_s)
        if result.more:
            return 0.0
        earliest = scheduler.earliest_next_fire(seat.partition)
        if earliest is None:
            return LEADER_MAX_SLEEP_S
        # Tick a little before the look-ahead horizon reaches the next fire: far from the instants
        # at which this node's own tasks start (a 1 s job's fires are all on whole seconds).
        until_due = (
            (earliest - self._now()).total_seconds() - self.config.lookahead_s - LEADER_TICK_EARLY_S
        )
        wait = max(0.0, min(LEADER_MAX_SLEEP_S, until_due))
        return max(wait, LEADER_PASS_MIN_S) if result.fired or result.skipped else wait

    def _cluster_work(self, term: int) -> None:
        """Partition 0's leader's share of a pass: reap dead nodes, move jobs whose partition is
        out of range, watch whether fires and claims keep up."""
        if (
            self.clock.monotonic() - self._last_reap >= REAP_INTERVAL_S
            and self.membership.steady_for() >= self.config.dead_after_s
        ):
            self._last_reap = self.clock.monotonic()
            presences = self.backend.live_nodes()
            now = self._now()
            dead_after = timedelta(seconds=self.config.dead_after_s)
            reaped = reaper.reap_dead_nodes(
                term=term,
                now=now,
                dead_after=dead_after,
                live=set(presences),
                cut_off=reaper.read_cut_off(
                    presences, now=now, after=dead_after, itself=self.config.node_id
                ),
            )
            if reaped.dead_nodes or reaped.stuck or reaped.cut_off_nodes:
                logger.warning(
                    "reaped nodes %s (dead) and %s (cut off from the database): %d lost, "
                    "%d unclaimed, %d stuck (retried per policy)",
                    reaped.dead_nodes,
                    reaped.cut_off_nodes,
                    reaped.lost,
                    reaped.unclaimed,
                    reaped.stuck,
                    extra={**self._log_extra, "term": term},
                )
        if self.clock.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = self.clock.monotonic()
            moved = partitioning.misplaced(self.partition_count)
            if moved:
                logger.warning(
                    "moved %d jobs whose partition was not below %d (written by a process that "
                    "had not yet seen the partition count)",
                    moved,
                    self.partition_count,
                    extra={**self._log_extra, "term": term},
                )
        if self.behind.due():
            self.behind.check(now=self._now())

    def notify_once(self) -> float:
        """The leader's notifier (a thread of its own: a slow webhook never delays a fire). A node
        that is not leading drops its state, so a new term looks back from the start."""
        if not self.is_leader:
            self._notifier = None
            return NOTIFY_INTERVAL_S
        if self._notifier is None:
            self._notifier = notifications.Notifier()
        try:
            self._notifier.run_once(self._now())
        except DatabaseError as exc:
            if is_connection_error(exc):
                self.database.failed(exc, "the notifier")  # said once by the node's health
            else:
                logger.warning(
                    "notifications: database error (%s); trying again", exc, extra=self._log_extra
                )
            connection.close()
        return NOTIFY_INTERVAL_S

    # --- wake-ups through Redis ------------------------------------------------------------------------
    def _publish_wake(self, message: str | None = None) -> None:
        if self.backend.pushes:
            with contextlib.suppress(Exception):
                self.backend.publish(announce.WAKE_CHANNEL, message or self.config.node_id)

    def _listen_wake(self) -> None:
        if not self.backend.pushes:
            return  # the loops poll on their own (LEADER_MAX_SLEEP_S, CLAIM_POLL_S)
        while not self.stop_event.is_set():
            try:
                for message in self.backend.subscribe(announce.WAKE_CHANNEL, self.stop_event):
                    if message == announce.LEASE_RELEASED:
                        # A node drained or gave partitions back: count the nodes again now.
                        self._balance = (float("-inf"), *self._balance[1:])
                        self.elector.poke()
                    if message != self.config.node_id:
                        # Not its own fires' wake-up: the leader's pass paces itself.
                        self._woken = True
                        self._wake_leader.set()
                    self._wake_claim.set()
            except Exception as exc:
                logger.warning("wake subscription failed: %s", exc, extra=self._log_extra)
                self.stop_event.wait(1.0)

    # --- claiming ------------------------------------------------------------------------------------
    def claim_once(self) -> float:
        self.executor.lookahead_s = min(
            self.config.lookahead_s,
            LEADER_CLAIM_LOOKAHEAD_S if self.is_leader else CLAIM_LOOKAHEAD_S,
        )
        self.claim_spacing_s = 0.0
        self.pace.judge_claims()
        if not self.clock_synced():
            # Until the database's clock is read, this machine's may be stepped: claim nothing.
            self._note_claim_idle(CLOCK_UNSYNCED)
            return self.config.claim_poll_s
        claimed = self.executor.claim_once()
        reason = self.executor.idle_reason
        self._note_claim_idle(reason)
        poll_s = self.config.claim_poll_s
        if reason in (None, "nothing due"):
            # A pass that read the queue and found less than it had room for (CLAIM_SPACING_S),
            # spaced by how many nodes claim beside this one (CLUSTER_CLAIM_PASSES_PER_S).
            self.claim_spacing_s, poll_s = claim_pace(self._claimers(), poll_s)
        # The claimer says when to look again (a claim that took all that was due, a node
        # gathering room); else a full claim goes again at once and an empty one polls.
        if self.executor.next_claim_in is not None:
            return max(self.executor.next_claim_in, self.claim_spacing_s)
        return 0.0 if claimed else poll_s

    def _claimers(self) -> int:
        """How many live nodes claim (this one included): those not cut off from the database,
        not draining and not holding their claims back, from the presences, read at most every
        BALANCE_VIEW_S. A count of its own, not the election's view: a claim pass refreshing
        that view would move when the election thread next reads the presences (a drained
        node's partitions were taken later)."""
        now = self.clock.monotonic()
        if now - self._claimers_view[0] >= BALANCE_VIEW_S:
            others = sum(
                1
                for node_id, presence in self._live_nodes().items()
                if node_id != self.config.node_id and _claims(presence)
            )
            self._claimers_view = (now, 1 + others)
        return self._claimers_view[1]

    def _note_claim_idle(self, reason: str | None) -> None:
        """Log, at most every CLAIM_IDLE_LOG_S, that this node has claimed nothing for a reason of
        its own (full, membership unconfirmed) for that long: a node that silently stops claiming
        is the hardest stall to see from outside."""
        now = self.clock.monotonic()
        if reason in (None, "nothing due", "draining", SLOW_PATH):
            self._idle_since = None
            return
        if self._idle_since is None or self._idle_since[0] != reason:
            self._idle_since = (reason, now)
            return
        since = self._idle_since[1]
        if now - since >= CLAIM_IDLE_LOG_S and now - self._idle_logged >= CLAIM_IDLE_LOG_S:
            self._idle_logged = now
            logger.warning(
                "claiming nothing for %.1f s: %s (capacity %d, load %d, %s)",
                now - since,
                reason,
                self.executor.capacity,
                self.executor.load,
                ", ".join(f"{k} {v}" for k, v in self.executor.snapshot().items()),
                extra=self._log_extra,
            )

    # --- one pass of everything (tests) ---------------------------------------------------------------
    def tick(self) -> None:
        self.election_once()
        self.presence_once()
        with self.database.thread(control=True):
            self.heartbeat_once()
            self.leader_once()
        with self.database.thread(control=False):
            self.claim_once()

    # --- running -------------------------------------------------------------------------------------
    def _waiting_loop(
        self,
        name: str,
        wake: threading.Event,
        body: Callable[[], float],
        *,
        control: bool,
        watch: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        least: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """Run ``body`` until stopped; after a pass, wait the delay it returned or until ``wake``
        is set, but never less than ``least()`` (read after the pass)."""

        def step() -> float:
            wait_after_pass(body(), least(), stop=self.stop_event, wake=wake)
            return 0.0

        _loop(name, self.stop_event, step, self.database, control=control, watch=watch)

    def register_when_reachable(self, stop: threading.Event) -> bool:
        """Register, waiting for the database and the coordination backend as long as it takes
        (a node started during an outage, or before its database, waits instead of exiting).
        Retries with backoff up to REGISTER_RETRY_MAX_S, logging each failure. False if ``stop``
        was set first."""
        delay = REGISTER_RETRY_FIRST_S
        while not stop.is_set():
            try:
                self.register()
                return True
            except (DatabaseError, CoordinationError) as exc:
                logger.warning(
                    "cannot register yet (%s: %s); retrying in %.1f s",
                    type(exc).__name__,
                    exc,
                    delay,
                    extra=self._log_extra,
                )
                connection.close()  # a fresh one on the next attempt
            if stop.wait(delay):
                break
            delay = min(REGISTER_RETRY_MAX_S, delay * 2)
        return False

    def start(self, *, registered: bool = False) -> None:
        if not registered:
            self.register()
        for name, target in self.loops():
            thread = threading.Thread(
                target=target, name=f"{self.config.node_id}:{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def loops(self) -> list[tuple[str, Callable[[], None]]]:
        """The node's threads: each one's name and what it runs until the node stops."""
        return [
            ("election", lambda: self.run_elections(self._election_stop)),
            ("presence", lambda: _loop("presence", self.stop_event, self.presence_once)),
            ("dbwatch", lambda: _loop("dbwatch", self.stop_event, self.watch_database_once)),
            (
                "heartbeat",
                lambda: _loop(
                    "heartbeat", self.stop_event, self.heartbeat_once, self.database, control=True
                ),
            ),
            (
                "leader",
                lambda: self._waiting_loop(
                    "leader", self._wake_leader, self.leader_once, control=True
                ),
            ),
            (
                "claim",
                lambda: self._waiting_loop(
                    "claim",
                    self._wake_claim,
                    self.claim_once,
                    control=False,
                    watch=self.bounded_work,
                    least=lambda: self.claim_spacing_s,
                ),
            ),
            ("starter", lambda: self.executor.run_starter(self.stop_event)),
            (
                "notifier",
                lambda: _loop(
                    "notifier", self.stop_event, self.notify_once, self.database, control=True
                ),
            ),
            ("wake", self._listen_wake),
        ]

    def shutdown(self) -> None:
        """Graceful drain: stop claiming, hand leadership over at once, finish or hand back work."""
        if self.draining:
            return
        extra = self._log_extra
        logger.info("draining: stop claiming, hand over leadership", extra=extra)
        self.hand_over()
        # This thread's connection may have died with a database outage long ago (the main
        # thread of runnode does no other database work): start the drain on a fresh one.
        connection.close()
        self._apply_term_events()  # the term row says "stepped down" before the process exits
        try:
            released = self.executor.release_unstarted()
        except Exception:
            logger.exception("handing back unstarted work failed", extra=extra)
            connection.close()
            released = 0
        finished = self.executor.wait_idle(self.config.grace_s)
        handed_back = 0 if finished else self.executor.hand_back_running()
        try:
            # Whatever this node still holds without tracking it (a batch that failed midway)
            # goes back too: a stopped node leaves nothing claimed behind.
            self.executor.reconcile(now=self._now() + timedelta(seconds=RECONCILE_AFTER_S))
        except Exception:
            logger.exception("final reconcile failed (the reaper will recover)", extra=extra)
        logger.info(
            "drained: %d unstarted handed back, %d running handed back",
            released,
            handed_back,
            extra=extra,
        )
        for attempt in range(STOP_MARK_ATTEMPTS):
            try:
                services.node_mark_stopped(node_id=self.config.node_id)
                break
            except Exception:
                logger.exception(
                    "could not mark the node stopped (attempt %d)", attempt + 1, extra=extra
                )
                connection.close()
                self.clock.sleep(STOP_MARK_BACKOFF_S)
        self.stop_event.set()
        self.executor.wake_starter()

    def hand_over(self) -> None:
        """The first step of a drain: stop claiming and leading, and let the others know at once.
        They see this node draining before its leases come free, so each counts it out of the
        nodes that share the partitions and takes its share of them now (not after the orphan
        rule's ORPHAN_AFTER_S)."""
        self.draining = True
        self.executor.claiming = False
        try:
            self.presence_once()
        except Exception:
            logger.exception("could not say draining in the presence", extra=self._log_extra)
        # Each term's end is recorded before its lease is released (_record_step_down). The
        # election thread is stopped only after these writes, since on its way out it releases
        # the leases.
        for seat in self.seats:
            self._record_step_down(seat)
        self._election_stop.set()
        self._election_poked.set()
        if self.release_leadership():
            # Followers campaign now instead of at their next retry (up to a retry period
            # later: 250 ms plus jitter by default).
            self._publish_wake(announce.LEASE_RELEASED)

    def release_leadership(self) -> bool:
        """Stop leading every partition and release their leases at once. True if any was still
        this node's and was released."""
        released = False
        for seat in self.seats:
            seat.leading.clear()
            try:
                released = seat.elector.release() or released
            except Exception:
                logger.exception(
                    "lease %s release failed (it will expire)",
                    seat.elector.name,
                    extra=self._log_extra,
                )
        return released

    def kill_switch(self) -> None:
        """Stop every loop without draining (tests simulating a crash use real SIGKILL instead)."""
        self._election_stop.set()
        self.elector.poke()
        self.stop_event.set()
        self.executor.wake_starter()

    def join(self, timeout: float = 5.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
        with contextlib.suppress(Exception):
            self.backend.close()
