"""Run the cluster under a seeded nemesis and check what happened:
``python manage.py chaos --minutes N --seed S [--coordination redis|database]
[--database sqlite|mariadb | --database-url URL] [--nodes 3] [--jobs 10] [--faults K,K]
[--durations S,S]``.

The run gets its own database: a SQLite file in a temporary directory by default; with
``--database mariadb`` a MariaDB server of its own, which the nemesis may also kill and restart;
or the MariaDB database named by ``--database-url`` (created if missing, dropped at the end) on a
server the run does not own. With ``--coordination redis`` it starts its own redis-server
processes; it never touches the caller's. ``--faults`` deals only the named kinds (``--faults
list`` prints the kinds a configuration can take) and ``--durations`` fixes the length of each
fault in turn: ``--faults partition_db_leader --durations 8,30`` measures one row of the
partition table. It prints
the faults as they land and a report (slots checked, runs, faults by kind, violations by kind with
their evidence) and exits 1 on any violation, 2 on bad arguments, 3 when the cluster could not be
set up, 4 when the verifier itself failed, 130 when interrupted. ``--check-history FILE`` re-checks
a history saved by ``--save-history`` (no cluster is started).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import dj_database_url
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chaos.checker import check
from chaos.record import history_from_dict
from chaos.runner import (
    EXIT_INTERRUPTED,
    EXIT_SETUP,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    ChaosPlan,
    check_config,
    fault_kinds,
)
from jobs import partitioning

MAX_MINUTES = 24 * 60
MIN_NODES, MAX_NODES = 2, 9
MIN_JOBS, MAX_JOBS = 1, 100
# Set-up, warm-up, tail and stop on top of --minutes before the child is stopped from outside.
CHILD_OVERHEAD_S = 600.0
CHILD_STOP_TIMEOUT_S = 60.0

ERR_MINUTES = f"--minutes must be greater than 0 and at most {MAX_MINUTES}"
ERR_NODES = f"--nodes must be between {MIN_NODES} and {MAX_NODES}"
ERR_JOBS = f"--jobs must be between {MIN_JOBS} and {MAX_JOBS}"
ERR_DATABASE_URL = "--database-url must be sqlite:///PATH or mysql://USER@HOST:PORT/NAME"
ERR_DATABASE_NAME = "--database-url must name a database (mysql://USER@HOST:PORT/NAME)"
ERR_DATABASE_NOT_EMPTY = (
    "database {name!r} exists and is not empty: a chaos run needs a database of its own "
    "(it is created and dropped by the run)"
)
ERR_SQLITE_EXISTS = "SQLite file {path} exists: a chaos run needs a database of its own"
ERR_DATABASE_UNREACHABLE = "cannot reach the database server: {error}"
ERR_HISTORY = "cannot read the history {path}: {error}"
ERR_TWO_DATABASES = "give --database or --database-url, not both"
ERR_FAULTS = "--faults: {bad} cannot be dealt in this configuration; it can take: {kinds}"
ERR_DURATIONS = "--durations must be comma-separated seconds, each within 0.1-600"
PRIVATE_DATABASE_NAME = "chaos"
MSG_VIOLATIONS = "the chaos run found violations (see the report above)"
MSG_SETUP = "the chaos run could not set up its cluster (see above)"
MSG_INTERRUPTED = "the chaos run was interrupted"
MSG_FAILED = "the chaos run failed with exit status {code} (no verdict; see above)"


def _usage(message: str) -> CommandError:
    return CommandError(message, returncode=EXIT_USAGE)


def _mysql_connect(config: dict[str, Any]) -> Any:
    import MySQLdb

    return MySQLdb.connect(
        host=config.get("HOST") or "127.0.0.1",
        port=int(config.get("PORT") or 3306),
        user=config.get("USER") or "root",
        passwd=config.get("PASSWORD") or "",
    )


def create_mysql_database(url: str) -> bool:
    """Create the run's database unless it exists; refuse one that holds tables. Returns whether
    it was created here (only then is it dropped at the end)."""
    import MySQLdb

    config = dj_database_url.parse(url)
    name = config["NAME"]
    try:
        conn = _mysql_connect(config)
    except MySQLdb.Error as exc:
        raise CommandError(
            ERR_DATABASE_UNREACHABLE.format(error=exc), returncode=EXIT_SETUP
        ) from exc
    try:
        cursor = conn.cursor()
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s", [name]
        )
        tables = cursor.fetchone()[0]
        cursor.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", [name])
        exists = cursor.fetchone() is not None
        if tables:
            raise _usage(ERR_DATABASE_NOT_EMPTY.format(name=name))
        if exists:
            return False
        # The name comes from the operator's own URL; quoting with backticks keeps it one name.
        quoted = name.replace("`", "``")
        cursor.execute(
            f"CREATE DATABASE `{quoted}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
        return True
    finally:
        conn.close()


def drop_mysql_database(url: str) -> None:
    config = dj_database_url.parse(url)
    conn = _mysql_connect(config)
    try:
        quoted = config["NAME"].replace("`", "``")
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{quoted}`")
    finally:
        conn.close()


class Command(BaseCommand):
    help = "Run a local cluster under a seeded nemesis, check its history, report violations."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--minutes", type=float, default=1.0, help="Length of the chaos")
        parser.add_argument(
            "--seed", type=int, default=None, help="Seed of the nemesis (default: random, printed)"
        )
        parser.add_argument("--coordination", choices=["database", "redis"], default="database")
        parser.add_argument(
            "--database",
            choices=["sqlite", "mariadb"],
            default=None,
            help="sqlite (default) or mariadb: a MariaDB server of the run's own, which the "
            "nemesis may kill and restart",
        )
        parser.add_argument(
            "--faults",
            default=None,
            help="Comma-separated fault kinds to deal (default: every kind the configuration "
            "can take); 'list' prints them",
        )
        parser.add_argument(
            "--durations",
            default=None,
            help="Comma-separated lengths (s) of the faults that last, used in turn",
        )
        parser.add_argument(
            "--database-url",
            default=None,
            help="mysql://USER@HOST:PORT/NAME for MariaDB (default: SQLite in a temp directory)",
        )
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument("--jobs", type=int, default=10)
        parser.add_argument(
            "--partitions",
            type=int,
            default=1,
            help="Scheduling partitions the jobs are split into, each with a leader of its own",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="Keep the run directory (node logs, history) even after a clean run",
        )
        parser.add_argument("--report-json", default=None, help="Write the report as JSON here")
        parser.add_argument("--save-history", default=None, help="Write the history as JSON here")
        parser.add_argument(
            "--check-history",
            default=None,
            help="Only check a history saved by --save-history (no cluster is started)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check_history"]:
            self._check_only(Path(options["check_history"]))
            return
        minutes = options["minutes"]
        if not 0 < minutes <= MAX_MINUTES:
            raise _usage(ERR_MINUTES)
        if not MIN_NODES <= options["nodes"] <= MAX_NODES:
            raise _usage(ERR_NODES)
        if not MIN_JOBS <= options["jobs"] <= MAX_JOBS:
            raise _usage(ERR_JOBS)
        partitions_problem = partitioning.count_problem(options["partitions"])
        if partitions_problem:
            raise _usage(f"--partitions: {partitions_problem}")
        url = options["database_url"]
        private = options["database"] == "mariadb"
        if private and url is not None:
            raise _usage(ERR_TWO_DATABASES)
        on_mysql = private or (url or "").startswith("mysql://")
        possible = fault_kinds(options["coordination"], on_mysql, private_mariadb=private)
        if options["faults"] == "list":
            self.stdout.write("\n".join(possible))
            return
        kinds = None
        if options["faults"]:
            kinds = [k.strip() for k in options["faults"].split(",") if k.strip()]
            bad = sorted(set(kinds) - set(possible))
            if bad or not kinds:
                raise _usage(
                    ERR_FAULTS.format(bad=", ".join(bad) or "nothing", kinds=", ".join(possible))
                )
        durations: list[float] = []
        if options["durations"]:
            try:
                durations = [float(d) for d in options["durations"].split(",")]
            except ValueError:
                raise _usage(ERR_DURATIONS) from None
            if not all(0.1 <= d <= 600 for d in durations):
                raise _usage(ERR_DURATIONS)
        if url is not None:
            if not url.startswith(("sqlite:///", "mysql://")):
                raise _usage(ERR_DATABASE_URL)
            if url.startswith("mysql://") and not dj_database_url.parse(url).get("NAME"):
                raise _usage(ERR_DATABASE_NAME)
            if url.startswith("sqlite:///") and Path(url[len("sqlite:///") :]).exists():
                raise _usage(ERR_SQLITE_EXISTS.format(path=url[len("sqlite:///") :]))
        seed = options["seed"] if options["seed"] is not None else random.randrange(2**31)

        run_dir = Path(tempfile.mkdtemp(prefix="sched-chaos-"))
        created_mysql = False
        code = EXIT_INTERRUPTED
        try:
            if private:
                url = f"mysql://root@127.0.0.1:1/{PRIVATE_DATABASE_NAME}"  # the port: the run's server
            elif url is None:
                url = f"sqlite:///{run_dir / 'chaos.sqlite3'}"
            if url.startswith("mysql://") and not private:
                created_mysql = create_mysql_database(url)
            plan = ChaosPlan(
                seed=seed,
                minutes=minutes,
                coordination=options["coordination"],
                nodes=options["nodes"],
                jobs=options["jobs"],
                database_url=url,
                run_dir=str(run_dir),
                report_json=options["report_json"],
                save_history=options["save_history"],
                private_mariadb=private,
                kinds=kinds,
                durations=durations,
                partitions=options["partitions"],
            )
            plan_path = run_dir / "plan.json"
            plan.dump(plan_path)
            where = "a private MariaDB" if private else url if on_mysql else "SQLite"
            self.stdout.write(
                f"chaos: seed {seed}, {minutes:g} min, {options['nodes']} nodes, "
                f"{options['jobs']} jobs, "
                + (f"{options['partitions']} partitions, " if options["partitions"] > 1 else "")
                + f"{options['coordination']} coordination, "
                f"database {where}; run dir {run_dir}"
            )
            code = self._run_child(plan_path, url, run_dir, timeout=minutes * 60 + CHILD_OVERHEAD_S)
        finally:
            if created_mysql:
                try:
                    drop_mysql_database(url)
                except Exception as exc:
                    self.stderr.write(f"could not drop the run's database: {exc}")
            # A run with a verdict other than "clean" keeps its logs and history for reading.
            if options["keep"] or code != 0:
                self.stdout.write(f"run directory kept: {run_dir}")
            else:
                shutil.rmtree(run_dir, ignore_errors=True)
        if code == EXIT_VIOLATIONS:
            raise CommandError(MSG_VIOLATIONS, returncode=EXIT_VIOLATIONS)
        if code == EXIT_SETUP:
            raise CommandError(MSG_SETUP, returncode=EXIT_SETUP)
        if code == EXIT_INTERRUPTED:
            raise CommandError(MSG_INTERRUPTED, returncode=EXIT_INTERRUPTED)
        if code != 0:
            raise CommandError(MSG_FAILED.format(code=code), returncode=code)

    def _run_child(self, plan_path: Path, url: str, run_dir: Path, *, timeout: float) -> int:
        """The run itself, in a child process connected to the run's database; its output is
        relayed line by line. A signal here is passed on to it once, and the child always gets
        the time to stop what it started."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            {
                "DATABASE_URL": url,
                # The settings this command runs with (the host project's, when it has one).
                "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                "SCHEDULER_VAR_DIR": str(run_dir / "var"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        child = subprocess.Popen(
            [sys.executable, "-m", "chaos.runner", str(plan_path)],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        forwarded = threading.Event()

        def forward(signum: int, frame: FrameType | None) -> None:
            if not forwarded.is_set() and child.poll() is None:
                forwarded.set()
                child.send_signal(signal.SIGTERM)

        def overtime() -> None:
            forward(signal.SIGTERM, None)
            try:
                child.wait(CHILD_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()

        handlers = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        watchdog = threading.Timer(timeout, overtime)
        watchdog.daemon = True
        watchdog.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                self.stdout.write(line.rstrip("\n"))
            return child.wait()
        finally:
            watchdog.cancel()
            if child.poll() is None:
                forward(signal.SIGTERM, None)
                try:
                    child.wait(CHILD_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    def _check_only(self, path: Path) -> None:
        try:
            history = history_from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise _usage(ERR_HISTORY.format(path=path, error=exc)) from exc
        report = check(history, check_config(history.meta))
        self.stdout.write(report.render())
        if not report.ok:
            raise CommandError(MSG_VIOLATIONS, returncode=EXIT_VIOLATIONS)
