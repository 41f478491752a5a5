"""A write the database rolled back as a deadlock victim is tried again; a database that stays
unavailable is a 503 (nothing written), never a 500."""

from __future__ import annotations

import pytest
from django.db import OperationalError, transaction

from jobs import retry, services
from jobs.models import AuditEvent, Job
from jobs.retry import retry_on_conflict

# Outside a test transaction: the services are the outermost transaction, as in a request.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch):
    monkeypatch.setattr(retry, "BACKOFF_S", (0.0, 0.0))


def flaky(failures: list[Exception]):
    calls = []

    @retry_on_conflict
    def write() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "written"

    return write, calls


@pytest.mark.parametrize(
    "error",
    [
        OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction"
        ),
        OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction"),
        OperationalError("database is locked"),
    ],
)
def test_a_transaction_rolled_back_by_a_conflict_is_tried_again(error):
    write, calls = flaky([error, error])
    assert write() == "written"
    assert len(calls) == 3


def test_a_conflict_that_persists_reaches_the_caller():
    error = OperationalError(1213, "Deadlock found")
    write, calls = flaky([error] * retry.ATTEMPTS)
    with pytest.raises(OperationalError):
        write()
    assert len(calls) == retry.ATTEMPTS


def test_other_database_errors_are_not_retried():
    write, calls = flaky([OperationalError(2003, "Can't connect to MySQL server")])
    with pytest.raises(OperationalError):
        write()
    assert len(calls) == 1


def test_inside_an_enclosing_transaction_the_owner_retries_not_the_service():
    write, calls = flaky([OperationalError(1213, "Deadlock found")])
    with pytest.raises(OperationalError), transaction.atomic():
        write()
    assert len(calls) == 1


def test_a_deadlocked_trigger_succeeds_on_its_second_attempt(monkeypatch):
    job = services.job_create(
        data={"name": "dl", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=services.SYSTEM,
    )
    real_audit = services.audit_record
    failures = [OperationalError(1213, "Deadlock found")]

    def audit_then_deadlock(**kwargs):
        event = real_audit(**kwargs)
        if failures:
            raise failures.pop(0)  # after the execution row was written: all of it rolls back
        return event

    monkeypatch.setattr(services, "audit_record", audit_then_deadlock)
    services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    assert job.executions.count() == 1
    assert AuditEvent.objects.filter(action="job.trigger").count() == 1


def test_the_api_answers_503_when_the_database_is_unavailable(api_client_for, monkeypatch):
    api = api_client_for("admin")
    job = Job.objects.create(name="x", task="noop", schedule_type="interval", interval_seconds=60)

    def unreachable(**kwargs):
        raise OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'")

    monkeypatch.setattr(services, "job_pause", unreachable)
    response = api.post(f"/api/jobs/{job.pk}/pause/")
    assert response.status_code == 503
    assert response.json()["code"] == "database_unavailable"
    assert response["Retry-After"] == "1"
