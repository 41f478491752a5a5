"""The runner's reusable worker threads: a call never waits behind a busy thread, an idle thread is
reused, a failing call does not end its thread, and idle threads end."""

from __future__ import annotations

import contextvars
import threading

from cluster.executor.runners import Workers

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
    workers = Workers(idle_s=0.05)
    ran = threading.Event()
    workers.submit(ran.set)
    assert ran.wait(WAIT_S)
    for _ in range(500):
        if workers._idle == 0 and not any(t.name == "task" for t in threading.enumerate()):
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
