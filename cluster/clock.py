"""Clocks the cluster code reads time from, so tests can move time instead of sleeping.

``now()`` is wall-clock seconds since the epoch: lease expiries kept in shared storage are written in
it. A node process reads it from a :class:`ReferenceClock` (the database server's time, carried by
the monotonic clock), so nodes agree on it even when one machine's clock is stepped.
``monotonic()`` never goes backwards and is what a process measures its own deadlines with (renew
deadline, lock validity). ``sleep()`` waits on the clock: real time on a real clock, an instant step
on a settable one (a stepped test never waits on the wall clock).
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

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on this clock."""
        ...


def wall_ms(clock: Clock) -> int:
    """The clock's wall time in whole milliseconds (the unit of every stored expiry)."""
    return int(clock.now() * 1000)


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class ReferenceClock:
    """Wall time taken from a reference (the database server, which every node shares) and carried
    between readings by this process's monotonic clock, so a step of the machine's own clock (an
    operator's ``date -s``, a bad NTP step, a VM resumed) moves nothing a node computes: the due
    runs it claims, the slots it fires, the heartbeats it writes. Until the first reading it is
    the base clock. Readings are taken by the node (:meth:`sync`); thread-safe."""

    def __init__(self, base: Clock | None = None) -> None:
        self.base = base or SystemClock()
        self._lock = threading.Lock()
        self._anchor_wall = self.base.now()
        self._anchor_mono = self.base.monotonic()
        self.offset_s = 0.0  # reference - this machine's wall clock, at the last reading

    def now(self) -> float:
        with self._lock:
            return self._anchor_wall + (self.base.monotonic() - self._anchor_mono)

    def monotonic(self) -> float:
        return self.base.monotonic()

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)

    def sync(self, reference_s: float, *, sent_mono: float, received_mono: float) -> float:
        """Take a reading of the reference, asked at ``sent_mono`` and answered at
        ``received_mono`` (this clock's monotonic): the reference is assumed read half-way.
        Returns the offset of this machine's wall clock from it (seconds, reference - local)."""
        middle = (sent_mono + received_mono) / 2
        local = self.base.now() - (self.base.monotonic() - middle)
        with self._lock:
            self._anchor_wall, self._anchor_mono = reference_s, middle
            self.offset_s = reference_s - local
        return self.offset_s


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

    def sleep(self, seconds: float) -> None:
        """A sleep on a settable clock is the time passing: at once, nobody waits."""
        self.advance(max(0.0, seconds))

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
