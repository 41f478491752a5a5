"""Secrets in task arguments: a plain credential is refused where a job or a run is written (400,
naming the field, nothing written); a reference ({"$secret": "NAME"}) is what is stored and shown,
and the node resolves it just before the call, from SCHEDULER_SECRET_<NAME> or the secrets
directory; a secret set nowhere fails the run naming it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.executor import Executor
from jobs import secrets, services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.registry import task
from jobs.states import ExecutionStatus
from tests.cluster.harness import running_executor, wait_until_ended

S = ExecutionStatus
SECRET_VALUE = "s3cr3t-value-for-the-test"


@task("test.secret_echo")
def secret_echo(value: str, headers: dict | None = None) -> dict:
    """Returns, prints and (asked to) raises what it was called with: all of it is recorded."""
    print(f"called with {value}")
    if value == "raise":
        raise RuntimeError(f"refused {headers}")
    return {"value": value, "headers": headers}


@task("test.secret_matches")
def secret_matches(value: str, name: str) -> dict:
    """Whether the task was given the secret's real value (without recording the value)."""
    return {"matches": value == os.environ[f"SCHEDULER_SECRET_{name}"], "length": len(value)}


def job_payload(name: str, **kwargs: object) -> dict:
    return {
        "name": name,
        "task": "http_request",
        "schedule_type": "interval",
        "interval_seconds": 60,
        "kwargs": {"url": "https://api.example.com/ping", **kwargs},
    }


@pytest.fixture(autouse=True)
def _allowed_host(settings):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["api.example.com"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"headers": {"Authorization": "Bearer abc123"}}, "kwargs.headers.Authorization"),
        ({"headers": {"X-Api-Key": "abc123"}}, "kwargs.headers.X-Api-Key"),
        ({"url": "https://bob:hunter2@api.example.com/ping"}, "kwargs.url"),
        ({"headers": {"Authorization": {"$secret": "lower-case"}}}, "kwargs.headers.Authorization"),
        (
            {"headers": {"Authorization": {"$secret": "A", "extra": 1}}},
            "kwargs.headers.Authorization",
        ),
    ],
    ids=["authorization", "api-key", "url-password", "bad-name", "bad-reference"],
)
def test_a_plain_credential_is_a_400_naming_the_field_and_nothing_is_written(
    admin_api, kwargs, field
):
    response = admin_api.post("/api/jobs/", job_payload("leaky", **kwargs), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.filter(name="leaky").exists()
    assert not AuditEvent.objects.filter(object_type="job").exists()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"headers": {"Authorization": "Bearer abc"}}, "kwargs.headers.Authorization"),
        ({"url": "https://bob:hunter2@api.example.com/ping"}, "kwargs.url"),
    ],
    ids=["plain", "url-password"],
)
def test_the_refusal_shows_the_reference_to_write_with_single_braces(admin_api, kwargs, field):
    response = admin_api.post("/api/jobs/", job_payload("leaky", **kwargs), format="json")
    assert response.status_code == 400
    (message,) = response.json()[field]
    assert '{"$secret": "NAME"}' in message, message
    assert "{{" not in message and "}}" not in message, message


def test_a_reference_is_stored_and_shown_never_a_value(admin_api, api_client_for):
    headers = {"Authorization": {"$secret": "PING_TOKEN"}}
    response = admin_api.post("/api/jobs/", job_payload("safe", headers=headers), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(name="safe")
    assert job.kwargs["headers"] == headers
    viewer = api_client_for("viewer")
    shown = viewer.get(f"/api/jobs/{job.pk}/").json()
    assert shown["kwargs"]["headers"] == headers
    event = AuditEvent.objects.get(object_type="job", action="job.create")
    assert "PING_TOKEN" in json.dumps(event.changes)


def test_the_enqueue_api_refuses_a_plain_credential_per_run(admin_api):
    job = services.job_create(
        data={
            "name": "echo",
            "task": "test.secret_echo",
            "schedule_type": "interval",
            "interval_seconds": 3600,
            "kwargs": {"value": "x"},
        },
        by=services.SYSTEM,
    )
    response = admin_api.post(
        f"/api/jobs/{job.pk}/enqueue/",
        {"runs": [{"kwargs": {"value": "x"}}, {"kwargs": {"value": "x", "password": "p"}}]},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "1.kwargs.password" in response.json()
    assert not JobExecution.objects.filter(job=job).exists()


def test_secrets_resolve_from_the_environment_then_the_secrets_directory(
    monkeypatch, settings, tmp_path: Path
):
    settings.SCHEDULER_SECRETS_DIR = str(tmp_path)
    (tmp_path / "FROM_FILE").write_text("file-value\n")
    monkeypatch.setenv("SCHEDULER_SECRET_FROM_ENV", "env-value")
    value = {"a": [{"$secret": "FROM_ENV"}], "b": {"$secret": "FROM_FILE"}, "c": 3}
    assert secrets.resolve(value) == {"a": ["env-value"], "b": "file-value", "c": 3}
    with pytest.raises(secrets.SecretMissing) as raised:
        secrets.resolve({"$secret": "NOWHERE"})
    assert "NOWHERE" in str(raised.value) and "SCHEDULER_SECRET_NOWHERE" in str(raised.value)


# --- at run time, on a real executor ------------------------------------------------------------


@pytest.fixture
def executor(transactional_db) -> Iterator[Executor]:
    with running_executor("secrets-node", capacity=2) as runner:
        yield runner


def run_once(
    executor: Executor,
    kwargs: dict,
    *,
    task_name: str = "test.secret_echo",
    job_kwargs: dict | None = None,
) -> JobExecution:
    """One enqueued run with ``kwargs`` of a job of ``task_name`` whose own arguments are
    ``job_kwargs`` (a run may use only the secrets its job uses)."""
    job = services.job_create(
        data={
            "name": f"echo-{len(kwargs)}-{JobExecution.objects.count()}",
            "task": task_name,
            "schedule_type": "interval",
            "interval_seconds": 3600,
            "concurrency_policy": "allow",
            "kwargs": job_kwargs or {"value": "the job's own"},
        },
        by=services.SYSTEM,
    )
    [execution] = services.runs_enqueue(
        job_id=job.pk, items=[{"kwargs": kwargs}], by=services.SYSTEM
    )
    assert executor.claim_once() == 1
    return wait_until_ended(execution.pk)


def test_the_node_calls_the_task_with_the_secret_and_stores_only_the_reference(
    executor, monkeypatch
):
    monkeypatch.setenv("SCHEDULER_SECRET_PING_TOKEN", SECRET_VALUE)
    reference = {"$secret": "PING_TOKEN"}
    done = run_once(
        executor,
        {"value": reference, "name": "PING_TOKEN"},
        task_name="test.secret_matches",
        job_kwargs={"value": reference, "name": "PING_TOKEN"},
    )
    assert done.status == S.SUCCEEDED, done.error
    assert done.result == {"matches": True, "length": len(SECRET_VALUE)}
    assert done.kwargs == {"value": reference, "name": "PING_TOKEN"}


def test_what_a_run_returns_prints_or_raises_never_records_its_secret(executor, monkeypatch):
    """A task echoing its argument (a result, a print, an error message quoting it): the run's
    record shows [secret] where the value was."""
    monkeypatch.setenv("SCHEDULER_SECRET_PING_TOKEN", SECRET_VALUE)
    reference = {"$secret": "PING_TOKEN"}
    done = run_once(executor, {"value": reference}, job_kwargs={"value": reference})
    assert done.status == S.SUCCEEDED
    assert done.result == {"value": "[secret]", "headers": None}
    assert done.output == "called with [secret]\n"
    failed = run_once(
        executor,
        {"value": "raise", "headers": {"Authorization": reference}},
        job_kwargs={"value": reference},
    )
    assert failed.status == S.FAILED
    assert "[secret]" in failed.error and SECRET_VALUE not in failed.error + failed.traceback


def test_a_secret_set_nowhere_fails_the_run_naming_it(executor, monkeypatch):
    monkeypatch.delenv("SCHEDULER_SECRET_ABSENT", raising=False)
    reference = {"$secret": "ABSENT"}
    done = run_once(executor, {"value": reference}, job_kwargs={"value": reference})
    assert done.status == S.FAILED
    assert "SecretMissing" in done.error and "ABSENT" in done.error


def test_no_log_line_of_a_run_carries_its_secret(executor, monkeypatch, caplog):
    """Everything logged while a run that uses a secret is claimed, started and finished (DEBUG
    and up, every logger), formatted as the JSON and text handlers would: no secret value."""
    from cluster.logcontext import ContextFilter, JsonFormatter

    monkeypatch.setenv("SCHEDULER_SECRET_LOGGED", SECRET_VALUE)
    caplog.set_level("DEBUG")
    reference = {"$secret": "LOGGED"}
    done = run_once(
        executor,
        {"value": "plain", "headers": {"Authorization": reference}},
        job_kwargs={"value": "x", "headers": {"Authorization": reference}},
    )
    assert done.status == S.SUCCEEDED
    assert caplog.records, "the run logged nothing: the check would prove nothing"
    context = ContextFilter()
    for record in caplog.records:
        context.filter(record)
        assert SECRET_VALUE not in JsonFormatter().format(record)
        assert SECRET_VALUE not in record.getMessage() + record.context


def test_an_enqueued_run_may_use_only_the_secrets_its_job_uses(admin_api, monkeypatch):
    """Enqueueing is an operator's right; which secrets a job may be given is an admin's (who
    defines the job). A run naming another secret is a 400, nothing written."""
    reference = {"$secret": "PING_TOKEN"}
    job = services.job_create(
        data={
            "name": "uses-one",
            "task": "test.secret_echo",
            "schedule_type": "interval",
            "interval_seconds": 3600,
            "kwargs": {"value": reference},
        },
        by=services.SYSTEM,
    )
    url = f"/api/jobs/{job.pk}/enqueue/"
    other = admin_api.post(
        url, {"runs": [{"kwargs": {"value": {"$secret": "DB_PASSWORD"}}}]}, format="json"
    )
    assert other.status_code == 400, other.content
    assert "DB_PASSWORD" in other.json()["0.kwargs"][0]
    assert not JobExecution.objects.filter(job=job).exists()
    same = admin_api.post(url, {"runs": [{"kwargs": {"value": reference}}]}, format="json")
    assert same.status_code == 201, same.content


@pytest.mark.parametrize(
    "value",
    [
        {"max_tokens": "512", "token_url": "https://auth.example.com/t", "secret_name": "X"},
        {"credentials_file": "/etc/creds.json", "tokenizer": "bpe", "passage": "text"},
        {"password_min_length": "8", "headers": {"Accept": "application/json"}},
    ],
)
def test_ordinary_arguments_that_mention_credentials_are_not_refused(value):
    assert secrets.problems(value, "kwargs") == []


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"api_key": ["sk-123456"]}, "kwargs.api_key.0"),
        ({"password": 123456}, "kwargs.password"),
        ({"credentials": {"user": "u", "pass": "p"}}, "kwargs.credentials.pass"),
        ({"clientSecret": "abc"}, "kwargs.clientSecret"),
        ({"db": {"access_token": "abc"}}, "kwargs.db.access_token"),
    ],
)
def test_credentials_in_lists_numbers_and_nested_names_are_refused(value, path):
    assert [found[0] for found in secrets.problems(value, "kwargs")] == [path]
