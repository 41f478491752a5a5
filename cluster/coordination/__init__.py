"""Coordination of the cluster: leader leases, mutual-exclusion locks and node presence.

One small interface (:class:`CoordinationBackend`, see ``base``), backends behind it:

- ``redis``: lease by ``SET NX PX`` + ``INCR`` term with compare-and-set scripts; locks by Redlock
  over the ``REDLOCK_URLS`` masters (``redis_backend``, ``redlock``);
- ``database``: the same semantics in ``CoordinationLease`` rows (``database``);
- ``memory``: in-process, for unit tests (``memory``).

``get_backend()`` builds the configured one from the settings.
"""

from __future__ import annotations

from typing import Any

from jobs.conf import app_setting

from .base import (
    CoordinationBackend,
    CoordinationError,
    Lease,
    LockHandle,
    LockNotAcquired,
    LockNotOwned,
    QuorumLost,
)
from .watchdog import LockKeeper, LockWatchdog

__all__ = [
    "BACKEND_KINDS",
    "CoordinationBackend",
    "CoordinationError",
    "Lease",
    "LockHandle",
    "LockKeeper",
    "LockNotAcquired",
    "LockNotOwned",
    "LockWatchdog",
    "QuorumLost",
    "get_backend",
]

BACKEND_KINDS = ("redis", "database", "memory")


def get_backend(kind: str | None = None, **overrides: Any) -> CoordinationBackend:
    """The coordination backend named by ``kind`` (default: ``settings.SCHEDULER_COORDINATION``).

    The Redis backend reads ``REDIS_URL``, ``REDLOCK_URLS`` and ``SCHEDULER_REDIS_PREFIX``; keyword
    ``overrides`` replace any constructor argument (``url``, ``prefix``, ``clock``, timeouts...).
    """
    kind = kind or app_setting("SCHEDULER_COORDINATION")
    if kind == "redis":
        from .redis_backend import RedisBackend

        options: dict[str, Any] = {
            "url": app_setting("REDIS_URL"),
            "redlock_urls": app_setting("REDLOCK_URLS") or None,
            "prefix": app_setting("SCHEDULER_REDIS_PREFIX"),
        }
        options.update(overrides)
        return RedisBackend(**options)
    if kind == "database":
        # Imported here: it needs the app registry, and this package must import without it.
        from .database import DatabaseBackend

        return DatabaseBackend(**overrides)
    if kind == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(**overrides)
    raise ValueError(f"unknown coordination backend {kind!r}; expected one of {BACKEND_KINDS}")
