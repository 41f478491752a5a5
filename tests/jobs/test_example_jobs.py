"""Example jobs on a first start (jobs/examples.py, called by ``runcluster``): created on a database
that never had a job when SCHEDULER_EXAMPLE_JOBS is on, through the services (audited), never when
it is off, never twice, never again once deleted, and off under the production settings."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import demo_tasks, examples, registry, services
from jobs.models import AuditEvent, AuditSource, Job

pytestmark = pytest.mark.django_db
NAMES = {example["name"] for example in examples.EXAMPLES}


@pytest.fixture
def on(settings) -> None:
    settings.SCHEDULER_EXAMPLE_JOBS = True


def test_created_on_an_empty_database_when_on(on) -> None:
    before = timezone.now()
    created = examples.create_on_first_start()
    assert {job.name for job in created} == NAMES  # the demo tasks are on in the test settings
    assert set(Job.objects.values_list("name", flat=True)) == NAMES
    audit = AuditEvent.objects.filter(action="job.create")
    assert set(audit.values_list("object_repr", flat=True)) == NAMES
    assert set(audit.values_list("source", flat=True)) == {AuditSource.SYSTEM}
    quick = Job.objects.get(name="example-every-5-seconds")
    assert quick.enabled and quick.next_fire_at <= before + timedelta(seconds=5)
    assert Job.objects.get(name="example-flaky-with-retries").max_retries > 0


def test_not_created_when_off(settings) -> None:
    settings.SCHEDULER_EXAMPLE_JOBS = False
    assert examples.create_on_first_start() == []
    assert not Job.objects.exists()


def test_not_created_twice(on) -> None:
    assert examples.create_on_first_start()
    assert examples.create_on_first_start() == []
    assert Job.objects.count() == len(NAMES)


def test_not_created_again_once_deleted(on) -> None:
    for job in examples.create_on_first_start():
        services.job_delete(job_id=job.pk, by=services.SYSTEM)
    assert not Job.objects.exists()
    assert examples.create_on_first_start() == []
    assert not Job.objects.exists()


def test_not_created_beside_jobs_of_ones_own(on) -> None:
    services.job_create(
        data={"name": "mine", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        by=services.SYSTEM,
    )
    assert examples.create_on_first_start() == []
    assert list(Job.objects.values_list("name", flat=True)) == ["mine"]


def test_only_examples_whose_task_is_registered(on, monkeypatch) -> None:
    builtin = {"log", "purge_runs"}
    monkeypatch.setattr(registry, "is_registered", lambda name: name in builtin)
    created = examples.create_on_first_start()
    assert {job.task for job in created} == builtin


def test_the_flaky_demo_task_fails_at_its_rate(monkeypatch) -> None:
    context = registry.TaskContext(execution_id=1, job_name="j", attempt=1, scheduled_for=None)
    monkeypatch.setattr(demo_tasks.random, "random", lambda: 0.3)
    with pytest.raises(RuntimeError, match="failed at random"):
        demo_tasks.demo_flaky(0.5, context=context)
    assert demo_tasks.demo_flaky(0.2, context=context) == {"attempt": 1}
    with pytest.raises(registry.TaskArgumentError):
        registry.validate_task_call("demo_flaky", [], {"fail_rate": 2})


@pytest.mark.parametrize(
    ("env", "expected"), [({}, "False"), ({"SCHEDULER_EXAMPLE_JOBS": "1"}, "True")]
)
def test_off_under_production_settings_unless_asked(env, expected) -> None:
    script = "from django.conf import settings; print(settings.SCHEDULER_EXAMPLE_JOBS)"
    environment = {
        k: v for k, v in os.environ.items() if k not in {"SCHEDULER_EXAMPLE_JOBS", "PYTEST_VERSION"}
    }
    environment.update(
        {
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings_production",
            "DJANGO_SECRET_KEY": "k" * 40 + "abcdefghij",
            "DJANGO_ALLOWED_HOSTS": "scheduler.example.com",
            **env,
        }
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == expected
