"""Pages at scale (docs/benchmarks.md): how long the dashboard's and the API's pages take with a large
installation's data, a signed-in admin, best of N. A measurement, not a test.

    python -m bench.pages                                   # 1,000,000 jobs, 10,000,000 runs
    python -m bench.pages --jobs 100000 --runs 1000000
    python -m bench.pages --database-url mysql://root@127.0.0.1:3306/sched_pages --keep

The database (MariaDB; default ``sched_pages`` on 127.0.0.1) is migrated, then filled with MariaDB's
sequence engine (``seq_1_to_N``) from one template row of each kind: J interval jobs of the ``noop``
task (about 1 in 20 paused, their next fires spread over their interval), and R runs of them, the
newest at the fill's instant and the rest one every ``--span-hours`` * 3,600 / R seconds before it,
each job's runs in turn, mostly succeeded (1 in 25 failed, 1 in 200 lost, 1 in 500 skipped). A
database already holding exactly J jobs and R runs is reused, so ``--keep`` lets a second run
skip the fill. Then each page is requested through Django's test client in this process (no
network, no browser: the server's own time, queries included), warmed once and timed ``--repeat``
times; the best, the median and the number of queries are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_URL = "mysql://root@127.0.0.1:3306/sched_pages"
ADMIN = "bench-pages-admin"


def _setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    os.environ.setdefault("SCHEDULER_EXAMPLE_JOBS", "0")
    # The fill's statements write hundreds of thousands of rows each.
    os.environ.setdefault("SCHEDULER_DB_IO_TIMEOUT_S", "900")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _create_database(database_url: str, *, fresh: bool = False) -> None:
    from urllib.parse import urlsplit

    import MySQLdb

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    conn = MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        passwd=parts.password or "",
    )
    try:
        if fresh:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
    finally:
        conn.close()


def _fill(jobs: int, runs: int, span_hours: float) -> dict[str, float]:
    """J jobs (and an audit event each) and R runs, from one template row each (MariaDB's sequence
    engine)."""
    from django.db import connection
    from django.utils import timezone

    from jobs.models import AuditEvent, Job, JobExecution

    timings: dict[str, float] = {}
    now = timezone.now().replace(microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION foreign_key_checks = 0, unique_checks = 0")
    interval = max(1, jobs // 2000)  # 2,000 fires/s offered across the jobs
    template = Job.objects.create(
        name="template",
        task="noop",
        schedule_type="interval",
        interval_seconds=interval,
        next_fire_at=now,
        description="a job of the scale benchmark",
    )
    job_table = Job._meta.db_table
    columns = [f.column for f in Job._meta.concrete_fields]
    base = template.pk  # the jobs get ids base + 1 ... base + J (no gaps for the runs to miss)
    values = {
        "id": f"({base} + s.seq)",
        "name": "CONCAT('scale-', LPAD(s.seq, 7, '0'))",
        "enabled": "(MOD(s.seq, 20) <> 0)",
        "next_fire_at": f"DATE_ADD(t.next_fire_at, INTERVAL MOD(s.seq, {interval}) SECOND)",
    }
    timings["fill jobs (s)"] = _copy_template(job_table, columns, values, base, jobs, "jobs")
    first_job = base + 1
    # One audit event per job, as creating them through the batch service writes.
    audit_table = AuditEvent._meta.db_table
    began = time.monotonic()
    with connection.cursor() as cursor:
        for first, last in _seq_ranges(jobs):
            cursor.execute(
                f"INSERT INTO {audit_table} (actor_name, action, object_type, object_id, "
                "object_repr, changes, source, created_at) "
                f"SELECT 'admin', 'job.create', 'job', {base} + s.seq, "
                "CONCAT('scale-', LPAD(s.seq, 7, '0')), '{}', 'api', "
                f"DATE_SUB(%s, INTERVAL ({jobs} + 1 - s.seq) SECOND) FROM seq_{first}_to_{last} s",
                [now - timedelta(days=1)],
            )
    timings["fill audit (s)"] = time.monotonic() - began
    run = JobExecution.objects.create(
        job_id=first_job,
        scheduled_for=now,
        run_after=now,
        status="succeeded",
        node="node-1",
        term=1,
        claimed_at=now,
        started_at=now,
        finished_at=now,
        duration_ms=12.5,
        result={"ok": True},
    )
    run_table = JobExecution._meta.db_table
    run_columns = [f.column for f in JobExecution._meta.concrete_fields if f.column != "id"]
    gap_ms = max(1, int(span_hours * 3_600_000 / runs))
    slot = f"DATE_SUB(t.scheduled_for, INTERVAL ({runs} + 1 - s.seq) * {gap_ms} * 1000 MICROSECOND)"
    status = (
        "CASE WHEN MOD(s.seq, 500) = 0 THEN 'skipped' WHEN MOD(s.seq, 200) = 0 THEN 'lost' "
        "WHEN MOD(s.seq, 25) = 0 THEN 'failed' ELSE 'succeeded' END"
    )
    run_values = {
        "job_id": f"({first_job} + MOD(s.seq, {jobs}))",
        "trigger": "'schedule'",
        "scheduled_for": slot,
        "run_after": slot,
        "created_at": slot,
        "updated_at": slot,
        "claimed_at": slot,
        "started_at": slot,
        "finished_at": f"DATE_ADD({slot}, INTERVAL 12500 MICROSECOND)",
        "status": status,
        "node": "CONCAT('node-', 1 + MOD(s.seq, 3))",
        "error": "CASE WHEN MOD(s.seq, 25) = 0 THEN 'ValueError: boom' ELSE '' END",
    }
    began = time.monotonic()
    _copy_template(run_table, run_columns, run_values, run.pk, runs, "runs")
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {run_table} WHERE id = %s", [run.pk])
        cursor.execute(f"DELETE FROM {job_table} WHERE id = %s", [template.pk])
        cursor.execute(f"ANALYZE TABLE {job_table}, {run_table}, {audit_table}")
    timings["fill runs (s)"] = time.monotonic() - began
    return timings


def _seq_ranges(count: int, step: int = 250_000) -> Iterator[tuple[int, int]]:
    """1..``count`` in ranges of ``step``: the bounds of the ``seq_<first>_to_<last>`` tables
    (MariaDB's sequence engine) that number the rows of one INSERT ... SELECT."""
    for first in range(1, count + 1, step):
        yield first, min(count, first + step - 1)


def _copy_template(
    table: str, columns: list[str], values: dict[str, str], template_id: int, count: int, label: str
) -> float:
    """INSERT ``count`` copies of one template row, 250,000 a statement (``s.seq`` numbers them
    from 1; ``values`` gives a column's SQL expression, the others copy the template's ``t``).
    Returns the seconds it took."""
    from django.db import connection

    names = ", ".join(f"`{c}`" for c in columns)
    select = ", ".join(values.get(c, f"t.`{c}`") for c in columns)
    began = time.monotonic()
    with connection.cursor() as cursor:
        for first, last in _seq_ranges(count):
            cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT {select} FROM seq_{first}_to_{last} s "
                f"JOIN {table} t ON t.id = %s",
                [template_id],
            )
            print(f"  {label} {last:,} / {count:,}  ({time.monotonic() - began:.0f} s)", flush=True)
    return time.monotonic() - began


def _pages() -> list[tuple[str, str]]:
    """(label, path) of every page timed, addressed to rows of the filled data."""
    from jobs.models import Job, JobExecution

    job = Job.objects.order_by("-id").values_list("id", "name").first()
    assert job is not None, "no jobs"
    job_id, name = job
    run_id = JobExecution.objects.order_by("-id").values_list("id", flat=True).first()
    needle = name[-6:]
    return [
        ("overview", "/"),
        ("jobs", "/jobs/"),
        ("jobs, search", f"/jobs/?q={needle}"),
        ("jobs, by next fire", "/jobs/?sort=next"),
        ("jobs, paused", "/jobs/?enabled=no"),
        ("jobs, by last outcome", "/jobs/?sort=outcome"),
        ("job detail", f"/jobs/{job_id}/"),
        ("executions", "/executions/"),
        ("executions, succeeded", "/executions/?status=succeeded"),
        ("executions, failed", "/executions/?status=failed"),
        ("executions of one job", f"/executions/?job={job_id}"),
        ("executions, search", f"/executions/?q={needle}"),
        ("execution detail", f"/executions/{run_id}/"),
        ("nodes", "/nodes/"),
        ("audit", "/audit/"),
        ("audit of one job", f"/audit/?object_type=job&object_id={job_id}"),
        ("API jobs", "/api/jobs/"),
        ("API jobs, search", f"/api/jobs/?search={needle}"),
        ("API executions", "/api/executions/"),
        ("API executions, failed", "/api/executions/?status=failed"),
        ("API cluster", "/api/cluster/"),
    ]


def _time_pages(repeat: int, only: list[str]) -> list[dict[str, Any]]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user_model = get_user_model()
    if not user_model.objects.filter(username=ADMIN).exists():
        call_command("createuser", ADMIN, "--role", "admin", "--password", "Quartz-Falcon-7731")
    client = Client()
    client.force_login(user_model.objects.get(username=ADMIN))
    rows = []
    for label, path in _pages():
        if only and label not in only:
            continue
        response = client.get(path)  # warm: caches, the buffer pool
        times = []
        queries = 0
        for _ in range(repeat):
            reset_queries()
            with CaptureQueriesContext(connection) as captured:
                began = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - began) * 1000)
            queries = len(captured)
        rows.append(
            {
                "page": label,
                "path": path,
                "status": response.status_code,
                "best_ms": min(times),
                "median_ms": statistics.median(times),
                "queries": queries,
                "bytes": len(response.content),
            }
        )
        print(
            f"  {label:28} {min(times):8.1f} ms best  {statistics.median(times):8.1f} ms median"
            f"  {queries:3} queries  {response.status_code}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--span-hours", type=float, default=24.0, help="the runs' time span")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the database for a next run")
    parser.add_argument(
        "--page", action="append", default=[], help="time only this page (its label; repeatable)"
    )
    args = parser.parse_args()
    if not args.database_url.startswith("mysql://"):
        parser.error("--database-url: MariaDB only (the fill uses its sequence engine)")
    if args.jobs < 1 or args.runs < 1:
        parser.error("--jobs and --runs must be at least 1")
    _create_database(args.database_url)
    _setup(args.database_url)
    from django.core.management import call_command
    from django.db import connection

    from jobs.models import Job, JobExecution

    call_command("migrate", verbosity=0)
    have = (Job.objects.count(), JobExecution.objects.count())
    print(f"database {connection.settings_dict['NAME']}: {have[0]:,} jobs, {have[1]:,} runs")
    if have != (args.jobs, args.runs):
        connection.close()
        _create_database(args.database_url, fresh=True)
        call_command("migrate", verbosity=0)
        print(f"filling {args.jobs:,} jobs and {args.runs:,} runs over {args.span_hours:g} h")
        for label, value in _fill(args.jobs, args.runs, args.span_hours).items():
            print(f"  {label}: {value:.1f}")
    print(f"pages (signed-in admin, best and median of {args.repeat}):")
    _time_pages(args.repeat, args.page)
    if not args.keep:
        name = connection.settings_dict["NAME"]
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE `{name}`")
        print(f"dropped {name}")


if __name__ == "__main__":
    main()
