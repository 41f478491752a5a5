"""The live feed's protocol (docs/live-protocol.md): its close codes and bounds, its timing
settings and the frame encoding."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from cluster import announce
from jobs.conf import app_setting

# WebSocket close codes of the protocol.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
BATCH_SIZE = 500  # rows per `executions` / `jobs` message (the protocol's bound), and per query
LATE_AFTER_S = 5.0  # a pending execution this far past its run_after is "late"
MAX_SUBSCRIPTIONS = 20  # per connection; a new one beyond this drops the oldest
OUTPUT_FIELDS = ("result", "error", "traceback", "output")
# What a dashboard was last sent of one execution it subscribed to: the row's updated_at and the
# length of its output then (None: nothing yet).
OutputSent = tuple[datetime, int] | None


@dataclass(frozen=True)
class LiveConfig:
    poll_s: float  # the shortest gap between two polls; the poll period without a doorbell
    recheck_s: float
    lookback_s: float
    # With the doorbell heard, a poll runs on a ring, and at least this often without one.
    idle_poll_s: float = 1.0
    doorbell: bool = False

    @classmethod
    def from_settings(cls) -> LiveConfig:
        config = cls(
            poll_s=float(app_setting("SCHEDULER_LIVE_POLL_S")),
            recheck_s=float(app_setting("SCHEDULER_LIVE_RECHECK_S")),
            lookback_s=float(app_setting("SCHEDULER_LIVE_LOOKBACK_S")),
            idle_poll_s=float(app_setting("SCHEDULER_LIVE_IDLE_POLL_S")),
            doorbell=announce.bus().pushes,
        )
        if min(config.poll_s, config.recheck_s) <= 0 or config.lookback_s < 0:
            raise ValueError(f"invalid live dashboard timing: {config}")
        if config.idle_poll_s < config.poll_s:
            raise ValueError(f"SCHEDULER_LIVE_IDLE_POLL_S is below SCHEDULER_LIVE_POLL_S: {config}")
        return config


def frame(kind: str, data: Any) -> str:
    """One server message, JSON-encoded: ``{"type", "data", "ts"}``."""
    return json.dumps(
        {"type": kind, "data": data, "ts": round(time.time(), 3)},
        cls=DjangoJSONEncoder,
        separators=(",", ":"),
    )
