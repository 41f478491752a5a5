"""Migration jobs 0013: a spread job's stored next fire moves from its slot to its due instant
(slot + offset), and back on a reverse migration; other jobs are untouched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.schedules import spread_offset

BEFORE = ("jobs", "0012_audit_filter_indexes")
AFTER = ("jobs", "0013_next_fire_is_due_instant")
SLOT = datetime(2030, 1, 1, tzinfo=UTC)


def _migrate(target: tuple[str, str]) -> Apps:
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    executor.loader.build_graph()
    return executor.loader.project_state([target]).apps


@pytest.mark.django_db(transaction=True)
def test_spread_jobs_move_to_their_due_instant_and_back() -> None:
    apps = _migrate(BEFORE)
    Job = apps.get_model("jobs", "Job")
    fields = {"task": "noop", "schedule_type": "interval", "interval_seconds": 60}
    Job.objects.create(name="spread", spread_seconds=30, next_fire_at=SLOT, **fields)
    Job.objects.create(name="plain", next_fire_at=SLOT, **fields)
    Job.objects.create(name="paused", spread_seconds=30, next_fire_at=None, **fields)
    try:
        apps = _migrate(AFTER)
        Job = apps.get_model("jobs", "Job")
        stored = dict(Job.objects.values_list("name", "next_fire_at"))
        offset = timedelta(seconds=spread_offset("spread", 30))
        assert offset > timedelta(0)
        assert stored == {"spread": SLOT + offset, "plain": SLOT, "paused": None}

        apps = _migrate(BEFORE)
        Job = apps.get_model("jobs", "Job")
        assert dict(Job.objects.values_list("name", "next_fire_at"))["spread"] == SLOT
    finally:
        # Back to the newest schema, whatever came after this migration.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        apps.get_model("jobs", "Job").objects.all().delete()
