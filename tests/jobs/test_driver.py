"""The hot path's use of the database driver (jobs.driver): transactions that travel with their
statements, DATETIME values parsed in C; and what jobs.bulk writes into a statement's text."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import bulk, driver, services
from jobs.executions.claims import _ClaimSQL
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

pytestmark = pytest.mark.django_db(transaction=True)

S = ExecutionStatus


def mariadb_only() -> None:
    if connection.vendor != "mysql":
        pytest.skip("SQLite's transactions are Django's atomic() blocks")


def make_runs(count: int) -> list[JobExecution]:
    job = services.job_create(
        data={
            "name": f"driver-{count}",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 86_400,
            "enabled": False,
        },
        by=services.SYSTEM,
    )
    return services.runs_enqueue(job_id=job.pk, items=[{}] * count, by=services.SYSTEM)


def reason_of(pk: int) -> str:
    return JobExecution.objects.values_list("reason", flat=True).get(pk=pk)


def test_a_transaction_script_sends_begin_and_commit_with_its_statements():
    mariadb_only()
    [run] = make_runs(1)
    table = JobExecution._meta.db_table
    with CaptureQueriesContext(connection) as queries, driver.transaction_script() as script:
        script.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [run.pk])
        assert script.cursor.fetchall() == ((run.pk,),)
        assert (
            script.execute_and_commit(
                f"UPDATE {table} SET reason = %s WHERE id = %s", ["written", run.pk]
            )
            == 1
        )
    sent = [query["sql"] for query in queries]
    assert len(sent) == 2  # two round trips: no SET autocommit, no COMMIT of their own
    assert sent[0].startswith("BEGIN; SELECT")
    assert sent[1].endswith("; COMMIT")
    assert reason_of(run.pk) == "written"


def test_the_rows_a_transaction_script_locked_are_held_until_its_commit():
    """BEGIN really opens a transaction: another connection cannot lock the row meanwhile."""
    mariadb_only()
    [run] = make_runs(1)
    table = JobExecution._meta.db_table
    seen: list[tuple] = []

    def other_claimer() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id FROM {table} WHERE id = %s FOR UPDATE SKIP LOCKED", [run.pk]
                )
                seen.append(cursor.fetchall())
        finally:
            connection.close()

    with driver.transaction_script() as script:
        script.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [run.pk])
        thread = threading.Thread(target=other_claimer)
        thread.start()
        thread.join(10)
        script.execute_and_commit(f"UPDATE {table} SET reason = 'mine' WHERE id = %s", [run.pk])
    assert seen == [()]  # skipped: the row was ours
    other_claimer()
    assert seen[-1] == ((run.pk,),)  # and free once committed


def test_leaving_a_transaction_script_without_its_commit_writes_nothing():
    mariadb_only()
    [run] = make_runs(1)
    table = JobExecution._meta.db_table
    with pytest.raises(RuntimeError), driver.transaction_script() as script:
        script.execute(f"UPDATE {table} SET reason = 'lost' WHERE id = %s", [run.pk])
        raise RuntimeError("the claim gave up")
    assert reason_of(run.pk) == ""


def test_a_failing_statement_with_the_commit_raises_and_writes_nothing():
    mariadb_only()
    first, second = make_runs(2)
    table = JobExecution._meta.db_table
    with pytest.raises(OperationalError), driver.transaction_script() as script:
        script.execute(f"UPDATE {table} SET reason = 'first' WHERE id = %s", [first.pk])
        script.execute_and_commit(f"UPDATE {table} SET no_such_column = 1 WHERE id = %s", [0])
    assert reason_of(first.pk) == ""
    script_connection_usable = JobExecution.objects.filter(pk=second.pk).exists()
    assert script_connection_usable


def test_inside_an_atomic_block_a_transaction_script_is_part_of_it():
    """Committed by the block, on either engine: nothing is sent on its own."""
    [run] = make_runs(1)
    table = JobExecution._meta.db_table
    with pytest.raises(RuntimeError), transaction.atomic():
        with driver.transaction_script() as script:
            script.execute_and_commit(
                f"UPDATE {table} SET reason = 'inner' WHERE id = %s", [run.pk]
            )
        raise RuntimeError("the outer block fails")
    assert reason_of(run.pk) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02 22:00:00.123456", datetime(2026, 12, 2, 22, 0, 0, 123456)),
        ("2026-12-02 22:00:00", datetime(2026, 12, 2, 22, 0, 0)),
        ("2026-12-02 22:00:00.12", datetime(2026, 12, 2, 22, 0, 0, 120000)),
        ("0000-00-00 00:00:00", None),  # a zero date: the driver's own rule (None)
    ],
)
def test_datetimes_are_parsed_as_the_driver_would(text, expected):
    from MySQLdb.times import DateTime_or_None

    assert driver._datetime_or_none(text) == expected == DateTime_or_None(text)


def test_datetimes_read_from_mariadb_are_the_values_written():
    mariadb_only()
    from MySQLdb.constants import FIELD_TYPE

    connection.ensure_connection()
    assert connection.connection.converter[FIELD_TYPE.DATETIME] is driver._datetime_or_none
    [run] = make_runs(1)
    stamp = datetime(2026, 12, 2, 22, 0, 0, 654321, tzinfo=UTC)
    JobExecution.objects.filter(pk=run.pk).update(finished_at=stamp)
    assert JobExecution.objects.get(pk=run.pk).finished_at == stamp


@pytest.mark.parametrize(
    ("value", "inlined"),
    [
        (12, "12"),
        (0.25, "0.25"),
        ("2026-12-02 22:00:00.123456", "'2026-12-02 22:00:00.123456'"),
        ("2026-12-02", "'2026-12-02'"),
        (float("nan"), None),
        (float("inf"), None),
        (True, None),
        ("2026-12-02 22:00:00'; DROP TABLE x; --", None),
        ("succeeded", None),
        ("12", None),
    ],
)
def test_only_numbers_and_dates_are_written_into_a_statement(value, inlined):
    assert bulk._inline(value) == inlined


def test_an_update_with_inlined_values_writes_what_a_parameter_would():
    runs = make_runs(3)
    now = timezone.now()
    rows = [
        (run.pk, {"finished_at": now + timedelta(seconds=index), "duration_ms": index / 3})
        for index, run in enumerate(runs)
    ]
    assert bulk.update(JobExecution, rows, ("finished_at", "duration_ms")) == 3
    for pk, values in rows:
        stored = JobExecution.objects.get(pk=pk)
        assert (stored.finished_at, stored.duration_ms) == (
            values["finished_at"],
            pytest.approx(values["duration_ms"]),
        )


def test_the_claims_look_walks_the_claim_index_whatever_the_backlog_of_one_job():
    """The candidates are found through the claim's index before they meet their job (a plain
    join let MariaDB start from the job and sort its whole backlog for every claim)."""
    mariadb_only()
    make_runs(500)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {JobExecution._meta.db_table}")
        cursor.fetchall()
        sql = _ClaimSQL.of(connection).candidates.format(queues="%s")
        cursor.execute(f"EXPLAIN {sql}", [S.PENDING, "default", timezone.now(), 20])
        plan = cursor.fetchall()
    executions = [row for row in plan if row[2] == JobExecution._meta.db_table]
    assert [row[5] for row in executions] == ["execution_unclaimed_idx"], plan
    assert "filesort" not in (executions[0][9] or ""), plan
