"""One chaos run, from an empty database to the checker's report (longer than most modules: the
timeline below, in order, in one place).

``python manage.py chaos`` prepares a :class:`ChaosPlan` (a temporary directory, the run's own
database) and runs ``python -m chaos.runner PLAN.json`` in a child process whose
``DATABASE_URL`` is that database, so this process's Django (the operator's API client, the history
reader) and the nodes share it without touching the caller's. The timeline:

1. private ``redis-server`` processes (coordination + three Redlock masters) when coordinating
   through Redis, and a private MariaDB when asked, before Django reads their URLs; the database
   migrated; the interval jobs and an operator account defined; for every node its own links
   (:mod:`chaos.links`) to the database and to each Redis server, and a wall clock the
   nemesis can step (:mod:`chaos.processes`);
2. ``--nodes`` real ``runnode`` processes; warm-up until a leader leads and every job has run;
3. the nemesis and the operator for ``--minutes``; then every fault undone, every node back;
4. a quiet tail, then every node stopped gracefully (SIGTERM, drain); the history collected and
   checked; the report printed. Exit status 0 = no violation, 1 = violations, 3 = the cluster could
   not be set up, 4 = the verifier itself failed, 130 = interrupted. Every process started here is
   stopped by PID in all cases.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from chaos.checker import Report, check
from chaos.faults import (
    BOTH_LINK_KINDS,
    CLOCK_JUMP,
    DB_LINK_KINDS,
    MARIADB_RESTART,
    NODE_FAULT_KINDS,
    OVERLAP_KINDS,
    REDIS_FAULT_KINDS,
    REDIS_LINK_KINDS,
    SIGSTOP_LEADER,
    SIGSTOP_WORKER,
)
from chaos.links import LinkSet
from chaos.mariadb_server import MariaDBServer
from chaos.nemesis import FaultDeck, Nemesis
from chaos.operator_actions import OPERATOR_KINDS, Operator
from chaos.processes import LocalCluster, build_clock_shim
from chaos.record import (
    LEADERSHIP_BLOCKING_FAULTS,
    CheckConfig,
    History,
    history_to_dict,
)
from chaos.redis_server import RedisServer

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_SETUP = 3
EXIT_ERROR = 4  # the verifier itself failed (a traceback is printed): no verdict
EXIT_INTERRUPTED = 130

TASK_MODULE = "chaos.tasks"
TASK_NAME = "chaos.record"
OPERATOR_USERNAME = "chaos-operator"
# The node defaults, spelled out: the checker's bounds are derived from them.
HEARTBEAT_S = 0.5
DEAD_AFTER_S = 2.0
# A control statement unanswered this long is an outage to its node (runnode --db-control-limit-s).
DB_CONTROL_LIMIT_S = 1.0
NODE_GRACE_S = 5.0
NODE_CAPACITY = 8
WARMUP_TIMEOUT_S = 120.0
WARMUP_RUNS_PER_JOB = 2
WARMUP_RECENT_S = 4.0
WARMUP_MAX_LAG_S = 0.5
# How long a running cluster gets to catch up with its slots before the faults start anyway.
WARMUP_CATCH_UP_S = 30.0
# After the last fault: time for restarted nodes to rejoin and retries to run.
TAIL_S = 8.0
# Slots this close to the graceful stop may be handed back unstarted by the drain.
WINDOW_END_MARGIN_S = 2.0
STOP_TIMEOUT_S = NODE_GRACE_S + 20.0
RECOVER_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 3000

ERR_WARMUP = "the cluster did not start running every job within {timeout:.0f} s ({what})"
ERR_NODES_DIED = "every node process exited during warm-up"


class SetupError(RuntimeError):
    """The cluster could not be brought up: not a verdict on the scheduler's guarantees."""


class Interrupted(BaseException):
    """SIGTERM (or a second Ctrl-C) while running: unwind through every ``finally``."""


@dataclass
class ChaosPlan:
    seed: int
    minutes: float
    coordination: str  # "database" | "redis"
    nodes: int
    jobs: int
    database_url: str  # how this process reaches the run's database
    run_dir: str
    report_json: str | None = None
    save_history: str | None = None
    # The run starts a MariaDB server of its own (and may kill it): database_url is then only
    # the database's name on it.
    private_mariadb: bool = False
    # Only these fault kinds (default: every kind the configuration can take), and, given, the
    # length of every fault that has one, in turn (a scenario: the partition table).
    kinds: list[str] | None = None
    durations: list[float] = field(default_factory=list)
    # The scheduling partitions the jobs are split into (each led by a node of its own).
    partitions: int = 1

    @property
    def on_mysql(self) -> bool:
        return self.private_mariadb or self.database_url.startswith("mysql")

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ChaosPlan:
        return cls(**json.loads(path.read_text()))


def fault_kinds(coordination: str, on_mysql: bool, *, private_mariadb: bool = False) -> list[str]:
    """The faults a configuration can take. Redis faults need Redis coordination; the database's
    links, and clock jumps, need MariaDB: SQLite is a file on one machine, so there is no path to
    cut and no node with a clock of its own; restarting the database needs a server of the run's
    own."""
    kinds = [*NODE_FAULT_KINDS, *OVERLAP_KINDS]
    if coordination == "redis":
        kinds += [*REDIS_LINK_KINDS, *REDIS_FAULT_KINDS]
    if on_mysql:
        kinds += [*DB_LINK_KINDS, CLOCK_JUMP]
        if coordination == "redis":
            kinds += BOTH_LINK_KINDS
    if private_mariadb:
        kinds.append(MARIADB_RESTART)
    return kinds


def check_config(meta: dict[str, Any]) -> CheckConfig:
    """The checker's configuration for a run described by ``meta`` (kept in the history)."""
    blocking = set(LEADERSHIP_BLOCKING_FAULTS)
    if meta.get("database") == "sqlite":
        # SQLite has one database-wide write lock: a node frozen inside a write transaction stops
        # every other writer (the leader renewing its lease, recording its term) until it resumes.
        blocking |= {SIGSTOP_LEADER, SIGSTOP_WORKER}
    return CheckConfig(
        dead_after_s=float(meta.get("dead_after_s", DEAD_AFTER_S)),
        db_control_limit_s=float(meta.get("db_control_limit_s", DB_CONTROL_LIMIT_S)),
        leadership_blocking_faults=frozenset(blocking),
    )


# Jobs that exercise what a whole-cluster stop or a long leader gap leaves behind: a short grace
# makes such a gap a misfire, and each policy names what its missed slots become.
MISFIRE_JOBS = {3: "skip", 5: "run_all", 7: "run_once"}
MISFIRE_GRACE_S = 2
CRON_JOB = 8  # this one fires on a cron pattern: every even second
CRON_EXPRESSION = "*/2 * * * * *"


# Every this many jobs, one ends its bodies with a fenced write (jobs 1, 5, 9, ...).
FENCED_EVERY = 4


def job_definitions(count: int, side_effects: Path) -> list[dict[str, Any]]:
    """``count`` jobs every second, forbid; a third with one retry, half with a timeout, bodies of
    50-400 ms, and the last one running 1.4 s on every 7th slot (its next slot then really is
    blocked: a forbid skip the checker must find justified). Jobs 3, 5 and 7 (when there are that
    many) have a 2 s misfire grace with the skip, run_all and run_once policies; job 8 is a cron
    job every even second; jobs 1, 5, 9... end each body with a fenced write. The rest keep the
    default policies."""
    sleeps = (0.05, 0.1, 0.2, 0.3, 0.4)
    jobs = []
    for index in range(count):
        kwargs: dict[str, Any] = {"path": str(side_effects), "sleep_s": sleeps[index % len(sleeps)]}
        if index == count - 1:
            kwargs.update(long_s=1.4, long_every=7)
        if index % FENCED_EVERY == 1:
            kwargs["fenced"] = True  # its bodies end with a fenced write (chaos.tasks)
        job: dict[str, Any] = {
            "name": f"chaos-{index:02d}",
            "task": TASK_NAME,
            "kwargs": kwargs,
            "schedule_type": "interval",
            "interval_seconds": 1,
            "max_retries": 1 if index % 3 == 1 else 0,
            "retry_backoff_base": 0.5,
            "timeout_seconds": 10 if index % 2 == 0 else None,
        }
        if index in MISFIRE_JOBS:
            job.update(misfire_policy=MISFIRE_JOBS[index], misfire_grace_seconds=MISFIRE_GRACE_S)
        if index == CRON_JOB and index != count - 1:
            del job["interval_seconds"]
            job.update(schedule_type="cron", cron_expression=CRON_EXPRESSION)
        jobs.append(job)
    return jobs


# Flow control under faults: two jobs run only when the operator enqueues bursts of runs, in a
# queue of their own that allows FLOW_QUEUE_LIMIT at once; one allows FLOW_JOB_LIMIT at once of its
# own (bodies of 1 s), the other FLOW_RATE starts per FLOW_RATE_PERIOD_S (bodies of 0.3 s).
FLOW_QUEUE = "chaos-flow"
FLOW_QUEUE_LIMIT = 3
FLOW_JOB_LIMIT = 2
FLOW_RATE = 4
FLOW_RATE_PERIOD_S = 3


def flow_job_definitions(side_effects: Path) -> list[dict[str, Any]]:
    """The two flow-limited jobs: no schedule of their own (a one-off due in ten years), any
    number of runs at once but for their limits."""
    far = (datetime.now(UTC) + timedelta(days=3650)).isoformat()
    base: dict[str, Any] = {
        "task": TASK_NAME,
        "schedule_type": "once",
        "run_at": far,
        "queue": FLOW_QUEUE,
        "concurrency_policy": "allow",
    }
    return [
        {
            **base,
            "name": "chaos-flow-limit",
            "kwargs": {"path": str(side_effects), "sleep_s": 1.0},
            "max_concurrent": FLOW_JOB_LIMIT,
        },
        {
            **base,
            "name": "chaos-flow-rate",
            "kwargs": {"path": str(side_effects), "sleep_s": 0.3},
            "rate_limit": FLOW_RATE,
            "rate_period_seconds": FLOW_RATE_PERIOD_S,
        },
    ]


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    host = parts.hostname or "127.0.0.1"
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


class ChaosRun:
    def __init__(self, plan: ChaosPlan, *, out: Any = None) -> None:
        self.plan = plan
        self.out = out or sys.stdout
        self.run_dir = Path(plan.run_dir)
        self.side_effects = self.run_dir / "side_effects.jsonl"
        self.redis: RedisServer | None = None
        self.redlock: list[RedisServer] = []
        self.mariadb: MariaDBServer | None = None
        self.links: dict[str, LinkSet] = {}
        self.cluster: LocalCluster | None = None
        self.operator: Operator | None = None
        self.started = time.time()
        self.flow_job_ids: list[int] = []

    def say(self, message: str) -> None:
        self.out.write(message + "\n")
        self.out.flush()

    # --- the whole run -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self._start_redis()
            self._start_mariadb()
            self._setup_django()
            job_ids, token = self._define_jobs()
            self._start_links()
            self._start_nodes()
            self._warm_up()
            return self._chaos(job_ids, token)
        except SetupError as exc:
            self.say(f"SETUP FAILED: {exc}")
            self._print_log_tails()
            return EXIT_SETUP
        except (KeyboardInterrupt, Interrupted):
            self.say("interrupted: stopping every process this run started")
            return EXIT_INTERRUPTED
        except Exception:
            # Not a verdict on the cluster: exit 1 must keep meaning "violations found".
            self.say("the chaos run itself failed:\n" + traceback.format_exc())
            self._print_log_tails()
            return EXIT_ERROR
        finally:
            # Nothing may interrupt the clean-up.
            previous = {
                s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                self._cleanup()
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    def _chaos(self, job_ids: list[int], token: str) -> int:
        assert self.cluster is not None
        plan = self.plan
        kinds = plan.kinds or fault_kinds(
            plan.coordination, plan.on_mysql, private_mariadb=plan.private_mariadb
        )
        if self.cluster.clock_shim is None and CLOCK_JUMP in kinds:
            kinds = [k for k in kinds if k != CLOCK_JUMP]
            self.say("no C compiler for the clock shim: clock jumps are not dealt")
        nemesis = Nemesis(
            cluster=self.cluster,
            deck=FaultDeck(plan.seed, kinds, durations=plan.durations),
            leader=self._leader,
            newest_term=self._newest_term,
            say=self.say,
            links=self.links,
            coordination_redis=self.redis,
            redlock_masters=self.redlock,
            mariadb=self.mariadb,
        )
        scratch = job_definitions(1, self.side_effects)[0]
        self.operator = Operator(
            token=token,
            job_ids=job_ids,
            flow_job_ids=self.flow_job_ids,
            seed=plan.seed + 1,
            say=self.say,
            scratch={**scratch, "name": "chaos-scratch"},
        )
        window_start = time.time()
        self.say(f"chaos for {plan.minutes:g} min; fault kinds: {', '.join(kinds)}")
        self.operator.start()
        nemesis.run(until=window_start + plan.minutes * 60)
        self.operator.close()
        nemesis.recover(time.time() + RECOVER_TIMEOUT_S)
        self.say(f"faults done; quiet tail of {TAIL_S:.0f} s, then a graceful stop")
        time.sleep(TAIL_S)
        stop_at = time.time()
        killed = self.cluster.stop_all(STOP_TIMEOUT_S)
        if killed:
            self.say(f"nodes that did not stop within {STOP_TIMEOUT_S:.0f} s (killed): {killed}")
        time.sleep(0.5)  # quiescence: every node has exited; let the file system settle
        incidents = nemesis.incidents + [
            f"{node_id} did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM: killed"
            for node_id in killed
        ]
        history = self._collect(
            faults=nemesis.faults + self.operator.faults,
            window_start=window_start,
            stop_at=stop_at,
            incidents=incidents,
        )
        report = check(history, check_config(history.meta))
        self._print_report(history, report)
        self._save(history, report)
        return EXIT_OK if report.ok else EXIT_VIOLATIONS

    # --- set-up ------------------------------------------------------------------------------------
    def _start_redis(self) -> None:
        if self.plan.coordination != "redis":
            os.environ.pop("REDIS_URL", None)
            os.environ.pop("REDLOCK_URLS", None)
            os.environ["SCHEDULER_COORDINATION"] = "database"
            return
        workdir = self.run_dir / "redis"
        try:
            self.redis = RedisServer("redis", workdir)
            self.redis.start()
            for index in range(3):
                master = RedisServer(f"redlock-{index}", workdir)
                self.redlock.append(master)
                master.start()
        except RuntimeError as exc:
            raise SetupError(str(exc)) from exc
        # Read by the settings when Django starts next (the operator's wake-ups go there too).
        os.environ["REDIS_URL"] = self.redis.url
        os.environ["REDLOCK_URLS"] = ",".join(m.url for m in self.redlock)
        os.environ["SCHEDULER_COORDINATION"] = "redis"
        self.say(
            f"redis: coordination {self.redis.url}; redlock "
            + ", ".join(m.url for m in self.redlock)
        )

    def _start_mariadb(self) -> None:
        """A MariaDB server of the run's own, before Django reads DATABASE_URL: the nemesis may
        kill and restart it."""
        if not self.plan.private_mariadb:
            return
        import MySQLdb

        self.mariadb = MariaDBServer(self.run_dir / "mariadb")
        try:
            self.mariadb.install()
            self.mariadb.start()
        except RuntimeError as exc:
            raise SetupError(str(exc)) from exc
        url = with_port(self.plan.database_url, self.mariadb.port)
        name = urlsplit(url).path.lstrip("/")
        conn = MySQLdb.connect(host="127.0.0.1", port=self.mariadb.port, user="root")
        try:
            conn.cursor().execute(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        finally:
            conn.close()
        self.plan.database_url = url
        os.environ["DATABASE_URL"] = url
        self.say(f"mariadb: a private server on 127.0.0.1:{self.mariadb.port} (database {name})")

    def _setup_django(self) -> None:
        os.environ["SCHEDULER_REDIS_PREFIX"] = f"chaos{os.getpid()}"
        os.environ["SCHEDULER_TASK_MODULES"] = TASK_MODULE
        os.environ["SCHEDULER_QUEUES"] = f"default,{FLOW_QUEUE}"
        if not os.environ.get("DJANGO_SETTINGS_MODULE"):
            raise RuntimeError("DJANGO_SETTINGS_MODULE is not set (the chaos command sets it)")
        import django

        django.setup()
        # The operator's API calls run in this process: their 409s (expected in a race) and
        # WhiteNoise's note about a missing STATIC_ROOT are not news in the report.
        logging.getLogger("django.request").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", message="No directory at")
        from django.core.management import call_command

        try:
            call_command("migrate", verbosity=0, interactive=False)
        except Exception as exc:
            raise SetupError(f"migrate failed: {exc}") from exc

    def _define_jobs(self) -> tuple[list[int], str]:
        from django.contrib.auth import get_user_model

        import chaos.tasks  # noqa: F401 - registers chaos.record here, for validation
        from jobs import partitioning, services, tokens

        partitioning.set_count(self.plan.partitions)
        from chaos.tasks import fence_row
        from jobs.models import SchedulerSetting

        ids = []
        from jobs.models import Queue

        Queue.objects.create(name=FLOW_QUEUE, max_concurrent=FLOW_QUEUE_LIMIT)
        self.flow_job_ids = []
        for definition in flow_job_definitions(self.side_effects):
            job = services.job_create(data=definition, by=services.SYSTEM)
            services.job_update(
                job_id=job.pk,
                expected_version=job.version,
                changes={"kwargs": {**definition["kwargs"], "job_id": job.pk}},
                by=services.SYSTEM,
            )
            self.flow_job_ids.append(job.pk)
        for definition in job_definitions(self.plan.jobs, self.side_effects):
            job = services.job_create(data=definition, by=services.SYSTEM)
            if definition["kwargs"].get("fenced"):
                SchedulerSetting.objects.create(name=fence_row(job.pk), value=0)
            # The task logs its job's id: known only now.
            services.job_update(
                job_id=job.pk,
                expected_version=job.version,
                changes={"kwargs": {**definition["kwargs"], "job_id": job.pk}},
                by=services.SYSTEM,
            )
            ids.append(job.pk)
        user = get_user_model().objects.create_superuser(
            OPERATOR_USERNAME, password=None, email="chaos@localhost"
        )
        return ids, tokens.issue(user, by=services.SYSTEM, name="chaos")[0]

    def _targets(self) -> dict[str, tuple[str, int]]:
        """The services a node reaches over the network, each through a link of its own."""
        targets: dict[str, tuple[str, int]] = {}
        if self.plan.on_mysql:
            parts = urlsplit(self.plan.database_url)
            targets["database"] = (parts.hostname or "127.0.0.1", parts.port or 3306)
        if self.redis is not None:
            targets["redis"] = ("127.0.0.1", self.redis.port)
            for index, master in enumerate(self.redlock):
                targets[f"redlock-{index}"] = ("127.0.0.1", master.port)
        return targets

    def _start_links(self) -> None:
        targets = self._targets()
        if not targets:
            return
        for index in range(1, self.plan.nodes + 1):
            node_id = f"n{index}"
            self.links[node_id] = LinkSet(node_id, targets)
        self.say(f"links: every node reaches {', '.join(targets)} through a path of its own")

    def _node_env(self, node_id: str) -> dict[str, str]:
        from django.conf import settings as django_settings

        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        node_url = self.plan.database_url
        links = self.links.get(node_id)
        if links is not None:
            services = links.links
            if "database" in services:
                node_url = with_port(node_url, links.port("database"))
            if "redis" in services and self.redis is not None:
                env["REDIS_URL"] = with_port(self.redis.url, links.port("redis"))
                env["REDLOCK_URLS"] = ",".join(
                    with_port(master.url, links.port(f"redlock-{index}"))
                    for index, master in enumerate(self.redlock)
                )
        env.update(
            {
                "DATABASE_URL": node_url,
                "DJANGO_SETTINGS_MODULE": django_settings.SETTINGS_MODULE,
                "SCHEDULER_TASK_MODULES": TASK_MODULE,
                "SCHEDULER_QUEUES": f"default,{FLOW_QUEUE}",
                "LOG_FORMAT": "json",  # parsed for the "started leading (term N)" lines
                "LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _start_nodes(self) -> None:
        from django.conf import settings

        shim = build_clock_shim(self.run_dir) if self.plan.on_mysql else None
        self.cluster = LocalCluster(
            root=Path(settings.BASE_DIR),
            run_dir=self.run_dir,
            env_for=self._node_env,
            clock_shim=shim,
            args=[
                "--heartbeat-s",
                str(HEARTBEAT_S),
                "--dead-after-s",
                str(DEAD_AFTER_S),
                "--db-control-limit-s",
                str(DB_CONTROL_LIMIT_S),
                "--grace",
                str(NODE_GRACE_S),
                "--capacity",
                str(NODE_CAPACITY),
            ],
        )
        for index in range(1, self.plan.nodes + 1):
            node = self.cluster.start(f"n{index}")
            self.say(f"started n{index} (pid {node.pid})")

    def _warm_up(self) -> None:
        """Until a leader leads and every job has run; then, for a while, until every job runs on
        time (a cluster still working off the backlog of its start makes the first faults look
        worse than they are). A cluster that never catches up is reported, not refused: its
        lag is in the report."""
        assert self.cluster is not None
        from chaos.history import read_side_effects

        deadline = time.time() + WARMUP_TIMEOUT_S
        catch_up_deadline: float | None = None
        what = "no leader yet"
        while time.time() < deadline:
            if not any(n.alive() for n in self.cluster.nodes.values()):
                raise SetupError(ERR_NODES_DIED)
            leader = self._leader()
            if leader is not None:
                now = time.time()
                starts = [
                    s
                    for s in read_side_effects(self.side_effects)
                    if s.event == "start" and s.scheduled_for is not None
                ]
                ran = Counter(s.job_id for s in starts)
                on_time = Counter(
                    s.job_id
                    for s in starts
                    if s.scheduled_for >= now - WARMUP_RECENT_S
                    and s.at - s.scheduled_for <= WARMUP_MAX_LAG_S
                )
                running = sum(1 for n in ran.values() if n >= WARMUP_RUNS_PER_JOB)
                ready = sum(1 for n in on_time.values() if n >= WARMUP_RUNS_PER_JOB)
                what = f"leader {leader}; {ready} of {self.plan.jobs} jobs ran on time lately"
                if ready >= self.plan.jobs:
                    self.say(f"warmed up in {now - self.started:.1f} s: {what}")
                    return
                if running >= self.plan.jobs:
                    catch_up_deadline = catch_up_deadline or now + WARMUP_CATCH_UP_S
                    if now >= catch_up_deadline:
                        lag = max(s.at - s.scheduled_for for s in starts[-self.plan.jobs :])
                        self.say(
                            f"WARNING: the cluster runs {lag:.1f} s behind its slots after "
                            f"{WARMUP_CATCH_UP_S:.0f} s of catching up; starting the faults anyway"
                        )
                        return
            time.sleep(0.5)
        raise SetupError(ERR_WARMUP.format(timeout=WARMUP_TIMEOUT_S, what=what))

    # --- helpers -----------------------------------------------------------------------------------
    def _leader(self) -> str | None:
        """The node of the newest open term (the database's view)."""
        from django.db import close_old_connections

        from cluster.models import LeadershipTerm

        try:
            return (
                LeadershipTerm.objects.filter(partition=0, ended_at__isnull=True)
                .order_by("-term")
                .values_list("node_id", flat=True)
                .first()
            )
        except Exception:
            close_old_connections()
            return None

    def _newest_term(self) -> tuple[int, str] | None:
        """The newest term recorded, open or not, and its node."""
        from django.db import close_old_connections

        from cluster.models import LeadershipTerm

        try:
            row = (
                LeadershipTerm.objects.filter(partition=0)
                .order_by("-term")
                .values_list("term", "node_id")
                .first()
            )
        except Exception:
            close_old_connections()
            return None
        return (int(row[0]), str(row[1])) if row else None

    def _collect(
        self, *, faults: list, window_start: float, stop_at: float, incidents: list[str]
    ) -> History:
        from django.db import connection

        from chaos.history import collect_history

        assert self.cluster is not None
        plan = self.plan
        history = collect_history(
            side_effects_path=self.side_effects,
            node_logs=self.cluster.logs,
            faults=sorted(faults, key=lambda f: f.start),
            window_start=window_start,
            window_end=stop_at - WINDOW_END_MARGIN_S,
            stop_at=stop_at,
            api_anomalies=self.operator.anomalies if self.operator else [],
            requested=self.operator.requested if self.operator else [],
            deleted=self.operator.deleted if self.operator else [],
            edits=self.operator.edits if self.operator else [],
            meta={
                "seed": plan.seed,
                "minutes": plan.minutes,
                "coordination": plan.coordination,
                "database": connection.vendor,
                "nodes": plan.nodes,
                "jobs": plan.jobs,
                "dead_after_s": DEAD_AFTER_S,
                "db_control_limit_s": DB_CONTROL_LIMIT_S,
                "incidents": incidents,
            },
        )
        if self.mariadb is not None:
            history.commits, history.running_steps = self._commits()
        return history

    def _commits(self) -> tuple[list, list]:
        """The run's committed transactions, from the private server's binary log: those on the
        fence or the runs, and every run's row entering or leaving ``running``."""
        from django.db import connection

        from chaos import binlog

        assert self.mariadb is not None
        with connection.cursor() as cursor:
            columns = binlog.table_columns(cursor, connection.settings_dict["NAME"])
        transactions = binlog.read_log(self.mariadb.workdir, columns)
        commits = binlog.commits(transactions)
        steps = binlog.running_steps(transactions)
        self.say(f"commit log: {len(commits)} transactions on the fence or the runs")
        return commits, steps

    def _print_report(self, history: History, report: Report) -> None:
        meta = history.meta
        operator = sum(report.faults_by_kind.get(k, 0) for k in OPERATOR_KINDS)
        self.say("")
        self.say(
            f"=== chaos report: seed {meta['seed']}, {meta['database']} + {meta['coordination']} "
            f"coordination, {meta['nodes']} nodes, {meta['jobs']} jobs ==="
        )
        self.say(report.render())
        for incident in meta.get("incidents", []):
            self.say(f"incident (not a guarantee, worth a look): {incident}")
        self.say(
            f"faults injected: {sum(report.faults_by_kind.values()) - operator} "
            f"(+ {operator} operator actions)"
        )
        self.say(
            "RESULT: "
            + ("OK, no violation" if report.ok else f"{len(report.violations)} violations")
        )

    def _save(self, history: History, report: Report) -> None:
        data = history_to_dict(history)
        (self.run_dir / "history.json").write_text(json.dumps(data))
        if self.plan.save_history:
            Path(self.plan.save_history).write_text(json.dumps(data))
        if self.plan.report_json:
            Path(self.plan.report_json).write_text(
                json.dumps({**report.to_dict(), "meta": history.meta}, indent=2, default=str)
            )

    def _print_log_tails(self) -> None:
        if self.cluster is None:
            return
        for paths in self.cluster.logs.values():
            if paths and paths[-1].exists():
                tail = paths[-1].read_text(errors="replace")[-LOG_TAIL_CHARS:]
                self.say(f"--- {paths[-1].name} (tail) ---\n{tail}")

    def _cleanup(self) -> None:
        if self.operator is not None:
            self.operator.stop.set()
        if self.cluster is not None:
            self.cluster.kill_all()
        for links in self.links.values():
            links.close()
        for server in [self.redis, *self.redlock]:
            if server is not None:
                server.stop()
        # Django may never have been set up (a Redis server that did not start).
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if self.mariadb is not None:
            self.mariadb.stop()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Once: the clean-up that follows ignores further signals.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m chaos.runner PLAN.json\n")
        return EXIT_USAGE
    plan = ChaosPlan.load(Path(argv[1]))
    signal.signal(signal.SIGTERM, _on_sigterm)
    return ChaosRun(plan).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
