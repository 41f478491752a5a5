"""Reading what changed: a cursor over one table's timestamp column, and the spacing of probes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model, QuerySet

from dashboard.live.protocol import BATCH_SIZE

SWEEP_LIMIT = 2000
# Counts and jobs are not backed by a covering index: a probe that got slow (a big table) is spaced
# out so that it takes at most 1/PROBE_DUTY of the time.
PROBE_DUTY = 10


def chunks(items: list[Any], size: int = BATCH_SIZE) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ChangeFeed:
    """Rows of one table changed since the last poll, by a timestamp column.

    Each poll first reads only (id, stamp) pairs, which the stamp's index answers; full rows are
    fetched only for pairs not sent yet, so an idle poll is one small query. The forward read pages
    by the key (stamp, id), so more rows with one stamp than fit a page cannot stall it. A row may
    commit after a newer one was read (its transaction was slow, or its writer's clock lags):
    ``sweep`` re-reads the pairs of the last ``lookback`` before the cursor; ``seen`` holds the pairs
    already sent in that window.
    """

    def __init__(
        self,
        changes: Callable[[], QuerySet],
        *,
        rows: Callable[[], QuerySet] | None = None,
        stamp: str,
        lookback: timedelta,
        batch: int = BATCH_SIZE,
        sweep_limit: int = SWEEP_LIMIT,
    ) -> None:
        self._changes = changes  # filtered to the rows of interest; read for (id, stamp) only
        self._rows = rows or changes  # the rows sent (select_related, only the fields needed)
        self.stamp = stamp
        self.lookback = lookback
        self.batch = batch
        self.sweep_limit = sweep_limit
        self.cursor: tuple[datetime, int] | None = None
        self.seen: set[tuple[int, datetime]] = set()

    def _window(self, low: datetime, high: datetime) -> QuerySet:
        return (
            self._changes()
            .filter(**{f"{self.stamp}__gte": low, f"{self.stamp}__lte": high})
            .order_by(f"-{self.stamp}")
            .values_list("pk", self.stamp)[: self.sweep_limit]
        )

    def seed(self, *, now: datetime) -> None:
        """Start at ``now``: rows already in the lookback window count as sent."""
        self.cursor = (now, 0)
        self.seen = set(self._window(now - self.lookback, now))

    def poll(self, *, sweep: bool) -> tuple[list[Model], bool]:
        """Rows changed since the last poll, oldest first; and whether more are waiting."""
        assert self.cursor is not None, "seed() first"
        stamp_at, pk = self.cursor
        forward = list(
            self._changes()
            .filter(**{f"{self.stamp}__gte": stamp_at})
            .exclude(**{self.stamp: stamp_at, "pk__lte": pk})
            .order_by(self.stamp, "pk")
            .values_list("pk", self.stamp)[: self.batch]
        )
        if forward:
            self.cursor = (forward[-1][1], forward[-1][0])
        wanted = {pk for pk, at in forward if (pk, at) not in self.seen}
        if sweep:
            wanted.update(
                pk
                for pk, at in self._window(self.cursor[0] - self.lookback, self.cursor[0])
                if (pk, at) not in self.seen
            )
        rows = self._fetch(wanted)
        # The row may have changed again since its pair was read: what is sent is what was fetched.
        self.seen.update((row.pk, getattr(row, self.stamp)) for row in rows)
        if sweep:
            self._prune()
        rows.sort(key=lambda row: (getattr(row, self.stamp), row.pk))
        return rows, len(forward) == self.batch

    def recent(self, *, since: datetime) -> list[Model]:
        """The newest rows (at most one batch) changed since ``since``, oldest first."""
        pairs = (
            self._changes()
            .filter(**{f"{self.stamp}__gte": since})
            .order_by(f"-{self.stamp}", "-pk")
            .values_list("pk", flat=True)[: self.batch]
        )
        rows = self._fetch(set(pairs))
        return sorted(rows, key=lambda row: (getattr(row, self.stamp), row.pk))

    def _fetch(self, pks: set[int]) -> list[Model]:
        ordered = sorted(pks)
        rows: list[Model] = []
        for chunk in chunks(ordered):  # bounded IN lists
            rows.extend(self._rows().filter(pk__in=chunk).order_by())
        return rows

    def _prune(self) -> None:
        assert self.cursor is not None
        low = self.cursor[0] - self.lookback
        self.seen = {pair for pair in self.seen if pair[1] >= low}


class Throttle:
    """Due every ``min_s``; a probe that took long is spaced out to 1/PROBE_DUTY of the time."""

    def __init__(self, min_s: float, idle_s: float = 0.0) -> None:
        self.min_s = min_s
        self.idle_s = idle_s
        self.next_at = 0.0
        self.last_at = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def idle_due(self, now: float) -> bool:
        return now >= self.last_at + self.idle_s

    def ran(self, started: float) -> None:
        elapsed = time.monotonic() - started
        self.last_at = started
        self.next_at = started + max(self.min_s, elapsed * PROBE_DUTY)
