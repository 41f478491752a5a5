"""Which term wrote what, in commit order, from the private MariaDB's row-based binary log.

Every fenced transaction updates the fence row (``writes + 1``, ``writer_term``), and a new leader's
fence raise updates its ``term``; the binary log lists transactions in the order they committed,
with the full image of every row they changed. So each committed transaction shows the term of its
writer, the newest term the fence had reached before it, and what it did to the runs: fires
inserted, runs declared lost, skips, retries; and whose fence it was (each scheduling partition
has its own row). The checker (``commit_order``) needs nothing else —
no writer's clock is involved.

Reading needs ``mariadb-binlog`` (or ``mysqlbinlog``) and the log files; parsing is pure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.record import Commit, RunningStep
from cluster import partitions

FENCE_TABLE = "cluster_clusterfence"
EXECUTION_TABLE = "jobs_jobexecution"
TABLES = (FENCE_TABLE, EXECUTION_TABLE)
BINLOG_TOOLS = ("mariadb-binlog", "mysqlbinlog")
ERR_NO_TOOL = "mariadb-binlog is not installed: the commit order cannot be read"
# Execution ids kept per commit as evidence.
EVIDENCE_IDS = 20

_EVENT = re.compile(r"^### (INSERT INTO|UPDATE|DELETE FROM) `[^`]*`\.`([^`]*)`")
_VALUE = re.compile(r"^###   @(\d+)=(.*)$")


@dataclass
class _Change:
    table: str
    op: str  # insert | update | delete
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)


def _value(text: str) -> Any:
    if text == "NULL":
        return None
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        return text


def parse(text: str, columns: Mapping[str, list[str]]) -> list[list[_Change]]:
    """The transactions of ``mariadb-binlog -v`` output, in commit order, each the changes it made
    to the tables of ``columns`` (table -> column names in their ordinal order)."""
    transactions: list[list[_Change]] = []
    current: list[_Change] | None = None
    change: _Change | None = None
    section = "after"
    for line in text.splitlines():
        if line.startswith(("START TRANSACTION", "BEGIN")):
            current, change = [], None
            continue
        if line.startswith("COMMIT") and current is not None:
            transactions.append(current)
            current, change = None, None
            continue
        if current is None or not line.startswith("###"):
            continue
        event = _EVENT.match(line)
        if event:
            op = {"INSERT INTO": "insert", "UPDATE": "update", "DELETE FROM": "delete"}[
                event.group(1)
            ]
            table = event.group(2)
            change = _Change(table, op) if table in columns else None
            if change is not None:
                current.append(change)
            section = "before" if op in ("update", "delete") else "after"
            continue
        if change is None:
            continue
        if line.startswith("### WHERE"):
            section = "before"
        elif line.startswith("### SET"):
            section = "after"
        else:
            found = _VALUE.match(line)
            if found:
                names = columns[change.table]
                position = int(found.group(1)) - 1
                if position < len(names):
                    target = change.before if section == "before" else change.after
                    target[names[position]] = _value(found.group(2))
    return [t for t in transactions if t]


def commits(transactions: Iterable[list[_Change]]) -> list[Commit]:
    """One :class:`Commit` per transaction that touched the fence or the runs."""
    found = []
    for seq, changes in enumerate(transactions):
        writer = raised = fence_before = None
        partition = 0
        fires = lost = skipped = retries = 0
        ids: list[int] = []
        for change in changes:
            if change.table == FENCE_TABLE:
                name = change.after.get("name") or change.before.get("name")
                partition = partitions.partition_of_fence(str(name)) or 0
            if change.table == FENCE_TABLE and change.op == "update":
                before, after = change.before, change.after
                fence_before = before.get("term")
                if after.get("writes") != before.get("writes"):
                    writer = after.get("writer_term")
                if after.get("term") != before.get("term"):
                    raised = after.get("term")
            elif change.table == FENCE_TABLE and change.op == "insert":
                raised = change.after.get("term") or None
            elif change.table == EXECUTION_TABLE:
                row, old = change.after, change.before
                if change.op == "insert":
                    fires += row.get("trigger") == "schedule"
                    retries += row.get("trigger") == "retry"
                    skipped += row.get("status") == "skipped"
                elif change.op == "update" and row.get("status") != old.get("status"):
                    lost += row.get("status") == "lost"
                    skipped += row.get("status") == "skipped"
                else:
                    continue
                if len(ids) < EVIDENCE_IDS and isinstance(row.get("id"), int):
                    ids.append(row["id"])
        if writer is None and raised is None and not (fires or lost or skipped or retries):
            continue
        found.append(
            Commit(
                seq=seq,
                writer_term=writer,
                fence_term=fence_before,
                raised_to=raised,
                fires=fires,
                lost=lost,
                skipped=skipped,
                retries=retries,
                execution_ids=ids,
                partition=partition,
            )
        )
    return found


RUNNING = "running"


def running_steps(transactions: Iterable[list[_Change]]) -> list[RunningStep]:
    """Every run's row entering or leaving ``running``, in commit order."""
    steps = []
    for seq, changes in enumerate(transactions):
        for change in changes:
            if change.table != EXECUTION_TABLE:
                continue
            row = change.after if change.op != "delete" else change.before
            was = change.before.get("status") if change.op != "insert" else None
            now = change.after.get("status") if change.op != "delete" else None
            if (was == RUNNING) == (now == RUNNING):
                continue
            if not isinstance(row.get("id"), int) or not isinstance(row.get("job_id"), int):
                continue
            steps.append(
                RunningStep(
                    seq=seq,
                    execution_id=row["id"],
                    job_id=row["job_id"],
                    queue=str(row.get("queue") or ""),
                    entered=now == RUNNING,
                )
            )
    return steps


def read_log(log_dir: Path, columns: Mapping[str, list[str]]) -> list[list[_Change]]:
    """The transactions of every binary log file in ``log_dir`` (a server's ``--log-bin``
    base), parsed."""
    tool = next((t for t in BINLOG_TOOLS if shutil.which(t)), None)
    if tool is None:
        raise RuntimeError(ERR_NO_TOOL)
    files = sorted(str(p) for p in log_dir.glob("binlog.[0-9]*"))
    if not files:
        return []
    out = subprocess.run(
        [tool, "--base64-output=DECODE-ROWS", "--verbose", *files],
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tool} failed: {out.stderr.strip()[:300]}")
    return parse(out.stdout, columns)


def read_commits(log_dir: Path, columns: Mapping[str, list[str]]) -> list[Commit]:
    """The commits of every binary log file in ``log_dir`` (a server's ``--log-bin`` base)."""
    return commits(read_log(log_dir, columns))


def table_columns(cursor: Any, database: str) -> dict[str, list[str]]:
    """Column names of the checked tables, in their ordinal order (a DB-API cursor)."""
    cursor.execute(
        "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN (%s, %s) ORDER BY TABLE_NAME, ORDINAL_POSITION",
        [database, *TABLES],
    )
    columns: dict[str, list[str]] = {}
    for table, column in cursor.fetchall():
        columns.setdefault(table, []).append(column)
    return columns
