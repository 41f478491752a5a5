"""A node's judgement of whether its database answers (cluster.dbhealth), on a settable clock: calls
are made through the real connection of the test's thread, and a call's slowness or failure is
played by an execute wrapper that moves the clock or raises, as a partition would."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import MySQLdb
import pytest
from django.db import IntegrityError, InterfaceError, OperationalError, connection

from cluster import dbhealth
from cluster.clock import SettableClock
from cluster.conf import DB_STALL_MARGIN_S
from cluster.dbhealth import (
    CONNECTION_ERROR_CODES,
    STALL_MARGIN_S,
    DatabaseHealth,
    Reachability,
    client_timeout_s,
    is_connection_error,
)

LIMIT_S = 1.0
LOST = OperationalError(2013, "Lost connection to server during query")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock() -> SettableClock:
    return SettableClock()


@pytest.fixture
def changes() -> list[Reachability]:
    return []


@pytest.fixture
def health(clock: SettableClock, changes: list[Reachability]) -> DatabaseHealth:
    return DatabaseHealth(node_id="n1", limit_s=LIMIT_S, clock=clock, on_change=changes.append)


def select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@contextmanager
def calls_that(behave: Callable[[], None]) -> Iterator[None]:
    """Every statement of this thread runs ``behave()`` first (which may move the clock, look at
    the health mid-call, or raise)."""

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any):
        behave()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


def test_answered_calls_keep_the_database_reachable(health: DatabaseHealth, changes) -> None:
    with health.thread(control=True):
        select_one()
    assert health.observe().reachable
    assert changes == []


def test_an_error_the_server_answered_with_is_an_answer(health: DatabaseHealth) -> None:
    def constraint() -> None:
        raise IntegrityError(1062, "Duplicate entry")

    with health.thread(control=True), calls_that(constraint), pytest.raises(IntegrityError):
        select_one()
    assert health.observe().reachable


def test_a_control_call_unanswered_past_its_limit_makes_the_database_unreachable(
    health: DatabaseHealth, clock: SettableClock, changes
) -> None:
    seen: list[Reachability] = []

    def hang() -> None:
        clock.advance(LIMIT_S + STALL_MARGIN_S - 0.01)
        seen.append(health.observe())  # not yet: within its bound
        clock.advance(0.02)
        seen.append(health.observe())  # past it, still in flight

    with health.thread(control=True):
        select_one()  # connected (a control connection reconnects with its bounds)
        with calls_that(hang):
            select_one()
    assert seen[0].reachable
    assert not seen[1].reachable
    assert "a statement of" in seen[1].reason and "unanswered" in seen[1].reason
    # It answered in the end, but past its bound: that proves nothing of the path.
    assert not health.observe().reachable
    with health.thread(control=True):
        select_one()  # begun after it, answered in time: the path works
    assert health.observe().reachable
    assert [c.reachable for c in changes] == [False, True]


def test_answers_that_each_come_past_the_bound_keep_the_node_unreachable(
    health: DatabaseHealth, clock: SettableClock, changes
) -> None:
    """A link slowed past the control limit (0.8 s each way) answers every call, each too late: the
    node stays unreachable for the whole stretch, from the first stall, instead of being
    reachable again after each late answer (it kept its presence and its bodies' job locks so,
    doing no work, and the cluster took none of it)."""
    seen: list[Reachability] = []

    def slow_link() -> None:
        clock.advance(1.6)
        seen.append(health.observe())

    with health.thread(control=True):
        select_one()
        with calls_that(slow_link):
            for _ in range(4):
                select_one()
                seen.append(health.observe())  # between two late answers
    assert not any(state.reachable for state in seen)
    assert seen[-1].since == seen[0].since  # one outage, from the first stall
    with health.thread(control=False), calls_that(lambda: clock.advance(1.6)):
        select_one()  # nor does a work call answered as late
    assert not health.observe().reachable
    with health.thread(control=False):
        select_one()  # a work call answered in time does
    assert health.observe().reachable
    assert [c.reachable for c in changes] == [False, True]


@pytest.mark.parametrize("later_control", [False, True])
def test_a_stalled_call_is_not_an_outage_while_a_later_call_is_answered(
    health: DatabaseHealth, clock: SettableClock, later_control: bool
) -> None:
    """One control call hangs past its bound while a call begun after it, on another thread, is
    answered: the path works and the server is slow to answer that one (a starved machine), so
    the database stays reachable. A control call that begins after that answer and stalls too is
    an outage: nothing begun since has been answered."""
    begun, release = threading.Event(), threading.Event()

    def held() -> None:
        begun.set()
        release.wait(5)

    def slow_caller() -> None:
        with health.thread(control=True):
            select_one()
            with calls_that(held):
                select_one()
        connection.close()

    with health.thread(control=True):
        select_one()  # this thread's connection, opened before the other call begins
    thread = threading.Thread(target=slow_caller)
    thread.start()
    try:
        assert begun.wait(5)
        with health.thread(control=later_control):
            select_one()  # begun after the held call, and answered
        clock.advance(LIMIT_S + STALL_MARGIN_S + 0.5)
        assert health.observe().reachable
        seen: list[Reachability] = []

        def hang() -> None:
            clock.advance(LIMIT_S + STALL_MARGIN_S + 0.01)
            seen.append(health.observe())

        with health.thread(control=True), calls_that(hang):
            select_one()
        assert not seen[0].reachable and "unanswered" in seen[0].reason
    finally:
        release.set()
        thread.join(5)


@pytest.mark.parametrize("bounded", [False, True])
def test_a_slow_call_of_a_work_thread_is_not_a_stall(
    health: DatabaseHealth, clock: SettableClock, bounded: bool
) -> None:
    """Nor of a bounded one (an admission's): its client timeout ends a hung call, as an error."""
    seen: list[Reachability] = []

    def slow() -> None:
        clock.advance(10 * LIMIT_S)
        seen.append(health.observe())

    with health.thread(control=False, bounded=bounded), calls_that(slow):
        select_one()
    assert seen[0].reachable
    assert health.round_trip_s() is None  # a work call's time is not the path's round trip


def test_a_connection_error_makes_it_unreachable_until_a_later_call_answers(
    health: DatabaseHealth, clock: SettableClock, changes
) -> None:
    def lose() -> None:
        raise LOST

    with health.thread(control=True):
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
        clock.advance(0.1)
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()  # the second failure, no answer between: an outage
        state = health.state
        assert not state.reachable and "Lost connection" in state.reason
        assert state.since == pytest.approx(clock.monotonic() - 0.1)  # from the first failure
        clock.advance(0.1)
        select_one()
    assert health.observe().reachable
    assert [c.reachable for c in changes] == [False, True]


def test_a_left_over_connection_that_breaks_at_once_waits_for_the_reconnect(
    health: DatabaseHealth, clock: SettableClock, changes
) -> None:
    """A connection kept idle through a server restart breaks on its first statement after it:
    not an outage while the thread's next call (its reconnect) is answered."""

    def lose() -> None:
        raise LOST

    with health.thread(control=False):
        select_one()
        clock.advance(30)
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
        assert health.observe().reachable
        connection.close()
        clock.advance(0.2)
        select_one()  # reconnected and answered
    clock.advance(5)
    assert health.observe().reachable
    assert changes == []


def test_a_broken_connection_no_call_answers_after_is_an_outage_after_the_stall_bound(
    health: DatabaseHealth, clock: SettableClock, changes
) -> None:
    def lose() -> None:
        raise LOST

    with health.thread(control=False):
        select_one()
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
    broke = clock.monotonic()
    clock.advance(LIMIT_S + STALL_MARGIN_S - 0.01)
    assert health.observe().reachable
    clock.advance(0.01)
    state = health.observe()
    assert not state.reachable and state.since == broke
    assert [c.reachable for c in changes] == [False]


def test_a_failed_reconnect_after_a_broken_connection_is_an_outage_at_once(
    health: DatabaseHealth, clock: SettableClock, changes, monkeypatch
) -> None:
    def lose() -> None:
        raise LOST

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise MySQLdb.OperationalError(2003, "Can't connect to server on '127.0.0.1' (111)")

    with health.thread(control=False):
        select_one()
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
        connection.close()
        monkeypatch.setattr(connection, "get_new_connection", refuse)
        clock.advance(0.1)
        # Django wraps the driver's error on MariaDB; the test database may be another.
        with pytest.raises((OperationalError, MySQLdb.OperationalError)):
            select_one()
        monkeypatch.undo()
    state = health.observe()
    assert not state.reachable and state.reason.startswith("connecting of ")
    assert [c.reachable for c in changes] == [False]


def test_a_slow_failure_of_an_open_connection_is_not_taken_for_a_left_over_one(
    health: DatabaseHealth, clock: SettableClock
) -> None:
    """A statement that failed only after the stall bound (a read timeout on a hung path) counts
    at once."""

    def stall_then_lose() -> None:
        clock.advance(LIMIT_S + STALL_MARGIN_S)
        raise LOST

    with health.thread(control=False):
        select_one()
        with calls_that(stall_then_lose), pytest.raises(OperationalError):
            select_one()
    assert not health.observe().reachable


def test_an_answer_to_a_call_begun_before_the_failure_proves_nothing(
    health: DatabaseHealth, clock: SettableClock
) -> None:
    """Two threads: one call begins, another begins later and fails; the first is answered
    after the failure. The path may have broken between the two: still unreachable."""
    failed = threading.Event()
    answered = threading.Event()
    begun = threading.Event()

    def earlier() -> None:
        def wait_for_failure() -> None:
            begun.set()
            failed.wait(5)

        with health.thread(control=True):
            select_one()
            with calls_that(wait_for_failure):
                select_one()
        connection.close()
        answered.set()

    def lose() -> None:
        raise LOST

    with health.thread(control=True):
        select_one()  # this thread's connection, opened before the other call begins
    thread = threading.Thread(target=earlier)
    thread.start()
    assert begun.wait(5)

    with health.thread(control=True):
        select_one()
        clock.advance(0.1)
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
    failed.set()
    assert answered.wait(5)
    thread.join(5)
    clock.advance(LIMIT_S + STALL_MARGIN_S)  # past the wait for a reconnect
    assert not health.observe().reachable


def test_an_outage_is_logged_once_when_noticed_and_once_when_over(
    health: DatabaseHealth, clock: SettableClock, caplog
) -> None:
    def lose() -> None:
        raise LOST

    caplog.set_level(logging.INFO, logger="cluster.dbhealth")
    with health.thread(control=True):
        for _ in range(5):
            with calls_that(lose), pytest.raises(OperationalError):
                select_one()
            health.observe()
            clock.advance(0.5)
        select_one()
    health.observe()
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == ["WARNING", "INFO"]
    assert records[0][1].startswith("database unreachable: a statement of")
    assert records[1][1] == "database reachable again after 2.5 s"


def test_a_failure_a_watched_call_saw_is_not_counted_again_by_the_loop(
    health: DatabaseHealth, clock: SettableClock
) -> None:
    def lose() -> None:
        raise LOST

    with health.thread(control=True):
        with calls_that(lose), pytest.raises(OperationalError) as raised:
            select_one()
        clock.advance(0.1)
        select_one()  # answered: reachable again
        health.failed(raised.value, "the heartbeat loop")  # the loop's handler, later
    assert health.observe().reachable


def test_calls_outside_a_watched_block_are_not_seen(
    health: DatabaseHealth, clock: SettableClock
) -> None:
    def lose() -> None:
        raise LOST

    with calls_that(lose), pytest.raises(OperationalError):
        select_one()  # a task body's own query, say
    with health.thread(control=True):
        pass
    with calls_that(lose), pytest.raises(OperationalError):
        select_one()
    assert health.observe().reachable


def test_nested_watchers_restore_the_outer_one(clock: SettableClock) -> None:
    outer = DatabaseHealth(node_id="a", limit_s=LIMIT_S, clock=clock)
    inner = DatabaseHealth(node_id="b", limit_s=LIMIT_S, clock=clock)

    def lose() -> None:
        raise LOST

    with outer.thread(control=True):
        with inner.thread(control=True):
            pass
        with calls_that(lose), pytest.raises(OperationalError):
            select_one()
    clock.advance(LIMIT_S + STALL_MARGIN_S)  # no answer since the break
    assert not outer.observe().reachable
    assert inner.observe().reachable


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OperationalError(2006, "MySQL server has gone away"), True),
        (OperationalError(2013, "Lost connection to server during query"), True),
        (OperationalError(2003, "Can't connect to server"), True),
        (InterfaceError("connection already closed"), True),
        (MySQLdb.OperationalError(2013, "Lost connection at handshake"), True),
        (MySQLdb.InterfaceError(0, ""), True),
        (OperationalError(1205, "Lock wait timeout exceeded"), False),
        (OperationalError(1969, "Query execution was interrupted (max_statement_time)"), False),
        (OperationalError("database is locked"), False),  # SQLite's busy answer
        (IntegrityError(1062, "Duplicate entry"), False),
        (ValueError(2013), False),
    ],
)
def test_which_errors_mean_the_database_could_not_be_reached(
    error: Exception, expected: bool
) -> None:
    assert is_connection_error(error) is expected


def test_a_wrapped_driver_error_is_judged_by_its_cause() -> None:
    wrapped = OperationalError("wrapped")
    wrapped.__cause__ = MySQLdb.OperationalError(2006, "gone away")
    assert is_connection_error(wrapped)


def test_bounds_and_the_settings_agree() -> None:
    assert DB_STALL_MARGIN_S == STALL_MARGIN_S
    assert 2013 in CONNECTION_ERROR_CODES
    assert client_timeout_s(1.0) == 2  # whole seconds, above the server's limit
    assert client_timeout_s(0.3) == 2
    with pytest.raises(ValueError):
        DatabaseHealth(node_id="n", limit_s=0)


@pytest.mark.mysql
@pytest.mark.skipif(connection.vendor != "mysql", reason="statement limits are a MariaDB matter")
def test_a_control_connection_carries_its_bounds_and_others_do_not(
    health: DatabaseHealth,
) -> None:
    def limits() -> tuple[float, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_statement_time, @@innodb_lock_wait_timeout")
            row = cursor.fetchone()
        return float(row[0]), int(row[1])

    found: dict[str, tuple[float, int]] = {}

    def in_thread(name: str, control: bool | None, bounded: bool) -> None:
        try:
            if control is None:
                found[name] = limits()
            else:
                with health.thread(control=control, bounded=bounded):
                    found[name] = limits()
        finally:
            connection.close()

    cases = (
        ("control", True, False),
        ("bounded work", False, True),  # an admission's: tight bounds, watched as work
        ("work", False, False),
        ("other", None, False),
    )
    for name, control, bounded in cases:
        thread = threading.Thread(target=in_thread, args=(name, control, bounded))
        thread.start()
        thread.join(30)
    assert found["control"] == (LIMIT_S, 1)
    bounded = dbhealth.bounded_limit_s(LIMIT_S)
    assert found["bounded work"] == (bounded, math.ceil(bounded))
    assert found["work"] == found["other"]
    assert found["other"][0] == 0.0


@pytest.mark.mysql
@pytest.mark.skipif(connection.vendor != "mysql", reason="statement limits are a MariaDB matter")
def test_a_control_statement_past_its_limit_is_stopped_by_the_server(
    health: DatabaseHealth,
) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with health.thread(control=True), connection.cursor() as cursor:
                cursor.execute("SELECT SLEEP(3)")
        except OperationalError as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert errors and errors[0].args[0] == 1969  # max_statement_time exceeded: an answer
    assert health.observe().reachable


def test_the_fastest_call_since_an_instant_is_the_floor_of_the_path(
    health: DatabaseHealth, clock: SettableClock
) -> None:
    """``fastest_since``: the quickest control call begun since an instant (a slow link raises
    every call; one big statement does not), an unanswered one by its age when none answered, and
    no work thread's call."""
    takes = iter([0.3, 0.05, 0.2])

    def slow() -> None:
        clock.advance(next(takes))

    with health.thread(control=True):
        select_one()  # connected
        clock.advance(1.0)
        began = clock.monotonic()
        assert health.fastest_since(began) is None
        seen: list[float | None] = []

        def hang() -> None:
            clock.advance(0.4)
            seen.append(health.fastest_since(began))

        with calls_that(hang):
            select_one()
        assert seen == [pytest.approx(0.4)]  # only an unanswered call: its age
        with calls_that(slow):
            for _ in range(3):
                select_one()
    assert health.fastest_since(began) == pytest.approx(0.05)
    later = clock.monotonic()
    with health.thread(control=False), calls_that(lambda: clock.advance(0.9)):
        select_one()
    assert health.fastest_since(later) is None
