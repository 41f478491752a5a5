"""The chaos command: its arguments, its seeded nemesis, the offline re-check of a saved history,
and one short seeded run against real ``runnode`` processes (SQLite + database coordination
always; MariaDB + Redis when the suite runs on MariaDB).

The run's verdict is the product: a failure here prints the checker's report, whose violations
name the cluster's bugs with their evidence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from chaos import faults, nemesis
from chaos.management.commands import chaos as chaos_command
from chaos.nemesis import FaultDeck, next_instant
from chaos.record import history_to_dict
from chaos.runner import (
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    check_config,
    fault_kinds,
    job_definitions,
    with_port,
)
from tests.chaos import test_checker

ROOT = Path(__file__).resolve().parents[2]
SEED = 11
CHAOS_MINUTES = "0.8"
RUN_TIMEOUT_S = 600
# 10 jobs x ~48 s of chaos: well over this many slots are checked when the cluster keeps up.
MIN_SLOTS = 200
MIN_FAULT_KINDS = 3
ON_MYSQL = "mysql" in settings.DATABASES["default"]["ENGINE"]


# --- arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "0"], chaos_command.ERR_MINUTES),
        (["--minutes", "100000"], chaos_command.ERR_MINUTES),
        (["--nodes", "1"], chaos_command.ERR_NODES),
        (["--jobs", "0"], chaos_command.ERR_JOBS),
        (["--database-url", "postgres://x/y"], chaos_command.ERR_DATABASE_URL),
        (["--database-url", "mysql://root@127.0.0.1:3306/"], chaos_command.ERR_DATABASE_NAME),
    ],
)
def test_bad_arguments_exit_2_before_anything_starts(args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as raised:
        call_command("chaos", *args)
    assert raised.value.returncode == EXIT_USAGE
    assert str(raised.value) == message


def test_an_existing_sqlite_file_is_refused(tmp_path: Path) -> None:
    existing = tmp_path / "db.sqlite3"
    existing.write_text("")
    with pytest.raises(CommandError) as raised:
        call_command("chaos", "--database-url", f"sqlite:///{existing}")
    assert raised.value.returncode == EXIT_USAGE


def test_bad_arguments_exit_2_from_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "chaos", "--nodes", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_USAGE
    assert chaos_command.ERR_NODES in result.stderr


# --- the nemesis plan ----------------------------------------------------------------------------


def test_the_fault_deck_is_seeded_and_deals_every_kind_each_round() -> None:
    kinds = fault_kinds("redis", on_mysql=True)
    first = list(FaultDeck(SEED, kinds).take(3 * len(kinds)))
    again = list(FaultDeck(SEED, kinds).take(3 * len(kinds)))
    other = list(FaultDeck(SEED + 1, kinds).take(3 * len(kinds)))
    assert first == again
    assert first != other
    for start in range(0, len(first), len(kinds)):
        assert sorted(s.kind for s in first[start : start + len(kinds)]) == sorted(kinds)
    for spec in first:
        assert spec.offset_s in nemesis.SLOT_OFFSETS_S
        if spec.kind in (nemesis.SIGSTOP_LEADER, nemesis.SIGSTOP_WORKER):
            assert nemesis.SIGSTOP_S[0] <= spec.duration_s <= nemesis.SIGSTOP_S[1]


def test_fault_kinds_follow_the_configuration() -> None:
    # SQLite: one file on one machine, so no link to cut and no clock of a node's own.
    assert set(fault_kinds("database", on_mysql=False)) == {
        *nemesis.NODE_FAULT_KINDS,
        *faults.OVERLAP_KINDS,
    }
    on_mariadb = fault_kinds("redis", on_mysql=True, private_mariadb=True)
    assert {faults.PARTITION_DB_LEADER, faults.ONEWAY_DB_LEADER, faults.SLOW_DB_LEADER} <= set(
        on_mariadb
    )
    assert {faults.PARTITION_BOTH_LEADER, faults.CLOCK_JUMP, faults.MARIADB_RESTART} <= set(
        on_mariadb
    )
    assert faults.REDIS_FREEZE in on_mariadb
    assert faults.MARIADB_RESTART not in fault_kinds("redis", on_mysql=True)
    assert faults.PARTITION_REDIS_LEADER not in fault_kinds("database", on_mysql=True)
    assert nemesis.DB_DOWN in fault_kinds("database", on_mysql=True)
    assert nemesis.REDIS_RESTART in fault_kinds("redis", on_mysql=False)
    assert nemesis.DB_DOWN not in fault_kinds("redis", on_mysql=False)


def test_faults_land_at_whole_seconds_plus_their_offset() -> None:
    assert next_instant(-0.1, now=100.2) == 100.9
    assert next_instant(0.0, now=100.2) == 101.0
    assert next_instant(0.5, now=100.2) == 100.5 + 1.0  # at least half a second ahead


def test_job_definitions_cover_the_misfire_policies_and_a_cron_job(tmp_path: Path) -> None:
    jobs = job_definitions(10, tmp_path / "effects.jsonl")
    assert len({j["name"] for j in jobs}) == 10
    assert all("concurrency_policy" not in j for j in jobs)  # forbid, the default
    policies = {j.get("misfire_policy", "run_once (default)") for j in jobs}
    assert {"skip", "run_all", "run_once"} <= policies
    assert [j["cron_expression"] for j in jobs if j["schedule_type"] == "cron"] == ["*/2 * * * * *"]
    assert all(j["interval_seconds"] == 1 for j in jobs if j["schedule_type"] == "interval")
    assert any(j["max_retries"] == 1 for j in jobs)
    assert jobs[-1]["kwargs"]["long_every"] > 0


def test_sqlite_runs_excuse_leader_gaps_while_a_writer_is_frozen() -> None:
    assert nemesis.SIGSTOP_LEADER in check_config({"database": "sqlite"}).leadership_blocking_faults
    assert (
        nemesis.SIGSTOP_LEADER not in check_config({"database": "mysql"}).leadership_blocking_faults
    )


def test_node_database_url_goes_through_the_proxy_port() -> None:
    assert (
        with_port("mysql://root:pw@127.0.0.1:3306/db", 4000) == "mysql://root:pw@127.0.0.1:4000/db"
    )
    assert with_port("mysql://127.0.0.1/db", 4000) == "mysql://127.0.0.1:4000/db"


# --- offline re-check of a saved history ---------------------------------------------------------


def test_check_history_re_checks_a_saved_history(tmp_path: Path, capsys) -> None:
    path = tmp_path / "history.json"
    history = test_checker.clean()
    path.write_text(json.dumps(history_to_dict(history)))
    call_command("chaos", "--check-history", str(path))
    assert "violations: none" in capsys.readouterr().out

    test_checker.body_twice(history)
    path.write_text(json.dumps(history_to_dict(history)))
    with pytest.raises(CommandError) as raised:
        call_command("chaos", "--check-history", str(path))
    assert raised.value.returncode == EXIT_VIOLATIONS
    assert "duplicate_execution: 1" in capsys.readouterr().out


def test_check_history_refuses_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text("{not json")
    with pytest.raises(CommandError) as raised:
        call_command("chaos", "--check-history", str(path))
    assert raised.value.returncode == EXIT_USAGE


# --- one short seeded run ------------------------------------------------------------------------


def _mysql_chaos_url() -> str:
    """The server the suite's own database lives on, with a database of the run's own."""
    sd = settings.DATABASES["default"]
    user = sd.get("USER") or "root"
    password = f":{sd['PASSWORD']}" if sd.get("PASSWORD") else ""
    host = sd.get("HOST") or "127.0.0.1"
    port = sd.get("PORT") or 3306
    return f"mysql://{user}{password}@{host}:{port}/sched_chaos_{os.getpid()}"


CONFIGURATIONS = [
    pytest.param([], id="sqlite-database"),
    pytest.param(
        ["--coordination", "redis", "--database-url", "MYSQL"],
        id="mariadb-redis",
        marks=[
            pytest.mark.mysql,
            pytest.mark.redis,
            pytest.mark.skipif(not ON_MYSQL, reason="the suite runs on SQLite (DATABASE_URL)"),
        ],
    ),
]


@pytest.mark.integration
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("extra", CONFIGURATIONS)
def test_a_short_seeded_chaos_run_finds_no_violation(extra: list[str], tmp_path: Path) -> None:
    if shutil.which("redis-server") is None and "redis" in extra:
        pytest.fail("redis-server is not installed (the README's set-up installs it)")
    extra = [_mysql_chaos_url() if arg == "MYSQL" else arg for arg in extra]
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # The command's own process needs no database of its own: keep it out of the repository's var/.
    env.update(
        {
            "SCHEDULER_VAR_DIR": str(tmp_path / "var"),
            "DJANGO_SECRET_KEY": "test-secret-key-for-the-chaos-command-0123456789abcdef",
        }
    )
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "chaos",
            "--minutes",
            CHAOS_MINUTES,
            "--seed",
            str(SEED),
            "--report-json",
            str(report_path),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    print(output)  # the faults as they landed and the report: shown when the test fails
    assert report_path.exists(), output[-4000:]
    report = json.loads(report_path.read_text())
    assert report["slots_checked"] >= MIN_SLOTS, report
    kinds = {kind for kind in report["faults_by_kind"] if not kind.startswith("api_")}
    assert len(kinds) >= MIN_FAULT_KINDS, report["faults_by_kind"]
    assert result.returncode == 0, (
        f"violations by kind: {report['violations_by_kind']}\n" + output[-6000:]
    )
