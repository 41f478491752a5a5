"""Lists of runs read through an index in their own order: a page of the newest runs costs the same
however long the history (before, the dashboard's and the API's lists sorted every run: 0.77 s a page
at 300,000 runs on MariaDB). Checked on the query plans SQLite makes (its planner does not turn to a
sort for a small table the way MariaDB's cost model may); the figures on MariaDB are in
bench/HISTORY.md."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import RECENT_FIRST, Job, JobExecution
from jobs.states import ExecutionStatus as S

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "sqlite", reason="plans are checked on SQLite's planner"
    ),
]

# (Not a status filter: for a rare status the planner rightly reads that status's runs through a
# status index and sorts those few; MariaDB does so for a rare one and reads the slot index for a
# common one.)
PAGES = [
    "/executions/",
    "/executions/?job={job}",
    "/",
    "/jobs/",
    "/jobs/{job}/",
    "/api/executions/",
    "/api/executions/?job={job}",
]


@pytest.fixture
def history() -> Job:
    now = timezone.now()
    jobs = [
        Job.objects.create(name=f"j{n}", task="noop", schedule_type="interval", interval_seconds=60)
        for n in range(3)
    ]
    for job in jobs:
        for k in range(20):
            slot = now - timedelta(minutes=k)
            JobExecution.objects.create(
                job=job,
                scheduled_for=slot,
                run_after=slot,
                status=S.FAILED if k % 3 else S.SUCCEEDED,
                finished_at=slot,
            )
    return jobs[0]


def sorted_run_queries(sqls: list[str]) -> list[tuple[str, str]]:
    """The queries over runs that order them, with SQLite's plan of each when it sorts."""
    sorting = []
    with connection.cursor() as cursor:
        for sql in sqls:
            if "jobs_jobexecution" not in sql or "ORDER BY" not in sql:
                continue
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = " / ".join(str(row[-1]) for row in cursor.fetchall())
            if "TEMP B-TREE FOR ORDER BY" in plan or "TEMP B-TREE FOR RIGHT PART" in plan:
                sorting.append((sql[:300], plan))
    return sorting


def test_every_list_of_runs_reads_an_index_in_its_order_instead_of_sorting(
    history, api_client_for, client, make_user
):
    client.force_login(make_user("viewer"))
    api = api_client_for("viewer")
    seen = 0
    for page in PAGES:
        url = page.format(job=history.pk)
        with CaptureQueriesContext(connection) as queries:
            response = (api if url.startswith("/api/") else client).get(url)
        assert response.status_code == 200, url
        sqls = [q["sql"] for q in queries.captured_queries]
        seen += sum("jobs_jobexecution" in sql and "ORDER BY" in sql for sql in sqls)
        assert sorted_run_queries(sqls) == [], url
    assert seen >= len(PAGES) - 1  # the check looked at the pages' own run queries


def test_the_newest_fire_slot_comes_first_and_a_retry_before_its_first_attempt(history):
    slot = timezone.now() + timedelta(hours=1)
    first = JobExecution.objects.create(
        job=history, scheduled_for=slot, run_after=slot, status=S.FAILED, attempt=1
    )
    retry = JobExecution.objects.create(
        job=history, scheduled_for=slot, run_after=slot, status=S.PENDING, attempt=2
    )
    newest = list(JobExecution.objects.order_by(*RECENT_FIRST)[:2])
    assert newest == [retry, first]
