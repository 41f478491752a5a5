"""Run the Celery + redbeat PEER on workloads W1, W2 and W3 (docs/benchmarks.md) and compute its figures.

Importable by the bench runner::

    from bench.peer_celery.run_peer import run_w1, run_w2, run_w3
    run_w1(redis_url: str | None, workdir: Path, jobs=200, warmup_s=10, window_s=40, ...) -> dict
    run_w2(redis_url: str | None, workdir: Path, *, count=5000, timeout_s=180, ...) -> dict
    run_w3(redis_url: str | None, workdir: Path, jobs=10, lock_timeout_s=None, ...) -> dict

and as a CLI (prints the dict as JSON)::

    python -m bench.peer_celery.run_peer w1 --jobs 50 --warmup 3 --window 10
    python -m bench.peer_celery.run_peer w2 --count 1000
    python -m bench.peer_celery.run_peer w3 --jobs 10 --lock-timeout 2 --after-kill 15

Topology ("3 nodes" on one machine): 3 ``celery beat -S StampingRedBeatScheduler`` processes (only the
redbeat lock holder schedules, the other two block on the lock) and 1 ``celery worker``, all on the same
Redis. Worker: the default prefork pool with ``--concurrency 4`` -- prefork is Celery's default pool and
what a user deploys; 4 processes on 2 cores is the usual "a few per core" choice for short tasks (the
default would be 2 = cpu count). Log levels: beat INFO (as the docs show; redbeat logs lock events at
INFO), worker WARNING (does not handicap the peer with per-task log lines; pass worker_loglevel="INFO"
to change). Every execution appends "job slot_ts started pid" to a record file (see app.py for what
slot_ts -- the peer's "due" -- means). W2 has no beat: one-off jobs due now are what a Celery user
sends straight to the queue with ``apply_async`` (slot_ts = the submission time).

If ``redis_url`` is None a private redis-server is started on a free loopback port and stopped by PID.
All child processes are started in their own session and stopped by PID / their own process group in
``finally`` blocks; every wait is bounded. Keys of a run live under a per-run namespace (redbeat key
prefix + queue name) and are deleted at the end, so a shared Redis is not polluted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import redis

from bench.cpu import CpuMeter, descendants
from bench.records import RecordCounter

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = "bench.peer_celery.app"
SCHEDULER = "bench.peer_celery.app:StampingRedBeatScheduler"
# W3 kills the lock holder this long before a whole second (as bench.run does ours).
SLOT_KILL_EARLY_S = 0.05


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_redis(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
    finally:
        client.close()


def _start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = open(workdir / "redis.log", "wb")
    try:
        proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_redis(url)
    except Exception:
        _stop(proc, grace_s=2)
        raise
    return proc, url


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
    """Stop one child we started (and its process group, which it leads) by PID; bounded."""
    if proc is None:
        return
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # leftovers (prefork children, or a child that ignored the signal)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _env(
    redis_url: str,
    record_file: Path,
    jobs: int,
    namespace: str,
    info_dir: Path,
    lock_timeout_s: float | None,
    max_loop_interval_s: float | None,
    interval_s: float,
) -> dict:
    env = dict(os.environ)
    env.update(
        PEER_REDIS_URL=redis_url,
        PEER_RECORD_FILE=str(record_file),
        PEER_JOBS=str(jobs),
        PEER_INTERVAL=repr(float(interval_s)),
        PEER_NAMESPACE=namespace,
        PEER_BEAT_INFO_DIR=str(info_dir),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    for key, value in (
        ("PEER_LOCK_TIMEOUT", lock_timeout_s),
        ("PEER_MAX_LOOP_INTERVAL", max_loop_interval_s),
    ):
        if value is None:
            env.pop(key, None)
        else:
            env[key] = repr(float(value))
    return env


def _spawn(args: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, *args],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()


def _spawn_worker(env, workdir, pool, concurrency, loglevel):
    return _spawn(
        [
            "worker",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            loglevel,
            "--hostname",
            f"peer-worker@{socket.gethostname()}",
        ],
        env,
        workdir / "worker.log",
    )


def _spawn_beat(env, workdir, i, loglevel="INFO"):
    # --pidfile "" : three beats share a cwd; redbeat needs no local schedule file.
    return _spawn(
        [
            "beat",
            "-S",
            SCHEDULER,
            "--loglevel",
            loglevel,
            "--pidfile",
            "",
            "--schedule",
            str(workdir / f"beat-{i}.schedule"),
        ],
        env,
        workdir / f"beat-{i}.log",
    )


def _cleanup_keys(redis_url: str, namespace: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"redbeat:{namespace}:*", count=1000))
        keys += [f"{namespace}-celery".encode()]
        keys += list(client.scan_iter(match=f"_kombu.binding.{namespace}-celery*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.exceptions.RedisError:
        pass
    finally:
        client.close()


def _queue_len(redis_url: str, namespace: str) -> int | None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        return int(client.llen(f"{namespace}-celery"))
    except redis.exceptions.RedisError:
        return None
    finally:
        client.close()


# --------------------------------------------------------------------------- records


def read_records(path: Path) -> list[tuple[str, float | None, float, int]]:
    """Lines "job slot_ts started pid" -> [(job, due, started, pid)]."""
    out = []
    if not path.exists():
        return out
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            job, slot, started, pid = parts
            due = None if slot == "None" else float(slot)
            out.append((job, due, float(started), int(pid)))
    return out


def _pct(sorted_vals: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def _r(x, nd=2):
    return None if x is None else round(x, nd)


def _duplicates(records) -> int:
    seen: dict[tuple[str, float], int] = defaultdict(int)
    for job, due, _, _ in records:
        if due is not None:
            seen[(job, due)] += 1
    return sum(n - 1 for n in seen.values() if n > 1)


def analyse_w1(records, jobs: int, t_start: float, t_end: float, interval_s: float = 1.0) -> dict:
    """Figures over the window [t_start, t_end) of due times (the peer's own due, see app.py)."""
    window_s = t_end - t_start
    in_window = [r for r in records if r[1] is not None and t_start <= r[1] < t_end]
    lags_ms = sorted((started - due) * 1000.0 for _, due, started, _ in in_window)
    started_in_window = sum(1 for r in records if t_start <= r[2] < t_end)
    expected = round(jobs * window_s / interval_s)
    per_job_slots = round(window_s / interval_s)
    by_job: dict[str, set[float]] = defaultdict(set)
    for job, due, _, _ in in_window:
        by_job[job].add(due)
    # Skipped slots: per job, nominal interval slots of the window that got no fire (the peer's
    # interval schedule drifts -- next due = send time + interval -- so it loses slots instead of
    # firing them late). Jobs that never fired in the window count fully.
    skipped = sum(max(0, per_job_slots - len(by_job.get(f"job-{i:04d}", ()))) for i in range(jobs))
    periods = []
    for dues in by_job.values():
        d = sorted(dues)
        periods += [b - a for a, b in itertools.pairwise(d)]
    periods.sort()
    return {
        "window_s": round(window_s, 3),
        "executions_per_s": _r(started_in_window / window_s if window_s > 0 else None),
        "fires": len(in_window),
        "expected": expected,
        "fires_over_expected": _r(len(in_window) / expected if expected else None, 4),
        "lag_ms": {
            "p50": _r(_pct(lags_ms, 50)),
            "p95": _r(_pct(lags_ms, 95)),
            "p99": _r(_pct(lags_ms, 99)),
            "max": _r(lags_ms[-1] if lags_ms else None),
        },
        "duplicate_fires": _duplicates(in_window),
        "skipped_slots": skipped,
        "due_period_s": {
            "p50": _r(_pct(periods, 50), 4),
            "max": _r(periods[-1] if periods else None, 4),
        },
        "worker_pids": len({r[3] for r in in_window}),
    }


def analyse_w3(records, jobs: int, kill_t: float, end_t: float, interval_s: float = 1.0) -> dict:
    """Failover figures around ``kill_t``.

    "Before" = fires whose due time (stamped by the sending beat) is < kill_t, i.e. scheduled by the
    killed leader; "after" = due >= kill_t. Gaps and kill->first fire use the execution start times.
    Lost slots per job = round(gap / interval) - 1 (nominal slots that passed with no fire); a job with
    no fire after the kill loses floor((end - last fire) / interval) slots.
    """
    per_job = {}
    gaps, kill_to_first, lost_total, no_takeover = [], [], 0, 0
    by_job: dict[str, list] = defaultdict(list)
    for r in records:
        by_job[r[0]].append(r)
    for i in range(jobs):
        job = f"job-{i:04d}"
        rs = sorted(by_job.get(job, []), key=lambda r: r[2])
        before = [r for r in rs if r[1] is not None and r[1] < kill_t]
        after = [r for r in rs if r[1] is not None and r[1] >= kill_t]
        last_before = before[-1][2] if before else None
        first_after = after[0][2] if after else None
        if last_before is not None and first_after is not None:
            gap = first_after - last_before
            lost = max(0, round(gap / interval_s) - 1)
            gaps.append(gap)
            kill_to_first.append(first_after - kill_t)
        else:
            gap = None
            lost = int((end_t - (last_before or kill_t)) // interval_s)
            no_takeover += 1
        lost_total += lost
        per_job[job] = {
            "gap_s": _r(gap, 3),
            "kill_to_first_s": _r(first_after - kill_t, 3) if first_after is not None else None,
            "lost_slots": lost,
        }
    gaps.sort()
    kill_to_first.sort()
    around = [
        r
        for r in records
        if r[1] is not None and kill_t - 5 <= r[1] <= kill_t + 5 + (gaps[-1] if gaps else 0)
    ]
    return {
        "jobs_taken_over": jobs - no_takeover,
        "jobs_without_fire_after_kill": no_takeover,
        "gap_s": {
            "p50": _r(_pct(gaps, 50), 3),
            "p99": _r(_pct(gaps, 99), 3),
            "max": _r(gaps[-1] if gaps else None, 3),
        },
        "kill_to_first_fire_s": {
            "min": _r(kill_to_first[0] if kill_to_first else None, 3),
            "p50": _r(_pct(kill_to_first, 50), 3),
            "max": _r(kill_to_first[-1] if kill_to_first else None, 3),
        },
        "lost_slots": lost_total,
        "duplicate_fires": _duplicates(records),
        "duplicate_fires_around_kill": _duplicates(around),
        "per_job": per_job,
    }


# --------------------------------------------------------------------------- leader


def _find_leader(
    redis_url: str,
    namespace: str,
    workdir: Path,
    beats: list[subprocess.Popen],
    timeout_s: float = 20.0,
) -> tuple[subprocess.Popen, str]:
    """The beat holding redbeat's lock.

    Primary: the lock key ``redbeat:<ns>::lock`` holds the redis-py Lock token (a uuid, not a pid); each
    beat writes "<pid> <token>" to beat-<pid>.lock once redbeat's beat_init receiver returned with the
    lock (app.py), so the leader is the live beat whose token equals the key's value.
    Fallback: the only live beat whose log says "beat: Acquired lock" (standbys block before logging it).
    """
    lock_key = f"redbeat:{namespace}::lock"
    client = redis.Redis.from_url(redis_url, socket_timeout=2, decode_responses=True)
    deadline = time.monotonic() + timeout_s
    by_pid = {b.pid: b for b in beats if b.poll() is None}
    try:
        while time.monotonic() < deadline:
            token = client.get(lock_key)
            if token:
                for pid, b in by_pid.items():
                    p = workdir / "beats" / f"beat-{pid}.lock"
                    if p.exists():
                        parts = p.read_text().split()
                        if len(parts) >= 2 and parts[1] == token and b.poll() is None:
                            return b, "lock-token"
            holders = [
                b
                for i, b in enumerate(beats)
                if b.poll() is None and "beat: Acquired lock" in _read(workdir / f"beat-{i}.log")
            ]
            if len(holders) == 1 and token:
                return holders[0], "log"
            time.sleep(0.1)
    finally:
        client.close()
    raise RuntimeError("could not identify the redbeat lock holder")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- workloads


def _prepare(workdir: Path | str | None, tag: str) -> Path:
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"peer-celery-{tag}-"))
    workdir = Path(workdir) / f"peer-celery-{tag}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (workdir / "beats").mkdir(parents=True, exist_ok=True)
    return workdir


def run_w1(
    redis_url: str | None,
    workdir: Path,
    jobs: int = 200,
    warmup_s: float = 10,
    window_s: float = 40,
    *,
    drain_s: float = 3.0,
    beats: int = 3,
    pool: str = "prefork",
    concurrency: int = 4,
    worker_loglevel: str = "WARNING",
    lock_timeout_s: float | None = None,
    max_loop_interval_s: float | None = None,
    interval_s: float = 1.0,
) -> dict:
    """W1 steady: ``jobs`` interval entries every ``interval_s``; 3 redbeat beats + 1 worker.

    Measures over a ``window_s`` window of due times starting ``warmup_s`` after the processes were
    launched, then waits ``drain_s`` so fires due inside the window can start, then stops everything.
    """
    workdir = _prepare(workdir, "w1")
    namespace = f"peer{uuid.uuid4().hex[:8]}"
    record_file = workdir / "records.txt"
    redis_proc = worker = None
    beat_procs: list[subprocess.Popen] = []
    try:
        if redis_url is None:
            redis_proc, redis_url = _start_redis(workdir)
        env = _env(
            redis_url,
            record_file,
            jobs,
            namespace,
            workdir / "beats",
            lock_timeout_s,
            max_loop_interval_s,
            interval_s,
        )
        worker = _spawn_worker(env, workdir, pool, concurrency, worker_loglevel)
        t0 = time.time()
        beat_procs = [_spawn_beat(env, workdir, i) for i in range(beats)]
        t_start, t_end = t0 + warmup_s, t0 + warmup_s + window_s
        time.sleep(max(0.0, t_end + drain_s - time.time()))
        backlog = _queue_len(redis_url, namespace)
        crashed = [i for i, b in enumerate(beat_procs) if b.poll() is not None]
        worker_alive = worker.poll() is None
    finally:
        for b in beat_procs:
            _stop(b)
        _stop(worker)
        if redis_url is not None and redis_proc is None:
            _cleanup_keys(redis_url, namespace)
        _stop(redis_proc, grace_s=5)
    out = analyse_w1(read_records(record_file), jobs, t_start, t_end, interval_s)
    out.update(
        workload="W1",
        peer="celery+redbeat",
        jobs=jobs,
        warmup_s=warmup_s,
        beats=beats,
        worker=f"{pool} x{concurrency}",
        lock_timeout_s=lock_timeout_s,
        max_loop_interval_s=max_loop_interval_s,
        queue_backlog_at_end=backlog,
        beats_exited_early=crashed,
        worker_alive_at_end=worker_alive,
        workdir=str(workdir),
    )
    return out


def analyse_w2(records, count: int, first_submit: float, last_submit: float) -> dict:
    """W2 figures, the same keys (and definitions) as bench.run.w2 computes for us."""
    starts = [r[2] for r in records]
    per_job: dict[str, int] = defaultdict(int)
    for job, _, _, _ in records:
        per_job[job] += 1
    lags_ms = sorted((started - due) * 1000.0 for _, due, started, _ in records if due is not None)
    wall = (max(starts) - first_submit) if starts else math.nan
    submit_s = last_submit - first_submit
    return {
        "submitted": count,
        "submit_rate_per_s": count / submit_s if submit_s > 0 else math.nan,
        "started": len(per_job),
        "wall_s": wall,
        "executions_per_s": len(records) / wall if starts and wall > 0 else 0.0,
        "lag_ms": {
            "p50": _pct(lags_ms, 50) if lags_ms else math.nan,
            "p95": _pct(lags_ms, 95) if lags_ms else math.nan,
            "p99": _pct(lags_ms, 99) if lags_ms else math.nan,
            "max": lags_ms[-1] if lags_ms else math.nan,
        },
        "duplicates": sum(n - 1 for n in per_job.values()),
        "missing": count - len(per_job),
    }


def _wait_records(path: Path, prefix: str, n: int, timeout_s: float) -> int:
    """Bounded wait until ``n`` records whose job starts with ``prefix`` exist; returns the count."""
    return RecordCounter(path, prefix).wait_for(n, timeout_s)


def run_w2(
    redis_url: str | None,
    workdir: Path,
    *,
    count: int = 5000,
    timeout_s: float = 180,
    ready_timeout_s: float = 60,
    pool: str = "prefork",
    concurrency: int = 4,
    worker_loglevel: str = "WARNING",
) -> dict:
    """W2 burst: ``count`` one-off jobs sent as fast as one client can, each due at its submission.

    The same worker as W1/W3 (no beat). Once the worker has executed ``concurrency`` warm-up tasks
    (bounded by ``ready_timeout_s``), this process sends ``record.apply_async`` ``count`` times in a
    loop over one producer connection, each with a unique job id and its own submission time as
    ``slot_ts``; then waits (bounded by ``timeout_s``) for ``count`` records. Lag = body start -
    submission time; wall = last start - first submit.
    """
    from bench.peer_celery.app import record  # importing only builds the app; no connection yet

    workdir = _prepare(workdir, "w2")
    namespace = f"peer{uuid.uuid4().hex[:8]}"
    queue = f"{namespace}-celery"
    record_file = workdir / "records.txt"
    redis_proc = worker = None
    meter: CpuMeter | None = None
    ready = False
    first_submit = last_submit = math.nan
    try:
        if redis_url is None:
            redis_proc, redis_url = _start_redis(workdir)
        env = _env(redis_url, record_file, 0, namespace, workdir / "beats", None, None, 1.0)
        worker = _spawn_worker(env, workdir, pool, concurrency, worker_loglevel)
        # This process is the client: its own connection to the run's Redis and queue (the app's
        # import-time defaults are not used, so a shared Redis / repeated runs stay separate).
        with record.app.connection_for_write(redis_url) as conn:
            producer = record.app.amqp.Producer(conn)
            for i in range(concurrency):
                record.apply_async(
                    kwargs={"job": f"warmup-{i}", "slot_ts": time.time()},
                    producer=producer,
                    queue=queue,
                )
            ready = (
                _wait_records(record_file, "warmup-", concurrency, ready_timeout_s) >= concurrency
            )
            if not ready:
                raise RuntimeError(f"celery worker not ready after {ready_timeout_s}s")
            # What the worker (its pool included), its Redis and this client spend per run, as
            # bench.run measures for us.
            meter = CpuMeter(
                {
                    "worker": descendants(worker.pid),
                    "redis": [redis_proc.pid] if redis_proc is not None else [],
                    "client": [os.getpid()],
                }
            )
            meter.start()
            first_submit = time.time()
            for i in range(count):
                record.apply_async(
                    kwargs={"job": f"w2-{i:05d}", "slot_ts": time.time()},
                    producer=producer,
                    queue=queue,
                )
            last_submit = time.time()
        _wait_records(record_file, "w2-", count, timeout_s)
        meter.stop()
        backlog = _queue_len(redis_url, namespace)
        worker_alive = worker.poll() is None
    finally:
        _stop(worker)
        if redis_url is not None and redis_proc is None:
            _cleanup_keys(redis_url, namespace)
        _stop(redis_proc, grace_s=5)
    records = [r for r in read_records(record_file) if r[0].startswith("w2-")]
    out = analyse_w2(records, count, first_submit, last_submit)
    out["cpu_us_per_run"] = meter.per_run_us(len(records)) if meter is not None else {}
    out["steal_share"] = meter.steal_share if meter is not None else None
    out.update(
        workload="W2",
        peer="celery",
        worker=f"{pool} x{concurrency}",
        submit_s=last_submit - first_submit,
        queue_backlog_at_end=backlog,
        worker_alive_at_end=worker_alive,
        worker_pids=len({r[3] for r in records}),
        workdir=str(workdir),
    )
    return out


def run_w3(
    redis_url: str | None,
    workdir: Path,
    jobs: int = 10,
    lock_timeout_s: float | None = None,
    *,
    before_kill_s: float = 10,
    after_kill_s: float | None = None,
    max_loop_interval_s: float | None = None,
    kill_signal: str = "KILL",
    beats: int = 3,
    pool: str = "prefork",
    concurrency: int = 4,
    worker_loglevel: str = "WARNING",
    interval_s: float = 1.0,
) -> dict:
    """W3 failover: ``jobs`` entries every ``interval_s``, 3 redbeat beats; after ``before_kill_s``
    send SIGKILL (or ``kill_signal="TERM"``) to the lock holder and keep running ``after_kill_s``
    (default 30 s with a tuned lock, 60 s with redbeat's default lock timeout of 1500 s).
    """
    if after_kill_s is None:
        after_kill_s = 60.0 if lock_timeout_s is None else 30.0
    sig = getattr(signal, "SIG" + kill_signal.upper().removeprefix("SIG"))
    workdir = _prepare(workdir, "w3")
    namespace = f"peer{uuid.uuid4().hex[:8]}"
    record_file = workdir / "records.txt"
    redis_proc = worker = None
    beat_procs: list[subprocess.Popen] = []
    killed_pid = how = kill_t = None
    try:
        if redis_url is None:
            redis_proc, redis_url = _start_redis(workdir)
        env = _env(
            redis_url,
            record_file,
            jobs,
            namespace,
            workdir / "beats",
            lock_timeout_s,
            max_loop_interval_s,
            interval_s,
        )
        worker = _spawn_worker(env, workdir, pool, concurrency, worker_loglevel)
        t0 = time.time()
        beat_procs = [_spawn_beat(env, workdir, i) for i in range(beats)]
        time.sleep(max(0.0, t0 + before_kill_s - time.time()))
        leader, how = _find_leader(redis_url, namespace, workdir, beat_procs)
        killed_pid = leader.pid
        # The same instant as ours: just before a whole second (a 1 s entry is due then).
        time.sleep(max(0.0, math.ceil(time.time() + 0.5) - SLOT_KILL_EARLY_S - time.time()))
        kill_t = time.time()
        os.kill(leader.pid, sig)
        end_t = kill_t + after_kill_s
        time.sleep(max(0.0, end_t - time.time()))
        new_holders = [
            p.name
            for p in (workdir / "beats").glob("beat-*.lock")
            if p.name != f"beat-{killed_pid}.lock"
        ]
    finally:
        for b in beat_procs:
            _stop(b)
        _stop(worker)
        if redis_url is not None and redis_proc is None:
            _cleanup_keys(redis_url, namespace)
        _stop(redis_proc, grace_s=5)
    out = analyse_w3(read_records(record_file), jobs, kill_t, end_t, interval_s)
    out.update(
        workload="W3",
        peer="celery+redbeat",
        jobs=jobs,
        signal=f"SIG{kill_signal.upper()}",
        lock_timeout_s=lock_timeout_s
        if lock_timeout_s is not None
        else "default (5 x max_loop_interval)",
        max_loop_interval_s=max_loop_interval_s
        if max_loop_interval_s is not None
        else "default (300)",
        before_kill_s=before_kill_s,
        after_kill_s=after_kill_s,
        killed_pid=killed_pid,
        leader_found_by=how,
        new_lock_holders=new_holders,
        workdir=str(workdir),
    )
    return out


# --------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="workload", required=True)
    for name in ("w1", "w3"):
        p = sub.add_parser(name)
        p.add_argument("--redis-url", default=None, help="default: start a private redis-server")
        p.add_argument("--workdir", type=Path, default=None)
        p.add_argument("--jobs", type=int, default=200 if name == "w1" else 10)
        p.add_argument("--lock-timeout", type=float, default=None)
        p.add_argument("--max-loop-interval", type=float, default=None)
        p.add_argument("--pool", default="prefork")
        p.add_argument("--concurrency", type=int, default=4)
        if name == "w1":
            p.add_argument("--warmup", type=float, default=10)
            p.add_argument("--window", type=float, default=40)
            p.add_argument("--drain", type=float, default=3)
        else:
            p.add_argument("--before-kill", type=float, default=10)
            p.add_argument("--after-kill", type=float, default=None)
            p.add_argument("--signal", default="KILL", choices=["KILL", "TERM"])
            p.add_argument("--per-job", action="store_true", help="include per-job figures")
    p = sub.add_parser("w2")
    p.add_argument("--redis-url", default=None, help="default: start a private redis-server")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--count", type=int, default=5000)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--pool", default="prefork")
    p.add_argument("--concurrency", type=int, default=4)
    a = ap.parse_args(argv)
    if a.workload == "w2":
        res = run_w2(
            a.redis_url,
            a.workdir,
            count=a.count,
            timeout_s=a.timeout,
            pool=a.pool,
            concurrency=a.concurrency,
        )
    elif a.workload == "w1":
        res = run_w1(
            a.redis_url,
            a.workdir,
            a.jobs,
            a.warmup,
            a.window,
            drain_s=a.drain,
            pool=a.pool,
            concurrency=a.concurrency,
            lock_timeout_s=a.lock_timeout,
            max_loop_interval_s=a.max_loop_interval,
        )
    else:
        res = run_w3(
            a.redis_url,
            a.workdir,
            a.jobs,
            a.lock_timeout,
            before_kill_s=a.before_kill,
            after_kill_s=a.after_kill,
            max_loop_interval_s=a.max_loop_interval,
            kill_signal=a.signal,
            pool=a.pool,
            concurrency=a.concurrency,
        )
        if not a.per_job:
            res.pop("per_job", None)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
