"""Clocks the cluster code reads time from, so tests can move time instead of sleeping.

``now()`` is wall-clock seconds since the epoch: lease expiries kept in shared storage are written in
it, so nodes are assumed to run NTP-synchronised clocks. ``monotonic()`` never goes backwards and is
what a process measures its own deadlines with (renew deadline, lock validity).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""
        ...


def wall_ms(clock: Clock) -> int:
    """The clock's wall time in whole milliseconds (the unit of every stored expiry)."""
    return int(clock.now() * 1000)


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class SettableClock:
    """A clock that moves only when told to. Its monotonic reading advances with it (never back)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = float(start)
        self._monotonic = 0.0

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot advance by a negative amount ({seconds} s)")
        with self._lock:
            self._now += seconds
            self._monotonic += seconds

    def set(self, t: float) -> None:
        """Jump the wall clock to ``t``. As with a real clock step, monotonic time only moves on."""
        with self._lock:
            delta = t - self._now
            self._now = float(t)
            if delta > 0:
                self._monotonic += delta
