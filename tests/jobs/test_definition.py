"""One job definition: the API schema, the validation, the forms and the model agree because they
are derived from one table (jobs.definition.FIELDS); and the API answers only what its schema says
(strict filters and pages, JSON 404s, every status declared)."""

from __future__ import annotations

import re

import pytest
from django.db.models import NOT_PROVIDED
from django.utils import timezone

from jobs.admin import JobAdminForm
from jobs.definition import (
    CHOICE,
    FIELDS,
    INTEGER,
    JOB_DEFAULTS,
    NUMBER,
    REQUIRED_BY_SCHEDULE,
    RULES,
    SCHEDULE_FIELDS,
    TEXT,
    foreign_empty,
    timezone_names,
)
from jobs.forms import JobForm
from jobs.models import Job, ScheduleType
from jobs.validation import ERR_NOT_FOR_TYPE, ERR_REQUIRED, ERR_UNKNOWN_FIELD

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(admin_api) -> dict:
    response = admin_api.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def _variants(schema: dict, path: str, method: str) -> list[dict]:
    body = schema["paths"][path][method]["requestBody"]
    assert body["required"] is True
    found = body["content"]["application/json"]["schema"]
    return found.get("oneOf", [found])


def test_model_defaults_are_the_tables() -> None:
    for name, default in JOB_DEFAULTS.items():
        field = Job._meta.get_field(name)
        model_default = field.default() if callable(field.default) else field.default
        if field.default is NOT_PROVIDED:
            model_default = None
        assert model_default == default, name


def test_model_lengths_and_choices_are_the_tables() -> None:
    for rule in FIELDS:
        field = Job._meta.get_field(rule.name)
        if rule.kind == TEXT:
            assert (
                field.max_length in (None, rule.max_length) or rule.max_length <= field.max_length
            )
        if rule.kind == CHOICE and isinstance(rule.choices, type):
            assert [c for c, _ in field.choices] == list(rule.allowed()), rule.name


def test_the_create_schema_states_every_rule_of_the_table(schema) -> None:
    variants = _variants(schema, "/api/jobs/", "post")
    assert [v["properties"]["schedule_type"]["enum"] for v in variants] == [
        [kind] for kind in ScheduleType.values
    ]
    for variant in variants:
        kind = variant["properties"]["schedule_type"]["enum"][0]
        assert variant["additionalProperties"] is False
        assert set(variant["properties"]) == set(RULES)
        required = set(variant["required"])
        assert {"name", "task", "schedule_type"} <= required
        for rule in FIELDS:
            prop = variant["properties"][rule.name]
            if rule.schedule not in (None, kind):
                assert prop["enum"] == list(foreign_empty(rule)), rule.name
                continue
            assert prop["description"] == rule.help
            if rule.kind in (INTEGER, NUMBER):
                assert (prop["minimum"], prop["maximum"]) == (rule.low, rule.high), rule.name
            if rule.kind == TEXT:
                assert prop["maxLength"] == rule.max_length
                assert prop.get("pattern") == rule.pattern
            if rule.kind == CHOICE and rule.name != "schedule_type":
                assert prop["enum"] == list(rule.allowed()), rule.name
            if rule.name in REQUIRED_BY_SCHEDULE:
                assert rule.name in required and not prop.get("nullable")


def test_the_replace_body_needs_a_version_and_the_patch_body_only_that(schema) -> None:
    for variant in _variants(schema, "/api/jobs/{id}/", "put"):
        assert "version" in variant["required"]
    (patch,) = _variants(schema, "/api/jobs/{id}/", "patch")
    assert patch["required"] == ["version"]
    assert set(patch["properties"]) == {*RULES, "version"}


def test_the_time_zones_are_listed_and_checked_the_same_way(admin_api) -> None:
    assert "Europe/Berlin" in timezone_names()
    body = {"name": "tz", "task": "noop", "schedule_type": "cron", "cron_expression": "0 3 * * *"}
    ok = admin_api.post("/api/jobs/", {**body, "timezone": "Europe/Berlin"}, format="json")
    assert ok.status_code == 201
    bad = admin_api.post(
        "/api/jobs/", {**body, "name": "tz2", "timezone": "Mars/Base"}, format="json"
    )
    assert bad.status_code == 400 and list(bad.json()) == ["timezone"]


@pytest.mark.parametrize("kind", ScheduleType.values)
def test_a_body_built_from_the_schema_alone_is_accepted(admin_api, schema, kind) -> None:
    """Every default the schema states, every required field at a value the schema allows: a
    client that reads only the schema writes a job the server takes."""
    variant = next(
        v
        for v in _variants(schema, "/api/jobs/", "post")
        if v["properties"]["schedule_type"]["enum"] == [kind]
    )
    body = {k: p["default"] for k, p in variant["properties"].items() if "default" in p}
    body.update(name=f"from-schema-{kind}", task="noop", schedule_type=kind)
    body.update(
        {
            ScheduleType.CRON: {"cron_expression": "0 3 * * *"},
            ScheduleType.INTERVAL: {"interval_seconds": 60},
            ScheduleType.ONCE: {"run_at": (timezone.now().replace(year=2100)).isoformat()},
        }[kind]
    )
    for field, owner in SCHEDULE_FIELDS.items():  # the other types' fields, at their empty value
        if owner != kind:
            body[field] = variant["properties"][field]["enum"][0]
    response = admin_api.post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.json()


def test_a_field_of_another_schedule_type_may_be_empty_but_not_set(admin_api) -> None:
    body = {"name": "i", "task": "noop", "schedule_type": "interval", "interval_seconds": 60}
    ok = admin_api.post(
        "/api/jobs/", {**body, "cron_expression": "", "run_at": None}, format="json"
    )
    assert ok.status_code == 201, ok.json()
    refused = admin_api.post(
        "/api/jobs/",
        {**body, "name": "i2", "interval_seconds": 60, "run_at": "2100-01-01T00:00:00Z"},
        format="json",
    )
    assert refused.json() == {"run_at": [ERR_NOT_FOR_TYPE.format(kind="once")]}
    empty_string = admin_api.post(
        "/api/jobs/",
        {**body, "name": "i3", "schedule_type": "cron", "interval_seconds": ""},
        format="json",
    )
    assert empty_string.status_code == 400
    assert empty_string.json()["interval_seconds"] == [ERR_NOT_FOR_TYPE.format(kind="interval")]
    assert empty_string.json()["cron_expression"] == [ERR_REQUIRED]


def test_the_dashboard_and_admin_forms_take_their_words_from_the_table() -> None:
    form = JobForm()
    admin_form = JobAdminForm()
    for rule in FIELDS:
        assert form.fields[rule.name].help_text == rule.help
        assert form.fields[rule.name].label == rule.title
        assert admin_form.fields[rule.name].help_text == rule.help
    assert list(form.fields)[: len(FIELDS)] == [rule.name for rule in FIELDS]


# --- the API answers only what its schema says -------------------------------------------------


def test_every_operation_declares_its_error_statuses(schema) -> None:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "403", "429", "503"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if method in ("post", "put", "patch", "delete"):
                assert "409" in codes, (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "415"} <= codes, (method, path)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("enabled=-1", "enabled"),
        ("enabled=", "enabled"),
        ("enabled=True", "enabled"),
        ("concurrency_policy=", "concurrency_policy"),
        ("page_size=abc", "page_size"),
        ("page_size=0", "page_size"),
        ("page_size=501", "page_size"),
        ("page=0", "page"),
        ("page=", "page"),
        ("page=last", "page"),
        ("search=a%00b", "search"),
        ("queue=a%00b", "queue"),
        ("ordering=bogus", "ordering"),
        ("ordering=", "ordering"),
        ("ordering=name,%20priority", "ordering"),
    ],
)
def test_a_query_parameter_the_schema_does_not_allow_is_a_400_naming_it(
    admin_api, query, param
) -> None:
    response = admin_api.get(f"/api/jobs/?{query}")
    assert response.status_code == 400, response.content[:200]
    assert list(response.json()) == [param]


@pytest.mark.parametrize(
    "query", ["job=abc", "job=", "attempt=1.5", "attempt=-1", "attempt=99999999999999999999"]
)
def test_numeric_execution_filters_are_whole_numbers_in_range(admin_api, query) -> None:
    response = admin_api.get(f"/api/executions/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [query.split("=")[0]]


def test_filters_still_filter(admin_api) -> None:
    body = {"name": "p", "task": "noop", "schedule_type": "interval", "interval_seconds": 60}
    assert (
        admin_api.post("/api/jobs/", {**body, "enabled": False}, format="json").status_code == 201
    )
    assert admin_api.get("/api/jobs/?enabled=true").json()["count"] == 0
    assert admin_api.get("/api/jobs/?ordering=-priority,name").status_code == 200
    assert admin_api.get("/api/jobs/?enabled=false&page_size=1&page=1").json()["count"] == 1
    missing = admin_api.get("/api/executions/?job=123456")
    assert missing.status_code == 200 and missing.json()["count"] == 0


def test_a_page_past_the_end_is_a_json_404(admin_api) -> None:
    response = admin_api.get("/api/jobs/?page=7")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("path", ["/api/jobs/0.5/", "/api/jobs/0.5/trigger/", "/api/nowhere/"])
def test_an_api_address_no_route_matches_is_a_json_404(admin_api, settings, path) -> None:
    settings.DEBUG = False
    response = admin_api.get(path)
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_a_dashboard_address_no_route_matches_is_still_a_page(client, settings) -> None:
    settings.DEBUG = False
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        ("/api/jobs/batch/", {"jobs": [], "extra": 1}, "extra"),
        ("/api/jobs/{id}/enqueue/", {"runs": [{}], "extra": 1}, "extra"),
    ],
)
def test_a_body_key_the_schema_does_not_know_is_refused(admin_api, path, body, key) -> None:
    job = admin_api.post(
        "/api/jobs/",
        {"name": "e", "task": "noop", "schedule_type": "interval", "interval_seconds": 60},
        format="json",
    ).json()
    response = admin_api.post(path.format(id=job["id"]), body, format="json")
    assert response.status_code == 400
    assert response.json() == {key: [ERR_UNKNOWN_FIELD]}


def test_an_open_term_states_its_empty_end_reason_in_the_schema(schema) -> None:
    component = schema["components"]["schemas"]["Term"]["properties"]["end_reason"]
    allowed = (
        [
            value
            for option in component.get("oneOf", [component])
            for value in schema["components"]["schemas"][option["$ref"].rsplit("/", 1)[1]]["enum"]
        ]
        if "oneOf" in component
        else component["enum"]
    )
    assert "" in allowed and "lease_lost" in allowed


def test_free_text_query_parameters_say_they_refuse_nul(schema) -> None:
    params = schema["paths"]["/api/jobs/"]["get"]["parameters"]
    search = next(p for p in params if p["name"] == "search")
    assert re.fullmatch(search["schema"]["pattern"], "text")
    assert not re.fullmatch(search["schema"]["pattern"].replace("\\u0000", "\x00"), "a\x00b")


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("schedule_type=once&run_at=2100-01-01T00:00:00Z&interval_seconds=", "interval_seconds"),
        ("schedule_type=once&run_at=2100-01-01T00:00:00Z&timezone=", "timezone"),
        ("schedule_type=interval", "interval_seconds"),
        ("schedule_type=cron&cron_expression=0%203%20*%20*%20*&count=0", "count"),
        # Free text in a query string never holds NUL (the schema's pattern), used or not.
        ("schedule_type=once&run_at=2100-01-01T00:00:00Z&cron_expression=a%00b", "cron_expression"),
    ],
)
def test_a_preview_checks_each_parameter_by_its_rule(admin_api, query, param) -> None:
    response = admin_api.get(f"/api/schedule-preview/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [param]


def test_a_preview_of_a_good_schedule_answers(admin_api) -> None:
    response = admin_api.get(
        "/api/schedule-preview/?schedule_type=cron&cron_expression=0%203%20*%20*%20*"
        "&timezone=Europe/Berlin&count=2"
    )
    assert response.status_code == 200
    assert len(response.json()["next_fires"]) == 2
