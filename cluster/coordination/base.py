"""The one small coordination interface every backend implements.

Two primitives, both time-bounded:

- a **lease** (the leader lease): held by a named ``holder``; every successful acquisition mints a
  new ``term`` strictly greater than any term minted before for that name, so the term can fence
  stale leaders; renewed and released by compare-and-set on (holder, token);
- a **lock** (mutual exclusion, e.g. the per-job ``forbid`` lock): no holder name, only an owner
  token; extended while the work runs, released by compare-and-delete.

Plus presence keys per node (heartbeats), and a **bus**: publish a short message on a channel,
subscribe to one. The bus carries wake-ups between processes (a job edited in the web process
wakes the leader, a new run the claimers) and the live feed's doorbell; it is an optimisation the
database stays the truth of, so a message may be lost and every subscriber also polls. Redis and the
memory backend push; the database backend's bus carries nothing (``pushes`` is False): its
subscribers poll instead, every node on its short loops, the live feed every
``SCHEDULER_LIVE_POLL_S``.

Every call makes exactly ONE attempt and never sleeps or retries: retries, jitter and timing belong
to the caller (the elector, the executor). "Someone else has it / it is no longer ours" is a normal
answer (``None`` or ``False``); a backend that cannot answer (Redis down, database error, Redlock quorum
unreachable) raises :class:`CoordinationError`.
"""

from __future__ import annotations

import abc
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# Bytes of randomness in an owner token (hex-encoded: 32 characters, fits CoordinationLease.token).
TOKEN_BYTES = 16


# How many times one lock may be extended. A holder that keeps extending past this is treated as
# stuck and loses the lock. With the watchdog extending every ttl/3, a 30 s lock can be held for up to
# 1000 x 10 s (about 2.8 h); work that may run longer should take a longer TTL.
DEFAULT_MAX_EXTENSIONS = 1000


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    term: int
    token: str
    # Wall-clock ms (the acquirer's or reader's estimate; storage enforces the real expiry).
    expires_at_ms: int


@dataclass(frozen=True)
class LockHandle:
    name: str
    token: str
    # How long from ``acquired_at`` the lock is certainly ours. Redlock: TTL - elapsed - drift.
    validity_ms: int
    # clock.monotonic() taken just before the acquisition (or latest extension) started.
    acquired_at: float
    extensions: int = 0

    def valid_until(self) -> float:
        """The monotonic instant after which the lock may belong to someone else."""
        return self.acquired_at + self.validity_ms / 1000


class CoordinationError(Exception):
    """The backend could not answer (unreachable, timed out, database error)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class LockNotAcquired(CoordinationError):
    """The lock is held by someone else."""


class LockNotOwned(CoordinationError):
    """The lock is not (or no longer) ours, or may not be extended any further."""


class QuorumLost(CoordinationError):
    """Too few Redlock masters answered to ever reach a quorum."""


class CoordinationBackend(abc.ABC):
    """Leases, locks and presence keys. Every method makes one attempt and does not block."""

    #: Whether ``live_nodes`` returns the payload given to ``heartbeat`` (the database backend keeps
    #: only presence: a node's details live in its ``SchedulerNode`` row).
    stores_heartbeat_payload: bool = True

    # --- leases -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def acquire_lease(self, name: str, holder: str, ttl_ms: int) -> Lease | None:
        """If the lease is free or expired, mint a new term and take it; otherwise ``None``."""

    @abc.abstractmethod
    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        """Extend the lease to ``ttl_ms`` from now if it is still ours; ``None`` if it is not."""

    @abc.abstractmethod
    def release_lease(self, lease: Lease) -> bool:
        """Give the lease up if it is still ours (the term is kept). True if it was ours."""

    @abc.abstractmethod
    def current_lease(self, name: str) -> Lease | None:
        """The unexpired lease on ``name``, or ``None``."""

    @abc.abstractmethod
    def raise_term_floor(self, name: str, floor: int) -> None:
        """Make the next term minted for ``name`` greater than ``floor``.

        Storage (the fence row) may have seen a newer term than this backend remembers: Redis lost
        its data in a restart without persistence, or the backend was switched. Without this, every
        new leader would be fenced forever."""

    # --- locks ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def acquire_lock(self, name: str, ttl_ms: int) -> LockHandle | None:
        """Take the lock if it is free or expired; otherwise ``None``."""

    @abc.abstractmethod
    def extend_lock(self, handle: LockHandle, ttl_ms: int) -> LockHandle | None:
        """Set the lock's TTL to ``ttl_ms`` from now if still ours and the extension cap allows."""

    @abc.abstractmethod
    def release_lock(self, handle: LockHandle) -> bool:
        """Delete the lock if it is still ours. True if it was."""

    def acquire_locks(
        self, names: Sequence[str], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        """``acquire_lock`` for each name, in order: the handle, ``None`` (held elsewhere; also
        a name given twice, after its first), or the CoordinationError that kept the backend from
        answering for it. A backend may do it in fewer round trips (Redlock: one per master)."""
        return _each(lambda name: self.acquire_lock(name, ttl_ms), names)

    def extend_locks(
        self, handles: Sequence[LockHandle], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        """``extend_lock`` for each handle, in order; results as for ``acquire_locks``."""
        return _each(lambda handle: self.extend_lock(handle, ttl_ms), handles)

    def release_locks(self, handles: Sequence[LockHandle]) -> list[bool | CoordinationError]:
        """``release_lock`` for each handle, in order: whether it was still ours, or the
        CoordinationError that kept the backend from answering (the lock then expires)."""
        results: list[bool | CoordinationError] = []
        for handle in handles:
            try:
                results.append(self.release_lock(handle))
            except CoordinationError as exc:
                results.append(exc)
        return results

    # --- presence ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def heartbeat(self, node_id: str, ttl_ms: int, payload: dict[str, Any]) -> bool:
        """Mark ``node_id`` alive for ``ttl_ms`` from now.

        Returns whether its presence was still alive when renewed. False means it had expired (or
        never existed): the cluster may have declared the node dead and taken its work meanwhile,
        so the node must give up what it held before it starts anything new."""

    @abc.abstractmethod
    def live_nodes(self) -> dict[str, dict[str, Any]]:
        """Node id -> heartbeat payload, for every node whose presence has not expired. Each
        payload also carries ``expires_at_ms`` (wall-clock ms, the reader's estimate) so a reader
        can tell a node that renews on time from one that has stopped and is about to expire."""

    # --- the bus ----------------------------------------------------------------------------------
    #: Whether a subscriber hears what is published. False: publishing is free and does nothing,
    #: and subscribers poll on their own schedule.
    pushes: bool = False

    def publish(self, channel: str, message: str) -> None:  # noqa: B027 - a bus that carries nothing
        """Tell whoever listens on ``channel`` now (nothing is kept for a later subscriber).
        Raises CoordinationError if the bus cannot be reached."""

    def subscribe(
        self,
        channel: str,
        stop: threading.Event,
        on_subscribed: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        """Yield each message published on ``channel`` from the subscription on, until ``stop`` is
        set. ``on_subscribed`` is called once the subscription holds (from then on nothing
        published is missed). Raises CoordinationError when the bus is lost; the subscriber
        subscribes again (and should look at the database, since it may have missed a message).
        A bus that pushes nothing yields nothing: it waits for ``stop``."""
        stop.wait()
        yield from ()

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for backends holding nothing
        """Release connections. The backend must not be used afterwards."""


def _each(call: Callable[[Any], LockHandle | None], items: Sequence[Any]) -> list[Any]:
    """``call`` on each item, a CoordinationError kept as that item's result."""
    results: list[Any] = []
    for item in items:
        try:
            results.append(call(item))
        except CoordinationError as exc:
            results.append(exc)
    return results


def validate_ttl(ttl_ms: int) -> None:
    if not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be a positive integer of milliseconds, got {ttl_ms!r}")
