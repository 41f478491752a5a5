"""Task metadata: each registered task's description, arguments (from its signature) and example
call, served by GET /api/tasks/, listed by `jobs tasks` and shown by the job editor."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from jobs import registry

pytestmark = pytest.mark.django_db


def _entry(name: str) -> dict:
    return next(entry for entry in registry.task_catalog() if entry["name"] == name)


def test_arguments_come_from_the_signature_without_the_context() -> None:
    http = _entry("http_request")
    params = {p["name"]: p for p in http["parameters"]}
    assert "context" not in params
    assert params["url"] == {"name": "url", "type": "string", "required": True}
    assert params["method"] == {
        "name": "method",
        "type": "string",
        "required": False,
        "default": "GET",
    }
    assert params["timeout"]["type"] == "number"
    assert params["headers"]["type"] == "object" and params["headers"]["default"] is None
    assert params["expect_status"]["type"] == "array"
    assert http["description"].startswith("Make an HTTP request")


def test_each_example_is_a_call_its_task_accepts(settings) -> None:
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["example.com"]
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    offered = [e for e in registry.task_catalog() if registry.get_task(e["name"]).example]
    assert {e["name"] for e in offered} >= {"sleep", "log", "http_request", "management_command"}
    for entry in offered:
        example = entry["example"]
        registry.validate_task_call(
            entry["name"], example.get("args", []), example.get("kwargs", {})
        )


def test_a_task_registered_without_metadata_still_describes_itself(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # undone after the test

    @registry.task("test.catalog_plain")
    def plain(count: int, label="x", *rest, flag: bool = False, **more) -> None:
        """Plain."""

    entry = _entry("test.catalog_plain")
    assert entry["example"] == {"args": [], "kwargs": {}}
    assert entry["parameters"] == [
        {"name": "count", "type": "integer", "required": True},
        {"name": "label", "type": "any", "required": False, "default": "x"},
        {
            "name": "flag",
            "type": "boolean",
            "required": False,
            "default": False,
            "keyword_only": True,
        },
    ]


def test_the_api_serves_the_catalog_to_a_viewer(api_client_for) -> None:
    response = api_client_for("viewer").get("/api/tasks/")
    assert response.status_code == 200
    sleep = next(entry for entry in response.json() if entry["name"] == "sleep")
    assert sleep["example"] == {"kwargs": {"seconds": 5}}
    assert sleep["parameters"] == [{"name": "seconds", "type": "number", "required": True}]
    assert api_client_for(None).get("/api/tasks/").status_code == 403


def test_jobs_tasks_lists_them(capsys) -> None:
    call_command("jobs", "tasks")
    out = capsys.readouterr().out
    assert "sleep: Sleep for a number of seconds" in out
    assert "    seconds (number, required)" in out
    assert 'example: {"kwargs": {"seconds": 5}}' in out
    call_command("jobs", "tasks", "--json")
    assert {e["name"] for e in json.loads(capsys.readouterr().out)} >= {"noop", "sleep", "log"}


def test_the_job_editor_carries_the_catalog(client, make_user) -> None:
    client.force_login(make_user("admin", "ada"))
    page = client.get("/jobs/new/").content.decode()
    assert '<script id="task-catalog" type="application/json">' in page
    assert 'id="task-help"' in page


PURGE_SUMMARY = (
    "Delete finished runs older than a number of days (run history retention; see "
    "``jobs.retention``): each job's newest run and runs with a notification to send are kept."
)


def test_a_summary_that_wraps_onto_two_lines_is_shown_whole(capsys) -> None:
    """The description is the docstring's first paragraph (its summary), not its first line:
    purge_runs' summary was cut at "(run history retention; see"."""
    assert _entry("purge_runs")["description"] == PURGE_SUMMARY
    call_command("jobs", "tasks")
    assert f"purge_runs: {PURGE_SUMMARY}\n" in capsys.readouterr().out


def test_the_description_stops_at_the_first_blank_line() -> None:
    def wrapped() -> None:
        """First part of a summary
        that goes on here.

        Details that are not part of it.
        """

    assert registry._description(wrapped) == "First part of a summary that goes on here."
