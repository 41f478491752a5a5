"""Tags on jobs: validated, kept through export and apply, and used to find and act on jobs
together (the API's filter, the dashboard's list, the CLI's list, trigger, pause and resume)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from jobs import selectors, services
from jobs.models import Job, JobExecution
from jobs.validation import JobValidationError

pytestmark = pytest.mark.django_db


def make(name: str, tags: list[str]) -> Job:
    return services.job_create(
        data={
            "name": name,
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "tags": tags,
        },
        by=services.SYSTEM,
    )


@pytest.fixture
def tagged_jobs():
    return [
        make("invoices", ["billing", "nightly"]),
        make("refunds", ["billing"]),
        make("cleanup", ["nightly", "billing-archive"]),
        make("untagged", []),
    ]


def test_tags_are_validated_and_duplicates_dropped() -> None:
    job = make("t", ["billing", "billing", "team.a"])
    assert job.tags == ["billing", "team.a"]
    for bad, says in (
        (["Billing"], "is not a tag"),
        (["has space"], "is not a tag"),
        ([7], "is not a tag"),
        ([f"t{i}" for i in range(21)], "At most 20 tags"),
        ("billing", "Expected a list of tags"),
    ):
        with pytest.raises(JobValidationError) as caught:
            make(f"bad-{len(str(bad))}", bad)
        assert "tags" in caught.value.errors and says in " ".join(caught.value.errors["tags"])
    assert not Job.objects.filter(name__startswith="bad-").exists()


def test_a_tag_finds_exactly_its_jobs(tagged_jobs) -> None:
    found = set(Job.objects.filter(selectors.tagged("billing")).values_list("name", flat=True))
    assert found == {"invoices", "refunds"}  # not "billing-archive"
    assert not Job.objects.filter(selectors.tagged("bill")).exists()


def test_the_api_filters_by_tag_and_takes_tags(admin_api, tagged_jobs) -> None:
    page = admin_api.get("/api/jobs/", {"tag": "nightly"})
    assert page.status_code == 200
    assert {j["name"] for j in page.data["results"]} == {"invoices", "cleanup"}
    job = tagged_jobs[3]
    changed = admin_api.patch(
        f"/api/jobs/{job.pk}/", {"tags": ["ops"], "version": job.version}, format="json"
    )
    assert changed.status_code == 200 and changed.data["tags"] == ["ops"]
    bad = admin_api.patch(
        f"/api/jobs/{job.pk}/", {"tags": ["OPS"], "version": changed.data["version"]}, format="json"
    )
    assert bad.status_code == 400 and "tags" in bad.data


def test_the_dashboard_lists_jobs_by_tag(make_user, tagged_jobs) -> None:
    client = Client()
    client.force_login(make_user("viewer", "vic"))
    page = client.get("/jobs/", {"tag": "billing"}).content.decode()
    assert "invoices" in page and "refunds" in page
    assert ">cleanup<" not in page and ">untagged<" not in page
    assert 'href="?tag=nightly"' in page


def test_the_cli_lists_and_acts_on_every_job_of_a_tag(tagged_jobs) -> None:
    out = io.StringIO()
    call_command("jobs", "list", "--tag", "billing", stdout=out)
    listed = out.getvalue()
    assert "invoices" in listed and "refunds" in listed and "cleanup" not in listed
    out = io.StringIO()
    call_command("jobs", "pause", "--tag", "nightly", stdout=out)
    assert set(Job.objects.filter(enabled=False).values_list("name", flat=True)) == {
        "invoices",
        "cleanup",
    }
    call_command("jobs", "trigger", "--tag", "billing", stdout=io.StringIO())
    assert JobExecution.objects.count() == 2
    call_command("jobs", "resume", "--tag", "nightly", stdout=io.StringIO())
    assert not Job.objects.filter(enabled=False).exists()
    for args, says in (
        (["pause", "--tag", "nobody"], "no job carries the tag"),
        (["pause"], "name one job, or give --tag"),
        (["pause", "invoices", "--tag", "billing"], "name one job, or give --tag"),
    ):
        with pytest.raises(CommandError, match=says) as caught:
            call_command("jobs", *args)
        assert caught.value.returncode == 2


def test_export_and_apply_keep_the_tags(tagged_jobs) -> None:
    exported = selectors.job_definitions_export()
    assert {d["name"]: d["tags"] for d in exported}["invoices"] == ["billing", "nightly"]
    Job.objects.all().delete()
    services.job_apply_definitions(definitions=exported, by=services.SYSTEM)
    assert Job.objects.get(name="cleanup").tags == ["nightly", "billing-archive"]
