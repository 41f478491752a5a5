"""Benchmarks (docs/benchmarks.md) against a real cluster: 3 ``runnode`` processes, MariaDB (or SQLite), a
private Redis. Prints numbers, and ratios against the peer (Celery beat + celery-redbeat + a Celery
worker on the same kind of Redis) when it is installed (``pip install -r requirements-bench.txt``).

    python -m bench.run                      # W1-W4 (+ the peer's W1-W3), about 7 minutes
    python -m bench.run w1 w3 --quick        # shorter windows
    python -m bench.run w1 w3 --hog 2        # beside two busy-looping processes (both systems)
    python -m bench.run w2 --repeat 5        # W2 five times each, ours and the peer's in turn
    BENCH_DATABASE_URL=sqlite:///tmp/b.db python -m bench.run w1

Every process is started here and stopped here by PID; traffic stays on loopback; every wait is
bounded. Lag = the moment the task body started (taken first thing, in the worker) - the fire slot
it was due for. W2 also reports the CPU each part of the machine spent per run (``bench.cpu``):
a rate follows the CPU the host grants from minute to minute, CPU per run is what the code
controls.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter, local_pids, speed_probe_ms
from bench.records import RecordCounter
from chaos.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/sched_bench"
NODES = 3
NODE_CAPACITY = 64
SECRET = "bench-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFG"


# W3 kills the leader this long before a whole second (its runs of the slot are in flight).
SLOT_KILL_EARLY_S = 0.05


# --- small utilities --------------------------------------------------------------------------------


def sleep_until(instant: float) -> None:
    time.sleep(max(0.0, instant - time.time()))


class CpuHog:
    """``count`` busy-looping processes (started and stopped here, by PID): the machine under load."""

    def __init__(self, count: int) -> None:
        self.processes = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)
        ]

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(5)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))
    return ordered[index]


def lag_summary(lags_ms: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(lags_ms, 50),
        "p95": percentile(lags_ms, 95),
        "p99": percentile(lags_ms, 99),
        "max": max(lags_ms) if lags_ms else math.nan,
    }


def read_records(path: Path) -> list[tuple[str, float, int, float, int]]:
    """(job, slot, attempt, started, pid) per line written by bench.record."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        job, slot, attempt, started, pid = line.split()
        rows.append((job, float(slot), int(attempt), float(started), int(pid)))
    return rows


# --- the environment: database, Redis, Django in this process ------------------------------------


class Environment:
    def __init__(
        self,
        database_url: str,
        workdir: Path,
        *,
        pin_cpus: bool = True,
        recreate: bool = True,
        partitions: int = 1,
    ) -> None:
        self.workdir = workdir
        # The scheduling partitions every workload's jobs are split into (set at each reset).
        self.partitions = partitions
        # Node i pinned to the i-th CPU in turn (runnode --cpus; see cluster.affinity).
        self.cpus = sorted(os.sched_getaffinity(0)) if pin_cpus else []
        self.redis = RedisServer("bench", workdir)
        self.redis.start()
        self.database_url = database_url
        self.prefix_count = 0
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": self.redis.url,
            "SCHEDULER_COORDINATION": "redis",
            "DJANGO_SECRET_KEY": SECRET,
            "SCHEDULER_VAR_DIR": str(workdir / "var"),
            "SCHEDULER_TASK_MODULES": "bench.tasks",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update({k: v for k, v in self.env.items() if k != "SCHEDULER_REDIS_PREFIX"})
        os.environ["DJANGO_SETTINGS_MODULE"] = "scheduler_project.settings"
        if recreate:
            self._create_database()
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def _create_database(self) -> None:
        if not self.database_url.startswith("mysql"):
            return
        import dj_database_url
        import MySQLdb

        cfg = dj_database_url.parse(self.database_url)
        conn = MySQLdb.connect(
            host=cfg["HOST"] or "127.0.0.1",
            port=int(cfg["PORT"] or 3306),
            user=cfg["USER"],
            passwd=cfg["PASSWORD"] or "",
        )
        cursor = conn.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
        cursor.execute(
            f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
        conn.close()

    def reset(self) -> str:
        """Empty the scheduler's tables and start a fresh Redis key prefix; returns the prefix."""
        from cluster.models import ClusterFence, CoordinationLease, LeadershipTerm, SchedulerNode
        from jobs.models import AuditEvent, Job, JobExecution

        for model in (
            JobExecution,
            Job,
            AuditEvent,
            SchedulerNode,
            LeadershipTerm,
            ClusterFence,
            CoordinationLease,
        ):
            model.objects.all().delete()
        from jobs import partitioning

        partitioning.set_count(self.partitions)
        self.prefix_count += 1
        prefix = f"bench{os.getpid()}n{self.prefix_count}"
        os.environ["SCHEDULER_REDIS_PREFIX"] = prefix
        return prefix

    def close(self) -> None:
        self.redis.stop()


class Nodes:
    def __init__(
        self, env: Environment, prefix: str, count: int = NODES, args: tuple[str, ...] = ()
    ) -> None:
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: list[Any] = []
        node_env = {**env.env, "SCHEDULER_REDIS_PREFIX": prefix}
        for index in range(1, count + 1):
            node_id = f"node-{index}"
            log = open(env.workdir / f"{prefix}-{node_id}.log", "wb")
            self.logs.append(log)
            self.processes[node_id] = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "runnode",
                    "--node-id",
                    node_id,
                    "--capacity",
                    str(NODE_CAPACITY),
                    *(["--cpus", str(env.cpus[(index - 1) % len(env.cpus)])] if env.cpus else []),
                    *args,
                ],
                cwd=ROOT,
                env=node_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def problems(self) -> dict[str, Any]:
        """WARNING and ERROR lines the nodes logged (a database refusing connections, a failed
        write), counted, with the first few."""
        lines = [
            line
            for log in self.logs
            for line in Path(log.name).read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line or "Too many connections" in line
        ]
        return {
            "warning_or_error_lines": len(lines),
            "too_many_connections": sum("Too many connections" in line for line in lines),
            "first": lines[:3],
        }

    def signal(self, node_id: str, signum: int) -> None:
        process = self.processes[node_id]
        if process.poll() is None:
            process.send_signal(signum)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for log in self.logs:
            log.close()


def wait_for_leader(timeout: float = 30) -> tuple[str, int]:
    from cluster.models import LeadershipTerm

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = (
            LeadershipTerm.objects.filter(partition=0, ended_at__isnull=True)
            .order_by("-term")
            .first()
        )
        if row:
            return row.node_id, row.term
        time.sleep(0.05)
    raise RuntimeError("no leader elected")


def create_interval_jobs(count: int, prefix: str, path: Path, interval: int = 1) -> None:
    from jobs import services

    items = [
        {
            "name": f"{prefix}-{index:04d}",
            "task": "bench.record",
            "kwargs": {"path": str(path)},
            "schedule_type": "interval",
            "interval_seconds": interval,
        }
        for index in range(count)
    ]
    for start in range(0, count, services.MAX_BATCH_JOBS):
        services.jobs_create_batch(
            items=items[start : start + services.MAX_BATCH_JOBS], by=services.SYSTEM
        )


class ConnectionPeak:
    """The most connections the database server held to the benchmark's database, sampled every
    0.25 s on a thread (MariaDB only), against the budget the nodes promise (cluster.node)."""

    def __init__(self, env: Environment) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if env.database_url.startswith("mysql"):
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(0.25):
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
                    )
                    self.peak = max(self.peak, cursor.fetchone()[0])
        finally:
            connection.close()

    def stop(self) -> dict[str, Any] | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(5)
        from cluster.node import NODE_DB_CONNECTIONS

        budget = NODE_DB_CONNECTIONS["redis"]
        # This process: its own connection and the sampler's.
        return {"peak": self.peak, "budget": NODES * budget + 2, "per_node_budget": budget}


# --- W1 steady --------------------------------------------------------------------------------------


def w1(env: Environment, *, jobs: int = 200, warmup_s: float = 10, window_s: float = 40) -> dict:
    prefix = env.reset()
    path = env.workdir / f"{prefix}-w1.txt"
    create_interval_jobs(jobs, "w1", path)
    nodes = Nodes(env, prefix)
    connections = None
    try:
        wait_for_leader()
        time.sleep(warmup_s)
        connections = ConnectionPeak(env)
        window_start = math.ceil(time.time())
        time.sleep(window_start + window_s - time.time() + 1.5)
    finally:
        peak = connections.stop() if connections else None
        nodes.stop()
    window_end = window_start + window_s
    rows = [r for r in read_records(path) if window_start <= r[1] < window_end]
    per_fire = Counter((r[0], r[1]) for r in rows)
    expected = jobs * int(window_s)
    lags = [(r[3] - r[1]) * 1000 for r in rows]
    return {
        "executions_per_s": len(rows) / window_s,
        "lag_ms": lag_summary(lags),
        "fires": len(per_fire),
        "expected": expected,
        "duplicates": sum(n - 1 for n in per_fire.values()),
        "skipped": expected - len(per_fire),
        "db_connections": peak,
        "node_logs": nodes.problems(),
    }


def w1_behind(
    env: Environment, *, jobs: int = 200, behind_s: int = 10, after_s: float = 20
) -> dict:
    """W1 started behind: the 200 jobs' last ``behind_s`` seconds of fires are overdue when the
    cluster starts (``run_all`` within the grace period: every missed slot is to run, oldest
    first, each job's one after another under ``forbid``). The backlog must drain in batches and
    the fires due after it run on time again: how long the overdue slots take, how many run,
    and the lag of the fires due once it is gone."""
    from jobs.models import Job

    prefix = env.reset()
    path = env.workdir / f"{prefix}-w1b.txt"
    create_interval_jobs(jobs, "w1b", path)
    started = math.ceil(time.time())
    first_missed = datetime.fromtimestamp(started - behind_s, tz=UTC)
    Job.objects.update(
        misfire_policy="run_all",
        run_all_max=behind_s + 5,
        misfire_grace_seconds=behind_s + 30,
        next_fire_at=first_missed,
    )
    sleep_until(started)
    nodes = Nodes(env, prefix)
    try:
        time.sleep(after_s)
    finally:
        nodes.stop()
    rows = read_records(path)
    overdue = [r for r in rows if r[1] < started]
    on_time_from = started + 5  # a margin for the nodes' start (a few seconds on 2 cores)
    later = [r for r in rows if r[1] >= on_time_from and r[1] < started + after_s - 2]
    drained_at = max((r[3] for r in overdue), default=math.nan)
    first_at = min((r[3] for r in overdue), default=math.nan)
    per_fire = Counter((r[0], r[1]) for r in rows)
    expected_overdue = jobs * behind_s
    return {
        "overdue_slots": expected_overdue,
        "overdue_run": len({(r[0], r[1]) for r in overdue}),
        # From the nodes' start (a Python process's start-up included), and from the first run.
        "backlog_drained_s_after_start": drained_at - started,
        "backlog_first_run_s_after_start": first_at - started,
        "backlog_runs_per_s": len(overdue) / max(1e-9, drained_at - first_at),
        "lag_after_ms": lag_summary([(r[3] - r[1]) * 1000 for r in later]),
        "fires_after": len({(r[0], r[1]) for r in later}),
        "expected_after": jobs * int(started + after_s - 2 - on_time_from),
        "duplicates": sum(n - 1 for n in per_fire.values()),
        "node_logs": nodes.problems(),
    }


# --- W2 burst ---------------------------------------------------------------------------------------


def w2(
    env: Environment, *, count: int = 5000, mode: str = "enqueue", timeout_s: float = 180
) -> dict:
    """``count`` one-off runs due at their submission, submitted as fast as one client can.

    ``enqueue``: runs of one job (concurrency ``allow``) with arguments of their own, 1,000 per
    call of the enqueue service (what ``POST /api/jobs/<id>/enqueue/`` does), as Celery's
    ``apply_async`` is used. ``jobs``: one-off jobs (``schedule_type once``), 1,000 per call of
    the batch service (``POST /api/jobs/batch/``); the leader then fires each."""
    from django.utils import timezone

    from jobs import services

    prefix = env.reset()
    path = env.workdir / f"{prefix}-w2.txt"
    nodes = Nodes(env, prefix)
    chunk = services.MAX_BATCH_JOBS
    try:
        wait_for_leader()
        target = None
        if mode == "enqueue":
            target = services.job_create(
                data={
                    "name": "w2-target",
                    "task": "bench.record",
                    "kwargs": {"path": str(path)},
                    "schedule_type": "interval",
                    "interval_seconds": 86_400,
                    "enabled": False,
                    "concurrency_policy": "allow",
                },
                by=services.SYSTEM,
            )
        time.sleep(2)
        meter = CpuMeter(
            {
                "database": local_pids("mariadbd") or local_pids("mysqld")
                if env.database_url.startswith("mysql")
                else [],
                "nodes": [process.pid for process in nodes.processes.values()],
                "client": [os.getpid()],
                "redis": [env.redis.process.pid] if env.redis.process else [],
            }
        )
        meter.start()
        first_submit = time.time()
        for start in range(0, count, chunk):
            indexes = range(start, min(count, start + chunk))
            if target is not None:
                services.runs_enqueue(
                    job_id=target.pk,
                    items=[{"kwargs": {"path": str(path), "name": f"w2-{k:05d}"}} for k in indexes],
                    by=services.SYSTEM,
                )
                continue
            services.jobs_create_batch(
                items=[
                    {
                        "name": f"w2-{k:05d}",
                        "task": "bench.record",
                        "kwargs": {"path": str(path)},
                        "schedule_type": "once",
                        "run_at": timezone.now().isoformat(),
                    }
                    for k in indexes
                ],
                by=services.SYSTEM,
            )
        last_submit = time.time()
        RecordCounter(path).wait_for(count, timeout_s)
        meter.stop()
    finally:
        nodes.stop()
    rows = read_records(path)
    starts = [r[3] for r in rows]
    per_fire = Counter((r[0], r[1]) for r in rows)
    wall = (max(starts) - first_submit) if starts else math.nan
    return {
        "mode": mode,
        "submitted": count,
        "submit_rate_per_s": count / (last_submit - first_submit),
        "started": len(per_fire),
        "wall_s": wall,
        "executions_per_s": len(rows) / wall if starts else 0.0,
        "lag_ms": lag_summary([(r[3] - r[1]) * 1000 for r in rows]),
        "duplicates": sum(n - 1 for n in per_fire.values()),
        "missing": count - len(per_fire),
        # From the first submission until the last run was seen (the nodes still write the last
        # outcomes then): what each part of the machine spent per run, and the host's steal.
        "cpu_us_per_run": meter.per_run_us(len(rows)),
        "steal_share": meter.steal_share,
    }


# --- W3 failover ------------------------------------------------------------------------------------


def _fault_metrics(rows: list, at: float, jobs: list[str], window: tuple[float, float]) -> dict:
    by_job: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job, slot, _attempt, started, _pid in rows:
        by_job[job].append((started, slot))
    gaps, first_after = [], []
    for job in jobs:
        runs = sorted(by_job[job])
        before = [s for s, _ in runs if s < at]
        after = [s for s, _ in runs if s >= at]
        if before and after:
            gaps.append(after[0] - before[-1])
            first_after.append(after[0] - at)
    in_window = [(r[0], r[1]) for r in rows if window[0] <= r[1] < window[1]]
    counts = Counter(in_window)
    expected = len(jobs) * int(window[1] - window[0])
    return {
        "gap_s": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99), "max": max(gaps)},
        "fault_to_first_fire_s": min(first_after) if first_after else math.nan,
        "duplicates": sum(n - 1 for n in counts.values()),
        "skipped": expected - len(counts),
    }


def _lost_in(window: tuple[float, float]) -> dict[str, Any]:
    """The slots of the window whose run is recorded ``lost`` (in flight on the killed node: the
    indeterminate case, at most once with no retries), and their reasons."""
    from jobs.models import JobExecution

    lost = JobExecution.objects.filter(
        status="lost",
        scheduled_for__gte=datetime.fromtimestamp(window[0], tz=UTC),
        scheduled_for__lt=datetime.fromtimestamp(window[1], tz=UTC),
    )
    return {
        "lost_recorded": lost.count(),
        "lost_reasons": sorted(set(lost.values_list("reason", flat=True))),
    }


def w3(env: Environment, *, jobs: int = 10, settle_s: float = 8, after_s: float = 10) -> dict:
    from cluster.models import LeadershipTerm

    prefix = env.reset()
    path = env.workdir / f"{prefix}-w3.txt"
    create_interval_jobs(jobs, "w3", path)
    names = [f"w3-{i:04d}" for i in range(jobs)]
    nodes = Nodes(env, prefix)
    result: dict[str, Any] = {}
    try:
        leader, term = wait_for_leader()
        time.sleep(settle_s)
        # The worst instant: just before a whole second, when the leader's runs of that slot are
        # marked running and their bodies have not started.
        sleep_until(math.ceil(time.time() + 0.5) - SLOT_KILL_EARLY_S)
        killed_at = time.time()
        nodes.signal(leader, signal.SIGKILL)
        time.sleep(after_s)
        new = LeadershipTerm.objects.filter(partition=0, term__gt=term).order_by("term").first()
        kill_window = (math.floor(killed_at) - 3, math.floor(killed_at) + after_s - 2)
        result["sigkill"] = {
            **_fault_metrics(read_records(path), killed_at, names, kill_window),
            "takeover_s": new.acquired_at.timestamp() - killed_at if new else math.nan,
            **_lost_in(kill_window),
        }
        leader, term = wait_for_leader()
        stopped_at = time.time()
        nodes.signal(leader, signal.SIGTERM)
        time.sleep(after_s)
        new = LeadershipTerm.objects.filter(partition=0, term__gt=term).order_by("term").first()
        term_window = (math.floor(stopped_at) - 3, math.floor(stopped_at) + after_s - 2)
        result["sigterm"] = {
            **_fault_metrics(read_records(path), stopped_at, names, term_window),
            "handover_s": new.acquired_at.timestamp() - stopped_at if new else math.nan,
            **_lost_in(term_window),
        }
    finally:
        nodes.stop()
    return result


# --- W4 scale ---------------------------------------------------------------------------------------


def w4(env: Environment, *, defined: int = 100_000, due: int = 3, repeats: int = 50) -> dict:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from cluster.fencing import fence_raise
    from cluster.scheduler import scheduler_tick
    from jobs.models import Job

    env.reset()
    now = timezone.now()
    far = now + timedelta(days=365)
    batch = [
        Job(
            name=f"w4-{i:06d}",
            task="noop",
            schedule_type="interval",
            interval_seconds=86400,
            next_fire_at=far,
        )
        for i in range(defined)
    ]
    Job.objects.bulk_create(batch, batch_size=5000)
    fence_raise(1, "bench")

    def timed_tick() -> tuple[float, int]:
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            scheduler_tick(term=1, now=timezone.now())
            elapsed = (time.perf_counter() - started) * 1000
        return elapsed, len(queries)

    idle = [timed_tick() for _ in range(repeats)]
    busy = []
    for _ in range(10):
        ids = list(Job.objects.order_by("?").values_list("pk", flat=True)[:due])
        Job.objects.filter(pk__in=ids).update(next_fire_at=timezone.now() - timedelta(seconds=1))
        busy.append(timed_tick())
    return {
        "jobs_defined": defined,
        "idle_tick_ms": {
            "p50": percentile([t for t, _ in idle], 50),
            "p99": percentile([t for t, _ in idle], 99),
        },
        "idle_tick_queries": max(q for _, q in idle),
        f"tick_with_{due}_due_ms": {
            "p50": percentile([t for t, _ in busy], 50),
            "max": max(t for t, _ in busy),
        },
        f"tick_with_{due}_due_queries": max(q for _, q in busy),
    }


# --- the runner ---------------------------------------------------------------------------------------


def _peer(name: str, **kwargs: Any) -> dict | None:
    try:
        from bench.peer_celery import run_peer
    except ImportError as exc:
        print(f"  (peer not installed: {exc}; pip install -r requirements-bench.txt)")
        return None
    runner = getattr(run_peer, f"run_{name}", None)
    if runner is None:
        return None
    return runner(None, Path(tempfile.mkdtemp(prefix=f"peer-{name}-")), **kwargs)


def median_run(runs: list[dict]) -> dict:
    """The run with the median executions/s (the lower of the middle two), with every run's rate,
    their range, and the median CPU per run of each part of the machine."""
    ordered = sorted(runs, key=lambda run: run["executions_per_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    rates = [run["executions_per_s"] for run in runs]
    median["runs"] = len(runs)
    # Every run counts for correctness: a duplicate in any of them is reported.
    median["duplicates"] = sum(run.get("duplicates", 0) for run in runs)
    median["missing"] = sum(run.get("missing", 0) for run in runs)
    median["executions_per_s_each"] = rates
    median["executions_per_s_range"] = [min(rates), max(rates)]
    parts = {part for run in runs for part in run.get("cpu_us_per_run", {})}
    median["cpu_us_per_run_median"] = {
        part: statistics.median(run["cpu_us_per_run"].get(part, 0.0) for run in runs)
        for part in sorted(parts)
    }
    return median


def _ratio(ours: float, theirs: float) -> str:
    if not theirs or math.isnan(theirs) or math.isnan(ours):
        return "n/a"
    return f"{theirs / ours:.1f}x" if ours else "inf"


def _ms(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.1f}"


def _rate(run: dict) -> str:
    low, high = run.get("executions_per_s_range", [run["executions_per_s"]] * 2)
    spread = f" ({low:,.0f}-{high:,.0f})" if run.get("runs", 1) > 1 else ""
    return f"{run['executions_per_s']:,.0f}/s{spread}"


def _cpu(parts: dict[str, float]) -> str:
    named = [f"{name} {value:,.0f}" for name, value in parts.items() if name != "total"]
    return " + ".join(named) + f" = {parts.get('total', math.nan):,.0f}"


def _lags(lag: dict[str, float]) -> str:
    return " / ".join(_ms(lag.get(k)) for k in ("p50", "p95", "p99", "max")) + " ms"


def summary_table(results: dict[str, Any]) -> str:
    """Every figure of the run as ours | the peer's in the same run | the ratio, with the machine's
    load alongside (Markdown)."""
    rows: list[tuple[str, str, str, str]] = []
    w1r, peer1 = results.get("w1"), results.get("peer_w1")
    if w1r:
        rows.append(
            (
                "W1 fires / expected (duplicates, skipped)",
                f"{w1r['fires']:,} / {w1r['expected']:,} ({w1r['duplicates']}, {w1r['skipped']})",
                f"{peer1['fires']:,} / {peer1['expected']:,} ({peer1.get('duplicate_fires')}, "
                f"{peer1.get('skipped_slots')})"
                if peer1
                else "—",
                f"{w1r['fires'] / peer1['fires']:.2f}x the fires"
                if peer1 and peer1["fires"]
                else "—",
            )
        )
        rows.append(
            (
                "W1 lag p50 / p95 / p99 / max",
                _lags(w1r["lag_ms"]),
                _lags(peer1["lag_ms"]) if peer1 else "—",
                f"{_ratio(w1r['lag_ms']['p50'], peer1['lag_ms']['p50'])} / "
                f"{_ratio(w1r['lag_ms']['p99'], peer1['lag_ms']['p99'])} lower at p50 / p99"
                if peer1
                else "—",
            )
        )
        conns, logs = w1r.get("db_connections"), w1r.get("node_logs", {})
        rows.append(
            (
                "W1 database connections (peak / budget); node log warnings",
                (f"{conns['peak']} / {conns['budget']}" if conns else "n/a")
                + f"; {logs.get('warning_or_error_lines', 'n/a')} lines, "
                f"{logs.get('too_many_connections', 'n/a')} 'Too many connections'",
                "—",
                "—",
            )
        )
    w1b = results.get("w1b")
    if w1b:
        rows.append(
            (
                "W1 started 10 s behind: overdue slots run; backlog drained after",
                f"{w1b['overdue_run']:,} / {w1b['overdue_slots']:,}; "
                f"{w1b['backlog_drained_s_after_start']:.2f} s after the nodes started (first run "
                f"at {w1b['backlog_first_run_s_after_start']:.2f} s; {w1b['backlog_runs_per_s']:,.0f}"
                " runs/s)",
                "—",
                "—",
            )
        )
        rows.append(
            (
                "W1 behind: lag of the fires due after the backlog",
                _lags(w1b["lag_after_ms"])
                + f" ({w1b['fires_after']:,} / {w1b['expected_after']:,})",
                "—",
                "—",
            )
        )
    w2r, peer2 = results.get("w2"), results.get("peer_w2")
    if w2r:
        rows.append(
            (
                f"W2 burst, {w2r['submitted']:,} runs enqueued: executions/s, median of "
                f"{w2r.get('runs', 1)} (range; wall of the median run)",
                f"{_rate(w2r)} ({w2r['wall_s']:.2f} s; {w2r['duplicates']} dup, "
                f"{w2r['missing']} missing in all {w2r.get('runs', 1)})",
                f"{_rate(peer2)} ({peer2.get('wall_s', math.nan):.2f} s)" if peer2 else "—",
                f"{w2r['executions_per_s'] / peer2['executions_per_s']:.1f}x"
                if peer2 and peer2["executions_per_s"]
                else "—",
            )
        )
        ours_cpu = w2r.get("cpu_us_per_run_median") or w2r.get("cpu_us_per_run") or {}
        peer_cpu = (peer2 or {}).get("cpu_us_per_run_median") or (peer2 or {}).get("cpu_us_per_run")
        if ours_cpu:
            rows.append(
                (
                    "W2 CPU per run, median (us; from the first submission to the last start)",
                    _cpu(ours_cpu),
                    _cpu(peer_cpu) if peer_cpu else "—",
                    f"{peer_cpu['total'] / ours_cpu['total']:.1f}x less"
                    if peer_cpu and ours_cpu.get("total")
                    else "—",
                )
            )
        rows.append(("W2 lag p50 / p95 / p99 / max", _lags(w2r["lag_ms"]), "—", "—"))
    w2j = results.get("w2_jobs")
    if w2j:
        rows.append(
            (
                f"W2 burst, {w2j['submitted']:,} one-off jobs: executions/s (wall)",
                f"{w2j['executions_per_s']:,.0f}/s ({w2j['wall_s']:.2f} s; submitted "
                f"{w2j['submit_rate_per_s']:,.0f} jobs/s)",
                "—",
                "—",
            )
        )
    w3r, peer3 = results.get("w3"), results.get("peer_w3_tuned")
    if w3r:
        kill = w3r["sigkill"]
        rows.append(
            (
                "W3 SIGKILL of the leader 50 ms before a slot: gap p99; takeover; dup / slots "
                "without a run (of them recorded lost)",
                f"{kill['gap_s']['p99']:.2f} s; {kill['takeover_s']:.2f} s; "
                f"{kill['duplicates']} / {kill['skipped']} ({kill['lost_recorded']})",
                f"{peer3['gap_s']['p99']:.2f} s (tuned: 2 s lock, 1 s loop); "
                f"{peer3.get('duplicate_fires')} / {peer3.get('lost_slots')}"
                if peer3
                else "—",
                _ratio(kill["gap_s"]["p99"], peer3["gap_s"]["p99"]) + " shorter gap"
                if peer3
                else "—",
            )
        )
        term = w3r["sigterm"]
        rows.append(
            (
                "W3 SIGTERM of the leader: handover; gap p99; dup / slots without a run",
                f"{term['handover_s'] * 1000:.0f} ms; {term['gap_s']['p99']:.2f} s; "
                f"{term['duplicates']} / {term['skipped']}",
                "—",
                "—",
            )
        )
    w4r = results.get("w4")
    if w4r:
        rows.append(
            (
                f"W4 tick, {w4r['jobs_defined']:,} jobs defined: idle p50 / p99 (queries); 3 due",
                f"{_ms(w4r['idle_tick_ms']['p50'])} / {_ms(w4r['idle_tick_ms']['p99'])} ms "
                f"({w4r['idle_tick_queries']}); {_ms(w4r['tick_with_3_due_ms']['p50'])} ms "
                f"({w4r['tick_with_3_due_queries']})",
                "—",
                "—",
            )
        )
    start, end = (
        results["load_average_at_start"][0],
        results.get("load_average_at_end", [math.nan])[0],
    )
    head = (
        f"{results['cpus']} CPUs, {results['database']}, {results['nodes']} nodes "
        f"(pinned to CPUs {results['nodes_pinned_to_cpus']}), {results['hog_processes']} hog "
        f"processes; load average {start:.2f} at start, {end:.2f} at end; core speed probe "
        f"{results.get('speed_probe_ms_at_start', math.nan):.1f} ms at start, "
        f"{results.get('speed_probe_ms_at_end', math.nan):.1f} ms at end (CPU time of a fixed "
        f"workload, bench.cpu.speed_probe_ms: lower is faster)"
    )
    lines = [
        head,
        "",
        "| figure | ours | peer (Celery beat + redbeat), same run | ratio |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("workloads", nargs="*", default=["w1", "w1b", "w2", "w3", "w4"])
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run)")
    parser.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="scheduling partitions the jobs are split into (each its own leader)",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip the Celery peer")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--table", help="also write the summary table (Markdown) to this file")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the nodes unpinned (by default node i runs with --cpus on the i-th CPU)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="W2: N runs of ours and N of the peer's, in turn; the median is reported, with the "
        "range",
    )
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        metavar="N",
        help="run everything (ours and the peer) beside N busy-looping processes",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    hog = CpuHog(args.hog) if args.hog else None
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    workdir = Path(tempfile.mkdtemp(prefix="sched-bench-"))
    env = Environment(database_url, workdir, pin_cpus=not args.no_pin, partitions=args.partitions)
    # This process is the submitting client of both systems (our enqueue and batch services, the
    # peer's apply_async): loaded as a web process is, and frozen as one is (freeze_loaded).
    from cluster.startup import freeze_loaded

    freeze_loaded()
    results: dict[str, Any] = {
        "database": database_url.split("://")[0],
        "nodes": NODES,
        "nodes_pinned_to_cpus": [env.cpus[i % len(env.cpus)] for i in range(NODES)]
        if env.cpus
        else None,
        "hog_processes": args.hog,
        "partitions": args.partitions,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        # The host's core speed (CPU ms of a fixed workload; lower is faster): rates measured
        # at different figures do not compare, CPU per run does only roughly.
        "speed_probe_ms_at_start": speed_probe_ms(),
    }
    quick = args.quick
    try:
        if "w1" in args.workloads:
            print("W1 steady: 200 jobs every second, 3 nodes ...", flush=True)
            results["w1"] = w1(env, warmup_s=5 if quick else 10, window_s=15 if quick else 40)
            print(json.dumps(results["w1"], indent=2))
            if not args.no_peer:
                peer = _peer("w1", warmup_s=5 if quick else 10, window_s=15 if quick else 40)
                if peer:
                    results["peer_w1"] = peer
                    print("  peer (Celery beat + redbeat):", json.dumps(peer))
                    print(
                        f"  lag p50 {results['w1']['lag_ms']['p50']:.1f} ms vs {peer['lag_ms']['p50']:.1f} ms"
                        f" ({_ratio(results['w1']['lag_ms']['p50'], peer['lag_ms']['p50'])} lower), "
                        f"p99 {results['w1']['lag_ms']['p99']:.1f} vs {peer['lag_ms']['p99']:.1f} ms "
                        f"({_ratio(results['w1']['lag_ms']['p99'], peer['lag_ms']['p99'])} lower); fires "
                        f"{results['w1']['fires']}/{results['w1']['expected']} vs "
                        f"{peer['fires']}/{peer['expected']}"
                    )
        if "w1b" in args.workloads:
            print(
                "W1 behind: 200 jobs every second, their last 10 s overdue at start ...", flush=True
            )
            results["w1b"] = w1_behind(env, after_s=12 if quick else 20)
            print(json.dumps(results["w1b"], indent=2))
        if "w2" in args.workloads:
            count = 1000 if quick else 5000
            ours: list[dict] = []
            theirs: list[dict] = []
            # Ours and the peer's in turn: the host's share of CPU moves within minutes, and
            # interleaved runs see the same swings.
            for round_ in range(1, args.repeat + 1):
                print(
                    f"W2 burst ({round_}/{args.repeat}): {count:,} runs enqueued, due at "
                    "submission ...",
                    flush=True,
                )
                ours.append(w2(env, count=count))
                print(json.dumps(ours[-1], indent=2))
                if not args.no_peer:
                    peer = _peer("w2", count=count)
                    if peer:
                        theirs.append(peer)
                        print("  peer (Celery apply_async + worker):", json.dumps(peer))
            results["w2"] = median_run(ours)
            if theirs:
                results["peer_w2"] = median_run(theirs)
                print(
                    f"  executions/s, median of {len(ours)}: "
                    f"{results['w2']['executions_per_s']:.0f} vs "
                    f"{results['peer_w2']['executions_per_s']:.0f} "
                    f"({results['w2']['executions_per_s'] / results['peer_w2']['executions_per_s']:.1f}x)"
                )
            print(f"W2 burst: {count:,} one-off jobs created in batches ...", flush=True)
            results["w2_jobs"] = w2(env, count=count, mode="jobs")
            print(json.dumps(results["w2_jobs"], indent=2))
        if "w3" in args.workloads:
            print(
                "W3 failover: 10 jobs every second, SIGKILL then SIGTERM the leader ...", flush=True
            )
            results["w3"] = w3(env, after_s=8 if quick else 12)
            print(json.dumps(results["w3"], indent=2))
            if not args.no_peer:
                # redbeat's defaults never take over within a minute (standbys retry the lock
                # every beat_max_loop_interval, 300 s); the peer is measured tuned: a 2 s lock
                # and a 1 s loop interval.
                peer = _peer("w3", lock_timeout_s=2, max_loop_interval_s=1)
                if peer:
                    results["peer_w3_tuned"] = peer
                    print("  peer (Celery beat + redbeat, 2 s lock, 1 s loop):", json.dumps(peer))
        if "w4" in args.workloads:
            print("W4 scale: 100,000 jobs defined, 3 due ...", flush=True)
            results["w4"] = w4(env, defined=10_000 if quick else 100_000)
            print(json.dumps(results["w4"], indent=2))
    finally:
        results["load_average_at_end"] = os.getloadavg()
        results["speed_probe_ms_at_end"] = speed_probe_ms()
        if hog is not None:
            hog.stop()
        env.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"load average at start {results['load_average_at_start'][0]:.2f}, "
        f"at end {results['load_average_at_end'][0]:.2f} ({os.cpu_count()} CPUs, "
        f"{args.hog} hog processes)"
    )
    table = summary_table(results)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    if args.table:
        Path(args.table).write_text(table + "\n")


if __name__ == "__main__":
    main()
