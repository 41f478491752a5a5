"""One contract, every coordination backend: memory (settable clock), redis (a private server) and
database (the configured engine: SQLite by default, MariaDB with DATABASE_URL=mysql://...).

Time: the memory backend's clock is advanced; the real backends use short real TTLs and sleeps, with
margins of at least 100 ms either side of every expiry so a loaded machine does not flip a result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import redis

from cluster.clock import SettableClock, wall_ms
from cluster.coordination import CoordinationBackend, get_backend
from cluster.coordination.memory import MemoryStore

# TTLs of the contract, in ms. SHORT is waited out; LONG never expires within a test.
SHORT_TTL_MS = 300
LONG_TTL_MS = 10_000
# Waiting this long after a SHORT lease was taken means it has certainly expired.
EXPIRY_WAIT_MS = SHORT_TTL_MS + 150
THREADS = 50
PROCESSES = 8
PROCESS_START_TIMEOUT_S = 60

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    """A backend under test plus how to build a peer (another node) and how to let time pass."""

    kind: str
    backend: CoordinationBackend
    build: Callable[..., CoordinationBackend]  # another node's backend on the same storage
    pass_time: Callable[[int], None]  # milliseconds
    now_ms: Callable[[], int]
    process_overrides: dict | None = None  # get_backend(kind, **overrides) in another process


def _memory_env() -> Iterator[Env]:
    clock = SettableClock()
    store = MemoryStore()

    def build(**overrides):
        return get_backend("memory", store=store, clock=clock, **overrides)

    yield Env(
        "memory",
        build(),
        build,
        lambda ms: clock.advance(ms / 1000),
        lambda: wall_ms(clock),
    )


def _redis_env(url: str) -> Iterator[Env]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    built: list[CoordinationBackend] = []

    def build(**overrides):
        backend = get_backend("redis", url=url, redlock_urls=[url], prefix=prefix, **overrides)
        built.append(backend)
        return backend

    yield Env(
        "redis",
        build(),
        build,
        lambda ms: time.sleep(ms / 1000),
        lambda: int(time.time() * 1000),
        process_overrides={"url": url, "redlock_urls": [url], "prefix": prefix},
    )
    cleanup = redis.Redis.from_url(url)
    keys = list(cleanup.scan_iter(match=f"{prefix}:*"))
    if keys:
        cleanup.delete(*keys)
    cleanup.close()
    for backend in built:
        backend.close()


def _database_env() -> Iterator[Env]:
    yield Env(
        "database",
        get_backend("database"),
        lambda **overrides: get_backend("database", **overrides),
        lambda ms: time.sleep(ms / 1000),
        lambda: int(time.time() * 1000),
        process_overrides={},
    )


ENV_BUILDERS = {"memory": _memory_env, "redis": _redis_env, "database": _database_env}
DATABASE_PARAM = pytest.param("database", marks=pytest.mark.django_db(transaction=True))


def _env(request: pytest.FixtureRequest) -> Iterator[Env]:
    if request.param == "redis":
        yield from _redis_env(request.getfixturevalue("redis_url"))
    else:
        yield from ENV_BUILDERS[request.param]()


@pytest.fixture(params=["memory", "redis", DATABASE_PARAM])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    yield from _env(request)


@pytest.fixture(params=["redis", DATABASE_PARAM])
def shared_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """The backends that coordinate separate processes (not the in-process memory backend)."""
    yield from _env(request)


# --- leases ---------------------------------------------------------------------------------------
def test_acquire_free_lease_mints_term_1(env: Env) -> None:
    before = env.now_ms()
    lease = env.backend.acquire_lease("leader", "node-a", LONG_TTL_MS)
    assert lease is not None
    assert (lease.name, lease.holder, lease.term) == ("leader", "node-a", 1)
    assert lease.token
    assert before + LONG_TTL_MS <= lease.expires_at_ms <= env.now_ms() + LONG_TTL_MS
    current = env.backend.current_lease("leader")
    assert replace(current, expires_at_ms=0) == replace(lease, expires_at_ms=0)
    # Redis reports the remaining TTL, so its expiry estimate may differ by the round trip.
    assert abs(current.expires_at_ms - lease.expires_at_ms) < 100


def test_second_holder_is_refused_while_the_lease_is_valid(env: Env) -> None:
    lease = env.backend.acquire_lease("leader", "node-a", LONG_TTL_MS)
    peer = env.build()
    assert peer.acquire_lease("leader", "node-b", LONG_TTL_MS) is None
    assert env.backend.acquire_lease("leader", "node-a", LONG_TTL_MS) is None  # not re-entrant
    current = peer.current_lease("leader")
    assert (current.holder, current.token, current.term) == ("node-a", lease.token, 1)


def test_after_expiry_another_holder_gets_a_higher_term(env: Env) -> None:
    first = env.backend.acquire_lease("leader", "node-a", SHORT_TTL_MS)
    env.pass_time(EXPIRY_WAIT_MS)
    assert env.backend.current_lease("leader") is None
    second = env.build().acquire_lease("leader", "node-b", LONG_TTL_MS)
    assert second is not None
    assert second.holder == "node-b"
    assert second.term > first.term


def test_renew_by_the_owner_extends_the_lease(env: Env) -> None:
    lease = env.backend.acquire_lease("leader", "node-a", SHORT_TTL_MS)
    env.pass_time(SHORT_TTL_MS // 2)
    renewed = env.backend.renew_lease(lease, 2 * SHORT_TTL_MS)
    assert renewed is not None
    assert (renewed.holder, renewed.token, renewed.term) == (lease.holder, lease.token, lease.term)
    assert renewed.expires_at_ms > lease.expires_at_ms
    env.pass_time(SHORT_TTL_MS)  # past the first expiry, well before the renewed one
    assert env.backend.current_lease("leader").token == lease.token
    assert env.build().acquire_lease("leader", "node-b", LONG_TTL_MS) is None


def test_renew_after_expiry_fails_even_if_nobody_took_the_lease(env: Env) -> None:
    lease = env.backend.acquire_lease("leader", "node-a", SHORT_TTL_MS)
    env.pass_time(EXPIRY_WAIT_MS)
    assert env.backend.renew_lease(lease, LONG_TTL_MS) is None
    assert env.backend.release_lease(lease) is False
    assert env.backend.current_lease("leader") is None


@pytest.mark.parametrize("next_holder", ["node-b", "node-a"])
def test_a_stale_lease_can_neither_renew_nor_release(env: Env, next_holder: str) -> None:
    # node-a's lease expires and is taken again (by node-b, or by node-a itself with a new token):
    # the old lease object must change nothing.
    stale = env.backend.acquire_lease("leader", "node-a", SHORT_TTL_MS)
    env.pass_time(EXPIRY_WAIT_MS)
    fresh = env.build().acquire_lease("leader", next_holder, LONG_TTL_MS)
    assert fresh is not None and fresh.token != stale.token
    assert env.backend.renew_lease(stale, LONG_TTL_MS) is None
    assert env.backend.release_lease(stale) is False
    current = env.backend.current_lease("leader")
    assert (current.holder, current.token, current.term) == (next_holder, fresh.token, fresh.term)
    assert current.expires_at_ms >= fresh.expires_at_ms - 1_000  # not shortened by the stale renew


def test_release_hands_the_lease_over_and_terms_keep_growing(env: Env) -> None:
    peer = env.build()
    terms = []
    for holder in ["node-a", "node-b", "node-a", "node-c"]:
        lease = peer.acquire_lease("leader", holder, LONG_TTL_MS)
        assert lease is not None, holder
        terms.append(lease.term)
        assert peer.release_lease(lease) is True
        assert peer.release_lease(lease) is False  # already released
        assert peer.renew_lease(lease, LONG_TTL_MS) is None
        assert env.backend.current_lease("leader") is None
    assert terms == [1, 2, 3, 4]


def test_leases_are_independent_per_name(env: Env) -> None:
    a = env.backend.acquire_lease("shard-1", "node-a", LONG_TTL_MS)
    b = env.backend.acquire_lease("shard-2", "node-b", LONG_TTL_MS)
    assert (a.term, b.term) == (1, 1)
    assert env.backend.current_lease("shard-3") is None


# --- locks ----------------------------------------------------------------------------------------
def test_lock_is_exclusive(env: Env) -> None:
    handle = env.backend.acquire_lock("job:1", LONG_TTL_MS)
    assert handle is not None
    assert handle.name == "job:1" and handle.token and handle.extensions == 0
    assert 0 < handle.validity_ms <= LONG_TTL_MS
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is None
    assert env.backend.acquire_lock("job:2", LONG_TTL_MS) is not None


def test_lock_release_by_a_non_owner_is_refused(env: Env) -> None:
    handle = env.backend.acquire_lock("job:1", LONG_TTL_MS)
    forged = replace(handle, token="0" * 32)
    assert env.build().release_lock(forged) is False
    assert env.build().extend_lock(forged, LONG_TTL_MS) is None
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is None  # still held
    assert env.backend.release_lock(handle) is True
    assert env.backend.release_lock(handle) is False
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is not None


def test_release_locks_releases_each_lock_still_ours_and_refuses_the_rest(env: Env) -> None:
    mine = env.backend.acquire_locks(["job:1", "job:2"], LONG_TTL_MS)
    forged = replace(env.backend.acquire_lock("job:3", LONG_TTL_MS), token="0" * 32)
    assert env.backend.release_locks([mine[0], forged, mine[1]]) == [True, False, True]
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is not None
    assert env.build().acquire_lock("job:2", LONG_TTL_MS) is not None
    assert env.build().acquire_lock("job:3", LONG_TTL_MS) is None  # the forged token freed nothing
    assert env.backend.release_locks([]) == []


def test_lock_expiry_frees_it(env: Env) -> None:
    old = env.backend.acquire_lock("job:1", SHORT_TTL_MS)
    env.pass_time(EXPIRY_WAIT_MS)
    new = env.build().acquire_lock("job:1", LONG_TTL_MS)
    assert new is not None and new.token != old.token
    assert env.backend.extend_lock(old, LONG_TTL_MS) is None
    assert env.backend.release_lock(old) is False
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is None  # the new owner still holds it


def test_lock_extend_keeps_it_past_its_first_ttl(env: Env) -> None:
    handle = env.backend.acquire_lock("job:1", SHORT_TTL_MS)
    env.pass_time(SHORT_TTL_MS // 2)
    extended = env.backend.extend_lock(handle, 2 * SHORT_TTL_MS)
    assert extended is not None
    assert (extended.token, extended.extensions) == (handle.token, 1)
    assert 0 < extended.validity_ms <= 2 * SHORT_TTL_MS
    env.pass_time(SHORT_TTL_MS)
    assert env.build().acquire_lock("job:1", LONG_TTL_MS) is None
    assert env.backend.release_lock(extended) is True


def test_lock_extensions_are_capped(env: Env) -> None:
    backend = env.build(max_extensions=2)
    handle = backend.acquire_lock("job:1", LONG_TTL_MS)
    for expected in (1, 2):
        handle = backend.extend_lock(handle, LONG_TTL_MS)
        assert handle is not None and handle.extensions == expected
    assert backend.extend_lock(handle, LONG_TTL_MS) is None
    assert backend.release_lock(handle) is True


def test_many_locks_at_once_behave_as_one_by_one(env: Env) -> None:
    """acquire_locks / extend_locks (one round trip per Redlock master on Redis, a loop elsewhere)
    give each name what acquire_lock / extend_lock would have, in order."""
    taken = env.build().acquire_lock("job:2", LONG_TTL_MS)
    results = env.backend.acquire_locks(["job:1", "job:2", "job:3", "job:1"], SHORT_TTL_MS)
    assert [r is not None for r in results] == [True, False, True, False]
    first, _, third, _ = results
    assert {first.name, third.name} == {"job:1", "job:3"}
    env.pass_time(SHORT_TTL_MS // 2)
    forged = replace(taken, token="0" * 32)
    extended = env.backend.extend_locks([first, third, forged], 2 * SHORT_TTL_MS)
    assert [h.extensions if h else None for h in extended] == [1, 1, None]
    env.pass_time(SHORT_TTL_MS)
    assert env.build().acquire_locks(["job:1", "job:3"], LONG_TTL_MS) == [None, None]
    assert env.backend.release_lock(extended[0]) and env.backend.release_lock(extended[1])
    assert env.backend.acquire_locks([], LONG_TTL_MS) == []


# --- presence -------------------------------------------------------------------------------------
def test_heartbeats_and_live_nodes(env: Env) -> None:
    assert env.backend.live_nodes() == {}
    # A first heartbeat creates the presence: it was not alive before.
    assert env.backend.heartbeat("node-a", SHORT_TTL_MS, {"pid": 1, "queues": ["default"]}) is False
    assert env.build().heartbeat("node-b", LONG_TTL_MS, {"pid": 2, "queues": []}) is False
    live = env.backend.live_nodes()
    assert set(live) == {"node-a", "node-b"}
    for node_id, ttl_ms in (("node-a", SHORT_TTL_MS), ("node-b", LONG_TTL_MS)):
        # The reader's estimate of the expiry: within a second of "now + TTL".
        remaining = live[node_id].pop("expires_at_ms") - env.now_ms()
        assert 0 < remaining <= ttl_ms
        assert remaining > ttl_ms - 1000
    if env.backend.stores_heartbeat_payload:
        assert live == {
            "node-a": {"pid": 1, "queues": ["default"]},
            "node-b": {"pid": 2, "queues": []},
        }
    # A renewal in time reports continuity.
    assert env.backend.heartbeat("node-b", LONG_TTL_MS, {"pid": 2, "queues": []}) is True
    env.pass_time(EXPIRY_WAIT_MS)
    assert set(env.backend.live_nodes()) == {"node-b"}
    # node-a's presence lapsed: the heartbeat that brings it back says so.
    assert env.backend.heartbeat("node-a", LONG_TTL_MS, {"pid": 3}) is False
    assert set(env.backend.live_nodes()) == {"node-a", "node-b"}
    assert env.backend.heartbeat("node-a", LONG_TTL_MS, {"pid": 3}) is True


# --- concurrency ----------------------------------------------------------------------------------
def _race(env: Env, attempt: Callable[[CoordinationBackend, int], object]) -> list[object]:
    """THREADS threads, each with its own backend (its own connections), released at once."""
    barrier = threading.Barrier(THREADS)
    results: list[object] = [None] * THREADS
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        backend = env.build()
        try:
            barrier.wait()
            results[index] = attempt(backend, index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if env.kind == "database":
                from django.db import connection

                connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results


def test_threads_racing_for_a_lease_have_exactly_one_winner(env: Env) -> None:
    results = _race(env, lambda b, i: b.acquire_lease("leader", f"node-{i}", LONG_TTL_MS))
    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1
    assert winners[0].term == 1
    assert env.backend.current_lease("leader").token == winners[0].token


def test_threads_racing_for_a_lock_have_exactly_one_winner(env: Env) -> None:
    results = _race(env, lambda b, i: b.acquire_lock("job:1", LONG_TTL_MS))
    assert sum(handle is not None for handle in results) == 1


# A tiny node: sets Django up on the test database, says "ready", waits for "go" on stdin, then
# makes one attempt at the lease and the lock and prints what it got.
RACER_SCRIPT = """
import json, os, sys
from django.conf import settings
settings.DATABASES["default"]["NAME"] = os.environ["RACER_DB_NAME"]
import django
django.setup()
from cluster.coordination import get_backend
backend = get_backend(os.environ["RACER_KIND"], **json.loads(os.environ["RACER_OVERRIDES"]))
print("ready", flush=True)
sys.stdin.readline()
lease = backend.acquire_lease("leader", "pid-%d" % os.getpid(), 10000)
lock = backend.acquire_lock("job:1", 10000)
print(json.dumps({"term": lease and lease.term, "lock": lock is not None}), flush=True)
"""


def test_processes_racing_have_exactly_one_winner(shared_env: Env) -> None:
    env = shared_env
    from django.db import connection

    child_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "RACER_DB_NAME": str(connection.settings_dict["NAME"]),
        "RACER_KIND": env.kind,
        "RACER_OVERRIDES": json.dumps(env.process_overrides),
    }
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER_SCRIPT],
            cwd=REPO_ROOT,
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready"
        for racer in racers:  # all are waiting on stdin: release them as close together as we can
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outcomes = [
            json.loads(racer.communicate(timeout=PROCESS_START_TIMEOUT_S)[0]) for racer in racers
        ]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    assert all(racer.returncode == 0 for racer in racers)
    assert [o["term"] for o in outcomes if o["term"] is not None] == [1]
    assert sum(o["lock"] for o in outcomes) == 1


def test_the_bus_delivers_to_subscribers_once_subscribed_or_says_it_carries_nothing(
    env: Env,
) -> None:
    """A node's publish reaches another node's subscription on a backend that pushes; on one that
    does not (the database), publishing is free and a subscription only waits for its stop."""
    peer = env.build()
    stop = threading.Event()
    subscribed = threading.Event()
    heard: list[str] = []

    def listen() -> None:
        for message in peer.subscribe("contract", stop, subscribed.set):
            heard.append(message)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        if not env.backend.pushes:
            env.backend.publish("contract", "ignored")
            assert not subscribed.wait(0.3) and heard == []
            return
        assert subscribed.wait(5), "the subscription never held"
        env.backend.publish("contract", "hello")
        env.backend.publish("other-channel", "not for us")
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert heard == ["hello"]
    finally:
        stop.set()
        listener.join(5)
        assert not listener.is_alive(), "the subscription did not end on stop"
