"""Retry a write transaction the database chose as a deadlock victim.

MariaDB rolls back one of two transactions that wait on each other (error 1213) or one that waited
too long for a row lock (1205); SQLite answers "database is locked" when its one write lock stays
busy past the timeout. The transaction was rolled back whole, so running the service again is safe
and is what the database asks for; only if it keeps failing does the error reach the caller (the
API answers 503 and the client may try again).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import OperationalError, connection

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

MYSQL_DEADLOCK = 1213
MYSQL_LOCK_WAIT_TIMEOUT = 1205
ATTEMPTS = 3
BACKOFF_S = (0.02, 0.1)


def is_transient(exc: OperationalError) -> bool:
    """A conflict the database resolved by rolling this transaction back (try again)."""
    code = exc.args[0] if exc.args else None
    if code in (MYSQL_DEADLOCK, MYSQL_LOCK_WAIT_TIMEOUT):
        return True
    return "database is locked" in str(exc)


def retry_on_conflict(func: F) -> F:
    """Run ``func`` again (up to ATTEMPTS in all, after a short random pause) when its transaction
    was rolled back by a deadlock or a lock wait timeout. Only outside an enclosing transaction:
    inside one, the enclosing transaction was rolled back too and is its owner's to retry."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return func(*args, **kwargs)
            except OperationalError as exc:
                if attempt == ATTEMPTS or connection.in_atomic_block or not is_transient(exc):
                    raise
                logger.warning(
                    "%s: %s; trying again (attempt %d of %d)",
                    func.__name__,
                    exc,
                    attempt + 1,
                    ATTEMPTS,
                )
                time.sleep(random.uniform(*BACKOFF_S))
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]
