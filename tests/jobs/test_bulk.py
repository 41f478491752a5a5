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


def test_a_made_instance_equals_the_models_own_in_every_attribute():
    """bulk.maker builds what Model(**values) builds: every default (callable ones called per
    instance), the given values, a new instance's state."""
    job = make_job()
    now = timezone.now()
    values = {
        "job_id": job.pk,
        "scheduled_for": now,
        "run_after": now + timedelta(seconds=3),
        "queue": "q",
        "term": 4,
        "reason": "why",
        "created_at": now,
    }
    made, orm = bulk.maker(JobExecution)(**values), JobExecution(**values)
    for field in JobExecution._meta.concrete_fields:
        assert getattr(made, field.attname) == getattr(orm, field.attname), field.name
    assert made._state.adding is True and made._state.db is None
    assert made.pk is None and made.job == job
    # A default that is called (created_at: now) is called for each instance.
    del values["created_at"]
    first, second = bulk.maker(JobExecution)(**values), bulk.maker(JobExecution)(**values)
    assert now <= first.created_at <= second.created_at
    assert first.created_at is not second.created_at
    with pytest.raises(TypeError, match="no field 'nope'"):
        bulk.maker(JobExecution)(nope=1)


def test_each_rows_own_values_are_stored_as_given_whatever_their_text():
    """On MariaDB every value is written into the statement's text: text that looks like SQL, a
    placeholder or a date, numbers, booleans, NULLs and JSON read back as they were given."""
    job = make_job()
    now = timezone.now()
    texts = ["50% off; it's \\ a %s 'quote' -- ü", "2026-12-07 10:00:00", "", "NULL"]
    rows = [
        JobExecution(
            job=job,
            scheduled_for=now + timedelta(microseconds=k),
            run_after=now + timedelta(microseconds=k),
            queue=f"q{k}",
            priority=-k,
            reason=text,
            error=text * 2,
            duration_ms=None if k % 2 else 1.0 / 3 + k,
            cancel_requested=bool(k % 2),
            args=[text, k, None, True] if k != 2 else None,
            kwargs={"t": text} if k else None,
            term=None if k == 3 else 10**12 + k,
        )
        for k, text in enumerate(texts)
    ]
    bulk.insert_instances(rows)
    for row in rows:
        stored = JobExecution.objects.get(pk=row.pk)
        for field in JobExecution._meta.concrete_fields:
            assert getattr(stored, field.attname) == getattr(row, field.attname), field.name
