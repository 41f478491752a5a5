"""The finisher's tries of a batch while the database cannot be reached (on a settable clock)."""

from __future__ import annotations

from django.db import OperationalError

from cluster.clock import SettableClock
from cluster.executor import finisher as finisher_module
from cluster.executor.finisher import FINISH_RETRY_MAX_WAIT_S, Finisher
from cluster.executor.runs import Outcome


class Sleeps(SettableClock):
    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)


def test_a_batch_is_tried_again_often_enough_to_be_written_soon_after_an_outage(monkeypatch):
    """Unwritten outcomes hold capacity, so the wait between tries bounds how long a node stays
    full once the database is back: never longer than FINISH_RETRY_MAX_WAIT_S."""
    clock = Sleeps()
    back_at = clock.monotonic() + 8.0  # an 8 s outage
    committed: list[float] = []
    written: list[list[Outcome]] = []

    def commit(self: Finisher, batch: list[Outcome]) -> None:
        if clock.monotonic() < back_at:
            raise OperationalError(2003, "Can't connect to server")
        committed.append(clock.monotonic())

    monkeypatch.setattr(Finisher, "_commit", commit)
    monkeypatch.setattr(finisher_module.connection, "close", lambda: None)
    finisher = Finisher(clock, on_written=written.append)
    batch: list[Outcome] = [object()]  # type: ignore[list-item]  # never looked into here
    finisher.write(batch)

    assert written == [batch] and len(committed) == 1
    assert max(clock.slept) <= FINISH_RETRY_MAX_WAIT_S
    assert committed[0] - back_at <= FINISH_RETRY_MAX_WAIT_S
