"""Behind schedule is loud: the leader's two lags read from the database (fires not yet written,
due runs not yet claimed), one WARNING saying how far and why, one INFO on catching up, the gauges,
the readiness text, the presence the dashboard reads; and, on the deterministic cluster, a queue no
live node serves found and named, then cleared when a node serving it joins."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest

from cluster import behind, node_metrics, selectors
from cluster.behind import BehindWatch, Lag, measure, reasons
from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend
from cluster.dbhealth import DatabaseHealth
from cluster.membership import Membership
from dashboard.live.payloads import cluster_payload
from jobs import services
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.sim import SimCluster
from tests.cluster.test_node_metrics import get, sample

NODE = "behind-node"
NOW = datetime(2026, 12, 6, 8, 0, 0, tzinfo=UTC)
S = ExecutionStatus


@pytest.fixture
def metrics() -> Iterator[node_metrics.NodeMetrics]:
    yield node_metrics.enable(NODE)
    node_metrics.disable()


def _job(name: str, *, next_fire_at: datetime | None, queue: str = "default") -> Job:
    job = services.job_create(
        data={
            "name": name,
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "queue": queue,
        },
        by=services.SYSTEM,
        now=NOW - timedelta(hours=1),
    )
    Job.objects.filter(pk=job.pk).update(next_fire_at=next_fire_at)
    return job


def _run(job: Job, *, due: datetime, claimed: bool = False, status: str = S.PENDING) -> None:
    JobExecution.objects.create(
        job=job,
        scheduled_for=due,
        run_after=due,
        queue=job.queue,
        status=status,
        claim_token="n9-1" if claimed else None,
    )


# --- what is read -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_lags_are_the_earliest_unwritten_fire_and_the_oldest_unclaimed_due_run():
    _job("on-time", next_fire_at=NOW + timedelta(seconds=3))
    _job("late", next_fire_at=NOW - timedelta(seconds=12))
    reports = _job("reports", next_fire_at=NOW + timedelta(seconds=60), queue="reports")
    _run(reports, due=NOW - timedelta(seconds=30))
    _run(reports, due=NOW - timedelta(seconds=7))
    _run(reports, due=NOW - timedelta(seconds=2))  # due, not yet past the threshold
    _run(reports, due=NOW - timedelta(seconds=90), claimed=True)  # a node has it
    _run(reports, due=NOW - timedelta(seconds=95), status=S.RUNNING)
    _run(reports, due=NOW + timedelta(seconds=20))  # not due

    lag = measure(now=NOW, threshold_s=5.0)

    assert lag == Lag(fires_s=12.0, claims_s=30.0, waiting=2, queue="reports")


@pytest.mark.django_db
def test_a_cluster_that_keeps_up_has_no_lag():
    job = _job("on-time", next_fire_at=NOW + timedelta(seconds=1))
    _run(job, due=NOW + timedelta(seconds=1))  # written ahead, as a leader that keeps up does
    _run(job, due=NOW - timedelta(seconds=40), claimed=True)
    assert measure(now=NOW, threshold_s=5.0) == Lag()


@pytest.mark.django_db
def test_the_read_of_unclaimed_runs_is_bounded(monkeypatch):
    """However long the backlog, at most SAMPLE_LIMIT unclaimed runs are read: the oldest of the
    first queue are among them, so the lag found is still the oldest's."""
    monkeypatch.setattr(behind, "SAMPLE_LIMIT", 3)
    job = _job("backlog", next_fire_at=NOW + timedelta(seconds=60))
    for age in (50, 40, 30, 20, 10):
        _run(job, due=NOW - timedelta(seconds=age))
    lag = measure(now=NOW, threshold_s=5.0)
    assert (lag.claims_s, lag.waiting) == (50.0, 3)


# --- what is said -----------------------------------------------------------------------------------


def test_the_reasons_name_the_tick_the_claims_an_unserved_queue_and_a_slow_database():
    lag = Lag(fires_s=12.4, claims_s=31.0, waiting=212, queue="reports")
    assert reasons(
        lag, threshold_s=5.0, round_trip_s=0.041, served_queues={"default": "active"}
    ) == [
        "the leader's tick: fires written 12.4 s after they were due",
        "claims: 212 due runs in queue 'reports' waiting unclaimed, the oldest 31.0 s",
        "no live node serves queue 'reports'",
        "the database: a round trip takes 41 ms from the leader",
    ]
    assert reasons(
        lag, threshold_s=5.0, round_trip_s=0.002, served_queues={"reports": "active"}
    ) == [
        "the leader's tick: fires written 12.4 s after they were due",
        "claims: 212 due runs in queue 'reports' waiting unclaimed, the oldest 31.0 s",
    ]
    assert reasons(Lag(fires_s=1.0), threshold_s=5.0, round_trip_s=None, served_queues={}) == []


@pytest.mark.parametrize(
    ("served", "said"),
    [
        ({"reports": "active", "default": "dead"}, None),
        ({"reports": "draining"}, "every node that serves queue 'reports' is draining"),
        (
            {"reports": "dead"},
            "every node that serves queue 'reports' is declared dead (missed heartbeats: "
            "stopped, paused, starved of CPU or cut off)",
        ),
        ({"default": "active"}, "no live node serves queue 'reports'"),
    ],
)
def test_a_queue_whose_nodes_are_dead_or_draining_is_not_called_unserved(served, said):
    lag = Lag(claims_s=31.0, waiting=3, queue="reports")
    why = reasons(lag, threshold_s=5.0, round_trip_s=None, served_queues=served)
    assert why[1:] == ([said] if said else [])


@pytest.mark.django_db
def test_served_queues_name_the_liveliest_state_of_their_nodes():
    from cluster.models import NodeStatus, SchedulerNode

    rows = [
        ("a", NodeStatus.DEAD, ["default", "reports"]),
        ("b", NodeStatus.ACTIVE, ["default"]),
        ("c", NodeStatus.DRAINING, ["reports", "gpu"]),
        ("d", NodeStatus.STOPPED, ["archive"]),
        ("e", NodeStatus.DEAD, ["mail"]),
    ]
    for node_id, status, queues in rows:
        SchedulerNode.objects.create(
            node_id=f"served-{node_id}",
            hostname="h",
            pid=1,
            status=status,
            queues=queues,
            started_at=NOW,
            last_heartbeat=NOW,
        )
    assert selectors.served_queues() == {
        "default": "active",
        "reports": "draining",
        "gpu": "draining",
        "mail": "dead",
    }


def test_one_warning_on_falling_behind_one_info_on_catching_up(metrics, caplog):
    clock = SettableClock(1_800_000_000.0)
    watch = BehindWatch(
        node_id=NODE, clock=clock, threshold_s=5.0, served_queues=lambda: {"default": "active"}
    )
    caplog.set_level(logging.INFO, logger="cluster.behind")

    def said() -> list[tuple[int, str]]:
        found = [(r.levelno, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return found

    watch.judge(Lag(fires_s=4.9))
    assert said() == [] and watch.state is None

    watch.judge(Lag(fires_s=6.0))
    assert said() == [
        (
            logging.WARNING,
            "behind schedule by 6.0 s: the leader's tick: fires written 6.0 s after they were due",
        )
    ]
    assert watch.state is not None
    assert watch.state["fires_s"] == 6 and watch.state["since"] == 1_800_000_000.0
    assert behind.describe(watch.state) == (
        "behind schedule (fires 6 s, claims 0 s): the leader's tick: fires written 6.0 s after "
        "they were due"
    )

    for seconds, lag in ((1, 9.0), (1, 20.0), (1, 3.0)):  # worse, then under the threshold
        clock.advance(seconds)
        watch.judge(Lag(fires_s=lag, claims_s=lag, waiting=4, queue="default"))
    assert said() == []  # said once; still behind at 3 s (more than half the threshold)
    assert watch.state is not None and watch.state["claims_s"] == 3

    text = generate_latest(metrics.registry).decode()
    assert sample(text, f'scheduler_node_behind_seconds{{node="{NODE}",part="claims"}}') == 3.0
    assert sample(text, f'scheduler_node_due_runs_waiting{{node="{NODE}"}}') == 4.0

    clock.advance(1)
    watch.judge(Lag(fires_s=2.4))
    assert said() == [
        (logging.INFO, "caught up with the schedule after 4.0 s behind (at worst 20.0 s)")
    ]
    assert watch.state is None
    watch.judge(Lag())
    assert said() == []

    watch.judge(Lag(claims_s=8.0, waiting=1, queue="gpu"))  # a new episode is said again
    [(level, message)] = said()
    assert level == logging.WARNING and "no live node serves queue 'gpu'" in message

    watch.caught_up(leading=False)  # leadership lost: the next leader measures, nothing said
    assert said() == [] and watch.state is None
    text = generate_latest(metrics.registry).decode()
    assert sample(text, f'scheduler_node_behind_seconds{{node="{NODE}",part="claims"}}') == 0.0


def test_readiness_names_the_lag_and_stays_200(metrics):
    clock = SettableClock()
    membership = Membership(MemoryBackend(clock=clock), NODE, ttl_s=60.0, clock=clock)
    membership.renew({})
    health = DatabaseHealth(node_id=NODE, limit_s=1.0, clock=clock)
    watch = BehindWatch(node_id=NODE, clock=clock, threshold_s=5.0)
    app = node_metrics.app(
        metrics,
        tracked=dict,
        capacity=1,
        member=membership.confirmed,
        database=health.observe,
        behind=lambda: behind.describe(watch.state),
    )
    server = node_metrics.serve(app, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/health/ready"
        assert get(url) == (200, "member; database reachable\n")
        watch.judge(Lag(fires_s=7.0))
        assert get(url) == (
            200,
            "member; database reachable; behind schedule (fires 7 s, claims 0 s): the leader's "
            "tick: fires written 7.0 s after they were due\n",
        )
    finally:
        server.shutdown()


# --- on the deterministic cluster ------------------------------------------------------------------


@pytest.fixture
def make_sim(monkeypatch):
    def make(node_ids=("n1",), **config):
        sim = SimCluster(node_ids, **config).patch_time(monkeypatch)
        # The web's reads of the presence go to the cluster's own store.
        monkeypatch.setattr(selectors, "_backend", MemoryBackend(store=sim.store, clock=sim.clock))
        return sim

    return make


def _frame(monkeypatch) -> dict:
    """The live feed's cluster frame, the presence read afresh (the web caches it for 1 s)."""
    monkeypatch.setattr(selectors, "_presence", (-selectors.PRESENCE_CACHE_S - 1e9, {}))
    return cluster_payload()


@pytest.mark.django_db(transaction=True)
def test_a_queue_no_node_serves_is_found_named_and_cleared(make_sim, caplog, monkeypatch):
    """A job in a queue no node serves: its runs are written on time but nobody claims them. The
    leader says so once, naming the queue; its presence carries the lag to the dashboard's cluster
    frame; a node that serves the queue joins, drains the backlog, and the leader says it caught
    up."""
    caplog.set_level(logging.INFO, logger="cluster.behind")
    sim = make_sim(("n1",))
    sim.advance(1.0)
    assert sim.leader() == "n1"
    sim.create_job(name="report", queue="reports", concurrency_policy="allow")

    sim.advance(7.0)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("behind schedule by 5.")
    assert "due runs in queue 'reports' waiting unclaimed" in warnings[0]
    assert "no live node serves queue 'reports'" in warnings[0]
    state = sim.nodes["n1"].runner.behind.state
    assert state is not None and state["fires_s"] == 0  # the tick keeps up; the claims do not
    sim.advance(0.5)  # a presence renewal carries it
    frame = _frame(monkeypatch)
    assert frame["leader"] == "n1"
    assert frame["behind"] is not None and frame["behind"]["claims_s"] >= 5
    assert "no live node serves queue 'reports'" in frame["behind"]["why"]

    sim.add("w2", queues=["reports"])
    sim.advance(6.0)

    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("caught up with the schedule after ") for m in infos), infos
    assert sim.nodes["n1"].runner.behind.state is None
    assert not JobExecution.objects.filter(
        status=S.PENDING, claim_token__isnull=True, run_after__lt=sim.now() - timedelta(seconds=1)
    ).exists()
    sim.advance(0.5)
    assert _frame(monkeypatch)["behind"] is None


# --- each partition leader's own partitions ---------------------------------------------------------


def _in_partition(job: Job, partition: int) -> None:
    Job.objects.filter(pk=job.pk).update(partition=partition)


@pytest.mark.django_db
def test_a_partitions_lag_is_its_own_earliest_unwritten_fire():
    on_time = _job("p-on-time", next_fire_at=NOW + timedelta(seconds=2))
    late = _job("p-late", next_fire_at=NOW - timedelta(seconds=9))
    later = _job("p-later", next_fire_at=NOW - timedelta(seconds=4))
    elsewhere = _job("p-elsewhere", next_fire_at=NOW - timedelta(seconds=60))
    for job, partition in ((on_time, 1), (late, 2), (later, 2), (elsewhere, 3)):
        _in_partition(job, partition)
    Job.objects.filter(pk=elsewhere.pk).update(enabled=False)  # a paused job is not behind

    assert behind.partition_lags([1, 2, 3, 4], now=NOW) == {1: 0.0, 2: 9.0, 3: 0.0, 4: 0.0}


def test_a_node_says_once_which_of_its_partitions_are_behind_and_when_they_catch_up(
    metrics, caplog
):
    """One WARNING naming the partitions behind and by how much, one INFO once they are all under
    half the threshold; a gauge per partition led, gone when the partition is led elsewhere; the
    state the presence carries and the readiness line."""
    caplog.set_level(logging.INFO, logger="cluster.behind")
    clock = SettableClock(NOW.timestamp())
    watch = behind.PartitionWatch(node_id=NODE, clock=clock, threshold_s=5.0)

    def said() -> list[tuple[int, str]]:
        found = [(r.levelno, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return found

    watch.judge({1: 0.0, 3: 2.0})
    assert said() == [] and watch.describe() == ""
    watch.judge({1: 0.0, 3: 7.4})
    ((level, message),) = said()
    assert level == logging.WARNING
    assert "partition 3 by 7.4 s" in message and "partition 1" not in message
    assert watch.state == {"1": 0, "3": 7}
    assert behind.partitions_line(watch.describe()).startswith(
        "partitions led here behind schedule: partition 3 by 7.4 s"
    )
    text = generate_latest(metrics.registry).decode()
    assert sample(text, f'scheduler_partition_behind_seconds{{node="{NODE}",partition="3"}}') == 7.4
    watch.judge({1: 0.0, 3: 6.0})
    watch.judge({1: 0.0, 3: 3.0})  # under the threshold, not yet under half of it
    assert said() == []
    watch.judge({1: 0.0, 3: 2.0})
    ((level, message),) = said()
    assert level == logging.INFO and "caught up" in message and "at worst 7.4 s" in message
    watch.judge({1: 0.0})  # partition 3 is led elsewhere now: its series goes
    text = generate_latest(metrics.registry).decode()
    assert 'partition="3"' not in text
    assert sample(text, f'scheduler_partition_behind_seconds{{node="{NODE}",partition="1"}}') == 0.0
    watch.forget()  # a measure failed (the database): nothing stale is shown
    assert watch.state == {} and "scheduler_partition_behind_seconds{" not in (
        generate_latest(metrics.registry).decode()
    )
    watch.judge({5: 9.0})
    said()
    watch.judge({})  # the partition behind was handed over
    ((level, message),) = said()
    assert level == logging.INFO and "handed over" in message


@pytest.mark.django_db
def test_the_overview_shows_how_far_behind_each_partition_is(monkeypatch):
    """The cluster frame takes each partition's lag from its leader's presence: the partitions
    entry says it, and the leading node's card lists those a second or more behind."""
    from cluster.models import LeadershipTerm, SchedulerNode
    from jobs import partitioning

    monkeypatch.setattr(partitioning, "count", lambda fresh=False: 2)
    from django.utils import timezone

    now = timezone.now()
    for node_id in ("pa", "pb"):
        SchedulerNode.objects.create(
            node_id=node_id, hostname="h", pid=1, started_at=now, last_heartbeat=now
        )
    LeadershipTerm.objects.create(term=1, node_id="pa", partition=0, acquired_at=now)
    LeadershipTerm.objects.create(term=1, node_id="pb", partition=1, acquired_at=now)
    presence = {
        "pa": {"leads": [0], "partition_lag": {"0": 0}},
        "pb": {"leads": [1], "partition_lag": {"1": 12}},
    }
    monkeypatch.setattr(selectors, "_live_presence", lambda: presence)

    frame = cluster_payload()

    assert [(p["partition"], p["behind_s"]) for p in frame["partitions"]] == [(0, 0), (1, 12)]
    cards = {n["node_id"]: n for n in frame["nodes"]}
    assert cards["pa"]["leads_behind"] == {} and cards["pb"]["leads_behind"] == {"1": 12}
