"""Redlock over three real, private redis-server masters: quorum, partial acquisition, validity,
extension cap, ownership, retries, and the watchdog; masters are stopped and restarted for real."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import redis

from cluster.coordination import CoordinationError, LockKeeper, LockWatchdog, get_backend
from cluster.coordination.base import LockNotAcquired, LockNotOwned, QuorumLost
from cluster.coordination.redis_backend import redis_client
from cluster.coordination.redlock import DRIFT_CONSTANT_MS, Redlock
from cluster.coordination.watchdog import LOST_NOT_OWNED, LOST_UNREACHABLE

TTL_MS = 10_000
MASTERS = 3


@pytest.fixture(scope="module")
def masters(redis_factory: Callable) -> list:
    return [redis_factory() for _ in range(MASTERS)]


@pytest.fixture(autouse=True)
def all_masters_up(masters: list) -> Iterator[None]:
    """Each test starts with every master running, whatever the previous test stopped."""
    for server in masters:
        if not server.running:
            server.start()
    yield
    for server in masters:
        if not server.running:
            server.start()


@pytest.fixture
def clients(masters: list) -> Iterator[list[redis.Redis]]:
    made = [
        redis_client(server.url, socket_timeout_s=0.2, connect_timeout_s=0.2) for server in masters
    ]
    yield made
    for client in made:
        client.close()


@pytest.fixture
def name() -> str:
    """A lock name no other test uses (the masters live for the whole module)."""
    return f"job:{uuid.uuid4().hex[:12]}"


def holders(clients: list[redis.Redis], name: str, token: str) -> int:
    """On how many running masters the key holds ``token``."""
    count = 0
    for client in clients:
        try:
            count += client.get(name) == token
        except redis.RedisError:
            pass
    return count


def test_all_masters_up_acquires_on_a_quorum(clients, name) -> None:
    lock = Redlock(clients)
    assert lock.quorum == 2
    handle = lock.acquire(name, TTL_MS)
    assert holders(clients, name, handle.token) == MASTERS
    for client in clients:
        assert 0 < client.pttl(name) <= TTL_MS
    with pytest.raises(LockNotAcquired) as refused:
        Redlock(clients).acquire(name, TTL_MS)
    assert refused.value.key == name
    assert lock.release(handle) is True
    assert holders(clients, name, handle.token) == 0


def test_validity_is_ttl_minus_elapsed_minus_drift(clients, name) -> None:
    handle = Redlock(clients, drift_factor=0.01).acquire(name, TTL_MS)
    max_validity = TTL_MS - (0.01 * TTL_MS + DRIFT_CONSTANT_MS)
    assert 0 < handle.validity_ms <= max_validity < TTL_MS
    assert handle.validity_ms > max_validity - 1_000  # three local round trips, not seconds


def test_one_master_down_still_acquires_and_is_logged(masters, clients, name, caplog) -> None:
    masters[0].stop()
    with caplog.at_level(logging.WARNING, logger="cluster.coordination.redlock"):
        handle = Redlock(clients).acquire(name, TTL_MS)
    assert holders(clients, name, handle.token) == 2
    assert any("failed" in record.getMessage() for record in caplog.records)


def test_two_masters_down_is_quorum_lost_and_leaves_nothing_behind(masters, clients, name) -> None:
    masters[0].stop()
    masters[1].stop()
    with pytest.raises(QuorumLost) as lost:
        Redlock(clients).acquire(name, TTL_MS)
    assert lost.value.key == name
    assert clients[2].get(name) is None  # the one master that said yes was released


def test_backend_reports_a_lost_quorum_as_a_coordination_error(masters, name) -> None:
    backend = get_backend(
        "redis", url=masters[0].url, redlock_urls=[m.url for m in masters], prefix="t"
    )
    try:
        masters[1].stop()
        masters[2].stop()
        with pytest.raises(CoordinationError):
            backend.acquire_lock(name, TTL_MS)
    finally:
        backend.close()


def test_partial_acquisition_is_released(clients, name) -> None:
    for client in clients[:2]:
        client.set(name, "someone-else", px=TTL_MS)
    with pytest.raises(LockNotAcquired):
        Redlock(clients).acquire(name, TTL_MS)
    # Our SET succeeded on the third master only, and was undone; the foreign keys are untouched.
    assert clients[2].get(name) is None
    assert [client.get(name) for client in clients[:2]] == ["someone-else", "someone-else"]


class SlowClock:
    """A clock whose monotonic time jumps by ``step_s`` on every read: every acquisition is slow."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.t = 0.0

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        self.t += self.step_s
        return self.t

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_acquired_too_slowly_counts_as_not_acquired_and_is_released(clients, name) -> None:
    lock = Redlock(clients, clock=SlowClock(step_s=TTL_MS / 1000))
    with pytest.raises(LockNotAcquired):
        lock.acquire(name, TTL_MS)
    assert [client.get(name) for client in clients] == [None] * MASTERS


def test_extension_resets_the_ttl_and_is_capped(clients, name) -> None:
    lock = Redlock(clients, max_extensions=2)
    handle = lock.acquire(name, 1_000)
    for expected in (1, 2):
        handle = lock.extend(handle, TTL_MS)
        assert handle.extensions == expected
        assert 0 < handle.validity_ms < TTL_MS
        assert all(client.pttl(name) > 1_000 for client in clients)
    with pytest.raises(LockNotOwned) as capped:
        lock.extend(handle, TTL_MS)
    assert "cap" in str(capped.value)
    assert lock.release(handle) is True


def test_extend_and_release_with_a_wrong_token_are_refused(clients, name) -> None:
    lock = Redlock(clients)
    handle = lock.acquire(name, TTL_MS)
    forged = replace(handle, token="f" * 32)
    with pytest.raises(LockNotOwned):
        lock.extend(forged, TTL_MS)
    assert lock.release(forged) is False
    assert holders(clients, name, handle.token) == MASTERS
    assert lock.release(handle) is True


def test_retries_with_a_random_delay_until_the_holder_lets_go(clients, name) -> None:
    Redlock(clients).acquire(name, 200)  # never released: expires after 200 ms
    started = time.monotonic()
    handle = Redlock(clients, retry_count=20, retry_delay_ms=(20, 60)).acquire(name, TTL_MS)
    assert time.monotonic() - started >= 0.15
    # The old key expires on each master at its own instant: a quorum is enough to win.
    assert holders(clients, name, handle.token) >= 2


def test_a_single_master_is_allowed(clients, name) -> None:
    lock = Redlock(clients[:1])
    assert lock.quorum == 1
    handle = lock.acquire(name, TTL_MS)
    with pytest.raises(LockNotAcquired):
        Redlock(clients[:1]).acquire(name, TTL_MS)
    assert lock.release(handle) is True


@pytest.fixture
def backend(masters) -> Iterator:
    made = get_backend(
        "redis",
        url=masters[0].url,
        redlock_urls=[m.url for m in masters],
        prefix=f"t{uuid.uuid4().hex[:8]}",
        socket_timeout_s=0.2,
        connect_timeout_s=0.2,
    )
    yield made
    made.close()


def test_watchdog_keeps_a_lock_alive_past_its_ttl(backend, name) -> None:
    ttl_ms = 300
    handle = backend.acquire_lock(name, ttl_ms)
    with LockWatchdog(backend, handle, ttl_ms) as watchdog:
        time.sleep(3 * ttl_ms / 1000)
        assert backend.acquire_lock(name, TTL_MS) is None
        assert not watchdog.lost.is_set()
    assert watchdog.handle.extensions >= 5
    assert backend.release_lock(watchdog.handle) is True


def test_watchdog_reports_when_masters_go_away(masters, backend, name) -> None:
    ttl_ms = 600
    reports: list[tuple[str, str]] = []
    handle = backend.acquire_lock(name, ttl_ms)
    watchdog = LockWatchdog(
        backend, handle, ttl_ms, on_lost=lambda h, reason: reports.append((h.token, reason))
    ).start()
    try:
        masters[0].stop()
        masters[1].stop()
        stopped_at = time.monotonic()
        assert watchdog.lost.wait(timeout=3)
        # Reported before the lock could have lapsed, so the work can stop in time.
        assert time.monotonic() - stopped_at < ttl_ms / 1000
    finally:
        watchdog.stop()
    assert reports == [(handle.token, LOST_UNREACHABLE)]


def test_watchdog_reports_a_lock_taken_from_it(clients, backend, name) -> None:
    ttl_ms = 300
    handle = backend.acquire_lock(name, ttl_ms)
    lost = threading.Event()
    with LockWatchdog(backend, handle, ttl_ms, on_lost=lambda h, reason: lost.set()) as watchdog:
        key = backend.redlock.key(name)
        for client in clients:
            client.set(key, "someone-else", px=TTL_MS)
        assert lost.wait(timeout=2)
    assert watchdog.lost_reason == LOST_NOT_OWNED


# --- the Redis backend's connections --------------------------------------------------------------
def test_a_dead_redis_fails_fast_and_the_backend_recovers_after_a_restart(masters, name) -> None:
    server = masters[0]
    backend = get_backend("redis", url=server.url, redlock_urls=[server.url], prefix=name)
    try:
        assert backend.acquire_lease("leader", "node-a", TTL_MS) is not None
        server.stop()
        for call in (
            lambda: backend.acquire_lease("leader", "node-a", TTL_MS),
            lambda: backend.current_lease("leader"),
            lambda: backend.heartbeat("node-a", TTL_MS, {}),
            lambda: backend.live_nodes(),
            lambda: backend.acquire_lock("job", TTL_MS),
        ):
            started = time.monotonic()
            with pytest.raises(CoordinationError):
                call()
            assert time.monotonic() - started < 1.0  # one attempt, no redis-py retry loop
        server.start()  # without persistence: the lease is gone, the pooled sockets are stale
        assert backend.acquire_lease("leader", "node-b", TTL_MS) is not None
        assert backend.acquire_lock("job", TTL_MS) is not None
    finally:
        backend.close()


# --- many locks at once, and one keeper per node --------------------------------------------------


def test_acquire_many_takes_free_locks_and_undoes_the_rest_in_one_round_trip(clients) -> None:
    lock = Redlock(clients)
    free, held, twice = (f"job:{uuid.uuid4().hex[:12]}" for _ in range(3))
    for client in clients[:2]:
        client.set(held, "someone-else", px=TTL_MS)
    results = lock.acquire_many([free, held, twice, twice], TTL_MS)
    assert [type(r).__name__ for r in results] == [
        "LockHandle",
        "NoneType",
        "LockHandle",
        "NoneType",
    ]
    assert holders(clients, free, results[0].token) == MASTERS
    assert holders(clients, twice, results[2].token) == MASTERS
    # The partial acquisition of ``held`` (the third master said yes) was undone there.
    assert clients[2].get(held) is None
    assert [client.get(held) for client in clients[:2]] == ["someone-else", "someone-else"]
    extended = lock.extend_many([results[0], results[2]], TTL_MS)
    assert [h.extensions for h in extended] == [1, 1]
    assert lock.release(results[0]) and lock.release(results[2])


def test_many_locks_survive_one_master_down_and_report_a_lost_quorum_with_two(
    masters, clients
) -> None:
    lock = Redlock(clients)
    names = [f"job:{uuid.uuid4().hex[:12]}" for _ in range(5)]
    masters[2].stop()
    handles = lock.acquire_many(names, TTL_MS)
    assert all(h is not None and not isinstance(h, Exception) for h in handles)
    masters[1].stop()
    assert all(isinstance(r, QuorumLost) for r in lock.extend_many(handles, TTL_MS))
    fresh = [f"job:{uuid.uuid4().hex[:12]}" for _ in range(3)]
    assert all(isinstance(r, QuorumLost) for r in lock.acquire_many(fresh, TTL_MS))
    # Nothing of the failed acquisitions is left on the master that answered.
    assert all(clients[0].get(n) is None for n in fresh)


def test_a_lock_taken_from_its_holder_is_not_extended(clients) -> None:
    lock = Redlock(clients)
    mine, stolen = (f"job:{uuid.uuid4().hex[:12]}" for _ in range(2))
    handles = lock.acquire_many([mine, stolen], TTL_MS)
    for client in clients:
        client.set(stolen, "someone-else", px=TTL_MS)
    extended = lock.extend_many(handles, TTL_MS)
    assert extended[0] is not None and extended[0].extensions == 1
    assert extended[1] is None


def test_one_keeper_keeps_many_locks_alive_and_reports_a_stolen_one(clients, backend) -> None:
    ttl_ms = 300
    names = [f"job:{uuid.uuid4().hex[:12]}" for _ in range(20)]
    keeper = LockKeeper(backend, tick_s=0.02)
    watchdogs = [
        keeper.keep(LockWatchdog(backend, handle, ttl_ms))
        for handle in backend.acquire_locks(names, ttl_ms)
    ]
    stop = threading.Event()
    thread = threading.Thread(target=keeper.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(3 * ttl_ms / 1000)
        assert all(backend.acquire_lock(n, TTL_MS) is None for n in names)  # still held
        assert not any(w.lost.is_set() for w in watchdogs)
        assert min(w.handle.extensions for w in watchdogs) >= 5
        for client in clients:
            client.set(backend.redlock.key(names[0]), "someone-else", px=TTL_MS)
        assert watchdogs[0].lost.wait(timeout=2)
        assert watchdogs[0].lost_reason == LOST_NOT_OWNED
        assert keeper.held == len(names) - 1
        for watchdog in watchdogs[1:]:
            handle = watchdog.stop()  # no extension in flight once this returns
            assert backend.release_lock(handle) is True
        assert keeper.held == 0
    finally:
        stop.set()
        thread.join(2)


def test_the_keeper_releases_queued_locks_together_in_one_round_trip_per_master(
    clients, backend, monkeypatch
) -> None:
    """Bodies ending together hand their locks to the keeper's thread, which releases them in
    one call (on Redis: one pipeline per master), not one round trip each in each task thread."""
    keeper = LockKeeper(backend, tick_s=0.5)
    names = [f"job:{uuid.uuid4().hex[:12]}" for _ in range(10)]
    watchdogs = [
        keeper.keep(LockWatchdog(backend, handle, TTL_MS))
        for handle in backend.acquire_locks(names, TTL_MS)
    ]
    calls: list[int] = []
    real = backend.release_locks

    def counted(handles):
        results = real(handles)
        calls.append(len(handles))  # after the release: the test looks at the locks next
        return results

    monkeypatch.setattr(backend, "release_locks", counted)
    # Bodies end while the keeper's thread is busy with a pass: their releases queue up.
    keeper._running.set()
    for watchdog in watchdogs:
        keeper.release(watchdog)
    assert calls == []  # nothing released in the callers' threads
    assert all(backend.acquire_lock(n, TTL_MS) is None for n in names)  # still held
    stop = threading.Event()
    thread = threading.Thread(target=keeper.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 2
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls == [len(names)]  # together, in one call
        assert all(backend.acquire_lock(n, TTL_MS) is not None for n in names)  # all free
    finally:
        stop.set()
        thread.join(2)
