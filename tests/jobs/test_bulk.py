"""jobs.bulk: many rows in one statement, stored as the ORM stores them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import bulk
from jobs.models import Job, JobExecution
from jobs.services import SYSTEM, job_create

pytestmark = pytest.mark.django_db


def make_job(name: str = "bulk") -> Job:
    return job_create(
        data={"name": name, "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=SYSTEM,
    )


def test_inserted_instances_get_their_ids_in_order_and_read_back_equal():
    job = make_job()
    now = timezone.now()
    rows = [
        JobExecution(
            job=job,
            scheduled_for=now + timedelta(seconds=k),
            run_after=now + timedelta(seconds=k),
            queue=job.queue,
            priority=k - 1,
            term=7,
            args=[k, "ü"] if k else None,
            cancel_requested=bool(k % 2),
        )
        for k in range(3)
    ]
    bulk.insert_instances(rows)
    assert [r.pk for r in rows] == sorted(r.pk for r in rows)
    for row in rows:
        stored = JobExecution.objects.get(pk=row.pk)
        assert stored.created_at is not None and stored.updated_at is not None  # auto_now
        for field in JobExecution._meta.concrete_fields:
            assert getattr(stored, field.attname) == getattr(row, field.attname), field.name
    assert not rows[0]._state.adding


def test_update_sets_each_rows_own_values_where_the_condition_holds():
    jobs = [make_job(f"j{k}") for k in range(3)]
    later = timezone.now() + timedelta(hours=1)
    changes = [
        (job.pk, {"priority": k, "next_fire_at": later + timedelta(seconds=k), "queue": "q"})
        for k, job in enumerate(jobs)
    ]
    matched = bulk.update(
        Job, changes, ("priority", "next_fire_at", "queue"), where="name <> %s", where_params=["j1"]
    )
    assert matched == 2
    got = {j.name: (j.priority, j.next_fire_at, j.queue) for j in Job.objects.all()}
    assert got["j0"] == (0, later, "q")
    assert got["j2"] == (2, later + timedelta(seconds=2), "q")
    assert got["j1"][0] == jobs[1].priority and got["j1"][2] == "default"  # left alone


def test_shared_values_are_stored_as_given_quotes_and_percent_signs_included():
    """Shared columns are quoted once into the statement on MariaDB: text that looks like SQL or
    like a placeholder is stored as it is."""
    job = make_job()
    meta = JobExecution._meta
    now = timezone.now()
    text = "50% off; it's \\ a %s 'quote' -- ü"
    shared = {
        meta.get_field(name): meta.get_field(name).get_db_prep_save(value, bulk.connection)
        for name, value in {
            "job_id": job.pk,
            "attempt": 1,
            "trigger": "enqueue",
            "status": "pending",
            "queue": "default",
            "node": "",
            "cancel_requested": False,
            "reason": text,
            "created_at": now,
            "updated_at": now,
            "error": "",
            "traceback": "",
            "output": "",
        }.items()
    }
    own = [meta.get_field(name) for name in ("scheduled_for", "run_after", "priority")]
    adapt = bulk.connection.ops.adapt_datetimefield_value
    rows = [
        (adapt(now + timedelta(microseconds=k)), adapt(now + timedelta(microseconds=k)), k)
        for k in range(3)
    ]
    ids = bulk.insert(JobExecution, own, rows, shared=shared)
    stored = list(JobExecution.objects.filter(pk__in=ids).order_by("pk"))
    assert [s.reason for s in stored] == [text] * 3
    assert [s.priority for s in stored] == [0, 1, 2]
    assert stored[0].cancel_requested is False and stored[0].created_at == now
