"""The dashboard's live feed: one poller per web process turns database changes into messages.

The database is the source of truth (docs/live-protocol.md): executions are written by node processes,
often on other machines, so in-process signals cannot see them. While at least one dashboard is
connected to this process, a single asyncio task polls the database and hands what changed,
encoded once, straight to the ``DashboardConsumer`` of each (same process, same event loop: no
channel-layer hop). Each web process polls for its own clients only, so this works the same in the
embedded mode and behind a load balancer.

When it polls: on the doorbell (any process rings it after it commits a change a dashboard shows:
``cluster.announce``; ``dashboard.live.doorbell`` listens) and every ``SCHEDULER_LIVE_IDLE_POLL_S``
as a fallback; on a bus that pushes nothing (database coordination), or while the doorbell cannot
be heard, every ``SCHEDULER_LIVE_POLL_S``.

The database work runs in one dedicated thread (one connection, not one per pool thread) and keeps
its state there (``LiveState``); the event loop keeps the registry of connected clients
(``LivePoller``). Frames are JSON-encoded once per poll, not once per client.

Modules: ``protocol`` (close codes, bounds, timing, frames, the group), ``payloads`` (what the
messages carry), ``access`` (who may stay connected), ``feed`` (reading what changed), ``state`` (one
poll, in the database thread), ``poller`` (the event-loop side: clients, timing, delivery).
"""

from __future__ import annotations

from dashboard.live.access import dashboard_access
from dashboard.live.payloads import cluster_payload, counts_payload, snapshot_frames
from dashboard.live.poller import (
    LiveStats,
    is_running,
    register,
    shutdown,
    stats,
    subscribe,
    unregister,
    unsubscribe,
)
from dashboard.live.protocol import (
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    LiveConfig,
    frame,
)

__all__ = [
    "CLOSE_FORBIDDEN",
    "CLOSE_UNAUTHENTICATED",
    "LiveConfig",
    "LiveStats",
    "cluster_payload",
    "counts_payload",
    "dashboard_access",
    "frame",
    "is_running",
    "register",
    "shutdown",
    "snapshot_frames",
    "stats",
    "subscribe",
    "unregister",
    "unsubscribe",
]
