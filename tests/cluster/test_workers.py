"""The runner's reusable worker threads: a call never waits behind a busy thread, an idle thread is
reused, a failing call does not end its thread, and idle threads end. Calls taking turns (runs
already due when launched) share a few threads, and none waits long behind a busy one."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from cluster.executor.runners import Workers, relief

WAIT_S = 5.0


def wait_idle(workers: Workers, count: int) -> None:
    """Until ``count`` threads have counted themselves idle (a call's thread does just after it)."""
    for _ in range(int(WAIT_S / 0.01)):
        if workers._idle == count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{workers._idle} idle threads, not {count}")


def test_an_idle_thread_is_reused_and_a_busy_one_is_not_waited_for():
    workers = Workers(idle_s=WAIT_S)
    seen: list[int] = []
    done = threading.Event()
    workers.submit(lambda: (seen.append(threading.get_ident()), done.set()))
    assert done.wait(WAIT_S)
    # The first thread is idle again once it counted itself idle: the next call goes to it.
    wait_idle(workers, 1)
    release = threading.Event()
    blocked = threading.Event()
    workers.submit(lambda: (seen.append(threading.get_ident()), blocked.set(), release.wait()))
    assert blocked.wait(WAIT_S)
    assert seen[1] == seen[0]
    # That thread is now busy (blocked): another call must not wait for it.
    second = threading.Event()
    workers.submit(lambda: (seen.append(threading.get_ident()), second.set()))
    assert second.wait(WAIT_S)
    assert seen[2] != seen[0]
    release.set()


def test_a_failing_call_does_not_end_its_thread():
    workers = Workers(idle_s=WAIT_S)
    idents: list[int] = []
    failed = threading.Event()

    def fail() -> None:
        idents.append(threading.get_ident())
        failed.set()
        raise RuntimeError("task bug")

    workers.submit(fail)
    assert failed.wait(WAIT_S)
    wait_idle(workers, 1)
    again = threading.Event()
    workers.submit(lambda: (idents.append(threading.get_ident()), again.set()))
    assert again.wait(WAIT_S)
    assert idents[0] == idents[1]


def test_idle_threads_end_and_a_later_call_still_runs():
    # A name of its own: the other tests' idle threads (named "task") outlive them.
    workers = Workers(name="idle-ends", idle_s=0.05)
    ran = threading.Event()
    workers.submit(ran.set)
    assert ran.wait(WAIT_S)
    for _ in range(500):
        if workers._idle == 0 and not any(t.name == "idle-ends" for t in threading.enumerate()):
            break
        threading.Event().wait(0.01)
    assert workers._idle == 0
    later = threading.Event()
    workers.submit(later.set)
    assert later.wait(WAIT_S)


SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def test_a_run_does_not_see_what_the_previous_run_on_its_thread_set_in_context_variables():
    workers = Workers(idle_s=WAIT_S)
    values: list[tuple[int, str]] = []
    first = threading.Event()

    def set_it() -> None:
        SEEN.set("left behind")
        values.append((threading.get_ident(), SEEN.get()))
        first.set()

    workers.submit(set_it)
    assert first.wait(WAIT_S)
    wait_idle(workers, 1)
    second = threading.Event()
    workers.submit(lambda: (values.append((threading.get_ident(), SEEN.get())), second.set()))
    assert second.wait(WAIT_S)
    assert values[0][0] == values[1][0]  # the same thread
    assert values[1][1] == "unset"


def test_calls_in_turn_share_a_few_threads():
    workers = Workers(idle_s=WAIT_S)
    idents: list[int] = []
    done = threading.Event()
    calls = [lambda: idents.append(threading.get_ident()) for _ in range(199)]
    calls.append(lambda: (idents.append(threading.get_ident()), done.set()))
    # No top-up within the test: every call is taken by one of the first three threads.
    workers.submit_in_turn(calls, threads=3, tick_s=WAIT_S)
    assert done.wait(WAIT_S)
    for _ in range(int(WAIT_S / 0.01)):
        if len(idents) == 200:
            break
        threading.Event().wait(0.01)
    assert len(idents) == 200
    assert 1 <= len(set(idents)) <= 3


def run_long_calls_then_quick_ones(
    workers: Workers, *, long: int, quick: int, threads: int, tick_s: float
) -> tuple[threading.Barrier, list[threading.Event], list[int], threading.Event]:
    """``long`` calls that hold their thread until released, then ``quick`` ones, taking turns.
    The barrier (``long`` + 1 parties) passes once every long call holds a thread."""
    release = threading.Event()
    started = threading.Barrier(long + 1)
    returned: list[int] = []

    def hold() -> None:
        started.wait(WAIT_S)
        release.wait()
        returned.append(1)

    events = [threading.Event() for _ in range(quick)]
    workers.submit_in_turn(
        [hold for _ in range(long)] + [event.set for event in events],
        threads=threads,
        tick_s=tick_s,
    )
    return started, events, returned, release


def test_a_thread_held_by_a_long_call_is_relieved_while_calls_wait():
    # Three long calls on one thread taking turns: each is reached only once the thread held by
    # the one before it is relieved; the quick calls after them, once the last one is.
    started, quick, returned, release = run_long_calls_then_quick_ones(
        Workers(idle_s=WAIT_S), long=3, quick=5, threads=1, tick_s=0.02
    )
    try:
        started.wait(WAIT_S)
        assert all(event.wait(WAIT_S) for event in quick)
        assert returned == []  # every long call still holds its thread
    finally:
        release.set()


def test_a_burst_of_long_calls_all_start_within_a_few_ticks():
    # Forty long calls behind two threads: the first tick sees two taken and thirty-eight
    # waiting, and gives most of those a thread, rather than one relief per held thread a tick.
    started, quick, returned, release = run_long_calls_then_quick_ones(
        Workers(idle_s=WAIT_S), long=40, quick=1, threads=2, tick_s=0.1
    )
    try:
        began = time.monotonic()
        started.wait(WAIT_S)
        assert time.monotonic() - began < 1.0  # one relief per held thread a tick: 2 s or more
        assert quick[0].wait(WAIT_S)
        assert returned == []
    finally:
        release.set()


@pytest.mark.parametrize(
    ("waiting", "taken", "held", "joining"),
    [
        (30, 34, 0, 0),  # quick calls: the queue drains within the next tick, nobody joins
        (30, 15, 0, 0),  # ... or within the two next ones
        (38, 2, 2, 34),  # long calls: what the last tick's pace leaves behind gets threads
        (195, 5, 0, 185),  # many slow calls (none held a whole tick): the same
        (3, 0, 4, 3),  # held threads, few calls left: a thread per call at most
        (10, 10, 1, 1),  # on pace, one thread held: its relief
        (0, 9, 2, 0),  # nothing waits
    ],
)
def test_relief_keeps_what_waits_within_two_ticks_at_the_last_ticks_pace(
    waiting: int, taken: int, held: int, joining: int
):
    assert relief(waiting=waiting, taken=taken, held=held) == joining


def test_a_failing_call_in_turn_does_not_stop_the_ones_after_it_nor_leak_its_context():
    workers = Workers(idle_s=WAIT_S)
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def fail() -> None:
        SEEN.set("left behind")
        seen.append((threading.get_ident(), SEEN.get()))
        raise RuntimeError("task bug")

    def after() -> None:
        seen.append((threading.get_ident(), SEEN.get()))
        done.set()

    workers.submit_in_turn([fail, after], threads=1, tick_s=WAIT_S)
    assert done.wait(WAIT_S)
    assert seen[0][0] == seen[1][0]  # the same thread, in turn
    assert [value for _, value in seen] == ["left behind", "unset"]
