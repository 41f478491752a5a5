"""Runners: how an admitted run's body is executed once its row is marked running.

``ThreadRunner`` (the one nodes use) gives each run a thread of its own that waits for the due
instant, passes the self-fence and runs the task: in that thread for ``thread`` isolation (fast; a
task that overruns its timeout is abandoned, it cannot be killed), in a child process the supervisor
kills on timeout or cancel for ``process`` isolation. Runs already due when they are launched (a
burst, a backlog) are the exception: they take turns on a few threads (``Workers.submit_in_turn``),
which more threads join within milliseconds when bodies are long or slow. A runner only
talks to its host (the executor) through ``may_start`` (the self-fence, just before the body) and
``complete`` (queue the outcome).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import multiprocessing
import queue
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

from django.db import connection

from cluster import affinity
from cluster.child import run_task
from cluster.clock import Clock
from cluster.executor.output import call_task, install_output_capture, task_context
from cluster.executor.runs import ActiveRun, Outcome
from cluster.logcontext import execution_context
from jobs import fencing, registry, secrets
from jobs.models import Isolation
from jobs.states import ExecutionStatus

logger = logging.getLogger(__name__)

S = ExecutionStatus
# A worker thread with nothing to run for this long ends (seconds).
WORKER_IDLE_S = 30.0
# Event.wait may overshoot by a millisecond or so: sleep to this close to the instant, then spin.
SPIN_S = 0.0015
# An instant shared by this many runs or more gets a gate (one thread spins to its instant and
# releases them all); a run alone on its instant (jobs spread over their interval are due
# microseconds apart) sleeps to it in its own thread, spinning nothing: a spin of SPIN_S per run,
# a thousand runs a second, was most of a node's CPU.
GATE_MIN_RUNS = 2
# A gated task also starts by itself this long after its instant if the gate never opens.
GATE_SLACK_S = 0.05
# How long a finished child process is waited for (seconds).
CHILD_JOIN_S = 5.0
# Runs already due when launched take turns on this many threads (``Workers.submit_in_turn``): a
# thread per run cost the nodes a wake-up and a hand-over of the interpreter for every run ...
TURN_THREADS = 4
# ... and every this often while runs wait, more threads join if the queue would not drain
# within two more such ticks at its last tick's pace, or if a thread has been held by one run for
# a whole tick (seconds): no run waits much longer than three ticks, whatever runs ahead of it.
TURN_TICK_S = 0.01
TURN_PACE_TICKS = 2


class RunHost(Protocol):
    """What a runner needs of the executor."""

    clock: Clock

    def may_start(self, run: ActiveRun) -> bool:
        """The self-fence: True if the body may start now (else the run was given up). Waits for
        a body slot first when the node's bodies fill its capacity (a run claimed beyond it)."""
        ...

    def body_room(self) -> bool:
        """Whether a body could start now without waiting for another to end."""
        ...

    def complete(self, outcome: Outcome, *, body_ended: bool = False) -> bool:
        """Queue the run's outcome (the first one wins)."""
        ...

    def still_owner(self, run: ActiveRun) -> bool:
        """Whether the run still holds its claim (a body asks: ``context.still_owner()``)."""
        ...


class Runner(Protocol):
    def launch(self, host: RunHost, runs: list[ActiveRun]) -> None:
        """Start the bodies of ``runs`` (marked running) at their due instants."""
        ...


def wait_until(clock: Clock, instant: float, *, spin_s: float = SPIN_S) -> None:
    """Return at the wall-clock ``instant``: sleep to ``spin_s`` before it, then spin (to well under
    a millisecond). With ``spin_s`` 0, only sleep (the sleep's own overshoot, a tenth of a
    millisecond on an idle machine, and no CPU spent). A real clock only."""
    remaining = instant - clock.now()
    if remaining > spin_s:
        clock.sleep(remaining - spin_s)
    while clock.now() < instant:
        if not spin_s:
            clock.sleep(max(0.0, instant - clock.now()))


class Workers:
    """Threads kept for reuse: a call goes to an idle thread when there is one, else to a new
    thread (never queued behind a busy one: a body may run for hours; ``submit_in_turn`` queues
    calls some milliseconds at most); a thread idle for ``idle_s`` ends. Starting a thread per run
    cost more than the run itself for short tasks."""

    def __init__(self, name: str = "task", idle_s: float = WORKER_IDLE_S) -> None:
        self.name = name
        self.idle_s = idle_s
        self._calls: queue.SimpleQueue[tuple[Callable[..., None], tuple]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, func: Callable[..., None], *args: object) -> None:
        with self._lock:
            if self._idle:
                # Put under the lock: the idle thread counted here cannot end before taking it.
                self._idle -= 1
                self._calls.put((func, args))
                return
        threading.Thread(target=self._work, args=(func, args), name=self.name, daemon=True).start()

    def submit_in_turn(
        self,
        calls: list[Callable[[], None]],
        *,
        threads: int = TURN_THREADS,
        tick_s: float = TURN_TICK_S,
    ) -> None:
        """Run ``calls`` in order on ``threads`` threads, each taking the next waiting call when
        its last one ends (each in a fresh context, as ``submit``'s): short calls (a burst of
        quick tasks) do not each cost a thread's wake-up. Every ``tick_s`` while calls wait,
        more threads join (``relief``): no call waits much longer than three ticks, behind long
        calls or many slow ones."""
        turns = _Turns(calls)
        for _ in range(min(threads, len(calls))):
            self.submit(turns.take)
        if len(calls) > threads:
            self.submit(turns.oversee, self, tick_s)

    def _work(self, func: Callable[..., None], args: tuple) -> None:
        while True:
            _call_fresh(func, *args)
            with self._lock:
                self._idle += 1
            try:
                func, args = self._calls.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    try:
                        # Handed over between the timeout and the lock: still ours to run.
                        func, args = self._calls.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


def _call_fresh(func: Callable[..., None], *args: object) -> None:
    """Call ``func`` in a fresh context: what a task sets in context variables (and what lives
    in them: Django's active translation and time zone, the log context) is not seen by the next
    run on this thread. A failure is logged; the thread goes on."""
    try:
        contextvars.Context().run(func, *args)
    except BaseException:
        logger.exception("a worker's call failed")


def relief(*, waiting: int, taken: int, held: int) -> int:
    """How many threads join calls taking turns, at a tick with ``waiting`` calls left, ``taken``
    of them taken since the last tick and ``held`` threads in one call for a whole tick: enough
    that what waits is taken within ``TURN_PACE_TICKS`` more ticks at the last one's pace, and
    one for each held thread (none beyond a thread per waiting call)."""
    return max(0, min(waiting, max(held, waiting - TURN_PACE_TICKS * taken)))


class _Turns:
    """Calls taking turns on a few threads (``Workers.submit_in_turn``): how many were taken, and
    since when each of those threads has been in its current call."""

    def __init__(self, calls: list[Callable[[], None]]) -> None:
        self.waiting = deque(calls)
        self._lock = threading.Lock()
        self._taken = 0
        self._busy_since: dict[object, float] = {}

    def take(self) -> None:
        """Run waiting calls one after another until none is left."""
        me = object()
        try:
            while True:
                with self._lock:
                    if not self.waiting:
                        return
                    call = self.waiting.popleft()
                    self._taken += 1
                    self._busy_since[me] = time.monotonic()
                _call_fresh(call)
        finally:
            with self._lock:
                self._busy_since.pop(me, None)

    def oversee(self, workers: Workers, tick_s: float) -> None:
        """Every ``tick_s`` while calls wait, add the threads ``relief`` asks for."""
        counted = 0
        while self.waiting:
            time.sleep(tick_s)
            held_since = time.monotonic() - tick_s
            with self._lock:
                taken, counted = self._taken - counted, self._taken
                held = [me for me, since in self._busy_since.items() if since <= held_since]
                for me in held:
                    # Counted once: the thread is seen again only once it takes its next call.
                    del self._busy_since[me]
                joining = relief(waiting=len(self.waiting), taken=taken, held=len(held))
            try:
                for _ in range(joining):
                    workers.submit(self.take)
            except Exception:
                # No thread to be had (the process's limit): the next tick tries again.
                logger.exception("could not start a thread for runs taking turns")


class ThreadRunner:
    """A worker thread per run due ahead or process-isolated (reused, see ``Workers``). One gate per
    due instant still ahead that several runs share: a single thread waits for the instant and
    opens it, and every task due then is released together (many threads spinning on the clock
    would fight over the GIL and delay each other); a run alone on its instant sleeps to it. Runs
    already due start at once, with no gate, taking turns on a few threads
    (``Workers.submit_in_turn``: none waits much longer than three ticks of 10 ms)."""

    def __init__(self) -> None:
        self.workers = Workers()

    def launch(self, host: RunHost, runs: list[ActiveRun]) -> None:
        gates: dict[float, threading.Event] = {}
        now = host.clock.now()
        sharing = Counter(run.due for run in runs if run.due > now)
        for run in runs:
            if run.due <= now or sharing[run.due] < GATE_MIN_RUNS:
                continue
            if run.due not in gates:
                gate = gates[run.due] = threading.Event()
                self.workers.submit(_open_gate, host.clock, run.due, gate)
            run.gate = gates[run.due]
        in_turn: list[Callable[[], None]] = []
        for run in runs:
            if run.execution.job.isolation == Isolation.PROCESS:
                self.workers.submit(_with_context, body_in_process, host, run)
            elif run.gate is None and run.due <= now:
                in_turn.append(functools.partial(_with_context, body_in_thread, host, run))
            else:
                self.workers.submit(_with_context, body_in_thread, host, run)
        if in_turn:
            self.workers.submit_in_turn(in_turn)


def _with_context(
    body: Callable[[RunHost, ActiveRun], None], host: RunHost, run: ActiveRun
) -> None:
    """Run ``body`` with the run's ids on every line this thread logs (the task's own too)."""
    threading.current_thread().name = f"task-{run.execution.pk}"
    try:
        with execution_context(execution=run.execution.pk, job=run.execution.job_id):
            body(host, run)
    finally:
        # Whatever happened, no connection of this run outlives it on a reused thread.
        connection.close()


def _open_gate(clock: Clock, instant: float, gate: threading.Event) -> None:
    wait_until(clock, instant)
    gate.set()


def _wait_for_start(clock: Clock, run: ActiveRun) -> None:
    if run.gate is not None:
        run.gate.wait(max(0.0, run.due - clock.now()) + GATE_SLACK_S)
    else:
        wait_until(clock, run.due, spin_s=0.0)  # alone on its instant, or due already


def body_in_thread(host: RunHost, run: ActiveRun) -> None:
    """Wait for the due instant, run the task in this thread, queue the outcome.

    What needs no instant is done before it (the task looked up, its arguments copied and their
    secrets resolved; a failure there is the run's failure once it may start): at a whole second
    every body due then waits for the interpreter, and each does the least it can between the
    gate and its task."""
    job = run.execution.job
    context = run.context = task_context(
        run.execution, run.cancel_event, lambda: host.still_owner(run)
    )
    stdout = install_output_capture()
    revealed: list[str] = []
    unready: BaseException | None = None  # raised as the task's own failure once it may start
    try:
        spec = registry.get_task(job.task)
        args, kwargs, revealed = secrets.resolve_call(*run.execution.call_arguments())
    except Exception as exc:
        unready = exc
    run.revealed = revealed
    _wait_for_start(host.clock, run)
    if not host.may_start(run):
        return
    if job.timeout_seconds:
        run.deadline = host.clock.monotonic() + job.timeout_seconds
    stdout.attach(context)
    started = host.clock.now()
    try:
        try:
            if unready is not None:
                raise unready
            value = call_task(spec, args, kwargs, context)
        finally:
            stdout.detach()  # the last, unterminated line belongs to the outcome's output
    except BaseException as exc:
        outcome = Outcome(
            run,
            S.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            tb=traceback.format_exc(),
            output=context.output,
            started=started,
        )
    else:
        if run.cancel_event.is_set() and run.outcome_reason:
            # Cancelled, with what the task wrote and returned while stopping.
            outcome = Outcome(
                run,
                S.CANCELLED,
                result=value,
                output=context.output,
                reason=run.outcome_reason,
                started=started,
            )
        else:
            outcome = Outcome(
                run, S.SUCCEEDED, result=value, output=context.output, started=started
            )
    outcome.ended = host.clock.now()
    if revealed:
        # What the run records (and viewers read) never carries a secret it was given.
        outcome.result = secrets.scrub(outcome.result, revealed)
        outcome.error = secrets.scrub(outcome.error, revealed)
        outcome.tb = secrets.scrub(outcome.tb, revealed)
        outcome.output = secrets.scrub(outcome.output, revealed)
    host.complete(outcome, body_ended=True)


def body_in_process(host: RunHost, run: ActiveRun) -> None:
    """Run the task in a child process that the supervisor kills on timeout or cancel."""
    execution, job = run.execution, run.execution.job
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    meta = {
        "execution_id": execution.pk,
        "job_name": job.name,
        "attempt": execution.attempt,
        "scheduled_for": execution.scheduled_for,
        "cpus": affinity.unpinned(),
        "fencing_token": execution.pk,
        "idempotency_key": fencing.run_key(execution),
    }
    args, kwargs = execution.call_arguments()
    process = ctx.Process(
        target=run_task,
        args=(job.task, args, kwargs, meta, child_conn),
        daemon=True,
    )
    _wait_for_start(host.clock, run)
    if not host.may_start(run):
        connection.close()
        return
    started = host.clock.now()
    if job.timeout_seconds:
        run.deadline = host.clock.monotonic() + job.timeout_seconds
    process.start()
    child_conn.close()
    run.process = process
    run.streamed = ""
    try:
        message = parent_conn.recv()
        while "progress" in message:  # the output so far, while the task goes on
            run.streamed = message["progress"]
            message = parent_conn.recv()
    except (EOFError, OSError):
        process.join(CHILD_JOIN_S)
        outcome = Outcome(
            run,
            S.FAILED,
            error=f"task process exited with status {process.exitcode}",
            started=started,
        )
    else:
        if message.get("ok"):
            outcome = Outcome(
                run,
                S.SUCCEEDED,
                result=message.get("result"),
                output=message.get("output", ""),
                started=started,
            )
        else:
            outcome = Outcome(
                run,
                S.FAILED,
                error=message.get("error", "task failed"),
                tb=message.get("traceback", ""),
                output=message.get("output", ""),
                started=started,
            )
    outcome.ended = host.clock.now()
    try:
        host.complete(outcome)
    finally:
        if process.is_alive():
            process.kill()
        process.join(CHILD_JOIN_S)
        parent_conn.close()
        connection.close()
