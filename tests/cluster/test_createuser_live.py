"""``createuser`` against a live 3-node cluster on SQLite costs it no leader election: the command
hashes the password before its write transaction, so it never holds SQLite's one write lock long
enough to stall the leader's lease renewal (it once cost two terms per call, each "Node died").
Real ``runnode`` processes on a database of the test's own."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.harness import NodeProcess, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def terms(database: Path) -> list[tuple[int, bool]]:
    """(term, still open) for every recorded term."""
    with sqlite3.connect(database) as db:
        return db.execute(
            "SELECT term, ended_at IS NULL FROM cluster_leadershipterm ORDER BY term"
        ).fetchall()


def test_createuser_on_a_live_sqlite_cluster_causes_no_new_term(tmp_path: Path) -> None:
    database = tmp_path / "live.sqlite3"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{database}",
            "SCHEDULER_VAR_DIR": str(tmp_path),
            "SCHEDULER_COORDINATION": "database",
            "DJANGO_SECRET_KEY": "test-secret-key-for-createuser-live-0123456789abcdefghij",
            "PYTHONUNBUFFERED": "1",
        }
    )
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    nodes = [
        NodeProcess(
            f"n{i}", [*manage, "runnode", "--node-id", f"n{i}"], env, tmp_path / f"n{i}.log"
        )
        for i in (1, 2, 3)
    ]
    try:
        wait_for(lambda: terms(database), 30)
        time.sleep(3.0)  # settled: one leader, every node renewing
        before = terms(database)
        assert len(before) == 1 and before[0][1], before
        for index in range(3):
            done = subprocess.run(
                [
                    *manage,
                    "createuser",
                    f"user{index}",
                    "--role",
                    "operator",
                    "--password",
                    f"Long-enough-pw-{index}",
                    "--token",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            assert "API token:" in done.stdout
        time.sleep(3.0)  # a lease lost during the calls would show as a new term by now
        assert terms(database) == before, [node.log()[-2000:] for node in nodes]
        assert all(node.alive() for node in nodes)
    finally:
        for node in nodes:
            node.stop()
