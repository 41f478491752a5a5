"""Cross-process wake-ups: a job edited in the web process wakes the leader at once, a triggered run
wakes the claimers. Through Redis pub/sub when the cluster coordinates through Redis; on the
database backend nodes notice within their short poll instead (LEADER_MAX_SLEEP_S, CLAIM_POLL_S)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from jobs.conf import app_setting

logger = logging.getLogger(__name__)

WAKE_CHANNEL = "wake"
_publisher: Any = None
_publisher_lock = threading.Lock()


def publisher() -> Any:
    """This process's Redis client for wake-ups and the live feed's doorbell (made on first use)."""
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            from cluster.coordination.redis_backend import RedisBackend

            _publisher = RedisBackend(
                app_setting("REDIS_URL"),
                prefix=app_setting("SCHEDULER_REDIS_PREFIX"),
                redlock_urls=None,
            )
        return _publisher


def wake_nodes(**_payload: Any) -> None:
    """Receiver of jobs.events.job_changed (sent after commit): a job edited, created, paused or
    triggered may give a node something new to do."""
    if app_setting("SCHEDULER_COORDINATION") != "redis":
        return
    try:
        publisher().publish(WAKE_CHANNEL, "changed")
    except Exception as exc:  # a wake-up is an optimisation: nodes poll anyway
        logger.warning("could not publish a wake-up: %s", exc)


def wake_for_executions(*, changes: list[Any], **_payload: Any) -> None:
    """Receiver of jobs.events.executions_changed (sent after commit): only new pending runs give
    a node something new to do; one wake-up for all of them."""
    if any(change.status == "pending" for change in changes):
        wake_nodes()
