"""The Redis coordination backend (production).

Keys, all under the installation's prefix (``SCHEDULER_REDIS_PREFIX``):

- ``{prefix}:lease:{name}`` — the leader lease, JSON ``{"holder", "token", "term"}`` with a PX TTL;
- ``{prefix}:term:{name}`` — the term counter (``INCR``), never deleted, so terms only grow;
- ``{prefix}:lock:{name}`` — Redlock keys on each of the Redlock masters;
- ``{prefix}:node:{id}`` — presence of a node, its heartbeat payload as JSON with a PX TTL.

Every call makes one attempt with small socket timeouts (redis-py's own retries turned off), so a
dead Redis fails a call within about a second with :class:`CoordinationError` instead of hanging the
elector. Terms live in Redis: run it with persistence (AOF) or a term could restart from 1 after a
Redis restart that lost its data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from cluster.clock import Clock, SystemClock, wall_ms

from .base import (
    DEFAULT_MAX_EXTENSIONS,
    CoordinationBackend,
    CoordinationError,
    Lease,
    LockHandle,
    LockNotAcquired,
    LockNotOwned,
    new_token,
    validate_ttl,
)
from .redlock import DEFAULT_DRIFT_FACTOR, DEFAULT_RETRY_DELAY_MS, Redlock

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "djsched"
# Small on purpose: a call to a dead or frozen Redis must fail well inside the renew deadline.
DEFAULT_SOCKET_TIMEOUT_S = 0.5
DEFAULT_CONNECT_TIMEOUT_S = 0.5
LIVE_NODES_SCAN_COUNT = 500

# Take the leader lease if it is free, minting the next term for it. One script rather than
# INCR followed by SET NX: the term is only incremented when the lease is really taken (no gaps from
# the followers' failed attempts), and nothing can run between the two.
# KEYS[1]: the lease key ({prefix}:lease:{name})
# KEYS[2]: the term counter ({prefix}:term:{name})
# ARGV[1]: the holder; ARGV[2]: the new owner token; ARGV[3]: the TTL in milliseconds
# Returns the new term, or nil if the lease is held.
ACQUIRE_LEASE_SCRIPT = """
if redis.call('exists', KEYS[1]) == 1 then
    return false
end
local term = redis.call('incr', KEYS[2])
local value = cjson.encode({holder = ARGV[1], token = ARGV[2], term = term})
redis.call('set', KEYS[1], value, 'NX', 'PX', ARGV[3])
return term
"""

# Reset the lease's TTL, but only while (holder, token) are still ours.
# KEYS[1]: the lease key
# ARGV[1]: the holder; ARGV[2]: the owner token; ARGV[3]: the new TTL in milliseconds
# Returns the lease's term if it was ours and was renewed, nil if it expired or is someone else's.
RENEW_LEASE_SCRIPT = """
local raw = redis.call('get', KEYS[1])
if not raw then
    return false
end
local lease = cjson.decode(raw)
if lease.holder ~= ARGV[1] or lease.token ~= ARGV[2] then
    return false
end
redis.call('pexpire', KEYS[1], ARGV[3])
return lease.term
"""

# Raise the term counter to at least a floor (never lower it).
# KEYS[1]: the term counter ({prefix}:term:{name})
# ARGV[1]: the floor
# Returns the counter's value afterwards.
RAISE_TERM_FLOOR_SCRIPT = """
local current = tonumber(redis.call('get', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if current < floor then
    redis.call('set', KEYS[1], floor)
    return floor
end
return current
"""

# Delete the lease, but only while (holder, token) are still ours. The term counter is kept.
# KEYS[1]: the lease key
# ARGV[1]: the holder; ARGV[2]: the owner token
# Returns 1 if the lease was ours and was deleted, 0 otherwise.
RELEASE_LEASE_SCRIPT = """
local raw = redis.call('get', KEYS[1])
if not raw then
    return 0
end
local lease = cjson.decode(raw)
if lease.holder ~= ARGV[1] or lease.token ~= ARGV[2] then
    return 0
end
return redis.call('del', KEYS[1])
"""


# How long one wait for a published message lasts before the stop flag is looked at again (below the
# socket timeout, so an idle subscription is not mistaken for a dead server).
SUBSCRIBE_POLL_S = 0.25


def redis_client(
    url: str,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> redis.Redis:
    """A client that makes one attempt per command (redis-py retries 10 times by default)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _glob_escape(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


class RedisBackend(CoordinationBackend):
    def __init__(
        self,
        url: str,
        *,
        redlock_urls: Sequence[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        clock: Clock | None = None,
        max_extensions: int = DEFAULT_MAX_EXTENSIONS,
        redlock_retry_count: int = 0,
        redlock_retry_delay_ms: tuple[int, int] = DEFAULT_RETRY_DELAY_MS,
        drift_factor: float = DEFAULT_DRIFT_FACTOR,
    ) -> None:
        if not url:
            raise ValueError("the Redis coordination backend needs a Redis URL")
        self.prefix = prefix
        self.clock = clock or SystemClock()

        def connect(target: str) -> redis.Redis:
            return redis_client(
                target, socket_timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s
            )

        self.client = connect(url)
        # The lease Redis may also be one of the Redlock masters: share its connection pool then.
        self._redlock_clients = [
            self.client if target == url else connect(target) for target in (redlock_urls or [url])
        ]
        self.redlock = Redlock(
            self._redlock_clients,
            retry_count=redlock_retry_count,
            retry_delay_ms=redlock_retry_delay_ms,
            drift_factor=drift_factor,
            max_extensions=max_extensions,
            key_prefix=f"{prefix}:lock:",
            clock=self.clock,
        )
        self._acquire_lease = self.client.register_script(ACQUIRE_LEASE_SCRIPT)
        self._renew_lease = self.client.register_script(RENEW_LEASE_SCRIPT)
        self._release_lease = self.client.register_script(RELEASE_LEASE_SCRIPT)
        self._raise_term_floor = self.client.register_script(RAISE_TERM_FLOOR_SCRIPT)

    def _lease_key(self, name: str) -> str:
        return f"{self.prefix}:lease:{name}"

    def _term_key(self, name: str) -> str:
        return f"{self.prefix}:term:{name}"

    def _node_key(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"

    def channel_key(self, channel: str) -> str:
        """The pub/sub channel ``channel`` of this cluster (its prefix keeps clusters apart)."""
        return f"{self.prefix}:chan:{channel}"

    @contextlib.contextmanager
    def _errors(self, operation: str, key: str) -> Iterator[None]:
        try:
            yield
        except RedisError as exc:
            logger.warning("redis %s of %s failed: %s", operation, key, exc)
            raise CoordinationError(f"redis {operation} of {key} failed: {exc}", key=key) from exc

    # --- leases -----------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        key, token = self._lease_key(name), new_token()
        # Taken before the call: the expiry we report is never later than the one Redis enforces.
        now = wall_ms(self.clock)
        with self._errors("acquire_lease", key):
            term = self._acquire_lease(
                keys=[key, self._term_key(name)], args=[holder, token, ttl_ms]
            )
        if term is None:
            return None
        return Lease(name, holder, int(term), token, now + ttl_ms)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        validate_ttl(ttl_ms)
        key = self._lease_key(lease.name)
        now = wall_ms(self.clock)
        with self._errors("renew_lease", key):
            term = self._renew_lease(keys=[key], args=[lease.holder, lease.token, ttl_ms])
        if term is None:
            return None
        return Lease(lease.name, lease.holder, int(term), lease.token, now + ttl_ms)

    def release_lease(self, lease: Lease) -> bool:
        key = self._lease_key(lease.name)
        with self._errors("release_lease", key):
            return bool(self._release_lease(keys=[key], args=[lease.holder, lease.token]))

    def raise_term_floor(self, name: str, floor: int) -> None:
        key = self._term_key(name)
        with self._errors("raise_term_floor", key):
            self._raise_term_floor(keys=[key], args=[int(floor)])

    def current_lease(self, name: str) -> Lease | None:
        key = self._lease_key(name)
        now = wall_ms(self.clock)
        with self._errors("current_lease", key):
            pipe = self.client.pipeline(transaction=True)
            pipe.get(key)
            pipe.pttl(key)
            raw, pttl = pipe.execute()
        if raw is None or pttl is None or pttl < 0:
            return None
        value = json.loads(raw)
        return Lease(name, value["holder"], int(value["term"]), value["token"], now + pttl)

    # --- locks (Redlock) --------------------------------------------------------------------------
    def acquire_lock(self, name: str, ttl_ms: int) -> LockHandle | None:
        # QuorumLost (a CoordinationError) propagates: "cannot tell" is not "someone else has it".
        try:
            return self.redlock.acquire(name, ttl_ms)
        except LockNotAcquired:
            return None

    def extend_lock(self, handle: LockHandle, ttl_ms: int) -> LockHandle | None:
        try:
            return self.redlock.extend(handle, ttl_ms)
        except LockNotOwned as exc:
            logger.info("%s", exc)
            return None

    def release_lock(self, handle: LockHandle) -> bool:
        return self.redlock.release(handle)

    def release_locks(self, handles: Sequence[LockHandle]) -> list[bool | CoordinationError]:
        return list(self.redlock.release_many(handles))

    def acquire_locks(
        self, names: Sequence[str], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        return self.redlock.acquire_many(names, ttl_ms)

    def extend_locks(
        self, handles: Sequence[LockHandle], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        return self.redlock.extend_many(handles, ttl_ms)

    # --- presence ---------------------------------------------------------------------------------
    def heartbeat(self, node_id: str, ttl_ms: int, payload: dict[str, Any]) -> bool:
        validate_ttl(ttl_ms)
        key = self._node_key(node_id)
        with self._errors("heartbeat", key):
            # SET ... GET (Redis >= 6.2): the old value tells whether the presence had lapsed.
            previous = self.client.set(key, json.dumps(payload), px=ttl_ms, get=True)
        return previous is not None

    def live_nodes(self) -> dict[str, dict[str, Any]]:
        start = self._node_key("")
        now = wall_ms(self.clock)
        with self._errors("live_nodes", start + "*"):
            keys = list(
                self.client.scan_iter(match=_glob_escape(start) + "*", count=LIVE_NODES_SCAN_COUNT)
            )
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute() if keys else []
        nodes: dict[str, dict[str, Any]] = {}
        for index, key in enumerate(keys):
            raw, pttl = replies[2 * index], replies[2 * index + 1]
            # A key that expired between SCAN and the reads is gone: that node just died.
            if raw is None or pttl is None or pttl < 0:
                continue
            nodes[key[len(start) :]] = {**json.loads(raw), "expires_at_ms": now + pttl}
        return nodes

    # --- the bus: Redis pub/sub on the coordination server ---------------------------------------
    pushes = True

    def publish(self, channel: str, message: str) -> None:
        key = self.channel_key(channel)
        with self._errors("publish", key):
            self.client.publish(key, message)

    def subscribe(
        self,
        channel: str,
        stop: threading.Event,
        on_subscribed: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        key = self.channel_key(channel)
        pubsub = self.client.pubsub()
        try:
            with self._errors("subscribe", key):
                pubsub.subscribe(key)
            while not stop.is_set():
                with self._errors("subscribe", key):
                    message = pubsub.get_message(timeout=SUBSCRIBE_POLL_S)
                if message is None:
                    continue
                if message.get("type") == "subscribe":
                    if on_subscribed is not None:
                        on_subscribed()
                elif message.get("type") == "message":
                    yield str(message.get("data", ""))
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()

    def close(self) -> None:
        self.redlock.close()
        for client in {id(c): c for c in [self.client, *self._redlock_clients]}.values():
            client.close()
