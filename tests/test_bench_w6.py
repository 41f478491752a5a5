"""W6's own arithmetic (bench/w6.py): the fires the schedule makes due in a window, counted from
the jobs' offsets, and the lags read back from the record file."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from bench.w6 import (
    STATEMENT_COUNTERS,
    buffer_pool,
    due_in,
    per_fire,
    read_window,
    server_counters,
)

OFFSETS = {"a": 0.5, "b": 9.5}


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 20, 4),  # a at 0.5 and 10.5, b at 9.5 and 19.5
        (1, 10, 1),  # b at 9.5 only
        (10.5, 10.6, 1),  # a's instant is inside (start inclusive)
        (9.6, 10.5, 0),  # a's instant is the end (exclusive)
        (-10, 0, 2),  # before the epoch too: a at -9.5, b at -0.5
    ],
)
def test_due_in_counts_each_jobs_slots_plus_its_offset(start, end, expected) -> None:
    assert due_in(OFFSETS, 10, start, end) == expected


def test_read_window_keeps_the_first_start_of_each_fire_due_in_the_window(tmp_path: Path) -> None:
    records = tmp_path / "records.txt"
    records.write_text(
        "a 10.000000 2 10.900000 1\n"  # due 10.5, started twice: the earlier start counts,
        "a 10.000000 1 10.600000 1\n"  # though written second (100 ms late)
        "b 0.000000 1 9.510000 2\n"  # due 9.5: 10 ms late
        "b 10.000000 1 19.500000 2\n"  # due 19.5: outside [5, 15)
        "c 10.000000 1 10.000000 3\n"  # not a W6 job
    )
    lags, duplicates = read_window(records, OFFSETS, 5, 15)
    assert sorted(round(lag, 3) for lag in lags) == [10.0, 100.0]
    assert duplicates == 1


def test_per_fire_divides_each_counters_growth_by_the_fires_started() -> None:
    before = {"Questions": 100, "Handler_update": 10}
    after = {"Questions": 160, "Handler_update": 50}
    assert per_fire(before, after, 10) == {"Questions": 6.0, "Handler_update": 4.0}
    assert per_fire(before, after, 0) == {}  # nothing started: nothing to divide by


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "mysql", reason="the server's counters are MariaDB's")
def test_server_counters_and_the_pool_are_read_from_the_server() -> None:
    counters = server_counters()
    assert set(counters) == set(STATEMENT_COUNTERS)
    assert server_counters()["Questions"] > counters["Questions"]  # the read itself counts
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_buffer_pool_size")
        size = int(cursor.fetchone()[0])
    pool = buffer_pool()
    assert pool["buffer_pool_mb"] == size // 2**20 > 0
    assert pool["jobs_table_mb"] >= 0  # the test database's table: well under a MiB
