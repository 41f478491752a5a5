"""The scale model: from W6's measured CPU per fire, which part runs out first, and at what rate.

    python -m bench.model W6.json [--run K] [--db-cores 2 4 8 16] [--node-cores 2]
                          [--nodes 3 6 10] [--partitions 1 8] [--dashboard-share 0.2]

W6 measures, over its window, the CPU every process used per fire started: the node leading
partition 0 (it also leads its share of the other partitions, claims and runs bodies), the other
nodes (claims and bodies), MariaDB and the coordination Redis. From one run with N nodes:

- ``e``: claiming and running one fire, on whatever node: the other nodes' CPU per fire spread
  over the share of fires they ran, ``others * N / (N - 1)``;
- ``s``: scheduling one fire (planning it, writing it, advancing its job): what the leader node
  spent beyond its own share of ``e``, ``leader - e / N``;
- ``d`` and ``r``: the database's and Redis's CPU per fire.

A cluster of ``n`` nodes of ``c`` cores, ``P`` partitions and a database of ``D`` cores then
sustains at most, each part alone:

- nodes: the busiest node schedules ``ceil(P / n) / P`` of the fires and runs ``1 / n`` of them:
  ``R <= c * 1e6 / (s * ceil(P / n) / P + e / n)`` (with P = 1 that is the one leader);
- database: ``R <= D * 1e6 * (1 - dashboard share) / d``; a replica serving the dashboard's reads
  gives the database back that share;
- Redis (one thread): ``R <= 1e6 / r``;
- this machine, where every part shares the same cores: ``R <= cores * 1e6 / total``.

It is linear: it knows nothing of lock waits (one partition's passes are serial on its fence row),
of the database's commit rate or of cache misses at another size. It says which part to grow
first, and roughly how far that goes; W6 on the larger machine says whether it does.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARTS = ("leader node", "other nodes", "database", "redis")


@dataclass(frozen=True)
class Costs:
    """CPU microseconds per fire: scheduling (s), claiming and running (e), database, Redis."""

    schedule_us: float
    execute_us: float
    database_us: float
    redis_us: float

    @classmethod
    def from_run(cls, run: dict[str, Any]) -> Costs:
        cpu = run["cpu_us_per_fire"]
        missing = [part for part in PARTS if part not in cpu and part != "other nodes"]
        if missing:
            raise ValueError(f"the run has no CPU figure for {', '.join(missing)}")
        nodes = int(run["nodes"])
        leader = float(cpu["leader node"])
        if nodes > 1:
            execute = float(cpu.get("other nodes", 0.0)) * nodes / (nodes - 1)
            schedule = max(0.0, leader - execute / nodes)
        else:  # one node: scheduling and running cannot be told apart; count it all as running
            execute, schedule = leader, 0.0
        return cls(schedule, execute, float(cpu["database"]), float(cpu["redis"]))


def node_ceiling(costs: Costs, *, nodes: int, cores: float, partitions: int) -> float:
    busiest = costs.schedule_us * math.ceil(partitions / nodes) / partitions
    per_fire = busiest + costs.execute_us / nodes
    return math.inf if per_fire <= 0 else cores * 1e6 / per_fire


def database_ceiling(costs: Costs, *, cores: float, dashboard_share: float = 0.0) -> float:
    return (
        math.inf
        if costs.database_us <= 0
        else cores * 1e6 * (1 - dashboard_share) / costs.database_us
    )


def redis_ceiling(costs: Costs) -> float:
    return math.inf if costs.redis_us <= 0 else 1e6 / costs.redis_us


def limits(
    costs: Costs,
    *,
    nodes: int,
    node_cores: float,
    partitions: int,
    db_cores: float,
    dashboard_share: float = 0.0,
) -> dict[str, float]:
    """Fires per second each part could sustain alone."""
    return {
        "nodes": node_ceiling(costs, nodes=nodes, cores=node_cores, partitions=partitions),
        "database": database_ceiling(costs, cores=db_cores, dashboard_share=dashboard_share),
        "redis": redis_ceiling(costs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("results", type=Path, help="a W6 --json file")
    parser.add_argument("--run", type=int, default=-1, help="which of its runs (default: the last)")
    parser.add_argument("--db-cores", type=float, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--node-cores", type=float, default=2)
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 6, 10])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--dashboard-share",
        type=float,
        default=0.0,
        help="the share of the database's CPU the dashboard's reads take (0 to 1)",
    )
    args = parser.parse_args()
    if not 0 <= args.dashboard_share < 1:
        parser.error("--dashboard-share must be in [0, 1)")
    if min(args.nodes) < 1 or min(args.partitions) < 1 or min(args.db_cores) <= 0:
        parser.error("--nodes, --partitions and --db-cores must be positive")
    data = json.loads(args.results.read_text())
    try:
        run = data["runs"][args.run]
        costs = Costs.from_run(run)
    except (KeyError, IndexError, ValueError) as exc:
        parser.error(f"{args.results}: not a W6 result with CPU figures ({exc})")
    total = sum(float(run["cpu_us_per_fire"].get(part, 0.0)) for part in PARTS)
    cores = data.get("cpus") or 1
    print(
        f"measured ({run['nodes']} nodes, {run.get('partitions', 1)} partition(s), "
        f"{run['started_per_s']:,.0f} fires/s): scheduling {costs.schedule_us:,.0f} us, "
        f"claiming and running {costs.execute_us:,.0f} us, database {costs.database_us:,.0f} us, "
        f"Redis {costs.redis_us:,.0f} us per fire"
    )
    print(
        f"this machine ({cores} cores shared by every part): at most "
        f"{cores * 1e6 / total:,.0f} fires/s\n"
    )
    print("| database cores | nodes | partitions | nodes' ceiling | database's | Redis's | limit |")
    print("|---|---|---|---|---|---|---|")
    for db_cores in args.db_cores:
        for nodes in args.nodes:
            for partitions in args.partitions:
                found = limits(
                    costs,
                    nodes=nodes,
                    node_cores=args.node_cores,
                    partitions=partitions,
                    db_cores=db_cores,
                    dashboard_share=args.dashboard_share,
                )
                part = min(found, key=lambda k: found[k])
                print(
                    f"| {db_cores:g} | {nodes} | {partitions} | {found['nodes']:,.0f} | "
                    f"{found['database']:,.0f} | {found['redis']:,.0f} | "
                    f"{part}, {found[part]:,.0f}/s |"
                )


if __name__ == "__main__":
    main()
