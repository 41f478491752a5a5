"""Redlock: a mutual-exclusion lock over N independent Redis masters.

N = 1 is allowed; 3 or 5 are advised.

The algorithm (https://redis.io/docs/latest/develop/use/patterns/distributed-locks/):

1. note the monotonic time, then try one tiny operation on every master in turn
   (``SET key token NX PX ttl``); a master that does not answer counts as a "no": it is logged,
   never raised;
2. the lock is ours if a quorum (N // 2 + 1) said yes AND some validity is left:
   ``validity = ttl - elapsed - (drift_factor * ttl + 2 ms)``; the drift allowance covers the
   masters' clocks running at slightly different rates and Redis' 1 ms expiry resolution;
3. otherwise delete our token from every master (including those that said no: a reply may have been
   lost after the SET happened), wait a random delay and retry, ``retry_count`` times.

Extending resets the TTL on every master that still holds our token and needs a quorum again; it is
capped at ``max_extensions`` so a stuck holder cannot keep a lock forever. Every mutating script
checks the owner token first.

Many locks at once (``acquire_many``, ``extend_many``: a node admitting a batch of runs, a node's
lock keeper extending everything it holds) cost one pipelined round trip per master, the masters
asked in parallel, so a slow or unreachable master delays the batch by one timeout, not one per lock.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisError

from cluster.clock import Clock, SystemClock

from .base import (
    DEFAULT_MAX_EXTENSIONS,
    CoordinationError,
    LockHandle,
    LockNotAcquired,
    LockNotOwned,
    QuorumLost,
    new_token,
    validate_ttl,
)

logger = logging.getLogger(__name__)

# Reset the TTL of one master's lock key, but only while it still holds our token.
# KEYS[1]: the lock key
# ARGV[1]: the owner token
# ARGV[2]: the new TTL in milliseconds
# Returns 1 if the key held ARGV[1] and its TTL was reset, 0 otherwise (missing or someone else's).
EXTEND_LOCK_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

# Delete one master's lock key, but only while it still holds our token.
# KEYS[1]: the lock key
# ARGV[1]: the owner token
# Returns 1 if the key held ARGV[1] and was deleted, 0 otherwise.
RELEASE_LOCK_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""

DEFAULT_DRIFT_FACTOR = 0.01
# Fixed part of the drift allowance: Redis expires keys with 1 ms resolution, on each side.
DRIFT_CONSTANT_MS = 2
# Threads asking the masters in parallel, per master (concurrent batches from one process).
POOL_WORKERS_PER_MASTER = 4
# Random pause between two acquisition attempts, so racing clients do not retry in lock-step.
DEFAULT_RETRY_DELAY_MS = (50, 200)


@dataclass
class _Votes:
    granted: int = 0
    unreachable: int = 0


class Redlock:
    def __init__(
        self,
        clients: Sequence[redis.Redis],
        *,
        retry_count: int = 0,
        retry_delay_ms: tuple[int, int] = DEFAULT_RETRY_DELAY_MS,
        drift_factor: float = DEFAULT_DRIFT_FACTOR,
        max_extensions: int = DEFAULT_MAX_EXTENSIONS,
        key_prefix: str = "",
        clock: Clock | None = None,
    ) -> None:
        if not clients:
            raise ValueError("Redlock needs at least one Redis master")
        if retry_count < 0:
            raise ValueError(f"retry_count must be >= 0, got {retry_count}")
        low, high = retry_delay_ms
        if not 0 <= low <= high:
            raise ValueError(
                f"retry_delay_ms must be (min, max) with 0 <= min <= max, got {low, high}"
            )
        if not 0 <= drift_factor < 1:
            raise ValueError(f"drift_factor must be in [0, 1), got {drift_factor}")
        if max_extensions < 0:
            raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
        self.clients = list(clients)
        self.quorum = len(self.clients) // 2 + 1
        self.retry_count = retry_count
        self.retry_delay_ms = (low, high)
        self.drift_factor = drift_factor
        self.max_extensions = max_extensions
        self.key_prefix = key_prefix
        self.clock = clock or SystemClock()
        self._extend_scripts = [c.register_script(EXTEND_LOCK_SCRIPT) for c in self.clients]
        self._release_scripts = [c.register_script(RELEASE_LOCK_SCRIPT) for c in self.clients]
        self._pool_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def key(self, name: str) -> str:
        return f"{self.key_prefix}{name}"

    def acquire(self, name: str, ttl_ms: int) -> LockHandle:
        """Take the lock on a quorum of masters.

        Raises LockNotAcquired when it is held elsewhere, QuorumLost when too few masters answered.
        """
        validate_ttl(ttl_ms)
        key, token = self.key(name), new_token()
        for attempt in range(self.retry_count + 1):
            if attempt:
                self.clock.sleep(random.uniform(*self.retry_delay_ms) / 1000)
            started = self.clock.monotonic()
            votes = self._vote(
                key, lambda index, client: client.set(key, token, nx=True, px=ttl_ms)
            )
            validity_ms = self._validity_ms(ttl_ms, started)
            if votes.granted >= self.quorum and validity_ms > 0:
                return LockHandle(name, token, validity_ms, started)
            # Partly acquired (or too slowly): undo it everywhere before anyone waits on us.
            self._release_everywhere(key, token)
        self._raise_if_quorum_unreachable(key, votes)
        raise LockNotAcquired(f"lock {key} is held elsewhere", key=key)

    def extend(self, handle: LockHandle, ttl_ms: int) -> LockHandle:
        """Reset the TTL on a quorum of masters. Raises LockNotOwned (lost, or cap reached) or
        QuorumLost. A failed extension leaves the keys alone: the caller still owns its old validity
        and should stop its work and release."""
        validate_ttl(ttl_ms)
        key = self.key(handle.name)
        if handle.extensions >= self.max_extensions:
            raise LockNotOwned(
                f"lock {key} reached its extension cap ({self.max_extensions})", key=key
            )
        started = self.clock.monotonic()
        votes = self._vote(
            key,
            lambda index, client: self._extend_scripts[index](
                keys=[key], args=[handle.token, ttl_ms], client=client
            ),
        )
        validity_ms = self._validity_ms(ttl_ms, started)
        if votes.granted >= self.quorum and validity_ms > 0:
            return LockHandle(
                handle.name, handle.token, validity_ms, started, handle.extensions + 1
            )
        self._raise_if_quorum_unreachable(key, votes)
        raise LockNotOwned(f"lock {key} is no longer held by this token", key=key)

    def release(self, handle: LockHandle) -> bool:
        """Delete our token from every master. True if it was still ours on a quorum."""
        key = self.key(handle.name)
        return self._release_everywhere(key, handle.token).granted >= self.quorum

    # --- many locks at once: one pipelined round trip per master, masters in parallel ------------
    def acquire_many(
        self, names: Sequence[str], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        """Take each lock on a quorum of masters, all in one round trip per master (the masters
        asked in parallel). Per name: the handle, None (held elsewhere, or already taken earlier
        in this call), or QuorumLost. Names not acquired are undone everywhere at once."""
        validate_ttl(ttl_ms)
        if not names:
            return []
        keys = [self.key(name) for name in names]
        tokens = [new_token() for _ in names]
        started = self.clock.monotonic()
        answers = self._pipeline_everywhere(
            keys,
            lambda index, pipe: [
                pipe.set(key, token, nx=True, px=ttl_ms)
                for key, token in zip(keys, tokens, strict=True)
            ],
        )
        validity_ms = self._validity_ms(ttl_ms, started)
        results: list[LockHandle | CoordinationError | None] = []
        undo: list[int] = []
        for j, name in enumerate(names):
            votes = _count(answers, j)
            if votes.granted >= self.quorum and validity_ms > 0:
                results.append(LockHandle(name, tokens[j], validity_ms, started))
                continue
            undo.append(j)
            results.append(self._quorum_error(keys[j], votes))
        if undo:
            self._pipeline_everywhere(
                [keys[j] for j in undo],
                lambda index, pipe: [
                    self._release_scripts[index](keys=[keys[j]], args=[tokens[j]], client=pipe)
                    for j in undo
                ],
            )
        return results

    def extend_many(
        self, handles: Sequence[LockHandle], ttl_ms: int
    ) -> list[LockHandle | CoordinationError | None]:
        """Extend each lock on a quorum, in one round trip per master (in parallel). Per handle:
        the new handle, None (no longer ours, or at its extension cap), or QuorumLost."""
        validate_ttl(ttl_ms)
        results: list[LockHandle | CoordinationError | None] = [None] * len(handles)
        live = [j for j, h in enumerate(handles) if h.extensions < self.max_extensions]
        if not live:
            return results
        keys = [self.key(handles[j].name) for j in live]
        started = self.clock.monotonic()
        answers = self._pipeline_everywhere(
            keys,
            lambda index, pipe: [
                self._extend_scripts[index](
                    keys=[key], args=[handles[j].token, ttl_ms], client=pipe
                )
                for key, j in zip(keys, live, strict=True)
            ],
        )
        validity_ms = self._validity_ms(ttl_ms, started)
        for position, j in enumerate(live):
            votes = _count(answers, position)
            handle = handles[j]
            if votes.granted >= self.quorum and validity_ms > 0:
                results[j] = LockHandle(
                    handle.name, handle.token, validity_ms, started, handle.extensions + 1
                )
            else:
                results[j] = self._quorum_error(keys[position], votes)
        return results

    def release_many(self, handles: Sequence[LockHandle]) -> list[bool]:
        """Release each lock everywhere, in one round trip per master (in parallel). Per handle:
        True if it was still ours on a quorum (an unreachable master's copy expires)."""
        if not handles:
            return []
        keys = [self.key(handle.name) for handle in handles]
        answers = self._pipeline_everywhere(
            keys,
            lambda index, pipe: [
                self._release_scripts[index](keys=[key], args=[handle.token], client=pipe)
                for key, handle in zip(keys, handles, strict=True)
            ],
        )
        return [_count(answers, j).granted >= self.quorum for j in range(len(handles))]

    def _quorum_error(self, key: str, votes: _Votes) -> QuorumLost | None:
        if len(self.clients) - votes.unreachable < self.quorum:
            return QuorumLost(
                f"only {len(self.clients) - votes.unreachable} of {len(self.clients)} Redlock "
                f"masters answered for {key}; a quorum needs {self.quorum}",
                key=key,
            )
        return None

    def _pipeline_everywhere(
        self, keys: Sequence[str], queue: Callable[[int, Any], object]
    ) -> list[list[object] | None]:
        """Per master: the answers of one pipeline of commands (``queue`` adds them), or None if
        the master could not be reached. Masters are asked in parallel."""

        def ask(index: int) -> list[object] | None:
            client = self.clients[index]
            try:
                pipe = client.pipeline(transaction=False)
                queue(index, pipe)
                return pipe.execute(raise_on_error=False)
            except RedisError as exc:
                logger.warning(
                    "redlock master %s failed on %d keys (%s...): %s",
                    _describe(client),
                    len(keys),
                    keys[0] if keys else "",
                    exc,
                )
                return None

        if len(self.clients) == 1:
            return [ask(0)]
        return list(self._pool().map(ask, range(len(self.clients))))

    def _pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._executor is None:
                # Several callers at once (a node's admission threads and its lock keeper): a
                # master that hangs must not take every worker and queue the others behind it.
                self._executor = ThreadPoolExecutor(
                    max_workers=len(self.clients) * POOL_WORKERS_PER_MASTER,
                    thread_name_prefix="redlock",
                )
            return self._executor

    def close(self) -> None:
        """Stop the threads that ask the masters in parallel."""
        with self._pool_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None

    # --- the pieces -------------------------------------------------------------------------------
    def _vote(self, key: str, operation: Callable[[int, redis.Redis], object]) -> _Votes:
        """Run one tiny operation on every master and only count the answers."""
        votes = _Votes()
        for index, client in enumerate(self.clients):
            try:
                if operation(index, client):
                    votes.granted += 1
            except RedisError as exc:
                votes.unreachable += 1
                logger.warning("redlock master %s failed on %s: %s", _describe(client), key, exc)
        return votes

    def _release_everywhere(self, key: str, token: str) -> _Votes:
        return self._vote(
            key,
            lambda index, client: self._release_scripts[index](
                keys=[key], args=[token], client=client
            ),
        )

    def _validity_ms(self, ttl_ms: int, started: float) -> int:
        elapsed_ms = (self.clock.monotonic() - started) * 1000
        drift_ms = self.drift_factor * ttl_ms + DRIFT_CONSTANT_MS
        return int(ttl_ms - elapsed_ms - drift_ms)

    def _raise_if_quorum_unreachable(self, key: str, votes: _Votes) -> None:
        if len(self.clients) - votes.unreachable < self.quorum:
            raise QuorumLost(
                f"only {len(self.clients) - votes.unreachable} of {len(self.clients)} Redlock "
                f"masters answered for {key}; a quorum needs {self.quorum}",
                key=key,
            )


def _count(answers: list[list[object] | None], position: int) -> _Votes:
    """The votes for the command at ``position`` of every master's pipeline."""
    votes = _Votes()
    for answer in answers:
        if answer is None or isinstance(answer[position], Exception):
            votes.unreachable += 1
        elif answer[position]:
            votes.granted += 1
    return votes


def _describe(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
