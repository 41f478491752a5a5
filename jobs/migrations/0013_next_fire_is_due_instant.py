"""A job's ``next_fire_at`` is now when its next fire is due: the slot plus the job's spread offset
(before, the slot itself). Jobs with a spread move their stored next fire by their offset, so none
fires off its slots after the upgrade; jobs without a spread (most) are unchanged."""

from datetime import timedelta

from django.db import migrations

from jobs.schedules import spread_offset

CHUNK = 1000


def _shift(apps, sign: int) -> None:
    Job = apps.get_model("jobs", "Job")
    spread_jobs = Job.objects.filter(spread_seconds__gt=0, next_fire_at__isnull=False)
    moved = []
    for job in spread_jobs.only("pk", "name", "spread_seconds", "next_fire_at").iterator(
        chunk_size=CHUNK
    ):
        job.next_fire_at += sign * timedelta(seconds=spread_offset(job.name, job.spread_seconds))
        moved.append(job)
        if len(moved) == CHUNK:
            Job.objects.bulk_update(moved, ["next_fire_at"])
            moved = []
    Job.objects.bulk_update(moved, ["next_fire_at"])


def forwards(apps, schema_editor) -> None:
    _shift(apps, 1)


def backwards(apps, schema_editor) -> None:
    _shift(apps, -1)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0012_audit_filter_indexes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
