"""The leader elector against the in-memory backend and a settable clock: no sleeps, table-driven."""

from __future__ import annotations

import threading

import pytest

from cluster.clock import SettableClock
from cluster.coordination import CoordinationError, Lease
from cluster.coordination.memory import MemoryBackend, MemoryStore
from cluster.elector import (
    ERR_JITTER,
    ERR_TIMING_ORDER,
    ERR_TIMING_TYPE,
    LEASE_LOST,
    STEPPED_DOWN,
    UNABLE,
    ElectionConfig,
    LeaderElector,
)

NAME = "scheduler"
CONFIG = ElectionConfig()  # the defaults: 2000 / 1500 / 250 ms
TTL_S = CONFIG.lease_ttl_ms / 1000
RETRY_S = CONFIG.retry_period_ms / 1000


# --- configuration --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lease_ttl_ms", "renew_deadline_ms", "retry_period_ms"),
    [
        (1500, 1500, 250),  # lease must outlive the renew deadline
        (2000, 250, 250),  # the deadline must leave room for a retry
        (2000, 1500, 0),  # a zero retry period would spin
        (2000, 1500, -5),
        (1000, 2000, 100),
        (100, 50, 60),
    ],
)
def test_config_refuses_a_bad_timing_order(
    lease_ttl_ms, renew_deadline_ms, retry_period_ms
) -> None:
    with pytest.raises(ValueError) as refused:
        ElectionConfig(lease_ttl_ms, renew_deadline_ms, retry_period_ms)
    assert str(refused.value) == ERR_TIMING_ORDER.format(
        lease_ttl_ms=lease_ttl_ms,
        renew_deadline_ms=renew_deadline_ms,
        retry_period_ms=retry_period_ms,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_ttl_ms": 2.5}, ERR_TIMING_TYPE.format(field="lease_ttl_ms", value=2.5)),
        ({"retry_period_ms": "250"}, ERR_TIMING_TYPE.format(field="retry_period_ms", value="250")),
        (
            {"renew_deadline_ms": True},
            ERR_TIMING_TYPE.format(field="renew_deadline_ms", value=True),
        ),
        ({"jitter_factor": 1.0}, ERR_JITTER.format(value=1.0)),
        ({"jitter_factor": -0.1}, ERR_JITTER.format(value=-0.1)),
    ],
)
def test_config_refuses_bad_values(overrides, message) -> None:
    with pytest.raises(ValueError) as refused:
        ElectionConfig(**overrides)
    assert str(refused.value) == message


def test_default_timing_replaces_a_dead_leader_within_3_s() -> None:
    assert (CONFIG.lease_ttl_ms, CONFIG.renew_deadline_ms, CONFIG.retry_period_ms) == (
        2000,
        1500,
        250,
    )
    assert CONFIG.renew_interval_ms == 666  # about ttl/3
    worst_takeover_ms = CONFIG.lease_ttl_ms + CONFIG.retry_period_ms * (1 + CONFIG.jitter_factor)
    assert worst_takeover_ms <= 2_300 < 3_000


@pytest.mark.parametrize(
    ("timing", "renew_interval_ms"),
    [
        ((2000, 1500, 250), 666),
        ((3000, 900, 100), 450),  # a short deadline leaves room for one retry
        ((1000, 600, 500), 500),  # never more often than the retry period
    ],
)
def test_renew_interval(timing, renew_interval_ms) -> None:
    assert ElectionConfig(*timing).renew_interval_ms == renew_interval_ms


# --- helpers --------------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def started(self, lease: Lease) -> None:
        self.events.append(("started", lease.holder, lease.term))

    def stopped(self, lease: Lease, reason: str) -> None:
        self.events.append(("stopped", lease.holder, lease.term, reason))

    def new_leader(self, holder: str) -> None:
        self.events.append(("new_leader", holder))


class FlakyBackend(MemoryBackend):
    """A memory backend whose calls can be made to raise, as an unreachable backend would."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.failing: set[str] = set()
        self.error: type[Exception] = CoordinationError

    def _maybe_fail(self, method: str) -> None:
        if method in self.failing or "*" in self.failing:
            raise self.error(f"{method} failed (injected)")

    def acquire_lease(self, *args):
        self._maybe_fail("acquire_lease")
        return super().acquire_lease(*args)

    def renew_lease(self, *args):
        self._maybe_fail("renew_lease")
        return super().renew_lease(*args)

    def release_lease(self, *args):
        self._maybe_fail("release_lease")
        return super().release_lease(*args)

    def current_lease(self, *args):
        self._maybe_fail("current_lease")
        return super().current_lease(*args)


@pytest.fixture
def clock() -> SettableClock:
    return SettableClock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def make_elector(identity, store, clock, config=CONFIG, **callbacks):
    backend = FlakyBackend(store=store, clock=clock)
    recorder = Recorder()
    elector = LeaderElector(
        backend,
        NAME,
        identity,
        config,
        clock=clock,
        on_started_leading=recorder.started,
        on_stopped_leading=recorder.stopped,
        on_new_leader=recorder.new_leader,
        **callbacks,
    )
    return elector, backend, recorder


# --- election -------------------------------------------------------------------------------------
def test_a_single_elector_becomes_leader(store, clock) -> None:
    elector, _, recorder = make_elector("node-a", store, clock)
    assert not elector.is_leader and elector.lease is None
    delay = elector.tick()
    assert elector.is_leader
    assert (elector.lease.holder, elector.lease.term) == ("node-a", 1)
    assert delay == pytest.approx(CONFIG.renew_interval_ms / 1000)
    assert recorder.events == [("new_leader", "node-a"), ("started", "node-a", 1)]


def test_of_two_electors_only_one_leads(store, clock) -> None:
    a, _, _ = make_elector("node-a", store, clock)
    b, _, b_events = make_elector("node-b", store, clock)
    a.tick()
    for _ in range(20):  # 5 s of ticks: a keeps renewing, b keeps trying
        assert b.tick() == pytest.approx(RETRY_S)
        a.tick()
        assert a.is_leader and not b.is_leader
        clock.advance(RETRY_S)
    assert a.lease.term == 1
    assert b_events.events == [("new_leader", "node-a")]


def test_a_leader_that_stops_renewing_is_replaced_after_its_ttl(store, clock) -> None:
    a, _, a_events = make_elector("node-a", store, clock)
    b, _, b_events = make_elector("node-b", store, clock)
    a.tick()
    waited = 0.0
    while not b.is_leader:  # a is frozen: it never ticks again
        b.tick()
        assert not (a.is_leader and b.is_leader)
        clock.advance(RETRY_S)
        waited += RETRY_S
    assert TTL_S <= waited <= TTL_S + RETRY_S * 2
    assert b.lease.term == 2
    assert not a.is_leader  # its lease cannot be trusted any more, tick or not
    a.tick()  # thawed: it notices at once and steps down, without calling the backend
    assert a_events.events[-1] == ("stopped", "node-a", 1, LEASE_LOST)
    assert ("started", "node-b", 2) in b_events.events


def test_a_leader_whose_renew_fails_steps_down_at_the_renew_deadline(store, clock) -> None:
    a, a_backend, a_events = make_elector("node-a", store, clock)
    a.tick()
    a_backend.failing.add("renew_lease")
    step_s = 1 / 16  # exact in binary, so the clock lands on the deadline exactly
    elapsed = 0.0
    while a.lease is not None:
        clock.advance(step_s)
        elapsed += step_s
        a.tick()
        assert a.is_leader == (elapsed < CONFIG.renew_deadline_ms / 1000)
    assert elapsed == CONFIG.renew_deadline_ms / 1000  # at the deadline, not a retry period later
    assert a_events.events[-1] == ("stopped", "node-a", 1, LEASE_LOST)
    assert sum(event[0] == "stopped" for event in a_events.events) == 1


def test_a_transient_renew_failure_is_retried_within_the_deadline(store, clock) -> None:
    a, a_backend, a_events = make_elector("node-a", store, clock)
    a.tick()
    a_backend.failing.add("renew_lease")
    clock.advance(CONFIG.renew_interval_ms / 1000)
    assert a.tick() == pytest.approx(RETRY_S)  # failed: retry after the retry period
    a_backend.failing.clear()
    clock.advance(RETRY_S)
    a.tick()
    assert a.is_leader and a.lease.term == 1
    assert [event[0] for event in a_events.events] == ["new_leader", "started"]


def test_a_leader_steps_down_when_the_lease_is_someone_elses(store, clock) -> None:
    a, a_backend, a_events = make_elector("node-a", store, clock)
    b, _, _ = make_elector("node-b", store, clock)
    a.tick()
    a_backend.release_lease(a.lease)  # e.g. an operator deleted the key
    b.tick()
    assert b.is_leader
    clock.advance(CONFIG.renew_interval_ms / 1000)
    a.tick()  # its compare-and-set renew is refused
    assert not a.is_leader
    assert a_events.events[-1] == ("stopped", "node-a", 1, LEASE_LOST)


def test_release_hands_over_at_once(store, clock) -> None:
    a, _, a_events = make_elector("node-a", store, clock)
    b, _, _ = make_elector("node-b", store, clock)
    a.tick()
    b.tick()
    assert a.release() is True
    assert not a.is_leader
    assert a_events.events[-1] == ("stopped", "node-a", 1, STEPPED_DOWN)
    # a does not campaign straight back: the follower wins on its next tick, with no TTL wait.
    assert a.tick() == pytest.approx(TTL_S)
    b.tick()
    assert b.is_leader and b.lease.term == 2
    assert a.release() is False  # nothing left to release


# --- leading means being able to do the work -----------------------------------------------------
class Ability:
    """What a node's database health would answer (cluster.dbhealth.DatabaseHealth.able)."""

    def __init__(self) -> None:
        self.able = True
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.able


def test_a_leader_unable_to_do_its_work_releases_at_its_next_step(store, clock) -> None:
    ability = Ability()
    a, a_backend, a_events = make_elector("node-a", store, clock, can_lead=ability)
    b, _, _ = make_elector("node-b", store, clock)
    a.tick()
    b.tick()
    ability.able = False
    clock.advance(0.01)  # well before its next renewal is due: it does not wait for it
    a.tick()
    assert not a.is_leader
    assert a_events.events[-1] == ("stopped", "node-a", 1, UNABLE)
    assert a_backend.current_lease(NAME) is None  # released, not left to expire
    b.tick()  # the follower takes over at its next step, with no TTL to wait
    assert b.is_leader and b.lease.term == 2


def test_a_node_unable_to_do_the_work_does_not_campaign_until_able(store, clock) -> None:
    ability = Ability()
    ability.able = False
    a, _, a_events = make_elector("node-a", store, clock, can_lead=ability)
    for _ in range(20):
        assert a.tick() == pytest.approx(RETRY_S)
        clock.advance(RETRY_S)
    assert a.lease is None and a_events.events == []
    ability.able = True
    a.tick()
    assert a.is_leader


def test_a_leader_that_gave_up_waits_a_ttl_before_campaigning_again(store, clock) -> None:
    ability = Ability()
    a, _, _ = make_elector("node-a", store, clock, can_lead=ability)
    a.tick()
    ability.able = False
    a.tick()
    ability.able = True  # the database answers again at once: others still get their turn
    assert a.tick() == pytest.approx(TTL_S)
    clock.advance(TTL_S)
    a.tick()
    assert a.is_leader and a.lease.term == 2


def test_a_failing_can_lead_check_counts_as_unable(store, clock) -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    a, _, a_events = make_elector("node-a", store, clock, can_lead=broken)
    a.tick()
    assert a.lease is None and a_events.events == []


def test_a_node_that_may_not_campaign_takes_no_lease_but_keeps_the_one_it_holds(
    store, clock
) -> None:
    """can_campaign gates taking a lease, not keeping one: a leader whose path slowed keeps
    leading (its own judgements hand over when it falls behind); a follower takes nothing new."""
    allowed = {"a": True, "b": False}
    a, _, a_events = make_elector("node-a", store, clock, can_campaign=lambda: allowed["a"])
    b, _, b_events = make_elector("node-b", store, clock, can_campaign=lambda: allowed["b"])
    a.tick()
    assert a.is_leader
    allowed["a"] = False
    for _ in range(10):
        clock.advance(RETRY_S)
        a.tick()
        b.tick()
    assert a.is_leader and not [e for e in a_events.events if e[0] == "stopped"]
    a.release()
    clock.advance(RETRY_S)
    b.tick()
    assert not b.is_leader and not [e for e in b_events.events if e[0] == "started"]
    allowed["b"] = True
    b.tick()
    assert b.is_leader


def test_backend_exceptions_never_escape_tick(store, clock) -> None:
    a, a_backend, a_events = make_elector("node-a", store, clock)
    a_backend.failing.add("*")
    a_backend.error = RuntimeError  # not even a CoordinationError
    for _ in range(5):
        assert a.tick() == pytest.approx(RETRY_S)
        clock.advance(RETRY_S)
    assert not a.is_leader
    a_backend.failing.clear()
    a.tick()
    assert a.is_leader
    a_backend.failing.add("*")
    assert a.release() is False  # the release failed, but leadership is given up all the same
    assert a_events.events[-1] == ("stopped", "node-a", 1, STEPPED_DOWN)


def test_callback_exceptions_never_escape_tick(store, clock) -> None:
    def explode(*args) -> None:
        raise RuntimeError("callback bug")

    elector = LeaderElector(
        MemoryBackend(store=store, clock=clock),
        NAME,
        "node-a",
        clock=clock,
        on_started_leading=explode,
        on_stopped_leading=explode,
        on_new_leader=explode,
    )
    elector.tick()
    assert elector.is_leader
    assert elector.release() is True


def test_run_leads_until_stopped_then_releases(store) -> None:
    backend = MemoryBackend(store=store)
    started = threading.Event()
    stopped: list[str] = []
    elector = LeaderElector(
        backend,
        NAME,
        "node-a",
        ElectionConfig(lease_ttl_ms=300, renew_deadline_ms=200, retry_period_ms=50),
        on_started_leading=lambda lease: started.set(),
        on_stopped_leading=lambda lease, reason: stopped.append(reason),
    )
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,))
    thread.start()
    assert started.wait(timeout=5)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert stopped == [STEPPED_DOWN]
    assert backend.current_lease(NAME) is None


def test_on_stopped_leading_may_wait_for_leader_work_that_reads_the_state(store, clock) -> None:
    # A node stops its leader loop from the callback and joins it; that loop reads is_leader.
    seen: list[bool] = []

    def stop_leader_work(lease: Lease, reason: str) -> None:
        worker = threading.Thread(target=lambda: seen.append(elector.is_leader))
        worker.start()
        worker.join(timeout=5)

    elector = LeaderElector(
        MemoryBackend(store=store, clock=clock),
        NAME,
        "node-a",
        clock=clock,
        on_stopped_leading=stop_leader_work,
    )
    elector.tick()
    assert elector.release() is True
    assert seen == [False]


def test_a_poked_follower_campaigns_at_once_not_at_its_next_retry(store) -> None:
    """A draining leader releases its lease and wakes the others (the node publishes a wake-up):
    a follower poked then takes over within moments, though its retry period is 10 s."""
    backend = MemoryBackend(store=store)
    leader = LeaderElector(backend, NAME, "node-a", ElectionConfig())
    leader.tick()
    assert leader.is_leader
    started = threading.Event()
    follower = LeaderElector(
        backend,
        NAME,
        "node-b",
        ElectionConfig(lease_ttl_ms=30_000, renew_deadline_ms=20_000, retry_period_ms=10_000),
        on_started_leading=lambda lease: started.set(),
    )
    stop = threading.Event()
    thread = threading.Thread(target=follower.run, args=(stop,))
    thread.start()
    try:
        assert not started.wait(timeout=0.3)  # the lease is held: it waits out its retry
        assert leader.release() is True
        follower.poke()
        assert started.wait(timeout=2)
    finally:
        stop.set()
        follower.poke()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_renewal_that_eats_half_the_retry_room_is_logged_once_naming_the_knobs(
    store, clock, caplog
) -> None:
    """A starved election thread (it woke late) is said before it costs leadership: the warning
    names the timing to raise, and repeats at most once a minute."""
    a, _, _ = make_elector("node-a", store, clock)
    a.tick()
    room_s = (CONFIG.renew_deadline_ms - CONFIG.renew_interval_ms) / 1000
    clock.advance(CONFIG.renew_interval_ms / 1000 + room_s * 0.4)  # woke late, within half
    with caplog.at_level("WARNING", logger="cluster.elector"):
        caplog.clear()
        a.tick()
        assert caplog.records == []
        clock.advance(CONFIG.renew_interval_ms / 1000 + room_s * 0.6)  # past half the room
        a.tick()
        clock.advance(CONFIG.renew_interval_ms / 1000 + room_s * 0.6)
        a.tick()
    assert a.is_leader
    [record] = caplog.records
    assert "SCHEDULER_RENEW_DEADLINE_MS" in record.getMessage()
    assert a.slowest_renewal_s == pytest.approx(room_s * 0.6)
