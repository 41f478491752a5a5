"""W6's own arithmetic (bench/w6.py): the fires the schedule makes due in a window, counted from
the jobs' offsets, and the lags read back from the record file."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.w6 import due_in, read_window

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
