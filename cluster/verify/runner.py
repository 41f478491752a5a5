"""One chaos run, from an empty database to the checker's report.

``python manage.py chaos`` prepares a :class:`ChaosPlan` (a temporary directory, the run's own
database) and runs ``python -m cluster.verify.runner PLAN.json`` in a child process whose
``DATABASE_URL`` is that database, so this process's Django (the operator's API client, the history
reader) and the nodes share it without touching the caller's. The timeline:

1. private ``redis-server`` processes (coordination + three Redlock masters) when coordinating
   through Redis, before Django reads ``REDIS_URL``; the database migrated; the interval jobs and
   an operator account defined; on MariaDB a cuttable proxy in front of the database for the nodes;
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
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cluster.verify.checker import (
    LEADERSHIP_BLOCKING_FAULTS,
    CheckConfig,
    History,
    Report,
    check,
    history_to_dict,
)
from cluster.verify.nemesis import (
    DB_DOWN,
    NODE_FAULT_KINDS,
    OPERATOR_KINDS,
    REDIS_FAULT_KINDS,
    SIGSTOP_LEADER,
    SIGSTOP_WORKER,
    FaultDeck,
    LocalCluster,
    Nemesis,
    Operator,
    TcpProxy,
)
from cluster.verify.redis_server import RedisServer

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_SETUP = 3
EXIT_ERROR = 4  # the verifier itself failed (a traceback is printed): no verdict
EXIT_INTERRUPTED = 130

TASK_MODULE = "cluster.verify.tasks"
TASK_NAME = "chaos.record"
OPERATOR_USERNAME = "chaos-operator"
# The node defaults, spelled out: the checker's bounds are derived from them.
HEARTBEAT_S = 0.5
DEAD_AFTER_S = 2.0
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

    @property
    def on_mysql(self) -> bool:
        return self.database_url.startswith("mysql")

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ChaosPlan:
        return cls(**json.loads(path.read_text()))


def fault_kinds(coordination: str, on_mysql: bool) -> list[str]:
    """The faults a configuration can take: Redis faults need Redis coordination, cutting the
    database needs the MariaDB proxy (SQLite is a file: nothing to cut)."""
    kinds = list(NODE_FAULT_KINDS)
    if coordination == "redis":
        kinds += REDIS_FAULT_KINDS
    if on_mysql:
        kinds.append(DB_DOWN)
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
        leadership_blocking_faults=frozenset(blocking),
    )


def job_definitions(count: int, side_effects: Path) -> list[dict[str, Any]]:
    """``count`` jobs every second with the default policies (forbid, run_once); a third with one
    retry, half with a timeout, bodies of 50-400 ms, and the last one running 1.4 s on every 7th
    slot (its next slot then really is blocked: a forbid skip the checker must find justified)."""
    sleeps = (0.05, 0.1, 0.2, 0.3, 0.4)
    jobs = []
    for index in range(count):
        kwargs: dict[str, Any] = {"path": str(side_effects), "sleep_s": sleeps[index % len(sleeps)]}
        if index == count - 1:
            kwargs.update(long_s=1.4, long_every=7)
        jobs.append(
            {
                "name": f"chaos-{index:02d}",
                "task": TASK_NAME,
                "kwargs": kwargs,
                "schedule_type": "interval",
                "interval_seconds": 1,
                "max_retries": 1 if index % 3 == 1 else 0,
                "retry_backoff_base": 0.5,
                "timeout_seconds": 10 if index % 2 == 0 else None,
            }
        )
    return jobs


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
        self.proxy: TcpProxy | None = None
        self.cluster: LocalCluster | None = None
        self.operator: Operator | None = None
        self.started = time.time()

    def say(self, message: str) -> None:
        self.out.write(message + "\n")
        self.out.flush()

    # --- the whole run -----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self._start_redis()
            self._setup_django()
            job_ids, token = self._define_jobs()
            self._start_proxy()
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
        kinds = fault_kinds(plan.coordination, plan.on_mysql)
        nemesis = Nemesis(
            cluster=self.cluster,
            deck=FaultDeck(plan.seed, kinds),
            leader=self._leader,
            say=self.say,
            coordination_redis=self.redis,
            redlock_masters=self.redlock,
            proxy=self.proxy,
        )
        self.operator = Operator(token=token, job_ids=job_ids, seed=plan.seed + 1, say=self.say)
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

    def _setup_django(self) -> None:
        os.environ["SCHEDULER_REDIS_PREFIX"] = f"chaos{os.getpid()}"
        os.environ["SCHEDULER_TASK_MODULES"] = TASK_MODULE
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
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

        import cluster.verify.tasks  # noqa: F401 - registers chaos.record here, for validation
        from jobs import services, tokens

        ids = []
        for definition in job_definitions(self.plan.jobs, self.side_effects):
            job = services.job_create(data=definition, by=services.SYSTEM)
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

    def _start_proxy(self) -> None:
        if not self.plan.on_mysql:
            return
        parts = urlsplit(self.plan.database_url)
        self.proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 3306))
        self.proxy.start()
        self.say(f"database proxy: 127.0.0.1:{self.proxy.port} -> {parts.hostname}:{parts.port}")

    def _node_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        node_url = self.plan.database_url
        if self.proxy is not None:
            node_url = with_port(node_url, self.proxy.port)
        env.update(
            {
                "DATABASE_URL": node_url,
                "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
                "SCHEDULER_TASK_MODULES": TASK_MODULE,
                "LOG_FORMAT": "json",  # parsed for the "started leading (term N)" lines
                "LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _start_nodes(self) -> None:
        from django.conf import settings

        self.cluster = LocalCluster(
            root=Path(settings.BASE_DIR),
            run_dir=self.run_dir,
            env=self._node_env(),
            args=[
                "--heartbeat-s",
                str(HEARTBEAT_S),
                "--dead-after-s",
                str(DEAD_AFTER_S),
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
        from cluster.verify.history import read_side_effects

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
                LeadershipTerm.objects.filter(ended_at__isnull=True)
                .order_by("-term")
                .values_list("node_id", flat=True)
                .first()
            )
        except Exception:
            close_old_connections()
            return None

    def _collect(
        self, *, faults: list, window_start: float, stop_at: float, incidents: list[str]
    ) -> History:
        from django.db import connection

        from cluster.verify.history import collect_history

        assert self.cluster is not None
        plan = self.plan
        return collect_history(
            side_effects_path=self.side_effects,
            node_logs=self.cluster.logs,
            faults=sorted(faults, key=lambda f: f.start),
            window_start=window_start,
            window_end=stop_at - WINDOW_END_MARGIN_S,
            stop_at=stop_at,
            api_anomalies=self.operator.anomalies if self.operator else [],
            meta={
                "seed": plan.seed,
                "minutes": plan.minutes,
                "coordination": plan.coordination,
                "database": connection.vendor,
                "nodes": plan.nodes,
                "jobs": plan.jobs,
                "dead_after_s": DEAD_AFTER_S,
                "incidents": incidents,
            },
        )

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
        if self.proxy is not None:
            self.proxy.close()
        for server in [self.redis, *self.redlock]:
            if server is not None:
                server.stop()
        # Django may never have been set up (a Redis server that did not start).
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Once: the clean-up that follows ignores further signals.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m cluster.verify.runner PLAN.json\n")
        return EXIT_USAGE
    plan = ChaosPlan.load(Path(argv[1]))
    signal.signal(signal.SIGTERM, _on_sigterm)
    return ChaosRun(plan).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
