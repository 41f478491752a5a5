"""Example jobs for a first start: something to watch on the dashboard within seconds.

``runcluster`` (what ``make run`` starts) calls :func:`create_on_first_start` before it starts the
web server and the nodes. It creates the jobs of :data:`EXAMPLES` whose task is registered, through
the jobs service layer (validated and audited like any other job, actor "system"), when
``settings.SCHEDULER_EXAMPLE_JOBS`` is on (the default of ``scheduler_project.settings``; off under
``scheduler_project.settings_production`` unless asked for) and no job has ever existed on this
database: no job row and no job in the audit log. Deleting the examples therefore never brings
them back, and an installation that already has jobs never gets them.
"""

from __future__ import annotations

from typing import Any

from jobs import registry, services
from jobs.conf import app_setting
from jobs.models import AuditEvent, Job

DESCRIPTION = (
    "An example created on the first start (SCHEDULER_EXAMPLE_JOBS); pause or delete it freely, "
    "it is not created again."
)

EXAMPLES: tuple[dict[str, Any], ...] = (
    {
        "name": "example-every-5-seconds",
        "task": "log",
        "kwargs": {"message": "hello from the scheduler", "level": "debug"},
        "schedule_type": "interval",
        "interval_seconds": 5,
    },
    {
        "name": "example-flaky-with-retries",
        "task": "demo_flaky",
        "kwargs": {"fail_rate": 0.5},
        "schedule_type": "interval",
        "interval_seconds": 20,
        "max_retries": 3,
        "retry_backoff_base": 2.0,
    },
    {
        "name": "example-streaming-output",
        "task": "demo_ticker",
        "kwargs": {"seconds": 5, "interval": 0.5},
        "schedule_type": "interval",
        "interval_seconds": 30,
        "timeout_seconds": 60,
    },
    {
        "name": "example-report-every-minute",
        "task": "demo_report",
        "schedule_type": "cron",
        "cron_expression": "* * * * *",
    },
    {
        "name": "example-purge-old-runs",
        "task": "purge_runs",
        "kwargs": {"older_than_days": 7},
        "schedule_type": "cron",
        "cron_expression": "7 * * * *",
    },
)


def first_start() -> bool:
    """True when no job has ever existed here (none now, none in the audit log)."""
    return not Job.objects.exists() and not AuditEvent.objects.filter(object_type="job").exists()


def create_on_first_start() -> list[Job]:
    """Create the example jobs if the setting is on and this is a first start; returns them
    (empty when nothing was created)."""
    if not app_setting("SCHEDULER_EXAMPLE_JOBS") or not first_start():
        return []
    items = [
        {"description": DESCRIPTION, **example}
        for example in EXAMPLES
        if registry.is_registered(example["task"])
    ]
    if not items:
        return []
    return services.jobs_create_batch(items=items, by=services.SYSTEM)
