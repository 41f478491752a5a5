"""What the database itself refuses: the last line of defence under any bug in Python code."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.models import Job, JobExecution


def make_job(name="job", **kwargs):
    fields = {"task": "noop", "schedule_type": "interval", "interval_seconds": 10, **kwargs}
    return Job.objects.create(name=name, **fields)


@pytest.mark.django_db
def test_duplicate_fire_is_refused_by_the_database():
    job = make_job()
    slot = timezone.now()
    JobExecution.objects.create(job=job, scheduled_for=slot, attempt=1, run_after=slot)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobExecution.objects.create(job=job, scheduled_for=slot, attempt=1, run_after=slot)
    # Another attempt of the same slot, or the same attempt of another slot, is fine.
    JobExecution.objects.create(job=job, scheduled_for=slot, attempt=2, run_after=slot)
    assert JobExecution.objects.filter(job=job).count() == 2


@pytest.mark.django_db
def test_duplicate_job_name_is_refused():
    make_job("same")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_job("same")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        {"schedule_type": "cron", "cron_expression": ""},
        {"schedule_type": "interval", "interval_seconds": None},
        {"schedule_type": "interval", "interval_seconds": 0},
        {"schedule_type": "once", "run_at": None},
        {"schedule_type": "bogus"},
        {"timeout_seconds": 0},
        {"retry_backoff_factor": 0.5},
        {"retry_backoff_base": -1.0},
        {"version": 0},
    ],
)
def test_check_constraints(fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        make_job("bad", **fields)
    assert not Job.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_attempt_must_be_positive():
    job = make_job()
    slot = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        JobExecution.objects.create(job=job, scheduled_for=slot, attempt=0, run_after=slot)
