"""A node keeps its database's time: a step of the machine's clock moves nothing it computes, the
offset is read from the database now and then, and a clock far off is logged once each way."""

from __future__ import annotations

import logging
import time

import pytest

from cluster import timesync
from cluster.clock import ReferenceClock, SettableClock
from cluster.timesync import (
    CLOCK_STALE_S,
    CLOCK_SYNC_S,
    FIRST_READING_MAX_RTT_S,
    TimeKeeper,
    database_time,
)


class SteppableClock(SettableClock):
    """A machine clock an operator can step (the wall moves, the monotonic clock does not)."""

    def step(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def test_a_step_of_the_machine_clock_moves_nothing_between_readings() -> None:
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    machine.advance(2.0)
    assert clock.now() == pytest.approx(1_002.0)
    machine.step(-6.0)  # someone sets the machine's clock back
    assert clock.now() == pytest.approx(1_002.0)
    machine.advance(1.0)
    assert clock.now() == pytest.approx(1_003.0)


def test_a_reading_sets_the_time_and_reports_the_offset() -> None:
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    machine.step(-6.0)  # the machine is 6 s behind the database
    sent = machine.monotonic()
    machine.advance(0.02)
    offset = clock.sync(1_000.02 - 0.01, sent_mono=sent, received_mono=machine.monotonic())
    # The server read its clock half-way through the round trip.
    assert offset == pytest.approx(6.0)
    assert clock.now() == pytest.approx(1_000.02)


def test_the_keeper_reads_the_database_clock_and_warns_once_each_way(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    server = {"offset": 0.0}
    monkeypatch.setattr(timesync, "database_time", lambda: machine.now() + server["offset"])
    keeper = TimeKeeper("n1", clock)
    caplog.set_level(logging.INFO, logger="cluster.timesync")
    assert keeper.maybe_sync()
    assert not keeper.maybe_sync()  # not due again before CLOCK_SYNC_S
    server["offset"] = 4.0  # the machine's clock was stepped 4 s back
    machine.advance(CLOCK_SYNC_S)
    assert keeper.maybe_sync()
    assert clock.now() == pytest.approx(machine.now() + 4.0)
    machine.advance(CLOCK_SYNC_S)
    keeper.maybe_sync()  # still off: no second warning
    server["offset"] = 0.0
    machine.advance(CLOCK_SYNC_S)
    keeper.maybe_sync()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == ["WARNING", "INFO"], messages
    assert "-4.000 s off the database's" in messages[0][1]


@pytest.mark.django_db
def test_the_database_clock_is_the_servers() -> None:
    # SQLite is a file on this machine; MariaDB answers with its own clock (same machine here).
    assert abs(database_time() - time.time()) < 1.0


def test_a_reading_with_a_long_round_trip_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request held by a link and answered at once, 0.15 s later, would put the node's time
    75 ms ahead: that reading is not used; a quick one is."""
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    keeper = TimeKeeper("n1", clock)
    monkeypatch.setattr(timesync, "database_time", lambda: machine.now() + 3.0)
    assert keeper.maybe_sync()  # the first reading
    machine.advance(CLOCK_SYNC_S)

    def held() -> float:
        machine.advance(0.15)  # the request waited on the link; the server answers at once
        return machine.now() + 5.0

    monkeypatch.setattr(timesync, "database_time", held)
    assert not keeper.maybe_sync()
    assert clock.now() == pytest.approx(machine.now() + 3.0)
    machine.advance(CLOCK_SYNC_S)
    monkeypatch.setattr(timesync, "database_time", lambda: machine.now() + 5.0)
    assert keeper.maybe_sync()
    assert clock.now() == pytest.approx(machine.now() + 5.0)


def test_a_slow_path_s_readings_do_not_make_themselves_typical(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A link slowed for a while: every reading over it is dropped, however many there are (the
    round trips of dropped readings used to become the typical one, and the next slow reading was
    used, its error up to half its round trip). Past CLOCK_STALE_S without a reading used, one is
    taken as a first reading would be."""
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    keeper = TimeKeeper("n1", clock)
    monkeypatch.setattr(timesync, "database_time", lambda: machine.now() + 3.0)
    assert keeper.maybe_sync()  # a quick first reading

    def held() -> float:
        machine.advance(0.26)  # the request waited on the link; the server answers at once
        return machine.now() + 3.0

    monkeypatch.setattr(timesync, "database_time", held)
    used = []
    for _ in range(20):  # ten seconds of heartbeats
        machine.advance(0.5)
        used.append(keeper.maybe_sync())
    assert not any(used)
    assert clock.now() == pytest.approx(machine.now() + 3.0)
    machine.advance(CLOCK_STALE_S)
    assert keeper.maybe_sync()  # nothing used for a minute: the slow reading is taken
    assert clock.now() == pytest.approx(machine.now() + 3.0 + 0.13)


def test_the_first_reading_takes_a_slower_round_trip_and_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Until its first reading a node has only its machine's clock (perhaps stepped): the first
    reading is taken with a round trip up to FIRST_READING_MAX_RTT_S, tried a few times at once."""
    machine = SteppableClock(start=1_000.0)
    clock = ReferenceClock(machine)
    keeper = TimeKeeper("n1", clock)
    delays = [2.0, 0.3]  # one too slow even for a first reading, then one slow but usable

    def answer() -> float:
        machine.advance(delays.pop(0) if delays else 0.0)
        return machine.now() + 5.47

    monkeypatch.setattr(timesync, "database_time", answer)
    assert not keeper.synced
    assert keeper.first_sync()
    assert keeper.synced and not delays
    # Read as if half-way through the 0.3 s round trip: off by at most half of it.
    assert clock.now() == pytest.approx(machine.now() + 5.47 + 0.15)
    # A lone reading slower than that is not taken, even as a first one.
    slow = TimeKeeper("n2", ReferenceClock(machine))

    def too_slow() -> float:
        machine.advance(FIRST_READING_MAX_RTT_S + 0.1)
        return machine.now()

    monkeypatch.setattr(timesync, "database_time", too_slow)
    assert not slow.maybe_sync() and not slow.synced


@pytest.mark.django_db(transaction=True)
def test_a_node_without_a_reading_claims_and_leads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node started while its machine's clock is stepped would claim runs due seconds from now
    as due already (a chaos run caught bodies started 1.1 s early): until its first reading it
    claims nothing and does not campaign."""
    from cluster.coordination.memory import MemoryBackend
    from cluster.node import CLOCK_UNSYNCED, NodeConfig, NodeRunner
    from jobs import services

    services.job_create(
        data={"name": "tick", "task": "noop", "schedule_type": "interval", "interval_seconds": 1},
        by=services.SYSTEM,
    )
    machine = SteppableClock(start=time.time())
    runner = NodeRunner(
        NodeConfig(node_id="late-clock"), backend=MemoryBackend(), clock=ReferenceClock(machine)
    )
    assert runner.timekeeper is not None
    monkeypatch.setattr(runner.timekeeper, "first_sync", lambda: False)  # the database is slow
    runner.register()
    runner.election_once()
    assert not runner.elector.lease  # it did not campaign
    before = runner.executor.claim_once
    monkeypatch.setattr(runner.executor, "claim_once", lambda: pytest.fail("claimed"))
    runner.claim_once()
    assert runner._idle_since is not None and runner._idle_since[0] == CLOCK_UNSYNCED
    runner.timekeeper.synced = True
    monkeypatch.setattr(runner.executor, "claim_once", before)
    runner.election_once()
    assert runner.elector.lease is not None
