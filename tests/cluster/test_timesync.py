"""A node keeps its database's time: a step of the machine's clock moves nothing it computes, the
offset is read from the database now and then, and a clock far off is logged once each way."""

from __future__ import annotations

import logging
import time

import pytest

from cluster import timesync
from cluster.clock import ReferenceClock, SettableClock
from cluster.timesync import CLOCK_SYNC_S, TimeKeeper, database_time


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

    def held() -> float:
        machine.advance(0.15)  # the request waited on the link; the server answers at once
        return machine.now() + 3.0

    monkeypatch.setattr(timesync, "database_time", held)
    assert not keeper.maybe_sync()
    assert clock.now() == pytest.approx(machine.now())
    machine.advance(CLOCK_SYNC_S)
    monkeypatch.setattr(timesync, "database_time", lambda: machine.now() + 3.0)
    assert keeper.maybe_sync()
    assert clock.now() == pytest.approx(machine.now() + 3.0)
