"""Seed the contract run's database: an admin and a viewer with API keys (printed, one per line), a
few jobs of each schedule type and some runs, so reads have rows to return."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402

from jobs import services, tokens  # noqa: E402
from jobs.models import AuditSource  # noqa: E402
from jobs.roles import ADMIN, VIEWER  # noqa: E402


def user_with_role(name: str, role: str) -> object:
    user = get_user_model().objects.create_user(name, password=None)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def main() -> None:
    admin = user_with_role("contract-admin", ADMIN)
    viewer = user_with_role("contract-viewer", VIEWER)
    actor = services.Actor(user=admin, source=AuditSource.CLI, remote_addr=None)
    admin_key, _ = tokens.issue(admin, by=actor, name="contract", lifetime=None)
    viewer_key, _ = tokens.issue(viewer, by=actor, name="contract", lifetime=None)
    bodies = [
        {
            "name": "cron-job",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 3 * * *",
        },
        {
            "name": "interval-job",
            "task": "sleep",
            "kwargs": {"seconds": 0},
            "schedule_type": "interval",
            "interval_seconds": 3600,
        },
        {
            "name": "once-job",
            "task": "log",
            "args": ["hello"],
            "schedule_type": "once",
            "run_at": "2030-01-01T00:00:00Z",
        },
    ]
    for body in bodies:
        job = services.job_create(data=body, by=actor)
        services.job_trigger(job_id=job.pk, by=actor)
    print(admin_key)
    print(viewer_key)


if __name__ == "__main__":
    main()
