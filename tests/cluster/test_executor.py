"""The Executor in-process: real rows, real threads and child processes, an in-memory lock backend.

Each test creates a job and one pending execution due now, claims it with ``claim_once()``, lets the
executor's starter thread run it, and polls the database (bounded) for the outcome.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import OperationalError
from django.utils import timezone

import tests.cluster.tasks  # noqa: F401 - registers the test.* tasks
from cluster.admission import REASON_FORBID, REASON_LOCK_WAIT, REASON_SUPERSEDED
from cluster.coordination.memory import MemoryBackend
from cluster.executor import (
    REASON_BLOCKER_GONE,
    REASON_CANCELLED,
    REASON_SHUT_DOWN,
    REASON_TIMEOUT,
    REASON_UNTRACKED,
    RECONCILE_AFTER_S,
    Executor,
    admitter,
    starter,
    supervisor,
)
from cluster.executor.output import install_output_capture
from cluster.logcontext import ContextFilter, JsonFormatter, set_process_context
from cluster.membership import Membership
from jobs import driver, executions, services
from jobs.models import ConcurrencyPolicy, Isolation, Job, JobExecution, Trigger
from jobs.registry import TaskContext, task
from jobs.services import SYSTEM, job_create
from jobs.states import TERMINAL_STATES, ExecutionStatus
from tests.cluster.harness import running_executor, wait_for
from tests.cluster.stepped import stepped_executor

pytestmark = pytest.mark.django_db(transaction=True)

PRESENCE_TTL_MS = 3_600_000

S = ExecutionStatus
NODE = "exec-node"
OUTCOME_TIMEOUT_S = 10.0
TEARDOWN_TIMEOUT_S = 5.0
# A 1 s task timeout is enforced within the executor's poll interval; allow for a loaded machine.
TIMEOUT_ENFORCED_WITHIN_S = 5.0
CHILD_EXIT_TIMEOUT_S = 5.0
LONG_TASK_S = 30
SLOW_SUPERVISOR_S = 30.0
PRINTED = ["first line", "second line"]
NON_UTF8_FILE_NAME = b"report-\xff.csv"


@task("test.print_parts")
def print_parts() -> None:
    """print() with several arguments writes each part separately; one print is one line."""
    print("progress:", 50, "%")
    print("no newline at the end", end="")


@task("test.print_lines")
def print_lines(lines: list[str]) -> int:
    """Print to stdout (the executor captures a task thread's prints into its output)."""
    for line in lines:
        print(line)
    return len(lines)


@task("test.log_line")
def log_line() -> None:
    """A task that logs through the logging module, as library code inside tasks does."""
    logging.getLogger("tests.task").warning("hello from the body")


@task("test.not_a_number")
def not_a_number() -> dict[str, float]:
    """A result json.dumps() accepts by default but no JSON column does."""
    return {"ratio": float("nan")}


@task("test.log_file_name", takes_context=True)
def log_file_name(context: TaskContext) -> None:
    """Log a file name that is not UTF-8 (os.fsdecode keeps the odd byte as a lone surrogate)."""
    context.log("wrote " + os.fsdecode(NON_UTF8_FILE_NAME))


@pytest.fixture
def executor() -> Iterator[Executor]:
    with running_executor(
        NODE, capacity=4, ttl_s=PRESENCE_TTL_MS / 1000, teardown_s=TEARDOWN_TIMEOUT_S
    ) as runner:
        yield runner


def make_job(name: str, task_name: str, **fields: object) -> Job:
    data = {
        "name": name,
        "task": task_name,
        "schedule_type": "interval",
        "interval_seconds": 3600,
        **fields,
    }
    return job_create(data=data, by=SYSTEM)


def submit(job: Job, **fields: object) -> JobExecution:
    """One pending execution of ``job``, due now."""
    now = timezone.now()
    return JobExecution.objects.create(
        **{
            "job": job,
            "scheduled_for": now,
            "run_after": now,
            "trigger": Trigger.MANUAL,
            "queue": job.queue,
            **fields,
        }
    )


def submit_ahead(job: Job, seconds: float = 0.5) -> JobExecution:
    """One pending execution of ``job`` due shortly (claimed ahead, admitted by the starter: a
    run already due of a job with no concurrency guard starts in its claim's transaction)."""
    due = timezone.now() + timedelta(seconds=seconds)
    return submit(job, scheduled_for=due, run_after=due)


def wait_for_status(execution: JobExecution, statuses, timeout: float = OUTCOME_TIMEOUT_S):
    statuses = {statuses} if isinstance(statuses, str) else set(statuses)

    def reached() -> JobExecution | None:
        row = JobExecution.objects.get(pk=execution.pk)
        return row if row.status in statuses else None

    return wait_for(reached, timeout, interval=0.02)


def run_to_outcome(executor: Executor, execution: JobExecution) -> JobExecution:
    assert executor.claim_once() == 1
    return wait_for_status(execution, TERMINAL_STATES)


def wait_until_running(executor: Executor, execution: JobExecution) -> None:
    wait_for_status(execution, S.RUNNING)
    wait_for(lambda: execution.pk in executor.running_ids(), OUTCOME_TIMEOUT_S)


def recorded_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


# --- outcomes ----------------------------------------------------------------------------------------


def test_a_noop_succeeds_with_its_timestamps(executor):
    execution = submit(make_job("noop-job", "noop"))

    done = run_to_outcome(executor, execution)

    assert done.status == S.SUCCEEDED
    assert done.node == NODE
    assert done.started_at is not None
    assert done.finished_at is not None
    assert done.started_at <= done.finished_at
    assert done.started_at >= done.run_after
    assert done.duration_ms == pytest.approx(
        (done.finished_at - done.started_at).total_seconds() * 1000, abs=1
    )
    assert done.result is None
    assert (done.error, done.traceback) == ("", "")


def test_a_task_result_is_stored(executor, tmp_path):
    execution = submit(make_job("record", "test.record", kwargs={"path": str(tmp_path / "r")}))

    done = run_to_outcome(executor, execution)

    assert done.status == S.SUCCEEDED
    assert done.result == {"pid": os.getpid()}  # thread isolation: this process
    assert recorded_ids(tmp_path / "r") == [execution.pk]


def test_enqueued_runs_call_the_task_with_their_own_arguments(executor, tmp_path):
    job = make_job("enqueued", "test.record", kwargs={"path": str(tmp_path / "job")})
    runs = services.runs_enqueue(
        job_id=job.pk,
        items=[{"kwargs": {"path": str(tmp_path / "own")}}, {}],
        by=SYSTEM,
    )
    assert executor.claim_once() == 2
    for run in runs:
        assert wait_for_status(run, TERMINAL_STATES).status == S.SUCCEEDED
    assert recorded_ids(tmp_path / "own") == [runs[0].pk]
    assert recorded_ids(tmp_path / "job") == [runs[1].pk]


def test_a_failing_task_is_failed_with_error_and_traceback(executor):
    execution = submit(make_job("fail", "test.fail", kwargs={"message": "kaput"}))

    done = run_to_outcome(executor, execution)

    assert done.status == S.FAILED
    assert done.error == "RuntimeError: kaput"
    assert "Traceback (most recent call last)" in done.traceback
    assert "raise RuntimeError(message)" in done.traceback
    assert done.finished_at is not None
    assert JobExecution.objects.count() == 1  # max_retries 0: no retry


def test_a_failing_task_with_retries_gets_a_retry(executor):
    job = make_job("fail-retry", "test.fail", max_retries=2, retry_jitter=False)
    execution = submit(job)

    done = run_to_outcome(executor, execution)

    assert done.status == S.FAILED
    retry = JobExecution.objects.get(job=job, attempt=2)
    assert retry.status == S.RETRY_SCHEDULED
    assert retry.run_after == done.finished_at + timedelta(seconds=job.retry_backoff_base)


def test_a_task_printing_to_stdout_has_its_output_captured(executor, monkeypatch):
    # pytest puts its own capture back into sys.stdout at every test phase, which unhooks the
    # executor's per-thread stdout router (installed once per process, at the first Executor).
    # A node process has no such swapping; put the router back for this test only.
    monkeypatch.setattr(sys, "stdout", install_output_capture())
    execution = submit(make_job("printer", "test.print_lines", kwargs={"lines": PRINTED}))

    done = run_to_outcome(executor, execution)

    assert done.status == S.SUCCEEDED
    assert done.result == len(PRINTED)
    assert done.output.splitlines() == PRINTED


def test_a_multi_argument_print_is_one_line(executor, monkeypatch):
    monkeypatch.setattr(sys, "stdout", install_output_capture())
    execution = submit(make_job("parts", "test.print_parts"))

    done = run_to_outcome(executor, execution)

    assert done.output.splitlines() == ["progress: 50 %", "no newline at the end"]


# --- the self-fence: nothing starts without a confirmed claim --------------------------------------------


def started_executor(
    backend: MemoryBackend,
    node_id: str,
    stop: threading.Event,
    *,
    capacity: int,
    ttl_s: float = PRESENCE_TTL_MS / 1000,
    heartbeat_s: float = 1.0,
    margin_s: float | None = None,
) -> Executor:
    """An executor on ``backend`` whose membership was confirmed once, its starter running until
    ``stop``."""
    extra = {} if margin_s is None else {"margin_s": margin_s}
    membership = Membership(backend, node_id, ttl_s=ttl_s, **extra)
    membership.renew({})
    runner = Executor(
        node_id=node_id,
        queues=["default"],
        capacity=capacity,
        backend=backend,
        membership=membership,
        heartbeat_s=heartbeat_s,
    )
    threading.Thread(target=runner.run_starter, args=(stop,), daemon=True).start()
    return runner


def lapsing_executor(ttl_s: float) -> tuple[Executor, Membership, threading.Event]:
    """An executor whose membership was confirmed once and is never renewed again."""
    stop = threading.Event()
    runner = started_executor(
        MemoryBackend(),
        "fenced-node",
        stop,
        capacity=4,
        ttl_s=ttl_s,
        heartbeat_s=ttl_s / 4,
        margin_s=0.1,
    )
    return runner, runner.membership, stop


@pytest.mark.parametrize("policy", [ConcurrencyPolicy.FORBID, ConcurrencyPolicy.ALLOW])
def test_a_run_whose_membership_lapsed_before_its_instant_is_handed_back(tmp_path, policy):
    """Claimed while the membership held; by the due instant it no longer does (the node was
    frozen, or cut off from the coordination backend): the body does not start, the run goes back
    to the queue for another node."""
    runner, membership, stop = lapsing_executor(ttl_s=0.6)
    try:
        path = tmp_path / "r"
        job = make_job(
            "fenced", "test.record", kwargs={"path": str(path)}, concurrency_policy=policy
        )
        due = timezone.now() + timedelta(seconds=0.8)
        execution = submit(job, scheduled_for=due, run_after=due)
        assert runner.claim_once() == 1

        wait_for(lambda: runner.load == 0, OUTCOME_TIMEOUT_S)
        # The hand-back is written just after the run stops counting against capacity.
        wait_for(
            lambda: JobExecution.objects.filter(pk=execution.pk, status=S.PENDING).exists(),
            OUTCOME_TIMEOUT_S,
        )

        row = JobExecution.objects.get(pk=execution.pk)
        assert (row.status, row.claim_token, row.node, row.started_at) == (
            S.PENDING,
            None,
            "",
            None,
        )
        assert recorded_ids(path) == []
        assert not membership.confirmed()
        assert runner.claim_once() == 0  # nothing is claimed that could not start
    finally:
        stop.set()


def test_a_lapse_found_at_renewal_voids_earlier_claims():
    """The presence expired while the node was away and a renewal brings it back: what was claimed
    before may have been taken by the cluster, so it is given up even though the membership is
    confirmed again; nothing of it starts at its instant. Stepped on a settable clock."""
    executor, runner, clock, backend = stepped_executor("voiding-node", capacity=4)
    job = make_job("voided", "noop")
    due = timezone.now() + timedelta(seconds=0.9)
    execution = submit(job, scheduled_for=due, run_after=due)
    assert executor.claim_once() == 1
    backend.store.nodes["voiding-node"] = (0, {})  # the presence expired meanwhile
    assert executor.membership.renew({}) is False  # the lapse is seen: the epoch moves on
    assert executor.membership.confirmed()

    clock.advance(0.9)  # its instant: admitted, its body asks the self-fence (the test plays it)
    executor.starter_step()
    (run,) = runner.runs
    assert not executor.may_start(run)  # claimed under the old epoch: given up, not started
    row = JobExecution.objects.get(pk=execution.pk)
    assert (row.status, row.claim_token, row.started_at) == (S.PENDING, None, None)
    assert executor.load == 0 and executor.body_ids() == []


# --- timeouts ----------------------------------------------------------------------------------------


def test_thread_isolation_times_out_an_overrunning_task(executor):
    job = make_job("slow", "sleep", kwargs={"seconds": LONG_TASK_S}, timeout_seconds=1)
    execution = submit(job)
    started = time.monotonic()

    done = run_to_outcome(executor, execution)

    assert time.monotonic() - started < TIMEOUT_ENFORCED_WITHIN_S
    assert done.status == S.TIMED_OUT
    assert done.error == REASON_TIMEOUT.format(seconds=1)
    assert done.reason == REASON_TIMEOUT.format(seconds=1)


def test_a_process_run_cancelled_before_its_instant_never_starts_its_child(
    executor, tmp_path, monkeypatch
):
    """Cancelled between admission (marked running ahead of its instant) and its instant: the run
    is recorded cancelled at once and its body must not start a child afterwards (it would run
    without its lock and without supervision)."""
    monkeypatch.setenv("SCHEDULER_TASK_MODULES", "tests.cluster.tasks")
    monkeypatch.setattr(starter, "PREPARE_AHEAD_S", 0.8)  # a wide window to cancel in
    path = tmp_path / "r"
    job = make_job("cancel-early", "test.record", kwargs={"path": str(path)}, isolation="process")
    due = timezone.now() + timedelta(seconds=0.9)  # within the claim's look-ahead (1 s)
    execution = submit(job, scheduled_for=due, run_after=due)
    assert executor.claim_once() == 1
    wait_for_status(execution, S.RUNNING)
    services.execution_cancel(execution_id=execution.pk, by=services.SYSTEM)
    assert executor.apply_cancel_requests() == 1
    done = wait_for_status(execution, TERMINAL_STATES)
    assert done.status == S.CANCELLED
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 1.0)
    assert recorded_ids(path) == []
    assert not multiprocessing.active_children()


def test_process_isolation_kills_the_child_on_timeout(executor, tmp_path, monkeypatch):
    # The child is a fresh interpreter: it finds the test tasks through the settings.
    monkeypatch.setenv("SCHEDULER_TASK_MODULES", "tests.cluster.tasks")
    pid_file = tmp_path / "child.pid"
    job = make_job(
        "hung",
        "test.hang",
        kwargs={"pid_file": str(pid_file)},
        isolation=Isolation.PROCESS,
        timeout_seconds=1,
    )
    execution = submit(job)
    before = {child.pid for child in multiprocessing.active_children()}
    children: set[int] = set()
    started = time.monotonic()
    assert executor.claim_once() == 1

    def finished() -> JobExecution | None:
        # Note every child this run starts, whether or not it got to write its pid file.
        children.update(c.pid for c in multiprocessing.active_children() if c.pid not in before)
        row = JobExecution.objects.get(pk=execution.pk)
        return row if row.status in TERMINAL_STATES else None

    done = wait_for(finished, OUTCOME_TIMEOUT_S, interval=0.02)

    assert done.status == S.TIMED_OUT
    assert done.error == REASON_TIMEOUT.format(seconds=1)
    assert time.monotonic() - started < TIMEOUT_ENFORCED_WITHIN_S + CHILD_EXIT_TIMEOUT_S
    if pid_file.exists():
        children.add(int(pid_file.read_text()))
    assert children, "no child process was seen"

    def all_gone() -> bool:
        for pid in children:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            return False
        return True

    wait_for(all_gone, CHILD_EXIT_TIMEOUT_S)
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_process_isolation_runs_the_task_in_a_child(executor, tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDULER_TASK_MODULES", "tests.cluster.tasks")
    path = tmp_path / "r"
    job = make_job("child", "test.record", kwargs={"path": str(path)}, isolation=Isolation.PROCESS)
    execution = submit(job)

    done = run_to_outcome(executor, execution)

    assert done.status == S.SUCCEEDED, done.error
    assert done.result["pid"] != os.getpid()
    assert recorded_ids(path) == [execution.pk]


# --- cancel --------------------------------------------------------------------------------------------


def test_a_cancel_request_cancels_the_running_execution(executor, tmp_path):
    job = make_job(
        "cancel-me",
        "test.record_and_sleep",
        kwargs={"path": str(tmp_path / "r"), "seconds": LONG_TASK_S},
    )
    execution = submit(job)
    assert executor.claim_once() == 1
    wait_until_running(executor, execution)
    started = time.monotonic()

    JobExecution.objects.filter(pk=execution.pk).update(cancel_requested=True)
    assert executor.apply_cancel_requests() == 1

    done = wait_for_status(execution, TERMINAL_STATES)
    assert done.status == S.CANCELLED
    assert done.reason == REASON_CANCELLED
    assert done.finished_at is not None
    assert time.monotonic() - started < TIMEOUT_ENFORCED_WITHIN_S
    assert recorded_ids(tmp_path / "r") == [execution.pk]  # it had started
    wait_for(lambda: executor.running_count == 0, OUTCOME_TIMEOUT_S)


def test_a_cancel_request_kills_a_process_isolated_run(executor, tmp_path, monkeypatch):
    # The outcome must not depend on when the supervisor's next pass comes: make it come late
    # (its current short wait ends long before the cancel below).
    monkeypatch.setattr(supervisor, "SUPERVISE_INTERVAL_S", SLOW_SUPERVISOR_S)
    monkeypatch.setenv("SCHEDULER_TASK_MODULES", "tests.cluster.tasks")
    pid_file = tmp_path / "child.pid"
    job = make_job(
        "cancel-child",
        "test.hang",
        kwargs={"pid_file": str(pid_file)},
        isolation=Isolation.PROCESS,
        max_retries=1,
    )
    execution = submit(job)
    assert executor.claim_once() == 1
    wait_until_running(executor, execution)
    wait_for(
        lambda: (
            pid_file.exists() or JobExecution.objects.get(pk=execution.pk).status in TERMINAL_STATES
        ),
        OUTCOME_TIMEOUT_S,
    )
    assert pid_file.exists(), JobExecution.objects.get(pk=execution.pk).error
    pid = int(pid_file.read_text())

    JobExecution.objects.filter(pk=execution.pk).update(cancel_requested=True)
    assert executor.apply_cancel_requests() == 1

    done = wait_for_status(execution, TERMINAL_STATES)
    assert (done.status, done.reason) == (S.CANCELLED, REASON_CANCELLED)
    assert not JobExecution.objects.filter(job=job, attempt=2).exists()  # a cancel is not retried
    wait_for(lambda: executor.running_count == 0, OUTCOME_TIMEOUT_S)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_apply_cancel_requests_ignores_runs_nobody_asked_to_cancel():
    """A running run nobody asked to cancel is not signalled, and the supervisor does not end it.
    Stepped: its body never starts (the test plays it), so nothing but a wrong signal could end it."""
    executor, runner, clock, _ = stepped_executor("keep-node", capacity=4)
    execution = submit(make_job("keep-me", "noop", timeout_seconds=None))
    assert executor.claim_once() == 1
    executor.starter_step()
    (run,) = runner.runs
    assert executor.apply_cancel_requests() == 0
    clock.advance(60)
    assert executor.supervise_once() == 0
    assert not run.cancel_event.is_set() and not run.completed
    assert JobExecution.objects.get(pk=execution.pk).status == S.RUNNING


# --- concurrency at start -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "other_presence_ms", "other_lock_ms", "status", "reason", "other_status"),
    [
        # The other run's node renews its presence (a TTL like ours) and its body holds the job
        # lock: that run really is active.
        (
            ConcurrencyPolicy.FORBID,
            PRESENCE_TTL_MS,
            PRESENCE_TTL_MS,
            S.SKIPPED,
            REASON_FORBID,
            S.RUNNING,
        ),
        # Its node's presence expired (and its lock with it): the run is not active, it is ended
        # as lost on the spot.
        (ConcurrencyPolicy.FORBID, None, None, S.SUCCEEDED, "", S.LOST),
        # Its node stopped renewing (about to expire): waited for, then ended as lost.
        (ConcurrencyPolicy.FORBID, 400, 450, S.SUCCEEDED, "", S.LOST),
        # Its node is alive but the body has ended and released the lock; the outcome is not
        # written yet (a finisher behind, a node frozen just then): not active, no skip.
        (ConcurrencyPolicy.FORBID, PRESENCE_TTL_MS, None, S.SUCCEEDED, "", S.RUNNING),
        (ConcurrencyPolicy.ALLOW, PRESENCE_TTL_MS, None, S.SUCCEEDED, "", S.RUNNING),
    ],
    ids=["forbid-live", "forbid-gone", "forbid-expiring", "forbid-ended-not-recorded", "allow"],
)
def test_a_run_while_another_of_the_job_is_running(
    executor, tmp_path, policy, other_presence_ms, other_lock_ms, status, reason, other_status
):
    path = tmp_path / "r"
    job = make_job("overlap", "test.record", kwargs={"path": str(path)}, concurrency_policy=policy)
    if other_lock_ms is not None:
        assert executor.backend.acquire_lock(f"job:{job.pk}", other_lock_ms) is not None
    now = timezone.now()
    # Another node's run of the same job, started well before this one became due.
    other = JobExecution.objects.create(
        job=job,
        scheduled_for=now - timedelta(seconds=60),
        run_after=now - timedelta(seconds=60),
        status=S.RUNNING,
        started_at=now - timedelta(seconds=60),
        node="other-node",
        claim_token="other-token",
    )
    if other_presence_ms is not None:
        # Its node's presence lists the body as running while its lock is held (a renewal that
        # comes after this run's instant: the listing is stamped a minute ahead).
        presence = (
            {"bodies": [other.pk], "bodies_at_ms": int((now.timestamp() + 60) * 1000)}
            if other_lock_ms is not None
            else {}
        )
        executor.backend.heartbeat("other-node", other_presence_ms, presence)
    execution = submit(job)

    done = run_to_outcome(executor, execution)

    assert (done.status, done.reason) == (status, reason)
    assert recorded_ids(path) == ([execution.pk] if status == S.SUCCEEDED else [])
    other.refresh_from_db()
    assert other.status == other_status
    if other_status == S.LOST:
        assert other.reason == REASON_BLOCKER_GONE.format(node="other-node")


def test_a_line_logged_by_a_task_carries_node_term_job_and_execution(executor):
    """The console handler's ContextFilter fills in the process's node and term and the thread's
    execution and job: a line the task body logs carries them, in JSON and in text."""
    stream = io.StringIO()
    json_handler = logging.StreamHandler(stream)
    json_handler.addFilter(ContextFilter())
    json_handler.setFormatter(JsonFormatter())
    text_stream = io.StringIO()
    text_handler = logging.StreamHandler(text_stream)
    text_handler.addFilter(ContextFilter())
    text_handler.setFormatter(logging.Formatter("%(message)s%(context)s"))
    task_logger = logging.getLogger("tests.task")
    task_logger.addHandler(json_handler)
    task_logger.addHandler(text_handler)
    set_process_context(node=NODE, term=9)
    try:
        job = make_job("logs", "test.log_line")
        done = run_to_outcome(executor, submit(job))
    finally:
        set_process_context(node=None, term=None)
        task_logger.removeHandler(json_handler)
        task_logger.removeHandler(text_handler)
    assert done.status == S.SUCCEEDED
    line = json.loads(stream.getvalue().splitlines()[0])
    assert (line["msg"], line["node"], line["term"]) == ("hello from the body", NODE, 9)
    assert (line["execution"], line["job"]) == (done.pk, job.pk)
    assert text_stream.getvalue().splitlines()[0] == (
        f"hello from the body [node={NODE} term=9 job={job.pk} execution={done.pk}]"
    )


def test_admission_batches_stuck_on_the_database_hold_up_no_later_batch(
    executor, tmp_path, monkeypatch
):
    """Three admission batches hang (a connection cut mid-query waits for the read timeout): a
    run due after them is still admitted and started on time, in a thread of its own."""
    release = threading.Event()
    real = executor.admitter.admit_batch

    def admit(batch, *rest):
        if any(item.execution.job.name.startswith("stuck") for item in batch):
            release.wait(OUTCOME_TIMEOUT_S)
        return real(batch, *rest)

    monkeypatch.setattr(executor.admitter, "admit_batch", admit)
    path = tmp_path / "r"
    now = timezone.now()
    stuck = []
    for k in range(3):  # more than the two threads admission once had
        due = now + timedelta(seconds=0.3 * k)  # separate batches (0.25 s prepare window)
        stuck.append(submit(make_job(f"stuck-{k}", "noop"), scheduled_for=due, run_after=due))
    due = now + timedelta(seconds=0.95)
    free = submit(
        make_job("free", "test.record", kwargs={"path": str(path)}),
        scheduled_for=due,
        run_after=due,
    )
    try:
        assert executor.claim_once() == len(stuck) + 1
        done = wait_for_status(free, TERMINAL_STATES)
        assert done.status == S.SUCCEEDED and recorded_ids(path) == [free.pk]
        assert all(JobExecution.objects.get(pk=e.pk).status == S.PENDING for e in stuck)
    finally:
        release.set()
    for execution in stuck:
        assert wait_for_status(execution, TERMINAL_STATES).status == S.SUCCEEDED


def test_allow_runs_two_executions_of_one_job_side_by_side(executor, tmp_path):
    path = tmp_path / "r"
    job = make_job(
        "side-by-side",
        "test.record_and_sleep",
        kwargs={"path": str(path), "seconds": 1},
        concurrency_policy=ConcurrencyPolicy.ALLOW,
    )
    now = timezone.now()
    first = submit(job)
    second = JobExecution.objects.create(
        job=job, scheduled_for=now + timedelta(seconds=1), run_after=now, queue=job.queue
    )

    assert executor.claim_once() == 2
    wait_for(lambda: executor.running_count == 2, OUTCOME_TIMEOUT_S)
    done = [wait_for_status(e, TERMINAL_STATES) for e in (first, second)]

    assert [d.status for d in done] == [S.SUCCEEDED, S.SUCCEEDED]
    assert sorted(recorded_ids(path)) == sorted([first.pk, second.pk])


# --- hand back on shutdown --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_name", "kwargs", "max_retries", "expect_retry"),
    [
        # test.hang ignores the cancel flag: the run cannot end by itself during the hand-back.
        ("test.hang", {"pid_file": "unused", "seconds": LONG_TASK_S}, 0, False),
        ("test.hang", {"pid_file": "unused", "seconds": LONG_TASK_S}, 1, True),
        # sleep stops as soon as it is cancelled: its own (late) outcome must not win.
        ("sleep", {"seconds": LONG_TASK_S}, 1, True),
    ],
    ids=["ignores-cancel-no-retry", "ignores-cancel-retry", "honours-cancel-retry"],
)
def test_hand_back_running_marks_the_run_lost_and_retries_it(
    executor, tmp_path, task_name, kwargs, max_retries, expect_retry
):
    if "pid_file" in kwargs:
        kwargs = {**kwargs, "pid_file": str(tmp_path / "pid")}
    job = make_job(
        "hand-back", task_name, kwargs=kwargs, max_retries=max_retries, retry_jitter=False
    )
    execution = submit(job)
    assert executor.claim_once() == 1
    wait_until_running(executor, execution)

    assert executor.hand_back_running() == 1

    assert executor.running_count == 0
    assert executor.wait_idle(OUTCOME_TIMEOUT_S)  # anything the run still reports is written
    done = JobExecution.objects.get(pk=execution.pk)
    assert done.status == S.LOST
    assert done.reason == REASON_SHUT_DOWN.format(node=NODE)
    retries = list(JobExecution.objects.filter(job=job, attempt=2))
    assert len(retries) == int(expect_retry)
    if expect_retry:
        assert retries[0].status == S.RETRY_SCHEDULED


# --- outcomes that cannot be stored as they are ------------------------------------------------------


@pytest.mark.parametrize(
    "odd_task",
    [
        "test.not_a_number",
        "test.log_file_name",
    ],
    ids=["nan-result", "non-utf8-output"],
)
def test_an_odd_outcome_is_recorded_and_does_not_hold_up_its_batch(executor, odd_task):
    now = timezone.now()
    due = now + timedelta(seconds=0.5)  # both due together: their outcomes share one write batch
    odd = make_job("odd", odd_task)
    plain = make_job("plain", "noop")
    executions = [
        JobExecution.objects.create(
            job=job, scheduled_for=due, run_after=due, trigger=Trigger.MANUAL, queue=job.queue
        )
        for job in (odd, plain)
    ]
    assert executor.claim_once() == 2

    # Claimed, run and every outcome written (or given up on).
    wait_for(lambda: executor.load == 0, OUTCOME_TIMEOUT_S)
    assert executor.wait_idle(OUTCOME_TIMEOUT_S)

    done = [JobExecution.objects.get(pk=e.pk) for e in executions]
    assert [d.status for d in done] == [S.SUCCEEDED, S.SUCCEEDED]


# --- the self-audit: nothing held that is not tracked --------------------------------------------------


def test_reconcile_gives_back_rows_this_node_holds_but_does_not_track(executor):
    job = make_job("audited", "noop")
    now = timezone.now()
    old = now - timedelta(seconds=RECONCILE_AFTER_S + 5)
    claim = submit(job, node=NODE, claim_token="lost-claim", claimed_at=old)
    running = submit(
        job,
        scheduled_for=now - timedelta(seconds=1),
        status=S.RUNNING,
        node=NODE,
        claim_token="lost-run",
        claimed_at=old,
        started_at=old,
    )
    fresh = submit(  # a claim in flight: too young to be a leftover
        job,
        scheduled_for=now - timedelta(seconds=2),
        node=NODE,
        claim_token="fresh",
        claimed_at=now,
    )
    elsewhere = submit(  # another node's: not ours to audit
        job,
        scheduled_for=now - timedelta(seconds=3),
        node="other-node",
        claim_token="theirs",
        claimed_at=old,
    )
    executor.books.launched[running.pk] = None  # its body may have run here (then lost track)

    assert executor.reconcile(now=now) == (1, 1)

    claim.refresh_from_db()
    assert (claim.status, claim.claim_token, claim.node) == (S.PENDING, None, "")
    running.refresh_from_db()
    assert (running.status, running.reason) == (S.LOST, REASON_UNTRACKED.format(node=NODE))
    for row in (fresh, elsewhere):
        row.refresh_from_db()
        assert row.claim_token is not None


def test_a_failed_admission_leaks_no_capacity(executor, monkeypatch):
    """The database stays away: each admission of the run fails. After ADMISSION_ATTEMPTS the run
    stops counting against capacity (a node that leaks them ends up claiming nothing at all), and
    the audit gives the row back."""
    monkeypatch.setattr(admitter, "ADMISSION_RETRY_S", 0.01)
    monkeypatch.setattr(admitter, "ADMISSION_ATTEMPTS", 3)
    job = make_job("unlucky", "noop")
    execution = submit_ahead(job)
    calls = []

    def failing_start_batch(*args, **kwargs):
        calls.append(1)
        raise OperationalError("(2013, 'Lost connection to server during query')")

    monkeypatch.setattr(executions, "start_batch", failing_start_batch)
    assert executor.claim_once() == 1
    wait_for(lambda: len(calls) == 3 and executor.load == 0, OUTCOME_TIMEOUT_S)
    monkeypatch.undo()

    assert executor.reconcile(now=timezone.now() + timedelta(seconds=RECONCILE_AFTER_S + 1)) == (
        1,
        0,
    )
    row = JobExecution.objects.get(pk=execution.pk)
    assert (row.status, row.claim_token) == (S.PENDING, None)
    done = run_to_outcome(executor, row)
    assert done.status == S.SUCCEEDED


def test_a_run_whose_admission_failed_starts_once_the_database_answers(executor, monkeypatch):
    """The database goes away in the middle of a batch, briefly: the run stays tracked and is
    admitted again ADMISSION_RETRY_S later; it starts then, not after the audit's
    RECONCILE_AFTER_S (every later fire of a forbid job waited behind such a claim)."""
    job = make_job("brief-outage", "noop")
    execution = submit_ahead(job)
    calls = []
    real_start_batch = executions.start_batch

    def flaky_start_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise OperationalError("(2013, 'Lost connection to server during query')")
        return real_start_batch(*args, **kwargs)

    monkeypatch.setattr(executions, "start_batch", flaky_start_batch)
    assert executor.claim_once() == 1
    done = wait_for_status(execution, TERMINAL_STATES)
    assert done.status == S.SUCCEEDED
    assert len(calls) == 3
    assert (done.started_at - done.claimed_at).total_seconds() < RECONCILE_AFTER_S


def test_runs_waiting_their_turn_do_not_hold_the_capacity_the_older_fire_needs(tmp_path):
    """A node of capacity 1 holds a newer fire of a forbid job that waits for an older one (which
    came back to the queue, e.g. from a dead node). The waiting run must not fill the node: the
    older fire is claimed and runs, then the newer one."""
    stop = threading.Event()
    runner = started_executor(MemoryBackend(), "small-node", stop, capacity=1)
    try:
        path = tmp_path / "r"
        # run_all: every late fire runs, in order (run_once would keep only the newest).
        job = make_job(
            "in-order",
            "test.record",
            kwargs={"path": str(path)},
            misfire_policy="run_all",
            run_all_max=10,
        )
        now = timezone.now()
        # The older fire exists from the start (claimed by a node that then died), so the newer
        # one's admission, however fast, always finds it: it is handed back only after the
        # newer fire is claimed. (Submitting it after the claim raced the starter: on a loaded
        # machine the newer fire had started before the older one existed.)
        older = submit(
            job,
            scheduled_for=now - timedelta(seconds=1),
            run_after=now - timedelta(seconds=1),
            trigger=Trigger.SCHEDULE,
            node="dead-node",
            claim_token="dead-node-claim",
            claimed_at=now - timedelta(seconds=1),
        )
        newer = submit(job, scheduled_for=now, run_after=now, trigger=Trigger.SCHEDULE)
        assert runner.claim_once() == 1
        assert executions.hand_back_nodes(["dead-node"]) == 1
        # The node's claim loop: the newer fire gives its claim back while the older one is
        # unclaimed, and both are claimed again, oldest first.
        wait_for(
            lambda: (
                runner.claim_once() >= 0
                and JobExecution.objects.filter(pk=newer.pk, status__in=TERMINAL_STATES).exists()
            ),
            OUTCOME_TIMEOUT_S,
        )
        for execution in (older, newer):
            assert wait_for_status(execution, TERMINAL_STATES).status == S.SUCCEEDED
        assert recorded_ids(path) == [older.pk, newer.pk]
    finally:
        stop.set()


def test_nodes_full_of_waiting_runs_still_claim_the_older_fire_they_wait_for(tmp_path):
    """Two nodes of capacity 1 hold, in their waiting rooms, every newer fire of a forbid job
    while an older fire is claimed elsewhere. That older fire then comes back to the queue (its
    node's claims handed back after a database outage, or reaped). Waiting runs must not keep
    both nodes full: they go back, the older fire is claimed and runs first, then the rest in
    order. Before the fix both nodes stayed full until the job's misfire grace (the chaos run
    saw 16 s of nothing claimed after a database outage)."""
    backend = MemoryBackend()
    stop = threading.Event()
    runners = [started_executor(backend, name, stop, capacity=1) for name in ("wait-a", "wait-b")]
    try:
        path = tmp_path / "r"
        job = make_job(
            "in-order-2",
            "test.record",
            kwargs={"path": str(path)},
            misfire_policy="run_all",
            run_all_max=10,
        )
        now = timezone.now()
        older = submit(
            job,
            scheduled_for=now - timedelta(seconds=5),
            run_after=now - timedelta(seconds=5),
            trigger=Trigger.SCHEDULE,
            node="elsewhere",
            claim_token="elsewhere-1",
            claimed_at=now,
        )
        newer = [
            submit(
                job,
                scheduled_for=now - timedelta(seconds=4 - k),
                run_after=now - timedelta(seconds=4 - k),
                trigger=Trigger.SCHEDULE,
            )
            for k in range(4)
        ]
        # Each node claims until full: one run counted against capacity, one more in the
        # waiting room's own budget.
        for runner in runners:
            wait_for(lambda r=runner: r.claim_once() == 0 and len(r.books.waiting) == 2, 5)
        assert not JobExecution.objects.filter(status=S.PENDING, claim_token__isnull=True).exists()

        assert executions.hand_back(older)  # its node gave it up
        deadline = time.monotonic() + OUTCOME_TIMEOUT_S
        while (
            time.monotonic() < deadline
            and not JobExecution.objects.filter(pk=newer[-1].pk, status=S.SUCCEEDED).exists()
        ):
            for runner in runners:
                runner.claim_once()
            time.sleep(0.05)
        statuses = [wait_for_status(e, TERMINAL_STATES).status for e in [older, *newer]]
        assert statuses == [S.SUCCEEDED] * 5
        assert recorded_ids(path) == [e.pk for e in [older, *newer]]
    finally:
        stop.set()


def test_outcomes_waiting_for_the_finisher_hold_capacity_only_beyond_a_budget(executor):
    """Bodies that have ended do not run and hold no lock: a finisher a little behind must not
    stop the node claiming. Up to ``capacity`` unwritten outcomes cost nothing; more do."""
    with executor.books.lock:
        executor.books.unwritten = executor.capacity
    assert executor.load == 0
    with executor.books.lock:
        executor.books.unwritten = executor.capacity + 3
    assert executor.load == 3
    with executor.books.lock:
        executor.books.unwritten = 0


def test_a_written_outcome_wakes_the_claim_loop(executor):
    woken = threading.Event()
    executor.on_room = woken.set
    job = make_job("wakes", "noop")
    execution = submit(job)
    assert executor.claim_once() == 1
    assert wait_for_status(execution, TERMINAL_STATES).status == S.SUCCEEDED
    assert woken.wait(OUTCOME_TIMEOUT_S)


def running_elsewhere(job: Job, *, at: datetime, node: str) -> JobExecution:
    """A run of ``job`` another node claimed and marked running at ``at`` (its row only)."""
    return JobExecution.objects.create(
        job=job,
        scheduled_for=at,
        run_after=at,
        status=S.RUNNING,
        started_at=at,
        node=node,
        claim_token=f"{node}-token",
    )


def test_a_run_marked_running_ahead_of_an_instant_its_node_did_not_live_to_see_is_not_a_blocker(
    executor, tmp_path
):
    """Another node marked its run running (write-ahead, for an instant after its last presence
    renewal) and was SIGKILLed before that instant: its presence and job lock have not expired
    yet, but no body runs. That run is no proof that the job is busy: this run is not skipped as
    "previous run still active" (the chaos run found one such skip); it waits (here, with a
    presence that never expires, until its misfire grace)."""
    path = tmp_path / "r"
    job = make_job(
        "ahead-of-death", "test.record", kwargs={"path": str(path)}, misfire_grace_seconds=1
    )
    executor.backend.heartbeat("dead-node", PRESENCE_TTL_MS, {})  # its last renewal: now
    assert executor.backend.acquire_lock(f"job:{job.pk}", PRESENCE_TTL_MS) is not None
    now = timezone.now()
    planned = now + timedelta(seconds=0.1)  # after that renewal
    running_elsewhere(job, at=planned, node="dead-node")
    due = now + timedelta(seconds=0.2)
    execution = submit(job, scheduled_for=due, run_after=due)

    done = run_to_outcome(executor, execution)

    assert done.status == S.SKIPPED
    assert done.reason == REASON_LOCK_WAIT.format(grace=1)
    assert recorded_ids(path) == []


def test_a_run_whose_job_lock_is_free_waits_while_the_live_nodes_cannot_be_read(
    executor, tmp_path, monkeypatch
):
    """Another node's run of a forbid job is still running (its body on, its row running), but
    that node gave the job lock up (its membership ran out in a coordination outage), and the live
    nodes cannot be read (the store is restarting). The lock alone is no proof that no body of the
    job runs: this run waits, as behind a node gone silent, and never starts beside that body (a
    chaos run started one 3 ms before the other body ended)."""
    from cluster.coordination import CoordinationError

    path = tmp_path / "r"
    job = make_job(
        "live-unread", "test.record", kwargs={"path": str(path)}, misfire_grace_seconds=1
    )
    started = timezone.now() - timedelta(seconds=0.5)
    running_elsewhere(job, at=started, node="other-node")

    def unreadable() -> dict:
        raise CoordinationError("redis live_nodes failed: Connection refused")

    monkeypatch.setattr(executor.backend, "live_nodes", unreadable)
    execution = submit(job)

    done = run_to_outcome(executor, execution)

    assert done.status == S.SKIPPED
    assert done.reason == REASON_LOCK_WAIT.format(grace=1)
    assert recorded_ids(path) == []


# --- the claim's own start: runs already due that need nothing looked at --------------------------


def test_a_due_run_of_an_unguarded_job_is_running_when_its_claim_returns(executor, monkeypatch):
    """One transaction claims it and marks it running (no second commit, no hand-over to the
    starter); the body still passes the self-fence and runs once."""
    admitted: list[object] = []
    monkeypatch.setattr(executor.starter, "_dispatch", admitted.append)
    execution = submit(make_job("at-claim", "noop", concurrency_policy=ConcurrencyPolicy.ALLOW))
    assert executor.claim_once() == 1
    row = JobExecution.objects.get(pk=execution.pk)
    assert row.status in (S.RUNNING, S.SUCCEEDED)
    done = wait_for_status(execution, TERMINAL_STATES)
    assert admitted == []  # the starter never saw it
    assert done.status == S.SUCCEEDED
    assert done.attempt == 1 and JobExecution.objects.filter(job=execution.job).count() == 1


@pytest.mark.parametrize(
    "policy", [ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE], ids=lambda p: p
)
def test_a_guarded_jobs_run_waits_for_the_starter_to_admit_it(executor, monkeypatch, policy):
    """forbid and buffer_one look at the job lock and other runs first: claimed, not started."""
    admitted = threading.Event()
    monkeypatch.setattr(executor.starter, "_dispatch", lambda batch: admitted.set())
    execution = submit(make_job(f"guarded-{policy}", "noop", concurrency_policy=policy))
    assert executor.claim_once() == 1
    assert admitted.wait(OUTCOME_TIMEOUT_S)
    row = JobExecution.objects.get(pk=execution.pk)
    assert (row.status, row.node) == (S.PENDING, NODE)
    monkeypatch.undo()
    executor.release_unstarted()


def test_a_stale_fire_is_not_started_by_its_claim_but_skipped(executor):
    """A scheduled fire past its misfire grace is a skip, whoever admits it."""
    job = make_job(
        "stale-at-claim",
        "noop",
        concurrency_policy=ConcurrencyPolicy.ALLOW,
        misfire_grace_seconds=1,
    )
    old = timezone.now() - timedelta(seconds=30)
    execution = submit(
        job, scheduled_for=old, run_after=old, created_at=old, trigger=Trigger.SCHEDULE
    )
    JobExecution.objects.filter(pk=execution.pk).update(created_at=old)
    assert executor.claim_once() == 1
    done = wait_for_status(execution, TERMINAL_STATES)
    assert done.status == S.SKIPPED and done.started_at is None


@pytest.mark.parametrize(
    ("policy", "misfire", "kept"),
    [
        (ConcurrencyPolicy.FORBID, "run_once", 1),
        (ConcurrencyPolicy.FORBID, "skip", 1),
        (ConcurrencyPolicy.FORBID, "run_all", 3),
        (ConcurrencyPolicy.ALLOW, "run_once", 1),
    ],
)
def test_a_backlog_of_fires_left_by_an_outage_collapses_to_what_the_policy_keeps(
    tmp_path, policy, misfire, kept
):
    """Fires written on time while no node could run them (the leader kept writing; the workers
    were cut off) are due and unstarted together. The policy keeps the newest (``run_all``: the
    newest ``run_all_max``); the older ones are skipped as superseded at once, not run one after
    the other a slot late each (a forbid job would stay as far behind as the outage was long)."""
    stop = threading.Event()
    runner = started_executor(MemoryBackend(), "backlog-node", stop, capacity=4)
    try:
        path = tmp_path / "r"
        job = make_job(
            f"backlog-{policy}-{misfire}",
            "test.record",
            kwargs={"path": str(path)},
            interval_seconds=1,
            concurrency_policy=policy,
            misfire_policy=misfire,
            run_all_max=kept,
        )
        now = timezone.now()
        fires = [
            submit(
                job,
                scheduled_for=now - timedelta(seconds=k),
                run_after=now - timedelta(seconds=k),
                trigger=Trigger.SCHEDULE,
            )
            for k in range(8, -1, -1)
        ]
        deadline = time.monotonic() + OUTCOME_TIMEOUT_S
        while (
            time.monotonic() < deadline
            and JobExecution.objects.filter(pk__in=[f.pk for f in fires])
            .exclude(status__in=TERMINAL_STATES)
            .exists()
        ):
            runner.claim_once()
            time.sleep(0.02)
        rows = [wait_for_status(f, TERMINAL_STATES) for f in fires]
        ran = [r.pk for r in rows if r.status == S.SUCCEEDED]
        assert ran == [f.pk for f in fires[-kept:]]
        superseded = rows[:-kept]
        assert all(r.status == S.SKIPPED for r in superseded)
        assert all(r.reason == REASON_SUPERSEDED.format(policy=misfire) for r in superseded)
        assert recorded_ids(path) == ran
    finally:
        stop.set()


def test_a_drain_during_the_claim_gives_the_started_run_back(executor, monkeypatch):
    """The drain began while the claim's transaction ran: the run marked running there never
    starts; it goes back to the queue, unstarted."""
    real_claim = executions.claim_batch

    def claim_then_drain(**kwargs):
        claimed = real_claim(**kwargs)
        executor.claiming = False
        return claimed

    monkeypatch.setattr(executions, "claim_batch", claim_then_drain)
    execution = submit(make_job("drained", "noop", concurrency_policy=ConcurrencyPolicy.ALLOW))
    assert executor.claim_once() == 0
    row = JobExecution.objects.get(pk=execution.pk)
    assert (row.status, row.claim_token, row.started_at) == (S.PENDING, None, None)
    assert executor.load == 0


def test_a_start_that_fails_inside_the_claim_leaves_the_run_unclaimed(executor, monkeypatch):
    """The claim and its start are one transaction: a claim that fails before it commits (its
    statement refused, the connection gone before the statement and its COMMIT went out) leaves
    the row as it was (claimable), nothing tracked, no capacity held."""

    def write_then_fail(self, sql, params=()):
        self.execute(sql, params)  # the claim's UPDATE, not committed
        raise OperationalError("(2013, 'Lost connection to server during query')")

    monkeypatch.setattr(driver.Transaction, "execute_and_commit", write_then_fail)
    execution = submit(make_job("cut", "noop", concurrency_policy=ConcurrencyPolicy.ALLOW))
    with pytest.raises(OperationalError):
        executor.claim_once()
    row = JobExecution.objects.get(pk=execution.pk)
    assert (row.status, row.claim_token, row.node) == (S.PENDING, None, "")
    assert executor.load == 0
    monkeypatch.undo()
    assert run_to_outcome(executor, row).status == S.SUCCEEDED


def test_reconcile_gives_back_a_running_row_whose_body_never_started_here(executor):
    """Marked running (a claim's own start whose answer was lost, a drain racing the claim) but
    never made active on this node: no body of it ran, so it goes back to the queue as it was,
    not ended lost (which would use up an attempt, or lose the fire with no retries left)."""
    job = make_job("never-started", "noop", max_retries=0)
    now = timezone.now()
    old = now - timedelta(seconds=RECONCILE_AFTER_S + 5)
    prefix = executions.new_claim_prefix()
    executor.books.own_prefixes[prefix] = None  # claimed by this process
    row = submit(
        job,
        status=S.RUNNING,
        node=NODE,
        claim_token=f"{prefix}1",
        claimed_at=old,
        started_at=old,
    )
    # Another process that ran under this node id (restarted): its body may have run.
    earlier = submit(
        job,
        scheduled_for=now - timedelta(seconds=9),
        status=S.RUNNING,
        node=NODE,
        claim_token=f"{executions.new_claim_prefix()}2",
        claimed_at=old,
        started_at=old,
    )
    assert executor.reconcile(now=now) == (1, 1)
    row.refresh_from_db()
    assert (row.status, row.claim_token, row.node, row.started_at) == (S.PENDING, None, "", None)
    earlier.refresh_from_db()
    assert earlier.status == S.LOST


def test_reconcile_leaves_the_rows_of_a_claim_in_flight_alone(executor):
    """The audit may look while a claim (which may have marked rows running in its own
    transaction) has committed but not yet tracked its rows: those rows are not leftovers, however
    long the claim waited for the database (their stamps are old)."""
    job = make_job("in-flight", "noop")
    now = timezone.now()
    old = now - timedelta(seconds=RECONCILE_AFTER_S + 5)
    prefix = executions.new_claim_prefix()
    row = submit(
        job,
        status=S.RUNNING,
        node=NODE,
        claim_token=f"{prefix}1",
        claimed_at=old,
        started_at=old,
    )
    executor.books.claims_in_flight.add(prefix)
    try:
        assert executor.reconcile(now=now) == (0, 0)
        assert not executor.idle()  # a drain waits for the claim to settle
    finally:
        executor.books.claims_in_flight.discard(prefix)
    row.refresh_from_db()
    assert (row.status, row.claim_token) == (S.RUNNING, f"{prefix}1")


def test_a_claims_own_start_is_stamped_when_it_is_made_not_when_the_claim_began(executor):
    """A claim that waited (SQLite's write lock) must not mark its runs running "since" before
    the wait: the self-audit judges a running row's age by that stamp."""
    execution = submit(make_job("stamped", "noop", concurrency_policy=ConcurrencyPolicy.ALLOW))
    long_ago = timezone.now() - timedelta(seconds=30)
    claimed = executions.claim_batch(
        node_id=NODE,
        queues=["default"],
        limit=1,
        horizon=timezone.now(),
        now=long_ago,
        start_now=lambda rows: rows,
    )
    assert [c.pk for c in claimed] == [execution.pk]
    row = JobExecution.objects.get(pk=execution.pk)
    assert row.status == S.RUNNING
    assert row.started_at > timezone.now() - timedelta(seconds=5)
    executions.hand_back_unstarted(row)


def test_a_body_lock_is_let_go_once_the_nodes_presence_is_no_longer_certain(monkeypatch):
    """A forbid body stuck on a node that stopped renewing its presence (cut off from its
    database, its heartbeat hung): the cluster is about to declare it gone and its run lost, so
    the node's lock keeper stops extending that body's job lock and releases it, and the next run
    of the job waits for the declaration, not for the stuck body. Stepped on a settable clock."""
    executor, runner, _clock, backend = stepped_executor("stuck-node", capacity=4)
    job = make_job("stuck", "noop", concurrency_policy=ConcurrencyPolicy.FORBID)
    submit(job)
    assert executor.claim_once() == 1
    executor.starter_step()
    (run,) = runner.runs
    assert run.lock is not None and executor.books.take_body_slot(run) is True
    lock_name = f"job:{job.pk}"
    executor.extend_locks()
    assert backend.acquire_lock(lock_name, 10_000) is None  # held while the presence is certain
    monkeypatch.setattr(executor.membership, "confirmed", lambda epoch=None: False)
    executor.extend_locks()  # the keeper's pass: the body's lock is given up and released
    assert backend.acquire_lock(lock_name, 10_000) is not None
