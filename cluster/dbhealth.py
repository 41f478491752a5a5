"""Whether a node can do its work in the database, judged from its own calls.

Leadership and claims mean "able to do the work", not "able to reach the lock": a leader cut off from
its database while it still reaches Redis would otherwise renew its lease and stall every scheduled
run for as long as the partition lasts. So a node watches the calls its own loops make:

- *control* threads (the leader's scheduling and reaping, the heartbeat, the notifier) run every
  statement under tight bounds on MariaDB/MySQL: a server-side limit (``max_statement_time`` and
  ``innodb_lock_wait_timeout``) of ``limit_s``, and a client read/write/connect timeout a second
  above it. The server answers any statement within its limit, be it only with an error, so a
  control call still unanswered ``limit_s + STALL_MARGIN_S`` after it began is waiting on the
  network: the database is *unreachable*;
- *work* threads (the claim loop) keep the default bounds; *bounded* work threads (admissions:
  short indexed statements that hold claimed runs while they wait) get the same kind of bounds,
  looser (``bounded_limit_s``: several times ``limit_s``, at least BOUNDED_MIN_S), so a statement
  held by a hung path fails within seconds, not the driver's default; a call of a work thread
  that fails with a connection error (gone away, lost, refused, timed out) counts too.

The database is unreachable while a control call is stalled and no call begun after it has been
answered (a hung path answers none; a slow server answers the others), or while the newest call to
fail with a connection error, or the newest control call answered only past its bound, began after
the newest call answered in time; it is reachable again once a call begun after the failure is
answered within the bound (an answer later than that comes over a link as slow as a cut one). A
statement whose open connection broke at once (gone away, lost) is the one exception while it is
the only failure since the newest answer: a connection left over from before a server restart
breaks so, so the thread's reconnect decides (a failed connect counts at once), or the limit +
STALL_MARGIN_S without an answer does. The leader's elector asks :meth:`DatabaseHealth.able`
before every renewal and before campaigning: a leader that cannot reach its database releases its
lease, and a node that cannot reach it does not campaign.

Calls are seen through the thread's own connection: its statements (an execute wrapper), and its
connect, commit, rollback and autocommit switches (a COMMIT whose answer is held hangs like any
statement). A thread is watched while it runs inside :meth:`DatabaseHealth.thread`; task bodies
and every other thread are not.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, connection

from cluster.clock import Clock, SystemClock

logger = logging.getLogger(__name__)

# A control call unanswered this long past its server-side limit is waiting on the network (s).
STALL_MARGIN_S = 0.25
# The client-side read/write/connect timeout of a control connection is the limit plus this, so
# the server's own limit always ends a slow statement first (seconds; the driver takes whole ones).
CLIENT_TIMEOUT_MARGIN_S = 1.0
# MySQL client error codes that mean the server could not be reached or the connection broke:
# 2002/2003 cannot connect, 2006 server has gone away, 2013 lost connection during a query (also a
# read timeout), 2055 lost connection at a system error. Other errors came from a server that
# answered (a deadlock, a statement limit, a constraint): the database is reachable.
CONNECTION_ERROR_CODES = frozenset({2002, 2003, 2006, 2013, 2055})
# What a watched connect is called (a failed connect is never a left-over connection's break).
CONNECTING = "connecting"
# The node's usual round trip is the median of its last this many answered control calls.
ROUND_TRIPS_KEPT = 32

_local = threading.local()


# A node's presence payload says "database": UNREACHABLE while it cannot reach its database (and
# "database_reason" why): the next leader and the dashboard read it there, since the node cannot
# write its own row then.
UNREACHABLE = "unreachable"


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached (as opposed to an answer): Django's
    wrapped errors and the driver's own (a failed connect is seen before Django wraps it)."""
    django_error = isinstance(exc, DatabaseError | InterfaceError)
    cause = exc.__cause__ if django_error and exc.__cause__ is not None else exc
    from_driver = django_error or type(cause).__module__.startswith("MySQLdb")
    if not from_driver:
        return False
    if isinstance(exc, InterfaceError) or type(cause).__name__ == "InterfaceError":
        return True  # the connection was already closed or broken
    args = getattr(cause, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    return code in CONNECTION_ERROR_CODES


def _seen(error: BaseException) -> bool:
    return any(getattr(e, "scheduler_seen", False) for e in (error, error.__cause__) if e)


# A bounded work thread's server-side limits are this many times the control limit, and at least
# BOUNDED_MIN_S (seconds): loose enough for row-lock waits at a busy whole second, tight enough
# that a hung path gives its runs back within seconds.
BOUNDED_FACTOR = 5
BOUNDED_MIN_S = 5.0


def bounded_limit_s(limit_s: float) -> float:
    """The server-side limit of a bounded work thread's statements (see the module's text)."""
    return max(BOUNDED_MIN_S, BOUNDED_FACTOR * limit_s)


def client_timeout_s(limit_s: float) -> int:
    """The whole seconds of a control connection's client read/write/connect timeout."""
    return math.ceil(limit_s + CLIENT_TIMEOUT_MARGIN_S)


@dataclass(frozen=True)
class Reachability:
    reachable: bool
    # Why not (empty while reachable), and since when (monotonic; None while reachable).
    reason: str = ""
    since: float | None = None


@dataclass
class _Call:
    thread: str
    what: str
    started: float
    control: bool


@dataclass(frozen=True)
class _Failure:
    key: int  # the call (calls are numbered as they begin)
    since: float  # when the first failure since the newest answer began (monotonic)
    reason: str
    # When an open connection broke at once under a statement, if this is the first failure since
    # the newest answer: a suspicion until the reconnect or STALL_MARGIN_S + the limit settles it.
    broke_at: float | None


class DatabaseHealth:
    """One node's view of its path to the database. Thread-safe; cheap on every call."""

    def __init__(
        self,
        *,
        node_id: str,
        limit_s: float,
        clock: Clock | None = None,
        on_change: Callable[[Reachability], None] | None = None,
    ) -> None:
        if limit_s <= 0:
            raise ValueError("the control statement limit must be positive")
        self.node_id = node_id
        self.limit_s = limit_s
        self.stall_s = limit_s + STALL_MARGIN_S
        self.clock = clock or SystemClock()
        self.on_change = on_change
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._next_call = 0
        # Calls are ordered by when they began (a counter: two may begin at one clock reading).
        self._answered = 0  # the newest-begun call answered within the stall bound
        # The newest call to fail with a connection error, or control call answered only past
        # its stall bound.
        self._failed: _Failure | None = None
        self._state = Reachability(True)
        self._round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)
        # (began, took) of the newest answered control calls: the floor of a stretch of calls.
        self._answers: deque[tuple[float, float]] = deque(maxlen=ROUND_TRIPS_KEPT)

    # --- what the node asks ----------------------------------------------------------------------
    def able(self) -> bool:
        """Whether this node can do database work now (the elector's question)."""
        return self.observe().reachable

    def observe(self) -> Reachability:
        """The current reachability; logs (once) and reports each change."""
        now = self.clock.monotonic()
        with self._lock:
            state = self._judge(now)
            previous = self._state
            changed = state.reachable != previous.reachable
            if changed:
                self._state = state
            elif not state.reachable:
                state = previous  # keep the first reason and instant of this outage
        if changed:
            self._report(previous, state, now)
        return state

    def round_trip_s(self) -> float | None:
        """The median time the node's recent control calls took to answer (None before any): what
        a leader compares with its peers' to tell a slow path of its own from a slow database."""
        with self._lock:
            kept = list(self._round_trips)
        return statistics.median(kept) if kept else None

    def fastest_since(self, since: float) -> float | None:
        """The quickest control call begun at or after ``since`` (monotonic): the floor of the
        path's latency over that stretch, which a slow link raises for every call and a big
        statement does not. A call still unanswered counts as its age when none was answered.
        None when no control call began since."""
        now = self.clock.monotonic()
        with self._lock:
            answered = [took for began, took in self._answers if began >= since]
            if answered:
                return min(answered)
            waiting = [
                now - c.started for c in self._calls.values() if c.control and c.started >= since
            ]
        return max(waiting) if waiting else None

    @property
    def state(self) -> Reachability:
        """The last observed reachability (no new judgement)."""
        return self._state

    def _judge(self, now: float) -> Reachability:
        # A control call stalled past its bound is waiting on the network, unless a call begun
        # after it (on any watched thread of this node) has been answered since: the path then
        # works and the server is slow to answer that one call (a machine or a server starved
        # of CPU, a big statement). Stepping down for it only moved the work to a peer in the
        # same state: ten nodes on two cores judged their database unreachable in turn, and the
        # hand-overs and refused starts made the overload worse until nothing ran.
        stalled = [
            c
            for key, c in self._calls.items()
            if c.control and now - c.started >= self.stall_s and key > self._answered
        ]
        if stalled:
            oldest = min(stalled, key=lambda c: c.started)
            return Reachability(
                False,
                f"{oldest.what} of {oldest.thread} unanswered for "
                f"{now - oldest.started:.1f} s (limit {self.limit_s:g} s)",
                oldest.started,
            )
        failed = self._failed
        if failed is not None and failed.key > self._answered:
            # A connection that broke at once under a statement may only have been left over from
            # before a server restart: the thread's reconnect settles it (a failed connect is a
            # new failure, judged at once), and so does STALL_MARGIN_S + the limit without an
            # answer. Judging at the first such error made every thread that had not touched the
            # database during an outage cost its node its partitions once the database was back.
            suspect = failed.broke_at is not None and now - failed.broke_at < self.stall_s
            if not suspect or not self._state.reachable:
                return Reachability(False, failed.reason, failed.since)
        return Reachability(True)

    def _report(self, previous: Reachability, state: Reachability, now: float) -> None:
        extra = {"node": self.node_id}
        if not state.reachable:
            logger.warning(
                "database unreachable: %s; this node neither leads nor campaigns until it "
                "answers again",
                state.reason,
                extra=extra,
            )
        else:
            since = previous.since if previous.since is not None else now
            logger.info("database reachable again after %.1f s", max(0.0, now - since), extra=extra)
        if self.on_change is not None:
            try:
                self.on_change(state)
            except Exception:
                logger.exception("database reachability callback failed", extra=extra)

    # --- watching a thread's calls ---------------------------------------------------------------
    @contextlib.contextmanager
    def thread(self, *, control: bool, bounded: bool = False) -> Iterator[None]:
        """Watch the calls the current thread makes inside this block (nested blocks restore the
        previous watcher on the way out). On MariaDB/MySQL a control thread's connection gets the
        tight bounds before it is opened; a ``bounded`` work thread's gets looser ones
        (``bounded_limit_s``: admissions, whose statement held by a hung path then fails within
        seconds and counts as a connection error, instead of holding its runs for the driver's
        default); its calls are otherwise watched as work (no stall judged, no round trip
        kept)."""
        previous = (
            getattr(_local, "health", None),
            getattr(_local, "control", False),
            getattr(_local, "limit_s", None),
        )
        if control:
            limit: float | None = self.limit_s
        else:
            limit = bounded_limit_s(self.limit_s) if bounded else None
        # The server-side limit this thread's statements run under (None: the defaults).
        _local.health, _local.control, _local.limit_s = self, control, limit
        _instrument(connection, limit)
        try:
            yield
        finally:
            _local.health, _local.control, _local.limit_s = previous

    def _began(self, what: str, control: bool) -> int:
        with self._lock:
            self._next_call += 1
            key = self._next_call
            self._calls[key] = _Call(
                threading.current_thread().name, what, self.clock.monotonic(), control
            )
        return key

    def _ended(self, key: int, error: BaseException | None, *, in_call: bool = True) -> None:
        now = self.clock.monotonic()
        with self._lock:
            call = self._calls.pop(key, None)
            if call is None:
                return
            if error is not None and is_connection_error(error):
                with contextlib.suppress(AttributeError):
                    error.scheduler_seen = True  # type: ignore[attr-defined]
                quick_break = (
                    in_call and call.what != CONNECTING and now - call.started < self.stall_s
                )
                self._failure_locked(
                    key,
                    call,
                    f"{call.what} of {call.thread} failed after {now - call.started:.1f} s: "
                    f"{_one_line(error)}",
                    now if quick_break else None,
                )
            else:
                took = now - call.started
                if took < self.stall_s:
                    self._answered = max(self._answered, key)
                elif call.control:
                    # Answered, but past the bound: a link that slow keeps every call of this
                    # node late, so the answer counts as a failure, not as the path's recovery
                    # (counted so, a node on such a link turned reachable for half a second after
                    # each one: it flapped, kept its presence and its bodies' job locks while it
                    # could do no work, and the cluster took none of its work for the fault).
                    self._failure_locked(
                        key,
                        call,
                        f"{call.what} of {call.thread} answered only after {took:.1f} s "
                        f"(limit {self.limit_s:g} s)",
                        None,
                    )
                if call.control:
                    self._round_trips.append(took)
                    self._answers.append((call.started, took))
        # A failure makes the node unable now: say so at once, not at the next look.
        if error is not None:
            self.observe()

    def _failure_locked(self, key: int, call: _Call, reason: str, broke_at: float | None) -> None:
        """(``_lock`` held.) Call ``key`` failed. The first failure since the newest answer starts
        the outage; a quick break of an open connection (``broke_at``) is only a suspicion (see
        _judge), a second failure without an answer between is not."""
        previous = self._failed
        if previous is not None and key <= previous.key:
            return
        first = previous is None or previous.key < self._answered
        self._failed = _Failure(
            key,
            call.started if first or previous is None else previous.since,
            reason,
            broke_at if first else None,
        )

    def failed(self, error: BaseException, what: str = "a call") -> None:
        """Record a connection error seen outside a watched call (a loop's own handler); one a
        watched call already recorded is not counted again, now."""
        if is_connection_error(error) and not _seen(error):
            key = self._began(what, False)
            self._ended(key, error, in_call=False)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


def _watched(what: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def watched(*args: Any, **kwargs: Any) -> Any:
        health = getattr(_local, "health", None)
        if health is None:
            return call(*args, **kwargs)
        key = health._began(what, _local.control)
        try:
            result = call(*args, **kwargs)
        except BaseException as exc:
            health._ended(key, exc)
            raise
        health._ended(key, None)
        return result

    return watched


def _execute_wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any):
    health = getattr(_local, "health", None)
    if health is None:
        return execute(sql, params, many, context)
    key = health._began("a statement", _local.control)
    try:
        result = execute(sql, params, many, context)
    except BaseException as exc:
        health._ended(key, exc)
        raise
    health._ended(key, None)
    return result


# The connection methods that talk to the server outside cursor.execute().
_ROUND_TRIPS = {
    "connect": CONNECTING,
    "_commit": "a commit",
    "_rollback": "a rollback",
    "_set_autocommit": "an autocommit switch",
}


def _instrument(conn: Any, control_limit_s: float | None) -> None:
    """Once per connection object (one per thread): route its round trips through the watcher
    of the thread that uses it; a control thread's connection on MySQL/MariaDB also gets its
    bounds (client timeouts now; the server-side limits when it connects, see ``apply_limits``)."""
    if not getattr(conn, "_scheduler_watched", False):
        conn._scheduler_watched = True
        for name, what in _ROUND_TRIPS.items():
            setattr(conn, name, _watched(what, getattr(conn, name)))
        conn.execute_wrappers.insert(0, _execute_wrapper)
    if control_limit_s is None or conn.vendor != "mysql":
        return
    if getattr(conn, "_scheduler_control_limit_s", None) == control_limit_s:
        return
    timeout = client_timeout_s(control_limit_s)
    options = {
        **conn.settings_dict.get("OPTIONS", {}),
        "connect_timeout": timeout,
        "read_timeout": timeout,
        "write_timeout": timeout,
    }
    # This thread's connection object only: the settings dict is shared by every thread's.
    conn.settings_dict = {**conn.settings_dict, "OPTIONS": options}
    conn._scheduler_control_limit_s = control_limit_s
    conn.close()  # opened again with the bounds on its next use


def apply_limits(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: a control connection's server-side limits. MariaDB bounds every
    statement (``max_statement_time``, fractional seconds); MySQL only SELECTs
    (``max_execution_time``, ms); lock waits are bounded on both (whole seconds, at least 1)."""
    limit = getattr(connection, "_scheduler_control_limit_s", None)
    if limit is None or connection.vendor != "mysql":
        return
    lock_wait = max(1, math.ceil(limit))
    with connection.cursor() as cursor:
        if connection.mysql_is_mariadb:
            cursor.execute(
                "SET SESSION max_statement_time = %s, innodb_lock_wait_timeout = %s",
                [float(limit), lock_wait],
            )
        else:
            cursor.execute(
                "SET SESSION max_execution_time = %s, innodb_lock_wait_timeout = %s",
                [int(limit * 1000), lock_wait],
            )
