"""The database coordination backend (the embedded default, and shops without Redis).

Leases, locks and presence keys are rows of :class:`cluster.models.CoordinationLease`, named
``lease:{name}``, ``lock:{name}`` and ``node:{id}``. Every change is one conditional UPDATE whose
row count says who won (zero rows: someone else); a row is created once, by an INSERT that loses cleanly
with an IntegrityError when another process created it first. The ``term`` column is only ever
incremented and is kept when a lease is released or expires, so minted terms never go backwards.

Correct with several processes: SQLite runs each transaction under ``BEGIN IMMEDIATE`` (one writer
at a time, see settings); MariaDB/InnoDB re-checks an UPDATE's WHERE clause on the newest committed row
once it holds the row lock, so two racing UPDATEs cannot both match.

Time: expiries are wall-clock milliseconds from the injected clock of whichever node writes them. A
node process keeps the database server's time (``runnode``'s ReferenceClock), so a machine whose
clock is stepped neither shortens nor lengthens the leases it writes.
On MariaDB, names compare case-insensitively (utf8mb4_unicode_ci): do not rely on case to tell two
leases apart.

Heartbeats keep presence only (``stores_heartbeat_payload = False``): a node's details live in its
``SchedulerNode`` row, so ``live_nodes`` maps each live node id to its expiry alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db import Error as DatabaseError
from django.db.models import F, Q

from cluster.clock import Clock, SystemClock, wall_ms
from cluster.models import CoordinationLease

from .base import (
    DEFAULT_MAX_EXTENSIONS,
    CoordinationBackend,
    CoordinationError,
    Lease,
    LockHandle,
    new_token,
    validate_ttl,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_PREFIX = "lease:"
LOCK_PREFIX = "lock:"
NODE_PREFIX = "node:"


class DatabaseBackend(CoordinationBackend):
    stores_heartbeat_payload = False

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        clock: Clock | None = None,
        max_extensions: int = DEFAULT_MAX_EXTENSIONS,
    ) -> None:
        self.using = using
        self.clock = clock or SystemClock()
        self.max_extensions = max_extensions

    def _rows(self):
        return CoordinationLease.objects.using(self.using)

    def _call(self, operation: str, key: str, body: Callable[[], T]) -> T:
        """Run one operation; a database error becomes a CoordinationError.

        After an error outside a transaction, a connection the server dropped (restart,
        wait_timeout) is closed so that the next call reconnects instead of failing forever.
        Closing connections that are merely old is the node loop's job (close_old_connections).
        """
        connection = connections[self.using]
        try:
            return body()
        except DatabaseError as exc:
            logger.warning("database %s of %s failed: %s", operation, key, exc)
            if not connection.in_atomic_block:
                connection.close_if_unusable_or_obsolete()
            raise CoordinationError(
                f"database {operation} of {key} failed: {exc}", key=key
            ) from exc

    def _take(
        self, key: str, now: int, *, holder: str, token: str, expires_at_ms: int
    ) -> int | None:
        """Take the row if it is free or expired, minting the next term. Returns the term or None.

        Runs inside a transaction, so the term read back is the one this UPDATE wrote.
        """
        taken = (
            self._rows()
            .filter(Q(token="") | Q(expires_at_ms__lte=now), name=key)
            .update(holder=holder, token=token, term=F("term") + 1, expires_at_ms=expires_at_ms)
        )
        if taken:
            return self._rows().filter(name=key).values_list("term", flat=True).get()
        if self._rows().filter(name=key).exists():
            return None  # held by someone else
        try:
            # A savepoint, so that losing the race does not break the enclosing transaction.
            with transaction.atomic(using=self.using):
                self._rows().create(
                    name=key, holder=holder, token=token, term=1, expires_at_ms=expires_at_ms
                )
        except IntegrityError:
            return None  # another process created (and so took) the row first
        return 1

    # --- leases -----------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        key, token = LEASE_PREFIX + name, new_token()

        def body() -> Lease | None:
            with transaction.atomic(using=self.using):
                # Read inside the transaction: on SQLite, after BEGIN IMMEDIATE got the write lock.
                now = wall_ms(self.clock)
                expires_at_ms = now + ttl_ms
                term = self._take(key, now, holder=holder, token=token, expires_at_ms=expires_at_ms)
            return None if term is None else Lease(name, holder, term, token, expires_at_ms)

        return self._call("acquire_lease", key, body)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        key = LEASE_PREFIX + lease.name

        def body() -> Lease | None:
            now = wall_ms(self.clock)
            renewed = (
                self._rows()
                .filter(name=key, holder=lease.holder, token=lease.token, expires_at_ms__gt=now)
                .update(expires_at_ms=now + ttl_ms)
            )
            # The token is unique to one acquisition, so the row's term is still lease.term.
            return (
                Lease(lease.name, lease.holder, lease.term, lease.token, now + ttl_ms)
                if renewed
                else None
            )

        return self._call("renew_lease", key, body)

    def release_lease(self, lease: Lease) -> bool:
        key = LEASE_PREFIX + lease.name

        def body() -> bool:
            released = (
                self._rows()
                .filter(
                    name=key,
                    holder=lease.holder,
                    token=lease.token,
                    expires_at_ms__gt=wall_ms(self.clock),
                )
                .update(holder="", token="", expires_at_ms=0)  # the term stays
            )
            return released == 1

        return self._call("release_lease", key, body)

    def raise_term_floor(self, name: str, floor: int) -> None:
        key = LEASE_PREFIX + name

        def body() -> None:
            if not self._rows().filter(name=key).exists():
                try:
                    with transaction.atomic(using=self.using):
                        self._rows().create(name=key, term=floor)
                except IntegrityError:
                    pass  # created meanwhile: raise it below
            self._rows().filter(name=key, term__lt=floor).update(term=floor)

        self._call("raise_term_floor", key, body)

    def current_lease(self, name: str) -> Lease | None:
        key = LEASE_PREFIX + name

        def body() -> Lease | None:
            row = (
                self._rows()
                .filter(name=key, expires_at_ms__gt=wall_ms(self.clock))
                .exclude(token="")
                .first()
            )
            if row is None:
                return None
            return Lease(name, row.holder, row.term, row.token, row.expires_at_ms)

        return self._call("current_lease", key, body)

    # --- locks ------------------------------------------------------------------------------------
    def acquire_lock(self, name: str, ttl_ms: int) -> LockHandle | None:
        validate_ttl(ttl_ms)
        key, token = LOCK_PREFIX + name, new_token()

        def body() -> LockHandle | None:
            started = self.clock.monotonic()
            with transaction.atomic(using=self.using):
                now = wall_ms(self.clock)
                term = self._take(key, now, holder="", token=token, expires_at_ms=now + ttl_ms)
            if term is None:
                return None
            handle = LockHandle(name, token, self._validity_ms(ttl_ms, started), started)
            if handle.validity_ms <= 0:  # waited so long for the database that it already expired
                self.release_lock(handle)
                return None
            return handle

        return self._call("acquire_lock", key, body)

    def extend_lock(self, handle: LockHandle, ttl_ms: int) -> LockHandle | None:
        validate_ttl(ttl_ms)
        key = LOCK_PREFIX + handle.name
        if handle.extensions >= self.max_extensions:
            logger.warning("lock %s reached its extension cap (%d)", key, self.max_extensions)
            return None

        def body() -> LockHandle | None:
            started = self.clock.monotonic()
            now = wall_ms(self.clock)
            extended = (
                self._rows()
                .filter(name=key, token=handle.token, expires_at_ms__gt=now)
                .update(expires_at_ms=now + ttl_ms)
            )
            if not extended:
                return None
            return LockHandle(
                handle.name,
                handle.token,
                self._validity_ms(ttl_ms, started),
                started,
                handle.extensions + 1,
            )

        return self._call("extend_lock", key, body)

    def release_lock(self, handle: LockHandle) -> bool:
        key = LOCK_PREFIX + handle.name

        def body() -> bool:
            released = (
                self._rows()
                .filter(name=key, token=handle.token, expires_at_ms__gt=wall_ms(self.clock))
                .update(token="", expires_at_ms=0)
            )
            return released == 1

        return self._call("release_lock", key, body)

    def _validity_ms(self, ttl_ms: int, started: float) -> int:
        # The expiry was computed before the round trip: what the round trip took is already gone.
        return int(ttl_ms - (self.clock.monotonic() - started) * 1000)

    # --- presence ---------------------------------------------------------------------------------
    def heartbeat(self, node_id: str, ttl_ms: int, payload: dict[str, Any]) -> bool:
        validate_ttl(ttl_ms)
        key = NODE_PREFIX + node_id

        def body() -> bool:
            now = wall_ms(self.clock)
            expires_at_ms = now + ttl_ms
            # Renewed only while unexpired: a lapse must be reported, not papered over.
            if (
                self._rows()
                .filter(name=key, expires_at_ms__gt=now)
                .update(expires_at_ms=expires_at_ms)
            ):
                return True
            if self._rows().filter(name=key).update(expires_at_ms=expires_at_ms):
                return False
            try:
                with transaction.atomic(using=self.using):
                    self._rows().create(name=key, holder=node_id, expires_at_ms=expires_at_ms)
            except IntegrityError:
                # Created by a concurrent heartbeat of the same node (a restart overlapping).
                self._rows().filter(name=key).update(expires_at_ms=expires_at_ms)
            return False

        return self._call("heartbeat", key, body)

    def live_nodes(self) -> dict[str, dict[str, Any]]:
        def body() -> dict[str, dict[str, Any]]:
            rows = self._rows().filter(
                name__startswith=NODE_PREFIX, expires_at_ms__gt=wall_ms(self.clock)
            )
            return {
                name[len(NODE_PREFIX) :]: {"expires_at_ms": expires_at_ms}
                for name, expires_at_ms in rows.values_list("name", "expires_at_ms")
            }

        return self._call("live_nodes", NODE_PREFIX + "*", body)
