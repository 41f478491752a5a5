"""W6 scale (docs/benchmarks.md): J interval jobs, an offered rate R of scheduled fires per second,
N ``runnode`` nodes on MariaDB + Redis. A measurement, not a test.

    python -m bench.w6                                   # 100,000 jobs, 1,000 fires/s, 3 nodes
    python -m bench.w6 --jobs 1000000 --rate 2000 --nodes 3 --window 60
    python -m bench.w6 --nodes 1 3 6 10                  # the scale curve, one run per count
    python -m bench.w6 --keep                            # reuse the jobs of an earlier run
    python -m bench.w6 --jobs 1000000 --buffer-pool-mb 2048  # a pool the jobs' table fits in

The jobs are J interval jobs of ``bench.record`` with interval = J / R seconds and
``spread_seconds`` = interval - 1, so their fires fall evenly over every interval (each job's
stable offset from its slot). They are written once through the batch service (what
``POST /api/jobs/batch/`` does) into the database ``sched_w6`` (``--keep`` starts from the jobs
already there, with their runs deleted). Each run starts N nodes (capacity 64, pinned to the CPUs
in turn), waits one interval (the warm-up: every job has fired once) and on to the next slot
instant (``--warmup S``: S seconds instead), and then measures a window:

- due: the fires whose due instant (slot + the job's offset) falls in the window, counted from the
  schedule itself, not from what the cluster wrote;
- started: those among them whose body started (``bench.record`` writes a line first thing);
- lag: body start - due instant, p50 / p99 / max;
- coalesced or skipped: runs the misfire policy recorded skipped since the warm-up began;
- overdue at the end: enabled jobs whose next due instant is more than 5 s past;
- CPU per fire by part (the leading node, the other nodes, MariaDB, Redis, this process) over the
  window, from /proc;
- the database's statements and rows per fire over the window (MariaDB's global counters);
- the peak of database connections, and the nodes' WARNING lines.

Every process is started here and stopped here by PID; traffic stays on loopback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter, local_pids, speed_probe_ms
from bench.run import ConnectionPeak, Environment, Nodes, lag_summary, wait_for_leader

DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/sched_w6"
OVERDUE_S = 5.0
# Jobs re-timed per statement before a run (by primary key).
UPDATE_SLICE = 50_000


def _job_name(index: int) -> str:
    return f"w6-{index:07d}"


def create_jobs(count: int, interval: int, path: Path, policy: str) -> float:
    """``count`` jobs through the batch service; returns the seconds it took."""
    from jobs import services

    began = time.monotonic()
    chunk = services.MAX_BATCH_JOBS
    for start in range(0, count, chunk):
        services.jobs_create_batch(
            items=[
                {
                    "name": _job_name(index),
                    "task": "bench.record",
                    "kwargs": {"path": str(path)},
                    "schedule_type": "interval",
                    "interval_seconds": interval,
                    "spread_seconds": interval - 1,
                    "concurrency_policy": policy,
                }
                for index in range(start, min(count, start + chunk))
            ],
            by=services.SYSTEM,
        )
    return time.monotonic() - began


def due_in(offsets: dict[str, float], interval: int, start: float, end: float) -> int:
    """How many fires the schedule makes due in [start, end): slots k * interval (epoch-anchored)
    plus each job's offset."""
    total = 0
    for offset in offsets.values():
        first = math.ceil((start - offset) / interval)
        last = math.ceil((end - offset) / interval)
        total += max(0, last - first)
    return total


def read_window(
    path: Path, offsets: dict[str, float], start: float, end: float
) -> tuple[list[float], int]:
    """(lags in ms of the first start of each fire due in the window, duplicates)."""
    first_start: dict[tuple[str, float], float] = {}
    seen: Counter[tuple[str, float]] = Counter()
    with open(path) as handle:
        for line in handle:
            name, slot, _attempt, started, _pid = line.split()
            offset = offsets.get(name)
            if offset is None:
                continue
            due = float(slot) + offset
            if not start <= due < end:
                continue
            key = (name, float(slot))
            seen[key] += 1
            if key not in first_start or float(started) - due < first_start[key]:
                first_start[key] = float(started) - due
    lags = [lag * 1000 for lag in first_start.values()]
    return lags, sum(n - 1 for n in seen.values())


def overdue_jobs(now: float) -> int:
    """Enabled jobs whose next fire (its due instant) is more than OVERDUE_S past."""
    from jobs.models import Job

    return Job.objects.filter(enabled=True, next_fire_at__lt=_aware(now - OVERDUE_S)).count()


STATEMENT_COUNTERS = (
    "Questions",
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_commit",
    "Com_rollback",
    "Rows_read",
    "Rows_sent",
    "Handler_read_key",
    "Handler_read_next",
    "Handler_read_rnd_next",
    "Handler_write",
    "Handler_update",
    "Handler_tmp_write",
    "Innodb_buffer_pool_read_requests",
    "Innodb_buffer_pool_reads",
    "Innodb_data_fsyncs",
)


def server_counters() -> dict[str, int]:
    """MariaDB's global status counters in STATEMENT_COUNTERS (server-wide: the bench's own
    statements count too, a handful per window)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ("
            + ", ".join(["%s"] * len(STATEMENT_COUNTERS))
            + ")",
            list(STATEMENT_COUNTERS),
        )
        return {name: int(value) for name, value in cursor.fetchall()}


def per_fire(before: dict[str, int], after: dict[str, int], fires: int) -> dict[str, float]:
    """The counters' growth over the window, per fire started."""
    if not fires:
        return {}
    return {name: round((after[name] - before[name]) / fires, 2) for name in before}


def set_buffer_pool(size_mb: int) -> int:
    """Set MariaDB's InnoDB buffer pool to ``size_mb`` MiB (it resizes online, in the background);
    returns the size it had, in bytes, for the caller to set back."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_buffer_pool_size")
        original = int(cursor.fetchone()[0])
        cursor.execute("SET GLOBAL innodb_buffer_pool_size = %s", [size_mb * 2**20])
    return original


def buffer_pool() -> dict[str, int]:
    """The server's InnoDB buffer pool against the jobs' table (data and indexes), in MiB: what a
    run's database figures were measured with."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT @@GLOBAL.innodb_buffer_pool_size, COALESCE(SUM(data_length + index_length), 0) "
            "FROM information_schema.tables WHERE table_schema = DATABASE() "
            "AND table_name = 'jobs_job'"
        )
        size, jobs_table = cursor.fetchone()
    return {"buffer_pool_mb": int(size) // 2**20, "jobs_table_mb": int(jobs_table) // 2**20}


def _profile(
    directory: Path | None, node_pids: dict[str, int], leader: str, seconds: float
) -> list[subprocess.Popen]:
    """py-spy (in requirements-bench.txt) sampling the leader and one other node over the window, as
    collapsed stacks (``DIR/<node>.txt``, one line per stack and its sample count)."""
    if directory is None:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    chosen = [leader, *[n for n in sorted(node_pids) if n != leader][:1]]
    return [
        subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(node_pids[node]),
                "--duration",
                str(int(seconds)),
                "--rate",
                "50",
                "--format",
                "raw",
                "--nonblocking",
                "--gil",
                "--output",
                str(directory / f"{'leader' if node == leader else 'other'}-{node}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in chosen
    ]


def run_once(
    env: Environment,
    *,
    jobs: int,
    rate: float,
    nodes: int,
    window_s: float,
    keep: bool,
    warmup_s: float | None = None,
    policy: str = "forbid",
    profile: Path | None = None,
    partitions: int = 1,
) -> dict[str, Any]:
    from jobs import partitioning, schedules
    from jobs.models import Job, JobExecution
    from jobs.states import ExecutionStatus

    interval = max(2, round(jobs / rate))
    path = env.workdir / "w6-records.txt"
    existing = Job.objects.filter(name__startswith="w6-").count()
    created_s = None
    if not (keep and existing == jobs):
        prefix = env.reset()
        created_s = create_jobs(jobs, interval, path, policy)
    else:
        from cluster.models import ClusterFence, CoordinationLease, LeadershipTerm, SchedulerNode

        JobExecution.objects.all().delete()
        for model in (SchedulerNode, LeadershipTerm, ClusterFence, CoordinationLease):
            model.objects.all().delete()
        env.prefix_count += 1
        prefix = f"w6{os.getpid()}n{env.prefix_count}"
        os.environ["SCHEDULER_REDIS_PREFIX"] = prefix
        # The jobs write where they were told when they were created.
        path = Path(
            Job.objects.filter(name=_job_name(0)).values_list("kwargs", flat=True)[0]["path"]
        )
        path.parent.mkdir(parents=True, exist_ok=True)
    # The nodes are stopped: the partition count may change (every job moves to its partition).
    partitioning.set_count(partitions)
    # The jobs' first fires start from after this statement (creating a million jobs takes
    # minutes, and the runs of an earlier measurement are gone): each job's first due instant
    # (slot + its spread offset) comes after ``soon``, which allows for the statement itself
    # (about 25,000 rows a second here). MariaDB computes the offset as
    # jobs.schedules.spread_offset does: the first 8 bytes of the name's SHA-256, modulo the
    # spread in microseconds.
    from django.db import connection

    soon = time.time() + 5 + jobs / 25_000
    slot = _aware(math.floor(soon / interval) * interval)
    spread_us = (interval - 1) * 1_000_000
    offset = f"CAST(CONV(LEFT(SHA2(name, 256), 16), 16, 10) AS UNSIGNED) MOD {spread_us}"
    ids = Job.objects.filter(name__startswith="w6-").order_by("pk").values_list("pk", flat=True)
    first, last = ids.first(), ids.last()
    with connection.cursor() as cursor:
        # In slices of the primary key: one statement over a million rows may outlast the
        # connection's read timeout (SCHEDULER_DB_IO_TIMEOUT_S) on a cold buffer pool.
        for low in range(first or 0, (last or -1) + 1, UPDATE_SLICE):
            cursor.execute(
                f"UPDATE jobs_job SET last_fire_at = NULL, concurrency_policy = %s, "
                f"interval_seconds = {interval}, spread_seconds = {interval - 1}, next_fire_at = "
                f"DATE_ADD(%s, INTERVAL {offset} + IF({offset} < %s, %s, 0) MICROSECOND) "
                "WHERE name LIKE 'w6-%%' AND id >= %s AND id < %s",
                [
                    policy,
                    slot,
                    int((soon - slot.timestamp()) * 1e6),
                    interval * 1_000_000,
                    low,
                    low + UPDATE_SLICE,
                ],
            )
    pool = buffer_pool()
    if path.exists():
        path.unlink()
    offsets = {
        _job_name(i): schedules.spread_offset(_job_name(i), interval - 1) for i in range(jobs)
    }
    cluster = Nodes(env, prefix, count=nodes)
    connections = None
    try:
        leader, _term = wait_for_leader(60)
        warm_began = time.time()
        if warmup_s is None:
            # A warm-up of one interval (every job has fired once), and the window opens on a
            # slot instant, when every job's next slot comes round at once: the hardest moment
            # for a scheduler that writes fires by slot rather than by due instant.
            window_start = math.ceil((warm_began + interval) / interval) * interval
        else:
            window_start = math.ceil(warm_began + warmup_s)
        time.sleep(max(0.0, window_start - 3 - time.time()))
        node_pids = {node_id: p.pid for node_id, p in cluster.processes.items()}
        leader, _term = wait_for_leader(5)
        meter = CpuMeter(
            {
                "leader node": [node_pids[leader]],
                "other nodes": [pid for n, pid in node_pids.items() if n != leader],
                "database": local_pids("mariadbd") or local_pids("mysqld"),
                "redis": [env.redis.process.pid] if env.redis.process else [],
                "bench": [os.getpid()],
            }
        )
        connections = ConnectionPeak(env)
        time.sleep(max(0.0, window_start - time.time()))
        profilers = _profile(profile, node_pids, leader, window_s)
        counted = server_counters()
        meter.start()
        time.sleep(window_s)
        meter.stop()
        counted_after = server_counters()
        for profiler in profilers:  # py-spy writes its samples when interrupted
            profiler.send_signal(signal.SIGINT)
            profiler.wait(30)
        window_end = window_start + window_s
        # Fires due at the window's end may start up to a few seconds later.
        time.sleep(5)
        overdue = overdue_jobs(time.time())
        load = os.getloadavg()
    finally:
        peak = connections.stop() if connections else None
        if peak is not None:  # the budget of this run's node count
            peak["budget"] = nodes * peak["per_node_budget"] + 2
        cluster.stop()
    due = due_in(offsets, interval, window_start, window_end)
    lags, duplicates = read_window(path, offsets, window_start, window_end)
    skipped = JobExecution.objects.filter(
        status=ExecutionStatus.SKIPPED, scheduled_for__gte=_aware(warm_began)
    ).count()
    return {
        "jobs": jobs,
        "interval_s": interval,
        "concurrency_policy": policy,
        "offered_per_s": jobs / interval,
        "nodes": nodes,
        "partitions": partitions,
        "jobs_created_s": created_s,
        "window_s": window_s,
        "due": due,
        "started": len(lags),
        "started_share": len(lags) / due if due else math.nan,
        "started_per_s": len(lags) / window_s,
        "duplicates": duplicates,
        "lag_ms": lag_summary(lags),
        "coalesced_or_skipped": skipped,
        "overdue_jobs_at_end": overdue,
        "cpu_us_per_fire": meter.per_run_us(len(lags)),
        "database_per_fire": per_fire(counted, counted_after, len(lags)),
        "database": pool,
        "steal_share": meter.steal_share,
        "load_average": load,
        "db_connections": peak,
        "node_logs": cluster.problems(),
    }


def _aware(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1000.0, help="offered fires per second")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3])
    parser.add_argument("--window", type=float, default=40.0, help="seconds measured")
    parser.add_argument(
        "--partitions", type=int, default=1, help="scheduling partitions (each its own leader)"
    )
    parser.add_argument("--keep", action="store_true", help="reuse the jobs already defined")
    parser.add_argument(
        "--policy",
        default="forbid",
        choices=["forbid", "allow", "buffer_one", "replace"],
        help="the jobs' concurrency policy (default forbid, the jobs' own default)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds before the window (default: one interval, and the window opens on a slot "
        "instant)",
    )
    parser.add_argument(
        "--buffer-pool-mb",
        type=int,
        help="set MariaDB's innodb_buffer_pool_size to this many MiB for the runs (set back at "
        "the end); every run reports the pool it had and the jobs' table size",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the leader and one other node with py-spy over the window, into this directory",
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.rate <= 0 or min(args.nodes) < 1 or args.window <= 0:
        parser.error("--jobs, --rate, --nodes and --window must be positive")
    if args.buffer_pool_mb is not None and args.buffer_pool_mb < 128:
        parser.error("--buffer-pool-mb must be at least 128 (MiB)")
    if args.profile and not Path(sys.executable).with_name("py-spy").exists():
        parser.error("--profile needs py-spy: pip install -r requirements-bench.txt")
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    if not database_url.startswith("mysql"):
        parser.error("W6 measures MariaDB (BENCH_DATABASE_URL=mysql://...)")
    workdir = Path(tempfile.mkdtemp(prefix="sched-w6-"))
    env = Environment(database_url, workdir, recreate=not args.keep)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "speed_probe_ms_at_start": speed_probe_ms(),
        "runs": [],
    }
    original_pool = (
        set_buffer_pool(args.buffer_pool_mb) if args.buffer_pool_mb is not None else None
    )
    try:
        for index, count in enumerate(args.nodes):
            print(
                f"W6: {args.jobs:,} jobs, {args.rate:,.0f} fires/s offered, {count} nodes, "
                f"{args.partitions} partition(s) ...",
                flush=True,
            )
            run = run_once(
                env,
                jobs=args.jobs,
                rate=args.rate,
                nodes=count,
                window_s=args.window,
                keep=args.keep or index > 0,
                warmup_s=args.warmup,
                policy=args.policy,
                profile=args.profile / f"nodes{count}" if args.profile else None,
                partitions=args.partitions,
            )
            results["runs"].append(run)
            print(json.dumps(run, indent=2, default=str), flush=True)
    finally:
        if original_pool is not None:
            set_buffer_pool(original_pool // 2**20)
        env.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(
        "\n| nodes | due | started (share) | started/s | lag p50 / p99 / max (ms) | "
        "skipped | overdue | CPU us/fire (total) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in results["runs"]:
        lag = run["lag_ms"]
        print(
            f"| {run['nodes']} | {run['due']:,} | {run['started']:,} "
            f"({run['started_share']:.2%}) | {run['started_per_s']:,.0f} | "
            f"{lag['p50']:.0f} / {lag['p99']:.0f} / {lag['max']:.0f} | "
            f"{run['coalesced_or_skipped']:,} | {run['overdue_jobs_at_end']:,} | "
            f"{run['cpu_us_per_fire'].get('total', math.nan):,.0f} |"
        )


if __name__ == "__main__":
    main()
