"""The lock keeper gives up the locks its node no longer wants kept (an in-memory backend)."""

from __future__ import annotations

from cluster.coordination.memory import MemoryBackend
from cluster.coordination.watchdog import LOST_GIVEN_UP, LockKeeper, LockWatchdog

TTL_MS = 2000


def test_locks_not_named_by_kept_are_given_up_and_released_at_the_next_pass():
    backend = MemoryBackend()
    keeper = LockKeeper(backend)
    body, waiting = (
        keeper.keep(LockWatchdog(backend, backend.acquire_lock(name, TTL_MS), TTL_MS))
        for name in ("job:body", "job:waiting")
    )
    keeper.step()
    assert keeper.held == 2 and not waiting.lost.is_set()  # None: every lock is kept

    keeper.kept = lambda: {id(body)}
    keeper.step()

    assert (waiting.lost.is_set(), waiting.lost_reason) == (True, LOST_GIVEN_UP)
    assert backend.acquire_lock("job:waiting", TTL_MS) is not None  # released: free for others
    assert not body.lost.is_set()
    assert backend.acquire_lock("job:body", TTL_MS) is None  # still held
    assert keeper.held == 1


def test_a_watchdog_makes_a_thread_only_when_it_extends_its_own_lock():
    """A kept lock has no thread of its own; a watchdog stopped before it starts extends
    nothing and its thread ends at once."""
    backend = MemoryBackend()
    kept = LockKeeper(backend).keep(
        LockWatchdog(backend, backend.acquire_lock("job:kept", TTL_MS), TTL_MS)
    )
    assert kept._thread is None
    kept.stop()
    assert kept.stopped

    handle = backend.acquire_lock("job:own", 300)
    own = LockWatchdog(backend, handle, 300)
    own.stop()
    own.start()
    own._thread.join(timeout=2)
    assert not own._thread.is_alive() and own.stopped
    assert own.handle.extensions == handle.extensions  # never extended
