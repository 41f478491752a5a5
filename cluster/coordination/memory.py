"""An in-process coordination backend for unit tests: the same semantics, an injected clock.

Shared only by the threads of one process; it coordinates nothing across processes. Its bus hands a
message to every subscription of the store open at the time.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cluster.clock import Clock, SystemClock, wall_ms

from .base import (
    DEFAULT_MAX_EXTENSIONS,
    CoordinationBackend,
    Lease,
    LockHandle,
    new_token,
    validate_ttl,
)

logger = logging.getLogger(__name__)


@dataclass
class _Slot:
    holder: str = ""
    token: str = ""
    term: int = 0  # kept after release and expiry, so terms never go backwards
    expires_at_ms: int = 0

    def held(self, now_ms: int) -> bool:
        return bool(self.token) and self.expires_at_ms > now_ms


class MemoryStore:
    """The shared state: several MemoryBackend instances (several "nodes") may share one store."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.leases: dict[str, _Slot] = {}
        self.locks: dict[str, _Slot] = {}
        self.nodes: dict[str, tuple[int, dict[str, Any]]] = {}
        self.subscriptions: dict[str, list[queue.SimpleQueue[str]]] = {}


class MemoryBackend(CoordinationBackend):
    def __init__(
        self,
        *,
        store: MemoryStore | None = None,
        clock: Clock | None = None,
        max_extensions: int = DEFAULT_MAX_EXTENSIONS,
    ) -> None:
        self.store = store or MemoryStore()
        self.clock = clock or SystemClock()
        self.max_extensions = max_extensions
        self._mutex = self.store.mutex
        self._leases = self.store.leases
        self._locks = self.store.locks
        self._nodes = self.store.nodes

    # --- leases -----------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        with self._mutex:
            now = wall_ms(self.clock)
            slot = self._leases.setdefault(name, _Slot())
            if slot.held(now):
                return None
            slot.holder, slot.token = holder, new_token()
            slot.term += 1
            slot.expires_at_ms = now + ttl_ms
            return Lease(name, holder, slot.term, slot.token, slot.expires_at_ms)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        with self._mutex:
            now = wall_ms(self.clock)
            slot = self._owned_lease(lease, now)
            if slot is None:
                return None
            slot.expires_at_ms = now + ttl_ms
            return Lease(lease.name, slot.holder, slot.term, slot.token, slot.expires_at_ms)

    def release_lease(self, lease: Lease) -> bool:
        with self._mutex:
            slot = self._owned_lease(lease, wall_ms(self.clock))
            if slot is None:
                return False
            slot.holder, slot.token, slot.expires_at_ms = "", "", 0
            return True

    def raise_term_floor(self, name: str, floor: int) -> None:
        with self._mutex:
            slot = self._leases.setdefault(name, _Slot())
            slot.term = max(slot.term, floor)

    def current_lease(self, name: str) -> Lease | None:
        with self._mutex:
            slot = self._leases.get(name)
            if slot is None or not slot.held(wall_ms(self.clock)):
                return None
            return Lease(name, slot.holder, slot.term, slot.token, slot.expires_at_ms)

    def _owned_lease(self, lease: Lease, now_ms: int) -> _Slot | None:
        slot = self._leases.get(lease.name)
        if (
            slot is None
            or not slot.held(now_ms)
            or (slot.holder, slot.token) != (lease.holder, lease.token)
        ):
            return None
        return slot

    # --- locks ------------------------------------------------------------------------------------
    def acquire_lock(self, name: str, ttl_ms: int) -> LockHandle | None:
        validate_ttl(ttl_ms)
        with self._mutex:
            started = self.clock.monotonic()
            now = wall_ms(self.clock)
            slot = self._locks.setdefault(name, _Slot())
            if slot.held(now):
                return None
            slot.token, slot.expires_at_ms = new_token(), now + ttl_ms
            return LockHandle(name, slot.token, ttl_ms, started)

    def extend_lock(self, handle: LockHandle, ttl_ms: int) -> LockHandle | None:
        validate_ttl(ttl_ms)
        if handle.extensions >= self.max_extensions:
            logger.warning("lock %s reached its extension cap (%d)", handle.name, handle.extensions)
            return None
        with self._mutex:
            started = self.clock.monotonic()
            now = wall_ms(self.clock)
            slot = self._locks.get(handle.name)
            if slot is None or not slot.held(now) or slot.token != handle.token:
                return None
            slot.expires_at_ms = now + ttl_ms
            return LockHandle(handle.name, handle.token, ttl_ms, started, handle.extensions + 1)

    def release_lock(self, handle: LockHandle) -> bool:
        with self._mutex:
            slot = self._locks.get(handle.name)
            if slot is None or not slot.held(wall_ms(self.clock)) or slot.token != handle.token:
                return False
            slot.token, slot.expires_at_ms = "", 0
            return True

    # --- presence ---------------------------------------------------------------------------------
    def heartbeat(self, node_id: str, ttl_ms: int, payload: dict[str, Any]) -> bool:
        validate_ttl(ttl_ms)
        with self._mutex:
            now = wall_ms(self.clock)
            previous = self._nodes.get(node_id)
            self._nodes[node_id] = (now + ttl_ms, copy.deepcopy(payload))
            return previous is not None and previous[0] > now

    def live_nodes(self) -> dict[str, dict[str, Any]]:
        with self._mutex:
            now = wall_ms(self.clock)
            return {
                node_id: {**copy.deepcopy(payload), "expires_at_ms": expires_at_ms}
                for node_id, (expires_at_ms, payload) in self._nodes.items()
                if expires_at_ms > now
            }

    # --- the bus -------------------------------------------------------------------------------------
    pushes = True
    # How often a subscription looks at its stop event while nothing is published (seconds).
    SUBSCRIBE_POLL_S = 0.05

    def publish(self, channel: str, message: str) -> None:
        with self._mutex:
            listeners = list(self.store.subscriptions.get(channel, ()))
        for listener in listeners:
            listener.put(message)

    def subscribe(
        self,
        channel: str,
        stop: threading.Event,
        on_subscribed: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        with self._mutex:
            self.store.subscriptions.setdefault(channel, []).append(inbox)
        try:
            if on_subscribed is not None:
                on_subscribed()
            while not stop.is_set():
                try:
                    yield inbox.get(timeout=self.SUBSCRIBE_POLL_S)
                except queue.Empty:
                    continue
        finally:
            with self._mutex:
                self.store.subscriptions[channel].remove(inbox)
