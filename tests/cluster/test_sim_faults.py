"""Faults on the deterministic in-process cluster (``tests/cluster/sim.py``): real nodes (elector,
membership, leader work, reaper, executor) on the real database, one settable clock, no sleeps. A
fault lands at the exact instant chosen (a slot, 0.1 s before it, inside the prepare window), which
real processes can only aim at. A few of these stay as real-process tests too (test_fault_windows,
test_failover), for what needs real signals and sockets."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from cluster.admission import REASON_FORBID, REASON_MISFIRE_STALE
from cluster.coordination.memory import MemoryBackend
from cluster.executor import PREPARE_AHEAD_S
from cluster.models import LeadershipTerm, NodeStatus, SchedulerNode
from cluster.pace import OVERRUN_S, SLOW_PATH
from jobs import services
from jobs.firing import (
    REASON_MISFIRE_BEYOND_BOUND,
    REASON_MISFIRE_COALESCED,
    REASON_MISFIRE_SKIPPED,
)
from jobs.models import Job, JobExecution
from jobs.states import TERMINAL_STATES, ExecutionStatus
from tests.cluster.faults_helpers import dump, rows
from tests.cluster.sim import SimCluster

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_sim(monkeypatch):
    def make(node_ids=("n1", "n2", "n3"), **config):
        return SimCluster(node_ids, **config).patch_time(monkeypatch)

    return make


S = ExecutionStatus
# The product's defaults: a dead node is reaped 2 s after its last renewal, a leader replaced
# within 3 s.
DEAD_AFTER_S = 2.0


def advance_to(sim: SimCluster, instant: float) -> None:
    sim.advance(instant - sim.clock.now())


def next_slot(sim: SimCluster, every: int = 1, *, after: float = 0.5) -> float:
    """The first epoch-aligned slot at least ``after`` seconds ahead."""
    now = sim.clock.now()
    slot = (int(now) // every + 1) * every
    while slot - now < after:
        slot += every
    return float(slot)


def effects_by_slot(sim: SimCluster, job: Job) -> Counter:
    return Counter(effect.scheduled_for for effect in sim.starts(job))


def assert_every_slot_accounted(job: Job, first: float, last: float) -> None:
    """Every slot in [first, last] has its row, and a row that did not succeed says why."""
    by_slot = defaultdict(list)
    for row in rows(job):
        by_slot[row["scheduled_for"].timestamp()].append(row)
    slot = first
    while slot <= last:
        found = by_slot.get(slot)
        assert found, f"slot {slot} of {job.name} has no row: {dump(job)}"
        for row in found:
            if row["status"] != S.SUCCEEDED:
                assert row["status"] in TERMINAL_STATES, f"{row} left {row['status']}"
                assert row["reason"], f"{row} ended {row['status']} without a reason"
        slot += 1


# --- the leader SIGKILLed at the worst instants ---------------------------------------------------


@pytest.mark.parametrize("before_slot", [0.0, 0.1, PREPARE_AHEAD_S / 2, 0.5])
def test_sigkill_of_the_leader_near_a_slot_loses_only_its_runs_in_flight(make_sim, before_slot):
    """Ten 1 s jobs with the defaults (forbid, run_once, no retries) on three nodes; the leader is
    killed ``before_slot`` seconds before a whole second (0.1 s: its runs of that slot are marked
    running, their bodies not started). The new leader takes over within 3 s, no slot runs twice,
    and the fires lost are only those in flight, each ended with a reason."""
    sim = make_sim()
    jobs = [sim.create_job(name=f"tick-{k}") for k in range(10)]
    sim.advance(3)
    victim = sim.leader()
    assert victim is not None
    slot = next_slot(sim, after=1.0)
    advance_to(sim, slot - before_slot)
    in_flight = JobExecution.objects.filter(node=victim, status=S.RUNNING).count()
    sim.kill(victim)
    killed_at = sim.clock.now()
    took = sim.advance_until(lambda: sim.leader() not in (None, victim), limit=10)
    assert took <= 3.0, f"takeover took {took:.2f} s"
    sim.advance(8)

    end = sim.clock.now()
    lost = JobExecution.objects.filter(status=S.LOST)
    assert lost.count() <= in_flight + len(jobs)
    assert all(victim in reason for reason in lost.values_list("reason", flat=True))
    gaps = []
    for job in jobs:
        counts = effects_by_slot(sim, job)
        assert max(counts.values()) == 1, f"a slot of {job.name} ran twice: {counts}"
        starts = sorted(effect.at for effect in sim.starts(job))
        gaps += [b - a for a, b in pairwise(starts)]
        first = min(row["scheduled_for"] for row in rows(job)).timestamp()
        assert_every_slot_accounted(job, first, end - 2)
        # Nothing started by the dead node after it died.
        assert not [e for e in sim.starts(job) if e.node == victim and e.at > killed_at]
    assert max(gaps) <= 3.0, f"a job went {max(gaps):.2f} s without a run"
    # The bodies take no time: no run was ever active at another's due instant, so a forbid skip
    # could only come from believing a dead node's row (or its expiring lock).
    skips = JobExecution.objects.filter(status=S.SKIPPED, reason=REASON_FORBID)
    assert not skips.exists(), list(skips.values_list("job__name", "scheduled_for"))


@pytest.mark.parametrize("before_slot", [0.05, 0.2])
def test_a_leader_killed_before_an_instant_holds_none_of_its_runs_while_others_have_room(
    make_sim, before_slot
):
    """The leader claims runs not yet due only 0.35 s ahead, the others 0.75 s: with room on the
    others, a leader killed inside the prepare window holds none of the slot's runs. Nothing is
    lost, and the runs of the slots after, claimed by the others, run on time though there is no
    leader for about two seconds."""
    sim = make_sim()
    jobs = [sim.create_job(name=f"tick-{k}") for k in range(10)]
    sim.advance(3)
    victim = sim.leader()
    assert victim is not None
    slot = next_slot(sim, after=1.0)
    advance_to(sim, slot - before_slot)
    assert not JobExecution.objects.filter(node=victim, status__in=[S.PENDING, S.RUNNING]).exists()
    sim.kill(victim)
    sim.advance(6)

    assert not JobExecution.objects.filter(status=S.LOST).exists()
    for job in jobs:
        starts = sorted(effect.at for effect in sim.starts(job))
        gaps = [b - a for a, b in pairwise(starts)]
        assert max(gaps) <= 1.5, f"{job.name} went {max(gaps):.2f} s without a run"


def test_a_leader_frozen_past_its_lease_is_fenced_and_starts_nothing_taken_from_it(make_sim):
    """SIGSTOP of the leader for 6 s (three leases), then SIGCONT, with retries on: its runs were
    declared lost and retried elsewhere; on resume it starts none of them, writes nothing with its
    old term, and the term moved on."""
    sim = make_sim()
    jobs = [
        sim.create_job(name=f"retry-{k}", max_retries=1, retry_backoff_base=0) for k in range(6)
    ]
    sim.advance(3)
    victim = sim.leader()
    slot = next_slot(sim, after=1.0)
    advance_to(sim, slot - 0.1)  # its runs of the slot are prepared, not started
    sim.freeze(victim)
    frozen_at = sim.clock.now()
    sim.advance(6)
    new_leader = sim.leader()
    assert new_leader not in (None, victim)
    sim.thaw(victim)
    sim.advance(4)

    lost = {
        row.pk: row.finished_at.timestamp()
        for row in JobExecution.objects.filter(node=victim, status=S.LOST)
    }
    for job in jobs:
        for effect in sim.starts(job):
            if effect.execution_id in lost:
                assert effect.at < frozen_at, f"a body started after its run was lost: {effect}"
        assert max(effects_by_slot(sim, job).values()) == 1
    terms = list(LeadershipTerm.objects.order_by("term").values_list("term", "node_id"))
    assert len({term for term, _ in terms}) == len(terms)
    assert terms[-1][1] != victim or len(terms) >= 3
    old_term = max(term for term, node in terms if node == victim and term < terms[-1][0])
    # (A retry carries its fire's term; the leader's own writes are the scheduled fires.)
    late = JobExecution.objects.filter(
        term=old_term, trigger="schedule", created_at__gt=datetime.fromtimestamp(frozen_at, tz=UTC)
    )
    assert not late.exists(), "the frozen leader wrote with its old term after resuming"


# --- a node partitioned from its database ---------------------------------------------------------


@pytest.mark.parametrize(("before_slot", "partition_s"), [(0.0, 8.0), (0.1, 30.0), (0.5, 8.0)])
def test_a_leader_cut_off_from_its_database_hands_over_and_the_jobs_keep_their_pace(
    make_sim, before_slot, partition_s
):
    """The leader loses its database (not the coordination store) at or near a slot, for 8 s or
    30 s: it stops leading and releases its lease at once (it can still reach it), another node
    takes over within the renew deadline, and every job keeps running about once a second; the
    cut node does not campaign until its database answers again. Before, it kept renewing its
    lease and the cluster started no scheduled run for the whole partition."""
    sim = make_sim()
    jobs = [sim.create_job(name=f"tick-{k}") for k in range(6)]
    sim.advance(3)
    victim = sim.leader()
    assert victim is not None
    advance_to(sim, next_slot(sim, after=1.0) - before_slot)
    sim.cut_database(victim)
    cut_at = sim.clock.now()
    took = sim.advance_until(lambda: sim.leader() not in (None, victim), limit=10)
    assert took <= 1.5 + 0.5, f"takeover took {took:.2f} s"
    assert not sim.nodes[victim].runner.database.state.reachable
    sim.advance(partition_s - took)
    assert sim.leader() != victim, "a node cut off from its database campaigned"
    sim.heal(victim)
    sim.advance(4)

    assert sim.nodes[victim].runner.database.state.reachable
    for job in jobs:
        assert max(effects_by_slot(sim, job).values()) == 1
        starts = sorted(effect.at for effect in sim.starts(job) if effect.at >= cut_at - 1.5)
        gaps = [b - a for a, b in pairwise(starts)]
        assert max(gaps) <= 3.0, f"{job.name} went {max(gaps):.2f} s without a run"
        first = min(row["scheduled_for"] for row in rows(job)).timestamp()
        assert_every_slot_accounted(job, first, sim.clock.now() - 2)
    ended = LeadershipTerm.objects.filter(node_id=victim).exclude(ended_at=None).get()
    assert ended.end_reason == "unable"  # the next leader saw why in its presence


def test_a_worker_cut_off_from_its_database_never_campaigns_when_the_leader_dies(make_sim):
    sim = make_sim()
    sim.create_job(name="tick")
    sim.advance(3)
    leader = sim.leader()
    worker = next(n for n in sim.nodes if n != leader)
    sim.cut_database(worker)
    sim.advance(1)
    sim.kill(leader)
    sim.advance(6)
    assert sim.leader() not in (None, worker, leader)
    sim.heal(worker)
    sim.advance(1)
    assert sim.nodes[worker].runner.database.state.reachable


@pytest.mark.parametrize("before_slot", [0.1, PREPARE_AHEAD_S / 2, 0.0])
def test_a_worker_cut_off_from_its_database_gives_its_work_up_and_the_jobs_keep_their_pace(
    make_sim, before_slot
):
    """A worker loses its database (it still reaches the coordination store, so its presence
    lives on) while it holds claims and runs marked running ahead of their instant: no body starts
    there, the leader takes its work from what its presence says (claims back to the queue,
    refused runs handed back), and every job keeps its pace; the worker is not declared dead.
    Before, its claims and rows stayed its own for the whole partition and those jobs stalled."""
    sim = make_sim()
    jobs = [
        sim.create_job(name=f"tick-{k}", concurrency_policy="forbid", kwargs={"seconds": 0.3})
        for k in range(6)
    ]
    sim.advance(3)
    leader = sim.leader()
    worker = next(n for n in sim.nodes if n != leader)
    advance_to(sim, next_slot(sim, after=1.0) - before_slot)
    held = JobExecution.objects.filter(node=worker, status__in=[S.PENDING, S.RUNNING]).count()
    sim.cut_database(worker)
    cut_at = sim.clock.now()
    sim.advance(15)
    during = {job.pk: [e.at for e in sim.starts(job) if e.at >= cut_at] for job in jobs}
    # A body may start in the moment before the worker notices (its first refused statement, or
    # a control call unanswered past its bound); none after.
    noticed = cut_at + 1.5
    assert not [e for job in jobs for e in sim.starts(job) if e.node == worker and e.at > noticed]
    assert SchedulerNode.objects.get(node_id=worker).status == NodeStatus.ACTIVE
    sim.heal(worker)
    sim.advance(4)

    assert held, "the worker held nothing when it was cut off: the test proves nothing"
    for job in jobs:
        assert max(effects_by_slot(sim, job).values()) == 1
        starts = sorted([cut_at - 1.0, *during[job.pk]])
        gaps = [b - a for a, b in pairwise(starts)]
        assert max(gaps) <= 4.0, f"{job.name} went {max(gaps):.2f} s without a run: {dump(job)}"
        ordered = sorted(sim.starts(job), key=lambda e: e.at)
        for earlier, later in pairwise(ordered):
            assert later.at - earlier.at >= 0.3, f"bodies overlapped: {earlier} / {later}"
        first = min(row["scheduled_for"] for row in rows(job)).timestamp()
        assert_every_slot_accounted(job, first, sim.clock.now() - 2)


def _slow_path(sim: SimCluster, node_id: str, seconds: float) -> None:
    """The node's usual database round trip is ``seconds`` (the sim's calls take no time)."""
    sim.nodes[node_id].runner.database.round_trip_s = lambda: seconds


def _slow_leader(make_sim, leader_s: float, peers_s: float) -> tuple[SimCluster, str]:
    """A cluster leading one job whose leader's round trip is ``leader_s``, its peers'
    ``peers_s``, every presence carrying its own."""
    sim = make_sim()
    sim.create_job(name="tick")
    sim.advance(3)
    leader = sim.leader()
    assert leader is not None
    for node_id in sim.nodes:
        _slow_path(sim, node_id, leader_s if node_id == leader else peers_s)
    sim.advance(1)  # every presence carries its round trip
    return sim, leader


def _handed_over(sim: SimCluster, leader: str) -> None:
    assert sim.leader() not in (None, leader)
    ended = LeadershipTerm.objects.filter(node_id=leader).exclude(ended_at=None).get()
    assert ended.end_reason == "fell_behind"


@pytest.mark.parametrize(("peers_s", "hands_over"), [(0.001, True), (0.25, False)])
def test_a_leader_that_falls_behind_on_a_slow_path_of_its_own_hands_over(
    make_sim, peers_s, hands_over
):
    """A leader whose ticks keep beginning after their slots, with a database round trip far
    slower than its peers', hands leadership over (term ended "fell_behind") and does not campaign
    again for a while; when every node's path is as slow (the database itself), it stays."""
    sim, leader = _slow_leader(make_sim, 0.25, peers_s)
    runner = sim.nodes[leader].runner
    for _ in range(3):
        runner.pace.judge_tick(1.4)
    sim.advance(2)

    if not hands_over:
        assert sim.leader() == leader
        return
    _handed_over(sim, leader)
    sim.kill(sim.leader())
    sim.advance(5)
    assert sim.leader() not in (None, leader)  # the third node: the slow one holds back
    sim.advance(10)
    assert sim.leader() is not None


@pytest.mark.parametrize(
    ("floor_s", "peers_s", "hands_over"),
    [
        (0.25, 0.001, True),  # a slow link: every call of the pass is slow
        (0.002, 0.001, False),  # a long pass of quick calls (a big batch): not the path
        (0.25, 0.25, False),  # every node as slow: the database itself
    ],
)
def test_a_leader_pass_that_overruns_on_a_slow_path_hands_over_mid_pass(
    make_sim, floor_s, peers_s, hands_over
):
    """A leader pass still running OVERRUN_S after it began, whose quickest database call since is
    far slower than a peer's usual round trip, hands over at once (the database watch sees it),
    not after BEHIND_TICKS late passes."""
    sim, leader = _slow_leader(make_sim, floor_s, peers_s)
    runner = sim.nodes[leader].runner
    runner.database.fastest_since = lambda since: floor_s
    runner.pace.pass_began = runner.clock.monotonic() - (OVERRUN_S - 0.2)
    runner.watch_database_once()
    assert not runner.pace.yielding()  # not yet past OVERRUN_S
    runner.pace.pass_began = runner.clock.monotonic() - (OVERRUN_S + 0.1)
    runner.watch_database_once()
    assert runner.pace.yielding() is hands_over
    runner.pace.pass_began = None
    sim.advance(1)
    if not hands_over:
        assert sim.leader() == leader
        return
    _handed_over(sim, leader)


@pytest.mark.parametrize(("peers_s", "steps_back"), [(0.001, True), (0.25, False)])
def test_a_worker_on_a_slow_path_of_its_own_steps_back_from_claiming_and_comes_back(
    make_sim, peers_s, steps_back
):
    """A worker whose every database call is far slower than a peer's claims nothing and hands
    back the claims it has not started (a claim it cannot start in time holds a forbid job's
    later fires behind it); once its path is quick again it claims again. When every node is as
    slow (the database itself), it keeps claiming."""
    sim = make_sim()
    jobs = [
        sim.create_job(name=f"tick-{k}", concurrency_policy="forbid", kwargs={"seconds": 0.3})
        for k in range(6)
    ]
    sim.advance(3)
    leader = sim.leader()
    slow = next(n for n in sim.nodes if n != leader)
    runner = sim.nodes[slow].runner
    for node_id in sim.nodes:
        _slow_path(sim, node_id, 0.25 if node_id == slow else peers_s)
    sim.advance(1)  # every presence carries its round trip
    assert [e for job in jobs for e in sim.starts(job) if e.node == slow], "slow node ran nothing"
    runner.database.fastest_since = lambda since: 0.25
    slowed_at = sim.clock.now()
    sim.advance(4)

    on_slow = [
        e for job in jobs for e in sim.starts(job) if e.node == slow and e.at > slowed_at + 1
    ]
    if not steps_back:
        assert runner.executor.held_back is None
        assert on_slow, "a node as fast as its peers stopped claiming"
        return
    assert runner.executor.held_back == SLOW_PATH
    assert not on_slow, f"the slow node still started runs: {on_slow}"
    assert not JobExecution.objects.filter(node=slow, status=S.PENDING).exclude(claim_token=None)
    for job in jobs:  # the others took its share: no slot went without its run
        first = min(row["scheduled_for"] for row in rows(job)).timestamp()
        assert_every_slot_accounted(job, first, sim.clock.now() - 2)
        starts = sorted(e.at for e in sim.starts(job) if e.at > slowed_at)
        gaps = [b - a for a, b in pairwise(starts)]
        assert max(gaps) <= 2.0, f"{job.name} went {max(gaps):.2f} s without a run: {dump(job)}"

    del runner.database.fastest_since  # the instance's own again: the sim's calls take no time
    _slow_path(sim, slow, 0.001)
    healed_at = sim.clock.now()
    sim.advance(4)
    assert runner.executor.held_back is None
    assert [e for job in jobs for e in sim.starts(job) if e.node == slow and e.at > healed_at]


@pytest.mark.parametrize(("peers_s", "hands_over"), [(0.001, True), (0.25, False)])
def test_a_leader_whose_every_call_is_slow_hands_over_though_no_pass_overruns(
    make_sim, peers_s, hands_over
):
    """A leader on a slow link of its own (0.375 s a call, against a peer's 1 ms) whose passes are
    short enough never to overrun, and whose ticks are not yet late BEHIND_TICKS in a row, hands
    leadership over at the claim judgement that steps it back from claiming; with every node as
    slow it leads on."""
    sim, leader = _slow_leader(make_sim, 0.375, peers_s)
    runner = sim.nodes[leader].runner
    runner.database.fastest_since = lambda since: 0.375
    sim.advance(1)
    assert runner.pace.yielding() is hands_over
    sim.advance(1)
    if not hands_over:
        assert sim.leader() == leader
        return
    _handed_over(sim, leader)


# --- a worker SIGKILLed mid-run -------------------------------------------------------------------


def test_a_sigkilled_worker_run_is_lost_and_retried_on_another_worker(make_sim):
    sim = make_sim(["lead"])
    job = sim.create_manual_job(
        name="slow-once",
        queue="slow",
        kwargs={"seconds": 30},
        max_retries=1,
        retry_backoff_base=0,
        retry_jitter=False,
    )
    sim.add("w1", queues=["slow"])
    sim.advance(1)
    first = services.job_trigger(job_id=job.pk, by=services.SYSTEM, now=sim.now())
    sim.advance_until(lambda: len(sim.starts(job)) == 1, limit=5)
    assert JobExecution.objects.get(pk=first.pk).node == "w1"
    sim.kill("w1")
    sim.add("w2", queues=["slow"])
    took = sim.advance_until(
        lambda: JobExecution.objects.filter(job=job, attempt=2, status=S.RUNNING).exists(),
        limit=10,
    )
    assert took <= DEAD_AFTER_S + 1.5, f"the retry started {took:.2f} s after the kill"
    lost = JobExecution.objects.get(pk=first.pk)
    assert lost.status == S.LOST and "w1" in lost.reason
    retry = JobExecution.objects.get(job=job, attempt=2)
    assert (retry.node, retry.trigger, retry.scheduled_for) == ("w2", "retry", first.scheduled_for)
    assert [(e.execution_id, e.node) for e in sim.starts(job)] == [
        (first.pk, "w1"),
        (retry.pk, "w2"),
    ]
    assert SchedulerNode.objects.get(node_id="w1").status == NodeStatus.DEAD


# --- forbid ---------------------------------------------------------------------------------------


def test_a_forbid_job_longer_than_its_interval_never_overlaps(make_sim):
    sim = make_sim()
    job = sim.create_job(name="long-forbid", kwargs={"seconds": 2.5}, concurrency_policy="forbid")
    sim.advance(12)
    starts = sorted(sim.starts(job), key=lambda e: e.at)
    assert len(starts) >= 3
    for earlier, later in pairwise(starts):
        assert later.at - earlier.at >= 2.5, f"bodies overlapped: {earlier} / {later}"
    assert max(effects_by_slot(sim, job).values()) == 1
    skipped = JobExecution.objects.filter(job=job, status=S.SKIPPED)
    assert skipped.filter(reason=REASON_FORBID).count() >= 4
    assert not skipped.exclude(reason=REASON_FORBID).exists(), dump(job)
    # A skip is justified: a body was running at the skipped fire's due instant.
    for row in skipped:
        due = row.scheduled_for.timestamp()
        assert [e for e in starts if e.at <= due < e.at + 2.5], f"unjustified skip: {row}"


@pytest.mark.parametrize("frozen_s", [2.5, 3.2, 6.0])
def test_a_body_frozen_past_its_lock_is_declared_lost_before_a_successor_starts(make_sim, frozen_s):
    """A node frozen inside a forbid body longer than the job lock's TTL: the lock lapses while the
    row still says running (a chaos run found the successor starting beside it). The successor
    waits until the frozen node is declared gone and its run ended lost (indeterminate), then
    starts; no slot runs twice. (Capacity 1: the frozen node cannot hold the next fires' claims
    too, so other nodes run them.)"""
    sim = make_sim(capacity=1)
    job = sim.create_job(name="frozen-body", kwargs={"seconds": 0.6}, concurrency_policy="forbid")
    sim.advance(3)
    slot = next_slot(sim, after=1.0)
    advance_to(sim, slot + 0.05)
    frozen = JobExecution.objects.get(
        job=job, scheduled_for=datetime.fromtimestamp(slot, tz=UTC), status=S.RUNNING
    )
    victim = sim.nodes[frozen.node].runner
    lock = victim.executor.books.active[frozen.pk].lock
    # The worst instant: inside the body, after a presence renewal that came after the job lock
    # was taken and before the lock's first extension. The lock then lapses before the presence:
    # for a moment the lock is free while the node still counts as present.
    ttl_less_margin = victim.membership.ttl_s - victim.membership.margin_s
    sim.advance_until(
        lambda: victim.membership._confirmed_until - ttl_less_margin > lock.handle.acquired_at,
        limit=0.6,
    )
    assert lock.handle.extensions == 0 and frozen.pk in victim.executor.books.active
    sim.freeze(frozen.node)
    frozen_at = sim.clock.now()
    sim.advance(frozen_s)
    sim.thaw(frozen.node)
    sim.advance(4)
    frozen.refresh_from_db()
    assert frozen.status == S.LOST, dump(job)
    successors = [e for e in sim.starts(job) if frozen_at < e.at]
    assert successors, dump(job)
    # (In the same step at the earliest: the admission that ends it lost then starts its own.)
    lost_at = frozen.finished_at.timestamp() - 0.001  # stored to the microsecond
    assert all(e.at >= lost_at for e in successors), dump(job)
    assert max(effects_by_slot(sim, job).values()) == 1


def _long_body_on_a_worker(sim: SimCluster, name: str) -> tuple[Job, JobExecution]:
    """A forbid job of 9 s bodies, and the first of its runs whose body runs on a node that does
    not lead (the one a test cuts off)."""
    job = sim.create_job(name=name, kwargs={"seconds": 9.0}, concurrency_policy="forbid")
    sim.advance(2)
    for _ in range(40):
        sim.advance(0.5)
        running = JobExecution.objects.filter(job=job, status=S.RUNNING).first()
        if running is not None and running.node != sim.leader() and running.started_at:
            return job, running
    raise AssertionError(f"no body of {name} ran on a worker: {dump(job)}")


def test_a_body_running_on_a_worker_cut_off_from_its_database_does_not_hold_its_job(make_sim):
    """A forbid body runs on (stuck in a write, say) on a worker cut off from its database, which
    still reaches the coordination store and so stays present. Past the dead threshold the worker
    gives the body's job lock up and names the run in its presence, the leader ends it lost, and
    the job's next fire starts on another node, only after that: within the lease's bound of the
    cut, not when the body ends. Before, the body held its job for as long as it ran (the chaos
    runs' slow recoveries after a database partition of one worker)."""
    sim = make_sim(capacity=1)
    job, stuck = _long_body_on_a_worker(sim, "stuck-body")
    worker = sim.nodes[stuck.node].runner
    sim.cut_database(stuck.node)
    cut_at = sim.clock.now()
    sim.advance(6)
    assert worker.executor.released_ids() == [stuck.pk]  # named until its outcome is written
    presence = MemoryBackend(store=sim.store, clock=sim.clock).live_nodes()[stuck.node]
    assert presence["released"] == [stuck.pk] and stuck.pk not in presence.get("bodies", [])
    sim.heal(stuck.node)
    sim.advance(6)

    stuck.refresh_from_db()
    assert stuck.status == S.LOST, dump(job)
    successors = [e for e in sim.starts(job) if e.at > cut_at]
    assert successors, dump(job)
    first = min(e.at for e in successors)
    # The presence lives DEAD_AFTER_S: the lock is given up that long after the worker noticed,
    # the run ended at the leader's next reap, the successor started at its next look.
    assert first - cut_at <= DEAD_AFTER_S + 2.0, f"{first - cut_at:.2f} s: {dump(job)}"
    assert first >= stuck.finished_at.timestamp() - 0.001, dump(job)
    assert all(e.node != stuck.node for e in successors if e.at < cut_at + 9.0)
    assert max(effects_by_slot(sim, job).values()) == 1
    assert worker.executor.released_ids() == []  # its outcome written (refused: ended lost)


def test_a_given_up_body_whose_database_answers_again_first_is_waited_for(make_sim):
    """The worst instant for the give-up: the worker's database answers again just after the
    worker gave a running body's lock up, before the leader ended the run. The run is then
    recorded by its node when its body returns, and no later run of the job starts beside that
    body unless the cluster had ended the run lost first (the body's node did not end it early,
    as "lock lost", while the body ran: a review found that path)."""
    sim = make_sim(capacity=1)
    job, stuck = _long_body_on_a_worker(sim, "given-up")
    worker = sim.nodes[stuck.node].runner
    sim.cut_database(stuck.node)
    sim.advance_until(lambda: worker.executor.released_ids() == [stuck.pk], limit=6)
    sim.heal(stuck.node)
    sim.advance(12)

    stuck.refresh_from_db()
    body = next(e for e in sim.starts(job) if e.execution_id == stuck.pk)
    body_end = body.at + 9.0
    beside = [e for e in sim.starts(job) if body.at < e.at < body_end]
    if stuck.status == S.LOST:
        assert all(e.at >= stuck.finished_at.timestamp() - 0.001 for e in beside), dump(job)
    else:
        assert stuck.status == S.SUCCEEDED and not beside, dump(job)
    assert max(effects_by_slot(sim, job).values()) == 1
    assert worker.executor.released_ids() == []


def test_run_all_catch_up_runs_of_a_forbid_job_run_one_after_the_other(make_sim):
    """A leader outage left next_fire_at in the past: run_all creates two catch-up runs of a forbid
    job whose bodies last 0.2 s; the second starts after the first ended, within the grace."""
    sim = make_sim(["a0"])
    job = sim.create_job(
        name="run-all-forbid",
        interval_seconds=2,
        kwargs={"seconds": 0.2},
        misfire_policy="run_all",
        run_all_max=2,
        misfire_grace_seconds=1,
        concurrency_policy="forbid",
        enabled=False,
    )
    sim.advance(2)
    odd = next_slot(sim, 2, after=1.0) + 1
    advance_to(sim, odd + 0.15)
    Job.objects.filter(pk=job.pk).update(
        enabled=True, next_fire_at=datetime.fromtimestamp(odd - 9, tz=UTC)
    )
    sim.advance(4)
    dump(job)
    catch_up = [r for r in rows(job) if r["scheduled_for"].timestamp() <= odd + 0.15]
    ran = [r for r in catch_up if r["reason"] != REASON_MISFIRE_BEYOND_BOUND]
    assert [r["scheduled_for"].timestamp() for r in ran] == [odd - 3, odd - 1]
    assert {r["status"] for r in ran} == {S.SUCCEEDED}
    assert len(catch_up) - len(ran) >= 2
    first, second = sorted(sim.starts(job), key=lambda e: e.at)[:2]
    assert second.at >= first.at + 0.2


# --- misfires after the whole cluster was down ----------------------------------------------------

MISFIRE_POLICIES = {
    "run_once": REASON_MISFIRE_COALESCED,
    "skip": REASON_MISFIRE_SKIPPED,
    "run_all": REASON_MISFIRE_BEYOND_BOUND,
}
RUN_ALL_MAX = 2
OUTAGE_S = 5.0


def test_misfire_policies_after_the_whole_cluster_was_down(make_sim):
    """One node runs three 1 s jobs (a misfire policy each, grace 1 s) and is drained right after
    the leader created their next fires ahead; the cluster stays down OUTAGE_S; a new node leads.
    Each policy runs what it says for the missed slots, the fires created ahead are skipped as
    stale, and the schedule goes on on time; no slot runs twice."""
    sim = make_sim(["m1"])
    jobs = {
        policy: sim.create_job(
            name=f"misfire-{policy}",
            misfire_policy=policy,
            misfire_grace_seconds=1,
            run_all_max=RUN_ALL_MAX,
            concurrency_policy="allow",
        )
        for policy in MISFIRE_POLICIES
    }
    sim.advance(3.5)  # the fires of the next whole second are created ahead (look-ahead 1 s)
    first_term = LeadershipTerm.objects.get().term
    stopped_at = sim.clock.now()
    ahead = JobExecution.objects.filter(
        status=S.PENDING, scheduled_for__gt=datetime.fromtimestamp(stopped_at, tz=UTC)
    )
    assert ahead.count() >= 3
    sim.drain("m1")
    sim.advance(OUTAGE_S)
    sim.add("m2")
    sim.advance(4)
    second_term = LeadershipTerm.objects.order_by("-term").first().term
    assert second_term > first_term
    for policy, reason in MISFIRE_POLICIES.items():
        job = jobs[policy]
        dump(job)
        counts = effects_by_slot(sim, job)
        assert max(counts.values()) == 1
        # The new leader's first tick recorded the misfires; its "now" is their finished_at.
        misfired = [r for r in rows(job) if r["term"] == second_term and r["reason"] == reason]
        assert misfired, f"{policy}: no misfire recorded"
        tick_now = min(r["finished_at"] for r in misfired)
        missed = [
            r for r in rows(job) if r["term"] == second_term and r["scheduled_for"] <= tick_now
        ]
        assert len(missed) >= 3, missed
        expected = {"run_once": 1, "skip": 0, "run_all": min(RUN_ALL_MAX, len(missed))}[policy]
        ran = [r for r in missed if r["status"] != S.SKIPPED]
        assert ran == missed[len(missed) - expected :], f"{policy}: ran {ran}"
        assert all(r["status"] == S.SUCCEEDED for r in ran)
        assert all(r["reason"] == reason for r in missed if r not in ran)
        for r in missed:
            assert counts[r["scheduled_for"]] == (1 if r in ran else 0)
        # The fires created ahead by the first term were missed too: skipped as stale, never run.
        stale = [
            r
            for r in rows(job)
            if r["term"] == first_term and r["scheduled_for"].timestamp() > stopped_at
        ]
        assert stale
        for r in stale:
            assert r["status"] == S.SKIPPED and r["reason"] == REASON_MISFIRE_STALE.format(grace=1)
            assert counts[r["scheduled_for"]] == 0
        on_time = [
            r
            for r in rows(job)
            if tick_now < r["scheduled_for"] <= sim.now() - timedelta(seconds=1)
        ]
        assert on_time and all(r["status"] == S.SUCCEEDED and not r["reason"] for r in on_time)


# --- drain ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("before_slot", [PREPARE_AHEAD_S / 2, 0.01, PREPARE_AHEAD_S + 0.05])
def test_a_drain_inside_the_prepare_window_orphans_nothing(make_sim, before_slot):
    """buffer_one, 0.5 s bodies: the leader is drained ``before_slot`` seconds before a slot it
    has claimed. Nothing of the job is left pending or running on the drained node, and the slot
    runs once (there, or on another node after the hand-back)."""
    sim = make_sim(["b0", "b1"])
    job = sim.create_job(
        name="buffer-drain",
        interval_seconds=2,
        kwargs={"seconds": 0.5},
        concurrency_policy="buffer_one",
    )
    sim.advance(3)
    leader = sim.leader()
    slot = next_slot(sim, 2, after=1.0)
    advance_to(sim, slot - before_slot)
    sim.drain(leader)
    assert SchedulerNode.objects.get(node_id=leader).status == NodeStatus.STOPPED
    assert not JobExecution.objects.filter(
        job=job, node=leader, status__in=[S.PENDING, S.RUNNING]
    ).exists(), dump(job)
    sim.advance(5)
    counts = effects_by_slot(sim, job)
    assert max(counts.values()) == 1
    assert counts[datetime.fromtimestamp(slot, tz=UTC)] == 1, dump(job)
    assert sim.leader() != leader
