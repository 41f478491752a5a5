"""The node's own row: it rejoins after being declared dead, never brings back a row its own
shutdown marked stopped (a heartbeat in flight during a drain made a stopped node look alive
again), and a node started while its database or Redis cannot be reached waits for them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

from cluster import node as node_module
from cluster.coordination.memory import MemoryBackend
from cluster.executor.claimer import CLAIM_PASS_MIN_S
from cluster.models import NodeStatus, SchedulerNode
from cluster.node import NodeConfig, NodeRunner
from tests.cluster.harness import wait_for

ROOT = Path(__file__).resolve().parents[2]

# Transactional: waiting to register closes the connection between attempts.
pytestmark = pytest.mark.django_db(transaction=True)


def make_runner(node_id: str) -> NodeRunner:
    runner = NodeRunner(NodeConfig(node_id=node_id), backend=MemoryBackend())
    runner.register()
    return runner


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def status_of(node_id: str) -> str:
    return SchedulerNode.objects.get(node_id=node_id).status


def test_a_heartbeat_keeps_an_active_node_active() -> None:
    runner = make_runner("beat-a")
    runner.heartbeat_once()
    assert status_of("beat-a") == NodeStatus.ACTIVE


def test_a_node_declared_dead_rejoins_on_its_next_heartbeat() -> None:
    runner = make_runner("beat-b")
    SchedulerNode.objects.filter(node_id="beat-b").update(status=NodeStatus.DEAD)
    runner.heartbeat_once()
    assert status_of("beat-b") == NodeStatus.ACTIVE


def test_a_heartbeat_never_revives_a_row_marked_stopped() -> None:
    runner = make_runner("beat-c")
    # The drain wrote "stopped" while this heartbeat was on its way.
    SchedulerNode.objects.filter(node_id="beat-c").update(status=NodeStatus.STOPPED)
    runner.heartbeat_once()
    assert status_of("beat-c") == NodeStatus.STOPPED


def unreachable_for(monkeypatch, attempts: int) -> list[int]:
    """The database refuses the node's registration ``attempts`` times, then answers."""
    calls: list[int] = []
    real = SchedulerNode.objects.update_or_create

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= attempts:
            raise OperationalError("(2003, \"Can't connect to server on '127.0.0.1' (111)\")")
        return real(*args, **kwargs)

    monkeypatch.setattr(SchedulerNode.objects, "update_or_create", flaky)
    return calls


def test_a_node_started_during_an_outage_registers_once_it_ends(monkeypatch) -> None:
    monkeypatch.setattr(node_module, "REGISTER_RETRY_FIRST_S", 0.01)
    calls = unreachable_for(monkeypatch, attempts=3)
    runner = NodeRunner(NodeConfig(node_id="late-a"), backend=MemoryBackend())
    assert runner.register_when_reachable(threading.Event())
    assert len(calls) == 4
    assert status_of("late-a") == NodeStatus.ACTIVE


def test_a_stop_while_waiting_to_register_ends_the_wait(monkeypatch) -> None:
    unreachable_for(monkeypatch, attempts=10**6)
    runner = NodeRunner(NodeConfig(node_id="late-b"), backend=MemoryBackend())
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert not runner.register_when_reachable(stop)
    monkeypatch.undo()
    assert not SchedulerNode.objects.filter(node_id="late-b").exists()


@pytest.mark.integration
def test_runnode_started_without_its_database_waits_and_stops_cleanly(tmp_path) -> None:
    """A real ``runnode`` whose MariaDB cannot be reached: it logs that it waits, keeps waiting
    (it used to exit 1 with a traceback), and a SIGTERM ends it with status 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        {
            "DATABASE_URL": f"mysql://root@127.0.0.1:{closed_port()}/nowhere",
            "SCHEDULER_VAR_DIR": str(tmp_path),
            "SCHEDULER_COORDINATION": "database",
            "DJANGO_SECRET_KEY": "test-secret-key-for-runnode-without-a-database-0123456789",
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = tmp_path / "node.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runnode", "--node-id", "no-db"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: "cannot register yet" in log.read_text(), 30)
            time.sleep(1.0)
            assert process.poll() is None, log.read_text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "stopped before it could register" in log.read_text()


def test_a_node_removed_from_the_list_while_away_registers_again() -> None:
    runner = make_runner("beat-d")
    SchedulerNode.objects.filter(node_id="beat-d").delete()
    runner.heartbeat_once()
    assert status_of("beat-d") == NodeStatus.ACTIVE


def test_a_node_that_claims_nothing_for_a_reason_of_its_own_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Full (or unable to confirm its membership) for CLAIM_IDLE_LOG_S: one warning naming the
    reason and what fills the node, then again only after another CLAIM_IDLE_LOG_S; nothing while
    there is simply nothing due."""
    from cluster.clock import SettableClock

    clock = SettableClock()
    runner = NodeRunner(
        NodeConfig(node_id="idle-a", capacity=2), backend=MemoryBackend(clock=clock), clock=clock
    )
    runner.register()
    runner.presence_once()
    caplog.set_level("WARNING", logger="cluster.node")

    def idle_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "claiming nothing" in r.getMessage()]

    for _ in range(8):
        runner.claim_once()  # nothing due: no warning, however long
        clock.advance(1.0)
        runner.presence_once()
    assert runner.executor.idle_reason == "nothing due"
    assert idle_warnings() == []
    runner.executor.books.claimed.update({1, 2})  # two claims tracked: full
    for _ in range(12):
        runner.claim_once()
        clock.advance(1.0)
        runner.presence_once()
    warnings = idle_warnings()
    assert len(warnings) == 2, warnings
    assert "full (capacity 2, load 2, claimed 2" in warnings[0]
    runner.executor.books.claimed.clear()
    clock.advance(10.0)  # the presence is no longer confirmed
    for _ in range(7):
        runner.claim_once()
        clock.advance(1.0)
    assert "membership unconfirmed" in idle_warnings()[-1]


def test_a_drained_leader_records_its_step_down_while_it_still_holds_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The election thread releases the lease on its way out; stopped before the term's end was
    written, it let the next leader close the term first and call it "lease lost" (a CI failure
    of test_sigterm_leader_hands_over_at_once_and_exits_zero on SQLite, whose writers queue)."""
    from cluster.models import LeadershipTerm, TermEndReason

    runner = make_runner("step-a")
    runner.elector.tick()
    runner.leader_once()
    term = runner.term
    assert term is not None and runner.is_leader
    election = threading.Thread(target=runner.elector.run, args=(runner._election_stop,))
    election.start()
    holders: list[str | None] = []
    record_term_end = runner._record_term_end

    def slow_record(lease: Any, reason: str) -> None:
        time.sleep(0.3)  # a write queued behind another node's: the election thread runs meanwhile
        current = runner.backend.current_lease(node_module.LEASE_NAME)
        holders.append(current.holder if current else None)
        record_term_end(lease, reason)

    monkeypatch.setattr(runner, "_record_term_end", slow_record)
    runner.shutdown()
    runner.stop_event.set()
    election.join(5)
    assert not election.is_alive()
    assert holders[0] == "step-a"  # the first call writes; later ones find it recorded
    assert LeadershipTerm.objects.get(term=term).end_reason == TermEndReason.STEPPED_DOWN
    assert runner.backend.current_lease(node_module.LEASE_NAME) is None


def test_an_outage_leaves_the_row_owed_until_the_heartbeat_writes_it() -> None:
    """The node tells its executor's ``NodeRow`` of each outage its database watcher judges, and
    its heartbeat's write is the row's write (what admissions and body starts wait for)."""
    from cluster.dbhealth import Reachability

    runner = make_runner("owed")
    SchedulerNode.objects.filter(node_id="owed").update(
        last_heartbeat=runner._now() - timedelta(hours=1)
    )
    runner._database_changed(Reachability(False, "cut", 0.0))
    assert runner.executor.row.owed
    runner.heartbeat_once()
    assert not runner.executor.row.owed
    beat = SchedulerNode.objects.get(node_id="owed").last_heartbeat
    assert (runner._now() - beat).total_seconds() < 60


def test_a_lease_released_message_makes_the_node_count_the_nodes_again_at_once() -> None:
    """A node that drains or gives partitions back says so on the wake-up channel: the others
    count the live nodes again then, not when their cached count runs out (the clock here never
    moves, so only the message can renew it)."""
    from cluster import announce
    from cluster.clock import SettableClock

    clock = SettableClock(time.time())
    backend = MemoryBackend(clock=clock)
    runner = NodeRunner(NodeConfig(node_id="counts"), backend=backend, clock=clock)
    assert runner._balance_view()[0] == 1  # alone
    backend.heartbeat("joined", 60_000, {"leads": []})
    assert runner._balance_view()[0] == 1  # the cached count

    listener = threading.Thread(target=runner._listen_wake, daemon=True)
    listener.start()
    try:
        wait_for(
            lambda: (
                backend.publish(announce.WAKE_CHANNEL, announce.LEASE_RELEASED)
                or runner._balance_view()[0] == 2
            ),
            5,
        )
    finally:
        runner.stop_event.set()
        listener.join(5)


def test_admissions_are_watched_with_bounds_and_a_cut_off_node_counts_how_long() -> None:
    """The node hands its executor the scope its admissions run in (its database's watcher, with
    the bounded work thread's limits) and how long it has been cut off from its database (0 while
    it answers)."""
    from cluster import dbhealth

    runner = NodeRunner(NodeConfig(node_id="wired"), backend=MemoryBackend())
    with runner.executor.starter.watch():
        assert dbhealth._local.health is runner.database
        assert dbhealth._local.control is False
        assert dbhealth._local.limit_s == dbhealth.bounded_limit_s(runner.database.limit_s)
    assert runner.executor.database_cut_for() == 0.0


def test_claim_passes_run_with_the_bounded_work_limits(monkeypatch) -> None:
    """The claim loop's statements are bounded as admissions' are: one that no answer comes back
    to fails within seconds, not after the driver's default read timeout."""
    from cluster import dbhealth

    runner = NodeRunner(NodeConfig(node_id="bounded-claims"), backend=MemoryBackend())
    seen: list[tuple[object, bool, float | None]] = []

    def claim_once() -> float:
        seen.append((dbhealth._local.health, dbhealth._local.control, dbhealth._local.limit_s))
        runner.stop_event.set()
        return 0.0

    monkeypatch.setattr(runner, "claim_once", claim_once)
    claim_loop = dict(runner.loops())["claim"]
    thread = threading.Thread(target=claim_loop, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    bound = dbhealth.bounded_limit_s(runner.database.limit_s)
    assert seen == [(runner.database, False, bound)]


# --- a loop's wait after a pass (the claim loop's spacing) -----------------------------------------


def timed_wait(delay: float, least: float, *, woken: bool) -> tuple[float, bool]:
    """How long ``wait_after_pass`` waited, and whether the wake-up was left set after it."""
    stop, wake = threading.Event(), threading.Event()
    if woken:
        wake.set()  # new runs came during the pass
    began = time.monotonic()
    node_module.wait_after_pass(delay, least, stop=stop, wake=wake)
    return time.monotonic() - began, wake.is_set()


def test_a_wake_up_during_the_spacing_waits_for_it_and_is_then_taken() -> None:
    took, left = timed_wait(5.0, 0.2, woken=True)
    assert 0.2 <= took < 4.0  # not at once, not the whole delay
    assert not left


def test_without_spacing_a_wake_up_is_taken_at_once() -> None:
    took, left = timed_wait(5.0, 0.0, woken=True)
    assert took < 1.0
    assert not left


def test_a_pass_that_asks_for_no_wait_gets_none_whatever_the_spacing() -> None:
    took, left = timed_wait(0.0, 5.0, woken=True)
    assert took < 1.0
    assert left  # kept for the next pass's own wait


def test_the_stop_ends_the_spacing() -> None:
    stop, wake = threading.Event(), threading.Event()
    stop.set()
    began = time.monotonic()
    node_module.wait_after_pass(5.0, 5.0, stop=stop, wake=wake)
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize(
    ("claimers", "spacing", "poll"),
    [(0, 0.05, 0.1), (1, 0.05, 0.1), (4, 0.05, 0.1), (8, 0.1, 0.2), (10, 0.125, 0.25)],
)
def test_claim_passes_are_spaced_by_how_many_nodes_claim(
    claimers: int, spacing: float, poll: float
) -> None:
    assert node_module.claim_pace(claimers, 0.1) == pytest.approx((spacing, poll))


def test_a_longer_claim_poll_of_its_own_is_kept() -> None:
    assert node_module.claim_pace(10, 2.0) == pytest.approx((0.125, 2.0))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("others", "took", "spacing", "wait"),
    [
        # Took less than it had room for: the claimer asks for its next pass CLAIM_PASS_MIN_S
        # on, no sooner than the spacing.
        (0, 3, 0.05, 0.05),
        (9, 3, 0.125, 0.125),
        # Found nothing: the poll.
        (0, 0, 0.05, 0.1),
        (9, 0, 0.125, 0.25),
    ],
)
def test_a_node_among_many_claimers_claims_and_polls_less_often(
    others: int, took: int, spacing: float, wait: float, monkeypatch
) -> None:
    backend = MemoryBackend()
    for index in range(others):
        backend.heartbeat(f"other-{index}", 60_000, {})
    # One that claims nothing (its path too slow) is not counted.
    backend.heartbeat("held-back", 60_000, {"claims_held_back": True})
    runner = NodeRunner(NodeConfig(node_id="spacing"), backend)

    def claim() -> int:
        claimer = runner.executor.claimer
        claimer.idle_reason = None if took else "nothing due"
        claimer.next_claim_in = CLAIM_PASS_MIN_S if took else None
        return took

    monkeypatch.setattr(runner.executor, "claim_once", claim)
    assert runner.claim_once() == pytest.approx(wait)
    assert runner.claim_spacing_s == pytest.approx(spacing)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reason", "spaced"), [(None, True), ("nothing due", True), ("full", False)]
)
def test_a_claim_pass_is_spaced_only_when_it_read_the_queue_and_found_less_than_room(
    reason: str | None, spaced: bool, monkeypatch
) -> None:
    runner = NodeRunner(NodeConfig(node_id="spacing"), MemoryBackend())
    monkeypatch.setattr(runner.executor, "claim_once", lambda: 0)
    runner.executor.claimer.idle_reason = reason
    runner.claim_once()
    assert runner.claim_spacing_s == (node_module.CLAIM_SPACING_S if spaced else 0.0)
