"""A node's proof of membership (cluster/membership.py) on the memory backend and a settable clock:
no sleeps."""

from __future__ import annotations

import pytest

from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend, MemoryStore
from cluster.membership import Liveness, Membership, node_liveness

TTL_S = 2.0
MARGIN_S = 0.25


@pytest.fixture
def clock() -> SettableClock:
    return SettableClock()


def member(clock: SettableClock, store: MemoryStore | None = None) -> Membership:
    backend = MemoryBackend(store=store or MemoryStore(), clock=clock)
    return Membership(backend, "node-a", ttl_s=TTL_S, margin_s=MARGIN_S)


def test_nothing_is_confirmed_before_the_first_renewal(clock):
    assert not member(clock).confirmed()


@pytest.mark.parametrize(
    ("elapsed", "confirmed"),
    [(0.0, True), (TTL_S - MARGIN_S - 0.01, True), (TTL_S - MARGIN_S, False), (TTL_S, False)],
)
def test_confirmation_lasts_the_ttl_less_the_margin(clock, elapsed, confirmed):
    membership = member(clock)
    assert membership.renew({}) is True  # a first presence is not a lapse
    clock.advance(elapsed)
    assert membership.confirmed() is confirmed


def test_a_renewal_after_the_presence_expired_moves_the_epoch_on(clock):
    membership = member(clock)
    membership.renew({})
    epoch = membership.epoch
    clock.advance(TTL_S - 0.5)
    assert membership.renew({}) is True  # in time: the same epoch
    assert membership.confirmed(epoch)
    clock.advance(TTL_S + 0.1)  # frozen past the TTL: the cluster may have taken our work
    assert membership.renew({}) is False
    assert membership.confirmed()  # confirmed again, but not for what was claimed before
    assert not membership.confirmed(epoch)
    assert membership.confirmed(membership.epoch)


def test_steady_renewals_are_counted_and_a_stall_restarts_the_count(clock):
    membership = member(clock)
    membership.renew({})
    for _ in range(6):
        clock.advance(0.5)
        membership.renew({})
    assert membership.steady_for() == pytest.approx(3.0)
    clock.advance(1.5)  # this node stalled (starved, blocked on a database lock)
    membership.renew({})
    assert membership.steady_for() == pytest.approx(0.0)
    clock.advance(0.5)
    membership.renew({})
    assert membership.steady_for() == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("remaining_ms", "expected"),
    [
        (None, Liveness.GONE),
        (2000, Liveness.ALIVE),  # just renewed
        (1300, Liveness.ALIVE),  # renewed 0.7 s ago: within 1.5 heartbeat intervals
        (1200, Liveness.SUSPECT),  # 0.8 s without a renewal: more than 1.5 intervals
        (100, Liveness.SUSPECT),
    ],
)
def test_node_liveness(remaining_ms, expected):
    now_ms = 1_000_000
    live = {} if remaining_ms is None else {"node-b": {"expires_at_ms": now_ms + remaining_ms}}
    assert node_liveness(live, "node-b", now_ms=now_ms, ttl_s=TTL_S, heartbeat_s=0.5) == expected


def test_a_margin_must_fit_inside_the_ttl(clock):
    backend = MemoryBackend(store=MemoryStore(), clock=clock)
    with pytest.raises(ValueError, match="margin"):
        Membership(backend, "node-a", ttl_s=1.0, margin_s=1.0)
