"""bench.model: the costs read from a W6 run and the ceilings they give."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.model import Costs, limits, node_ceiling

RUN = {
    "nodes": 3,
    "partitions": 1,
    "started_per_s": 2000.0,
    # The leader 500 us a fire, the two others 600 together, MariaDB 400, Redis 20.
    "cpu_us_per_fire": {
        "leader node": 500.0,
        "other nodes": 600.0,
        "database": 400.0,
        "redis": 20.0,
    },
}


def test_costs_split_the_leader_into_scheduling_and_its_share_of_running() -> None:
    costs = Costs.from_run(RUN)
    assert costs.execute_us == pytest.approx(900.0)  # 600 us ran 2/3 of the fires
    assert costs.schedule_us == pytest.approx(200.0)  # 500 - 900 / 3
    one = Costs.from_run({**RUN, "nodes": 1, "cpu_us_per_fire": {**RUN["cpu_us_per_fire"]}})
    assert (one.schedule_us, one.execute_us) == (0.0, 500.0)


def test_partitions_spread_the_scheduling_and_the_database_is_its_own_limit() -> None:
    costs = Costs.from_run(RUN)
    one_leader = node_ceiling(costs, nodes=3, cores=2, partitions=1)
    spread = node_ceiling(costs, nodes=3, cores=2, partitions=6)
    assert one_leader == pytest.approx(2e6 / (200 + 300))
    assert spread == pytest.approx(2e6 / (200 / 3 + 300))
    assert spread > one_leader
    found = limits(costs, nodes=10, node_cores=8, partitions=10, db_cores=2, dashboard_share=0.5)
    assert found["database"] == pytest.approx(2e6 * 0.5 / 400)
    assert min(found, key=found.get) == "database"
    assert found["redis"] == pytest.approx(50_000)
    assert math.isinf(node_ceiling(Costs(0, 0, 1, 1), nodes=1, cores=1, partitions=1))


def test_the_command_prints_a_table_and_refuses_what_is_not_a_w6_result(tmp_path: Path) -> None:
    good = tmp_path / "w6.json"
    good.write_text(json.dumps({"cpus": 2, "runs": [RUN]}))
    out = subprocess.run(
        [sys.executable, "-m", "bench.model", str(good), "--db-cores", "4", "--nodes", "3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "this machine (2 cores shared by every part): at most 1,316 fires/s" in out
    assert "| 4 | 3 | 8 |" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"nodes": 3, "cpu_us_per_fire": {}}]}))
    refused = subprocess.run(
        [sys.executable, "-m", "bench.model", str(bad)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "not a W6 result" in refused.stderr
