"""Services without HTTP: optimistic locking, racing retries, applying definitions, after-commit events."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import events, services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.services import (
    ERR_ALREADY_RETRIED,
    ERR_DEFINITION_NOT_OBJECT,
    ERR_DUPLICATE_DEFINITION,
    ERR_NAME_TAKEN,
    ERR_VERSION_REQUIRED,
    ActionNotAllowed,
    Actor,
    JobValidationError,
    VersionConflict,
    job_apply_definitions,
    job_create,
    job_update,
)
from jobs.states import ExecutionStatus
from jobs.validation import ERR_RANGE

S = ExecutionStatus
ALICE = Actor(source="cli")
BOB = Actor(source="api", remote_addr="10.0.0.2")
CRON = {"name": "nightly", "task": "noop", "schedule_type": "cron", "cron_expression": "0 3 * * *"}
INTERVAL = {"name": "poll", "task": "noop", "schedule_type": "interval", "interval_seconds": 30}


def state() -> tuple:
    return (
        list(Job.objects.order_by("pk").values()),
        list(JobExecution.objects.order_by("pk").values()),
        list(AuditEvent.objects.order_by("pk").values_list("pk", flat=True)),
    )


# --- optimistic locking --------------------------------------------------------------------------


@pytest.mark.django_db
def test_second_editor_of_the_same_version_gets_a_conflict():
    job = job_create(data=CRON, by=ALICE)
    # Both editors read version 1.
    first = Job.objects.get(pk=job.pk).version
    second = Job.objects.get(pk=job.pk).version
    assert first == second == 1

    job_update(job_id=job.pk, expected_version=first, changes={"priority": 1}, by=ALICE)
    before = state()
    with pytest.raises(VersionConflict) as info:
        job_update(job_id=job.pk, expected_version=second, changes={"priority": 2}, by=BOB)
    assert (info.value.expected, info.value.current) == (1, 2)
    assert state() == before
    stored = Job.objects.get(pk=job.pk)
    assert (stored.priority, stored.version) == (1, 2)


@pytest.mark.django_db
def test_conflict_detected_by_the_conditional_update(monkeypatch):
    """Another editor commits between this editor's read and write: the UPDATE matches no row."""
    job = job_create(data=CRON, by=ALICE)
    real_clean = services.clean_job
    interleaved: list[bool] = []

    def clean_then_someone_else_writes(*args, **kwargs):
        values = real_clean(*args, **kwargs)
        if not interleaved:
            interleaved.append(True)
            job_update(job_id=job.pk, expected_version=1, changes={"priority": 7}, by=BOB)
        return values

    monkeypatch.setattr(services, "clean_job", clean_then_someone_else_writes)
    with pytest.raises(VersionConflict) as info:
        job_update(job_id=job.pk, expected_version=1, changes={"priority": 3}, by=ALICE)
    assert info.value.current == 2
    stored = Job.objects.get(pk=job.pk)
    assert (stored.priority, stored.version) == (7, 2)
    assert list(
        AuditEvent.objects.filter(action="job.update").values_list("actor_name", "changes")
    ) == [("api", {"priority": [0, 7]})]


@pytest.mark.django_db
def test_update_without_version_is_refused():
    job = job_create(data=CRON, by=ALICE)
    with pytest.raises(JobValidationError) as info:
        job_update(job_id=job.pk, expected_version=None, changes={"priority": 1}, by=ALICE)
    assert info.value.errors == {"version": [ERR_VERSION_REQUIRED]}
    assert Job.objects.get(pk=job.pk).priority == 0


@pytest.mark.django_db
def test_invalid_update_writes_nothing():
    job = job_create(data=CRON, by=ALICE)
    before = state()
    with pytest.raises(JobValidationError):
        job_update(job_id=job.pk, expected_version=1, changes={"max_retries": -1}, by=ALICE)
    assert state() == before


@pytest.mark.django_db
def test_create_with_a_taken_name_is_a_validation_error():
    job_create(data=CRON, by=ALICE)
    before = state()
    with pytest.raises(JobValidationError) as info:
        job_create(data={**INTERVAL, "name": CRON["name"]}, by=ALICE)
    assert info.value.errors == {"name": [ERR_NAME_TAKEN]}
    assert state() == before


@pytest.mark.django_db
def test_pause_resume_bump_the_version_so_stale_editors_conflict():
    job = job_create(data=INTERVAL, by=ALICE)
    services.job_pause(job_id=job.pk, by=BOB)
    with pytest.raises(VersionConflict):
        job_update(job_id=job.pk, expected_version=1, changes={"enabled": True}, by=ALICE)
    assert Job.objects.get(pk=job.pk).enabled is False


# --- retries -------------------------------------------------------------------------------------


def failed_execution(job: Job) -> JobExecution:
    slot = timezone.now() - timedelta(minutes=1)
    return JobExecution.objects.create(job=job, scheduled_for=slot, run_after=slot, status=S.FAILED)


@pytest.mark.django_db
def test_sequential_retries_of_one_execution_make_one_attempt():
    execution = failed_execution(job_create(data=INTERVAL, by=ALICE))
    retry = services.execution_retry(execution_id=execution.pk, by=ALICE)
    assert retry.attempt == 2
    with pytest.raises(ActionNotAllowed, match=ERR_ALREADY_RETRIED):
        services.execution_retry(execution_id=execution.pk, by=BOB)
    assert JobExecution.objects.filter(scheduled_for=execution.scheduled_for).count() == 2


@pytest.mark.django_db
def test_retry_losing_the_unique_constraint_race_is_not_allowed(monkeypatch):
    """The "latest attempt" check passed, but a racer's attempt 2 landed first: the unique
    (job, scheduled_for, attempt) constraint refuses our row, and that is ActionNotAllowed."""
    execution = failed_execution(job_create(data=INTERVAL, by=ALICE))
    real_create = JobExecution.objects.create
    raced: list[int] = []

    def create_after_racer(**fields):
        if fields.get("trigger") == "retry" and not raced:
            raced.append(real_create(**fields).pk)  # the racer's identical row lands first
        return real_create(**fields)

    monkeypatch.setattr(JobExecution.objects, "create", create_after_racer)
    with pytest.raises(ActionNotAllowed, match=ERR_ALREADY_RETRIED):
        services.execution_retry(execution_id=execution.pk, by=BOB)
    monkeypatch.undo()
    assert raced, "the simulated racer did not run"
    # Our transaction (which here also held the simulated racer's row) rolled back as a whole:
    # no half-written retry and no audit row.
    assert JobExecution.objects.filter(attempt=2).count() == 0
    assert not AuditEvent.objects.filter(action="execution.retry").exists()
    # The database is still usable afterwards, and a retry now succeeds once.
    assert services.execution_retry(execution_id=execution.pk, by=BOB).attempt == 2


def _race(n: int, target) -> list:
    """Run ``target`` in ``n`` threads at once; each closes its own connection."""
    start = threading.Barrier(n)
    results: list = [None] * n

    def run(index: int) -> None:
        try:
            start.wait(timeout=10)
            results[index] = target()
        except BaseException as exc:  # collected and asserted on by the test
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_execution_make_one_attempt():
    job = Job.objects.create(
        name="race", task="noop", schedule_type="interval", interval_seconds=30
    )
    execution = failed_execution(job)
    results = _race(4, lambda: services.execution_retry(execution_id=execution.pk, by=BOB))
    won = [r for r in results if isinstance(r, JobExecution)]
    lost = [r for r in results if isinstance(r, ActionNotAllowed)]
    assert len(won) == 1, results
    assert len(lost) == 3, results
    attempts = JobExecution.objects.filter(job=job).order_by("attempt")
    assert [e.attempt for e in attempts] == [1, 2]
    assert AuditEvent.objects.filter(action="execution.retry").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_edits_of_one_version_one_wins():
    job = Job.objects.create(
        name="edit", task="noop", schedule_type="interval", interval_seconds=30
    )

    def edit(priority: int):
        return lambda: job_update(
            job_id=job.pk, expected_version=1, changes={"priority": priority}, by=BOB
        )

    start = threading.Barrier(3)
    results: list = [None] * 3

    def run(index: int) -> None:
        try:
            start.wait(timeout=10)
            results[index] = edit(index + 1)()
        except BaseException as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    winners = [r for r in results if isinstance(r, Job)]
    assert len(winners) == 1, results
    assert all(isinstance(r, VersionConflict) for r in results if r not in winners), results
    stored = Job.objects.get(pk=job.pk)
    assert (stored.priority, stored.version) == (winners[0].priority, 2)
    assert AuditEvent.objects.filter(action="job.update").count() == 1


# --- applying definitions ------------------------------------------------------------------------


def actions(results) -> dict[str, str]:
    return {r.name: r.action for r in results}


@pytest.mark.django_db
def test_apply_creates_then_is_idempotent():
    definitions = [dict(CRON), dict(INTERVAL)]
    first = job_apply_definitions(definitions=definitions, by=ALICE)
    assert actions(first) == {"nightly": "created", "poll": "created"}
    assert Job.objects.count() == 2
    assert Job.objects.get(name="nightly").next_fire_at is not None
    before = state()

    second = job_apply_definitions(definitions=[dict(CRON), dict(INTERVAL)], by=ALICE)
    assert actions(second) == {"nightly": "unchanged", "poll": "unchanged"}
    assert all(r.changes == {} for r in second)
    assert state() == before


@pytest.mark.django_db
def test_apply_reports_and_writes_the_diff():
    job_apply_definitions(definitions=[dict(CRON), dict(INTERVAL)], by=ALICE)
    results = job_apply_definitions(
        definitions=[{**CRON, "cron_expression": "0 4 * * *", "priority": 2}, dict(INTERVAL)],
        by=ALICE,
    )
    assert actions(results) == {"nightly": "updated", "poll": "unchanged"}
    updated = next(r for r in results if r.name == "nightly")
    assert updated.changes == {"cron_expression": ["0 3 * * *", "0 4 * * *"], "priority": [0, 2]}
    stored = Job.objects.get(name="nightly")
    assert (stored.cron_expression, stored.priority, stored.version) == ("0 4 * * *", 2, 2)
    assert stored.next_fire_at.hour == 4
    audit = AuditEvent.objects.filter(action="job.update").get()
    assert audit.source == "cli"
    assert audit.changes == {"cron_expression": ["0 3 * * *", "0 4 * * *"], "priority": [0, 2]}


@pytest.mark.django_db
def test_apply_changing_the_schedule_type():
    job_apply_definitions(definitions=[dict(CRON)], by=ALICE)
    results = job_apply_definitions(
        definitions=[
            {**CRON, "schedule_type": "interval", "cron_expression": "", "interval_seconds": 60}
        ],
        by=ALICE,
    )
    assert actions(results) == {"nightly": "updated"}
    stored = Job.objects.get(name="nightly")
    assert (stored.schedule_type, stored.cron_expression, stored.interval_seconds) == (
        "interval",
        "",
        60,
    )


@pytest.mark.django_db
def test_apply_dry_run_writes_nothing():
    job_apply_definitions(definitions=[dict(CRON)], by=ALICE)
    before = state()
    results = job_apply_definitions(
        definitions=[{**CRON, "priority": 5}, dict(INTERVAL)], by=ALICE, dry_run=True, prune=True
    )
    assert actions(results) == {"nightly": "updated", "poll": "created"}
    assert state() == before


@pytest.mark.django_db
def test_apply_dry_run_prune_reports_deletions_but_writes_nothing():
    job_apply_definitions(definitions=[dict(CRON), dict(INTERVAL)], by=ALICE)
    before = state()
    results = job_apply_definitions(definitions=[dict(CRON)], by=ALICE, dry_run=True, prune=True)
    assert actions(results) == {"nightly": "unchanged", "poll": "deleted"}
    assert state() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("bad", "key"),
    [
        ({**INTERVAL, "interval_seconds": 0}, "poll.interval_seconds"),
        ({**INTERVAL, "task": "nope"}, "poll.task"),
        ({**INTERVAL, "colour": "red"}, "poll.colour"),
        ({"task": "noop"}, "#1"),
        ("not a definition", "#1"),
    ],
)
def test_apply_with_one_invalid_definition_writes_nothing(bad, key):
    job_apply_definitions(definitions=[{**CRON, "description": "old"}], by=ALICE)
    before = state()
    with pytest.raises(JobValidationError) as info:
        job_apply_definitions(
            definitions=[{**CRON, "description": "new"}, bad, {**CRON, "name": "third"}],
            by=ALICE,
            prune=True,
        )
    assert key in info.value.errors
    if key.startswith("#"):
        assert info.value.errors[key] == [ERR_DEFINITION_NOT_OBJECT]
    if key == "poll.interval_seconds":
        assert info.value.errors[key] == [ERR_RANGE.format(low=1, high=366 * 24 * 3600)]
    assert state() == before


@pytest.mark.django_db
def test_apply_is_atomic_when_a_write_fails_midway(monkeypatch):
    """Validation passed, an update was written, then the bulk create fails: the update is rolled
    back too."""
    job_create(data=dict(CRON), by=ALICE)
    calls = []

    def failing_batch(**kwargs):
        calls.append([item["name"] for item in kwargs["items"]])
        raise RuntimeError("database went away")

    monkeypatch.setattr(services, "jobs_create_batch", failing_batch)
    before = state()
    with pytest.raises(RuntimeError):
        job_apply_definitions(definitions=[{**CRON, "priority": 5}, dict(INTERVAL)], by=ALICE)
    assert calls == [["poll"]]
    assert state() == before


@pytest.mark.django_db
def test_apply_refuses_duplicate_names_in_one_file():
    with pytest.raises(JobValidationError) as info:
        job_apply_definitions(definitions=[dict(CRON), {**CRON, "priority": 1}], by=ALICE)
    assert info.value.errors == {"nightly.name": [ERR_DUPLICATE_DEFINITION]}
    assert not Job.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db
def test_apply_prune_deletes_the_others():
    job_apply_definitions(
        definitions=[dict(CRON), dict(INTERVAL), {**INTERVAL, "name": "extra"}], by=ALICE
    )
    results = job_apply_definitions(definitions=[dict(INTERVAL)], by=ALICE, prune=True)
    assert actions(results) == {"poll": "unchanged", "nightly": "deleted", "extra": "deleted"}
    assert list(Job.objects.values_list("name", flat=True)) == ["poll"]
    assert AuditEvent.objects.filter(action="job.delete").count() == 2


@pytest.mark.django_db
def test_apply_without_prune_keeps_the_others():
    job_apply_definitions(definitions=[dict(CRON), dict(INTERVAL)], by=ALICE)
    job_apply_definitions(definitions=[dict(INTERVAL)], by=ALICE)
    assert Job.objects.count() == 2


# --- events after commit -------------------------------------------------------------------------


@pytest.fixture
def received():
    calls: list[dict] = []

    def receiver(sender, **payload):
        calls.append({k: v for k, v in payload.items() if k != "signal"})

    events.job_changed.connect(receiver, weak=False)
    events.executions_changed.connect(receiver, weak=False)
    yield calls
    events.job_changed.disconnect(receiver)
    events.executions_changed.disconnect(receiver)


@pytest.mark.django_db
def test_job_changed_is_sent_only_after_commit(received, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        job = job_create(data=CRON, by=ALICE)
        assert received == []  # not yet: the transaction has not committed
    assert len(callbacks) == 1
    assert received == [{"job_id": job.pk, "change": "created"}]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("operation", "change"),
    [
        (
            lambda job: job_update(
                job_id=job.pk, expected_version=1, changes={"priority": 1}, by=ALICE
            ),
            "updated",
        ),
        (lambda job: services.job_pause(job_id=job.pk, by=ALICE), "paused"),
        (lambda job: services.job_delete(job_id=job.pk, by=ALICE), "deleted"),
        (lambda job: services.job_trigger(job_id=job.pk, by=ALICE), "triggered"),
    ],
    ids=["update", "pause", "delete", "trigger"],
)
def test_every_job_write_notifies_after_commit(
    received, django_capture_on_commit_callbacks, operation, change
):
    job = job_create(data=CRON, by=ALICE)
    with django_capture_on_commit_callbacks(execute=True):
        operation(job)
        assert received == []
    assert {"job_id": job.pk, "change": change} in received


@pytest.mark.django_db
def test_no_event_when_the_transaction_rolls_back(received, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            job_create(data=CRON, by=ALICE)
            services.job_trigger(job_id=Job.objects.get(name="nightly").pk, by=ALICE)
            raise RuntimeError("rolled back")
    assert callbacks == []
    assert received == []
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_no_event_for_a_refused_write(received, django_capture_on_commit_callbacks):
    job = job_create(data=CRON, by=ALICE)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(VersionConflict):
            job_update(job_id=job.pk, expected_version=5, changes={"priority": 1}, by=ALICE)
        with pytest.raises(JobValidationError):
            job_update(job_id=job.pk, expected_version=1, changes={"priority": "x"}, by=ALICE)
    assert callbacks == []
    assert received == []


@pytest.mark.django_db(transaction=True)
def test_events_follow_the_real_commit(received):
    """Without test wrapping: inside an outer transaction nothing is sent until it commits."""
    with transaction.atomic():
        job = job_create(data=CRON, by=ALICE)
        services.job_pause(job_id=job.pk, by=ALICE)
        assert received == []
    assert received == [
        {"job_id": job.pk, "change": "created"},
        {"job_id": job.pk, "change": "paused"},
    ]
    received.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.job_resume(job_id=job.pk, by=ALICE)
        raise RuntimeError("rolled back")
    assert received == []
    assert Job.objects.get(pk=job.pk).enabled is False
