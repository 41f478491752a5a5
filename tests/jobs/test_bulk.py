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
