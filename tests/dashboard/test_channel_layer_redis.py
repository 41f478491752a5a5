"""The dashboard socket over the Redis channel layer (production's, whenever REDIS_URL is set) stays
open while nothing happens: redis-py's default 5 s read timeout raced channels-redis's 5 s
blocking receive, and an idle dashboard's socket crashed about every 5 s.

On a private Redis started by the suite, under a key prefix of this test's own."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async

from cluster.conf import redis_channel_layers
from jobs.services import SYSTEM, job_create, job_trigger
from tests.dashboard.live_helpers import Dashboard, of_type, run, session_headers

INTERVAL = {"name": "idle", "task": "noop", "schedule_type": "interval", "interval_seconds": 3600}
# Past channels-redis's blocking read (5 s) and redis-py's default read timeout (5 s).
IDLE_S = 6.5


@pytest.mark.django_db(transaction=True)
def test_an_idle_dashboard_on_the_redis_layer_keeps_its_socket(
    make_user: Callable[..., Any], settings: Any, redis_url: str
) -> None:
    settings.CHANNEL_LAYERS = redis_channel_layers(redis_url, f"idle{os.getpid()}x{time.time_ns()}")
    settings.SCHEDULER_LIVE_POLL_S = 0.02
    settings.SCHEDULER_LIVE_IDLE_POLL_S = 0.02
    headers = session_headers(make_user("viewer"))
    job = job_create(data=INTERVAL, by=SYSTEM)

    async def body() -> None:
        tab = Dashboard(headers)
        await tab.open()
        await tab.assert_none(lambda message: message["type"] == "<close>", IDLE_S)
        execution = await database_sync_to_async(job_trigger)(job_id=job.pk, by=SYSTEM)
        await tab.wait_for(
            of_type("executions", lambda rows: any(r["id"] == execution.pk for r in rows)), 2.0
        )
        await tab.close()

    run(body)
