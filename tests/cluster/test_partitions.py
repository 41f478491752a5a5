"""Scheduling partitions: which job is in which, the count's procedure, and on the deterministic
cluster every partition led by one node at a time, the partitions shared out, handed over on a
join, taken over after a death, and no fire twice or lost at those hand-overs."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from django.core.management.base import CommandError

from cluster import partitions
from cluster.models import ClusterFence, LeadershipTerm
from cluster.pace import SLOW_PATH
from jobs import partitioning, services
from jobs.models import Job, JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.sim import SimCluster

S = ExecutionStatus
JOBS = 24


# --- which job is in which partition ---------------------------------------------------------------


def test_a_jobs_partition_is_a_stable_function_of_its_name() -> None:
    names = [f"job-{i}" for i in range(4000)]
    for total in (1, 2, 8, 13):
        first = [partitioning.of_name(name, total) for name in names]
        assert first == [partitioning.of_name(name, total) for name in names]
        assert set(first) == set(range(total))
        if total > 1:
            # Even enough: no partition holds more than twice its fair share.
            assert max(Counter(first).values()) < 2 * len(names) / total
    assert partitioning.of_name("anything", 1) == 0


@pytest.mark.parametrize("bad", [0, -1, 257, 2.5, "4", True, None])
def test_a_bad_partition_count_is_refused_and_nothing_is_written(db, bad) -> None:
    with pytest.raises(ValueError, match="partition count"):
        partitioning.set_count(bad)
    assert partitioning.count(fresh=True) == 1


@pytest.mark.django_db
def test_jobs_are_created_renamed_and_moved_into_their_partition() -> None:
    partitioning.set_count(8)
    job = services.job_create(
        data={"name": "alpha", "task": "noop", "schedule_type": "interval", "interval_seconds": 5},
        by=services.SYSTEM,
    )
    assert job.partition == partitioning.of_name("alpha", 8)
    batch = services.jobs_create_batch(
        items=[
            {"name": f"b-{i}", "task": "noop", "schedule_type": "interval", "interval_seconds": 5}
            for i in range(40)
        ],
        by=services.SYSTEM,
    )
    stored = dict(Job.objects.filter(name__startswith="b-").values_list("name", "partition"))
    assert stored == {j.name: partitioning.of_name(j.name, 8) for j in batch}
    renamed = next(
        n for n in (f"r-{i}" for i in range(100)) if partitioning.of_name(n, 8) != job.partition
    )
    job = services.job_update(
        job_id=job.pk, expected_version=job.version, changes={"name": renamed}, by=services.SYSTEM
    )
    assert job.partition == partitioning.of_name(renamed, 8)

    moved = partitioning.set_count(3)
    assert moved > 0
    assert all(
        p == partitioning.of_name(name, 3)
        for name, p in Job.objects.values_list("name", "partition")
    )
    assert sum(partitioning.sizes(3).values()) == Job.objects.count()

    # A job written by a process that had not seen the count lowered is moved by the sweep.
    Job.objects.filter(pk=job.pk).update(partition=7)
    assert partitioning.misplaced(3) == 1
    assert Job.objects.get(pk=job.pk).partition == partitioning.of_name(renamed, 3)
    assert partitioning.misplaced(3) == 0


def test_the_share_covers_every_partition() -> None:
    for total in range(1, 20):
        for nodes in range(1, 12):
            assert partitions.share(total, nodes) * nodes >= total
            assert partitions.share(total, nodes) - 1 < total / nodes
    assert partitions.lease_name(0) == "scheduler-leader"  # one partition: today's names
    assert partitions.fence_name(0) == "leader"
    assert partitions.lease_name(3) != partitions.lease_name(0)


def test_a_partition_is_handed_back_only_to_a_node_with_room() -> None:
    # 4 partitions, 3 able nodes: a share is 2, the floor 1.
    assert partitions.gives_back(3, 4, 3, fewest_other=0)  # over its share, a taker in view
    assert partitions.gives_back(2, 4, 3, fewest_other=0)  # over the floor while one has none
    assert not partitions.gives_back(2, 4, 3, fewest_other=1)  # 2, 1, 1: settled
    assert not partitions.gives_back(3, 4, 3, fewest_other=2)  # nobody has room: keep it
    assert not partitions.gives_back(3, 4, 3, fewest_other=None)  # no other node in view
    assert partitions.gives_back(4, 4, 2, fewest_other=0)  # a node joined


# --- on the deterministic cluster --------------------------------------------------------------------


@pytest.fixture
def make_sim(monkeypatch):
    def make(node_ids=("n1", "n2", "n3"), *, total=4, jobs=JOBS, **config):
        partitioning.set_count(total)
        sim = SimCluster(node_ids, **config).patch_time(monkeypatch)
        made = [sim.create_job(name=f"p-{k}") for k in range(jobs)]
        assert len({j.partition for j in made}) == total
        return sim, made

    return make


def leaders(sim: SimCluster) -> dict[int, list[str]]:
    """Which live nodes lead each partition (recorded term, lease held)."""
    found: dict[int, list[str]] = {}
    for node in sim.nodes.values():
        if node.alive and not node.frozen:
            for partition in node.runner.led_partitions():
                found.setdefault(partition, []).append(node.node_id)
    return found


def settled(sim: SimCluster, total: int, nodes: list[str]) -> bool:
    led = leaders(sim)
    if sorted(led) != list(range(total)) or any(len(v) != 1 for v in led.values()):
        return False
    counts = Counter(v[0] for v in led.values())
    share = partitions.share(total, len(nodes))
    return set(counts) <= set(nodes) and all(counts[n] <= share for n in nodes)


def balanced(sim: SimCluster, total: int, nodes: list[str]) -> bool:
    """Settled, and every node leads at least the floor of its share."""
    if not settled(sim, total, nodes):
        return False
    counts = Counter(v[0] for v in leaders(sim).values())
    return all(counts[n] >= total // len(nodes) for n in nodes)


@pytest.mark.django_db(transaction=True)
def test_a_node_leading_every_partition_hands_its_extras_over_at_once(make_sim) -> None:
    """Eight partitions led by the one node that started first; two more nodes start: it hands
    the five beyond its share over in one step (the others have room for six), not one every
    HAND_BACK_EVERY_S (ten seconds and more before), and no fire runs twice meanwhile."""
    sim, jobs = make_sim(("n1",), total=8, jobs=32)
    sim.advance_until(lambda: settled(sim, 8, ["n1"]), limit=10)
    first = sim.clock.now() + 1
    sim.add("n2")
    sim.add("n3")
    took = sim.advance_until(lambda: balanced(sim, 8, ["n1", "n2", "n3"]), limit=30)
    assert took <= partitions.HAND_BACK_EVERY_S + 1, f"balanced after {took:.2f} s"
    sim.advance(3)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    assert_terms_held_once()


def test_a_node_hands_back_what_the_others_have_room_for() -> None:
    assert partitions.hand_back_count(8, 8, 3, room=6) == 5  # its share is 3
    assert partitions.hand_back_count(8, 8, 3, room=2) == 2  # the others take two more
    assert partitions.hand_back_count(8, 8, 3, room=0) == 1
    assert partitions.hand_back_count(2, 4, 3, room=1) == 1  # the floor rule: one at a time


def assert_each_slot_once(sim: SimCluster, jobs: list[Job], first: float, last: float) -> None:
    """Every slot in [first, last] of every job started exactly once."""
    for job in jobs:
        counts = Counter(e.scheduled_for.timestamp() for e in sim.starts(job))
        twice = {slot: n for slot, n in counts.items() if n > 1}
        assert not twice, f"{job.name} (partition {job.partition}) ran twice: {twice}"
        missing = [
            slot for slot in range(int(first), int(last) + 1) if counts.get(float(slot), 0) == 0
        ]
        assert not missing, f"{job.name} (partition {job.partition}) missed slots {missing}"


def assert_terms_held_once() -> None:
    """No term of a partition recorded twice, and each partition's fence at its newest term."""
    rows = list(LeadershipTerm.objects.values_list("partition", "term"))
    assert len(rows) == len(set(rows))
    for partition in {p for p, _ in rows}:
        newest = max(t for p, t in rows if p == partition)
        fence = ClusterFence.objects.get(name=partitions.fence_name(partition))
        assert fence.term == newest


@pytest.mark.django_db(transaction=True)
def test_the_partitions_are_shared_out_and_every_fire_runs_once(make_sim) -> None:
    sim, jobs = make_sim(total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1", "n2", "n3"]), limit=15)
    assert sim.leader() is not None  # partition 0's leader: the cluster's
    first = sim.clock.now() + 1
    sim.advance(6)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    # Each partition's fires were written under its own fence, by its own leader's term.
    for job in jobs:
        terms = set(
            JobExecution.objects.filter(job=job, trigger="schedule").values_list("term", flat=True)
        )
        open_terms = set(
            LeadershipTerm.objects.filter(partition=job.partition).values_list("term", flat=True)
        )
        assert terms <= open_terms
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_joining_node_is_handed_its_share_and_no_fire_runs_twice(make_sim) -> None:
    sim, jobs = make_sim(("n1",), total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1"]), limit=10)
    assert len(sim.nodes["n1"].runner.led_partitions()) == 4
    first = sim.clock.now() + 1
    sim.add("n2")
    sim.add("n3")
    took = sim.advance_until(lambda: balanced(sim, 4, ["n1", "n2", "n3"]), limit=20)
    # The extras go at once (two: the others have room for them); the floor rule's one move
    # more, if a joiner took both, comes a hand-back period later.
    assert took <= 2 * partitions.HAND_BACK_EVERY_S + 1
    led = Counter(v[0] for v in leaders(sim).values())
    assert led["n1"] <= 2 and led["n2"] >= 1 and led["n3"] >= 1
    sim.advance(4)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    ended = LeadershipTerm.objects.filter(node_id="n1", ended_at__isnull=False)
    assert ended.exists() and set(ended.values_list("end_reason", flat=True)) == {"stepped_down"}
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_dead_nodes_partitions_are_taken_over_at_lease_speed(make_sim) -> None:
    sim, jobs = make_sim(total=6)
    sim.advance_until(lambda: settled(sim, 6, ["n1", "n2", "n3"]), limit=15)
    victim = max(leaders(sim).items(), key=lambda kv: kv[0])[1][0]
    first = sim.clock.now() + 1
    sim.kill(victim)
    took = sim.advance_until(
        lambda: settled(sim, 6, [n for n in ("n1", "n2", "n3") if n != victim]), limit=15
    )
    assert took <= 3.5, f"the dead node's partitions were taken over after {took:.2f} s"
    sim.advance(4)
    # Fires of the dead node's partitions between its death and the takeover run late (run_once
    # catches up), none twice; runs it had claimed are lost with it, and say so.
    for job in jobs:
        counts = Counter(e.scheduled_for for e in sim.starts(job))
        assert max(counts.values()) == 1, f"{job.name} ran a slot twice: {counts}"
    lost = JobExecution.objects.filter(status=S.LOST)
    assert all(victim in r for r in lost.values_list("reason", flat=True))
    # From a second after the takeover, every slot of every job runs, once.
    assert_each_slot_once(sim, jobs, first + took + 1, sim.clock.now() - 1.5)
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_draining_nodes_partitions_are_taken_at_once_not_as_orphans(make_sim) -> None:
    """A node stopped gracefully says it is draining before its leases come free: the others
    count it out at once and take its partitions within a retry period, not after the orphan
    rule's ORPHAN_AFTER_S (a cached count that still had it was 0.8-0.9 s of a SIGTERM hand-over
    with eight partitions)."""
    sim, jobs = make_sim(total=8, jobs=32)
    sim.advance_until(lambda: balanced(sim, 8, ["n1", "n2", "n3"]), limit=20)
    sim.advance(1)  # every node's view of the others is current
    victim = Counter(v[0] for v in leaders(sim).values()).most_common(1)[0][0]
    rest = [n for n in ("n1", "n2", "n3") if n != victim]
    # Drained just after its presence was renewed: its next renewal, which would say so, is
    # a heartbeat interval away.
    runner = sim.nodes[victim].runner
    presence = next(loop for loop in sim.nodes[victim].loops if loop.name == "presence")
    beat = runner.config.heartbeat_interval_s
    sim.advance_until(lambda: presence.next_at - sim.clock.monotonic() > beat - 0.1, limit=3)
    first = began = sim.clock.now()
    sim.drain(victim)  # steps the clock until the node's running work has finished
    sim.advance_until(lambda: settled(sim, 8, rest), limit=10)
    took = sim.clock.now() - began
    retry = sim.nodes[rest[0]].runner.config.election.retry_period_ms / 1000
    assert took < partitions.ORPHAN_AFTER_S, f"taken over after {took:.2f} s (retry {retry} s)"
    sim.advance(3)
    assert_each_slot_once(sim, jobs, first + 1, sim.clock.now() - 1.5)
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_node_joining_while_another_dies_leaves_no_partition_unled(make_sim) -> None:
    sim, jobs = make_sim(("n1", "n2"), total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1", "n2"]), limit=15)
    sim.add("n3")
    sim.advance(0.3)
    sim.kill("n1")
    sim.advance_until(lambda: settled(sim, 4, ["n2", "n3"]), limit=15)
    first = sim.clock.now() + 1
    sim.advance(4)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    for job in jobs:
        counts = Counter(e.scheduled_for for e in sim.starts(job))
        assert max(counts.values()) == 1
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_partition_leader_frozen_during_a_rebalance_writes_nothing_when_it_resumes(
    make_sim,
) -> None:
    """n1 leads every partition; n2 and n3 join and n1 is frozen (SIGSTOP) while it hands over.
    Its leases expire, the others take every partition; thawed, n1's passes find newer terms in
    the partitions' fences and write nothing: no fire twice."""
    sim, jobs = make_sim(("n1",), total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1"]), limit=10)
    sim.add("n2")
    sim.add("n3")
    sim.advance(partitions.HAND_BACK_EVERY_S + 0.1)  # n1 has handed one partition over
    sim.freeze("n1")
    sim.advance_until(lambda: settled(sim, 4, ["n2", "n3"]), limit=15)
    first = sim.clock.now() + 1
    sim.advance(2)
    sim.thaw("n1")
    sim.advance(5)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    for job in jobs:
        counts = Counter(e.scheduled_for for e in sim.starts(job))
        assert max(counts.values()) == 1, f"{job.name} ran a slot twice: {counts}"
    assert_terms_held_once()
    assert settled(sim, 4, ["n1", "n2", "n3"]) or settled(sim, 4, ["n2", "n3"])


@pytest.mark.django_db(transaction=True)
def test_a_node_holding_its_claims_back_on_a_slow_path_is_handed_no_partition(make_sim) -> None:
    """A node joins on a database path too slow to claim (``cluster.pace`` holds its claims
    back, and its presence says so): the leader hands it no partition and it campaigns for none,
    so no partition waits for a leader that cannot record its term (a chaos run: 6.7 s without
    one). Once its path is quick again it is handed its share."""
    sim, jobs = make_sim(("n1",), total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1"]), limit=10)
    slow = sim.add("n2")
    slow.runner.executor.held_back = SLOW_PATH
    first = sim.clock.now() + 1
    for _ in range(int(3 * partitions.HAND_BACK_EVERY_S / 0.1)):
        sim.advance(0.1)
        assert settled(sim, 4, ["n1"]), f"partitions led: {leaders(sim)}"
    assert not LeadershipTerm.objects.filter(node_id="n2").exists()
    slow.runner.executor.held_back = None
    sim.advance_until(lambda: balanced(sim, 4, ["n1", "n2"]), limit=20)
    sim.advance(3)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_node_yielding_after_it_fell_behind_is_counted_out_of_the_shares(make_sim) -> None:
    """A node that handed its partitions over for falling behind does not campaign for a while;
    its path quick again, it claims and says nothing else is wrong. Counted in, it made each of
    the two others one over its share, and they handed a partition back and forth, unled for a
    moment at each pass (a chaos run: 5 s without a leader for one). Counted out, the two keep
    four each until it campaigns again, then it gets its share."""
    sim, jobs = make_sim(total=8, jobs=32)
    sim.advance_until(lambda: balanced(sim, 8, ["n1", "n2", "n3"]), limit=20)
    runner = sim.nodes["n3"].runner
    runner.pace._hand_over("a test's slow path", ("n1", 0.1))
    sim.advance_until(lambda: settled(sim, 8, ["n1", "n2"]), limit=10)
    terms = LeadershipTerm.objects.count()
    first = sim.clock.now() + 1
    while runner.pace.yielding():
        sim.advance(0.1)
        assert settled(sim, 8, ["n1", "n2"]), f"partitions led: {leaders(sim)}"
    assert LeadershipTerm.objects.count() == terms, "partitions changed hands meanwhile"
    sim.advance_until(lambda: balanced(sim, 8, ["n1", "n2", "n3"]), limit=30)
    sim.advance(2)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_a_node_cut_off_from_its_database_leads_no_partition(make_sim) -> None:
    sim, jobs = make_sim(total=4)
    sim.advance_until(lambda: settled(sim, 4, ["n1", "n2", "n3"]), limit=15)
    victim = leaders(sim)[1][0]
    sim.cut_database(victim)
    sim.advance_until(
        lambda: settled(sim, 4, [n for n in ("n1", "n2", "n3") if n != victim]), limit=15
    )
    first = sim.clock.now() + 1
    sim.advance(4)
    assert_each_slot_once(sim, jobs, first, sim.clock.now() - 1.5)
    assert_terms_held_once()


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_the_cli_say_who_leads_which_partition(make_sim, monkeypatch) -> None:
    import json

    from django.core.management import call_command

    from cluster import selectors
    from cluster.coordination.memory import MemoryBackend
    from dashboard.live.payloads import cluster_payload

    sim, jobs = make_sim(total=4)
    monkeypatch.setattr(selectors, "_backend", MemoryBackend(store=sim.store, clock=sim.clock))
    sim.advance_until(lambda: settled(sim, 4, ["n1", "n2", "n3"]), limit=15)
    sim.advance(4)  # the hand-overs are over, each leader has measured its partitions
    sim.advance_until(lambda: settled(sim, 4, ["n1", "n2", "n3"]), limit=15)
    led = {p: nodes[0] for p, nodes in leaders(sim).items()}
    monkeypatch.setattr(selectors, "_presence", (float("-inf"), {}))  # read the presence anew
    payload = cluster_payload()
    assert {p["partition"]: p["node_id"] for p in payload["partitions"]} == led
    for node in payload["nodes"]:
        assert node["leads"] == sorted(p for p, n in led.items() if n == node["node_id"])
    # Each leader measures its own partitions and says how far behind they are (none is).
    assert {p["partition"]: p["behind_s"] for p in payload["partitions"]} == dict.fromkeys(led, 0)
    assert all(node["leads_behind"] == {} for node in payload["nodes"])
    out = io.StringIO()
    call_command("partitions", "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["partitions"] == 4
    assert {row["partition"]: row["node"] for row in shown["leaders"]} == led
    assert sum(row["jobs"] for row in shown["leaders"]) == len(jobs)
    # Changing the count while nodes run is refused, and changes nothing.
    with pytest.raises(CommandError, match="stop every node first"):
        call_command("partitions", "--set", "2")
    with pytest.raises(CommandError, match="partition count"):
        call_command("partitions", "--set", "0")
    assert partitioning.count(fresh=True) == 4


@pytest.mark.django_db(transaction=True)
def test_a_node_that_sees_the_count_change_drains(make_sim, caplog) -> None:
    sim, _ = make_sim(("n1",), total=2)
    sim.advance_until(lambda: settled(sim, 2, ["n1"]), limit=10)
    partitioning.set_count(3)
    runner = sim.nodes["n1"].runner
    sim.advance(6)
    assert runner.draining
    assert "partition count changed from 2 to 3" in caplog.text
    # The drain (a thread of its own, as in a node) ends with every lease given back.
    sim.advance_until(runner.stop_event.is_set, limit=30)
    assert not any(seat.holds_lease for seat in runner.seats)


@pytest.mark.django_db
def test_behind_names_the_partition_of_the_most_overdue_fire_and_its_leader() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from cluster import behind

    partitioning.set_count(4)
    now = timezone.now()
    job = services.job_create(
        data={"name": "late", "task": "noop", "schedule_type": "interval", "interval_seconds": 5},
        by=services.SYSTEM,
    )
    Job.objects.filter(pk=job.pk).update(next_fire_at=now - timedelta(seconds=30))
    lag = behind.measure(now=now, threshold_s=5)
    assert (lag.partition, lag.partition_leader) == (job.partition, "")
    LeadershipTerm.objects.create(partition=job.partition, term=3, node_id="n9", acquired_at=now)
    lag = behind.measure(now=now, threshold_s=5)
    why = behind.reasons(lag, threshold_s=5, round_trip_s=None, served_queues=None)
    assert why[0].startswith(f"partition {job.partition}'s tick (led by n9): fires written 30")
    # One partition: the reason is the leader's, as it always was.
    partitioning.set_count(1)
    lag = behind.measure(now=now, threshold_s=5)
    assert lag.partition is None
    assert behind.reasons(lag, threshold_s=5, round_trip_s=None, served_queues=None)[0].startswith(
        "the leader's tick"
    )
