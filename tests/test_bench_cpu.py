"""The benchmarks' core speed probe: a fixed workload, timed in CPU time, shown in the table."""

from __future__ import annotations

import math

from bench.cpu import _probe_work, speed_probe_ms
from bench.run import summary_table


def test_the_probe_does_the_same_work_every_time_and_reports_its_cpu_milliseconds():
    assert _probe_work(5_000) == _probe_work(5_000)
    assert _probe_work(5_000) != _probe_work(5_001)
    small = speed_probe_ms(steps=1_000, rounds=2)
    assert math.isfinite(small) and small > 0


def test_the_summary_names_the_core_speed_at_start_and_end():
    table = summary_table(
        {
            "cpus": 2,
            "database": "mysql",
            "nodes": 3,
            "nodes_pinned_to_cpus": [0, 1, 0],
            "hog_processes": 0,
            "load_average_at_start": [0.5, 0.4, 0.3],
            "load_average_at_end": [1.0, 0.5, 0.3],
            "speed_probe_ms_at_start": 33.04,
            "speed_probe_ms_at_end": 61.96,
        }
    )
    head = table.splitlines()[0]
    assert "core speed probe 33.0 ms at start, 62.0 ms at end" in head
