"""API rate limits: writes per user are limited more strictly than reads; the answer past a limit
is 429 with Retry-After; other users are not affected."""

from __future__ import annotations

import socket

import pytest
from rest_framework.throttling import SimpleRateThrottle

from jobs.models import Job
from scheduler_project.settings import redis_cache

pytestmark = pytest.mark.django_db


@pytest.fixture
def low_rates(monkeypatch):
    rates = {"anon": "5/min", "user": "8/min", "writes": "3/min"}
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", rates)
    return rates


def test_writes_are_limited_per_user_and_reads_go_on(api_client_for, low_rates):
    job = Job.objects.create(name="t", task="noop", schedule_type="interval", interval_seconds=60)
    operator = api_client_for("operator")
    statuses = [operator.post(f"/api/jobs/{job.pk}/trigger/").status_code for _ in range(4)]
    assert statuses == [201, 201, 201, 429]
    refused = operator.post(f"/api/jobs/{job.pk}/trigger/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert operator.get("/api/jobs/").status_code == 200  # reads have their own, larger budget
    other = api_client_for("admin")
    assert other.post(f"/api/jobs/{job.pk}/trigger/").status_code == 201


def test_every_call_counts_against_the_per_user_rate(api_client_for, low_rates):
    viewer = api_client_for("viewer")
    statuses = [viewer.get("/api/jobs/").status_code for _ in range(9)]
    assert statuses == [200] * 8 + [429]


def test_the_api_goes_on_without_its_limits_while_the_cache_redis_is_down(api_client_for, settings):
    """The production cache settings with a Redis nobody answers on: calls are served (the rate
    limits fail open, logged), not refused with a 500."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    viewer = api_client_for("viewer")
    settings.CACHES = {"default": redis_cache(f"redis://127.0.0.1:{port}/0", "down")}
    assert viewer.get("/api/jobs/").status_code == 200
    assert viewer.post("/api/jobs/1/trigger/").status_code in (403, 404)  # a write, too


@pytest.mark.parametrize(
    "headers",
    [{}, {"HTTP_AUTHORIZATION": "Token not-a-real-key"}, {"HTTP_AUTHORIZATION": "Token"}],
    ids=["no-credential", "bad-token", "malformed-header"],
)
def test_anonymous_calls_are_limited_by_the_anon_rate_before_the_401(
    client, api_client_for, low_rates, headers
):
    """SCHEDULER_API_RATE_ANON applies: calls without a valid credential get 401 up to the anon
    rate, then 429 with Retry-After (guessing keys is throttled too); a valid key from the same
    address is not affected."""
    statuses = [client.get("/api/jobs/", **headers).status_code for _ in range(6)]
    assert statuses == [401] * 5 + [429]
    refused = client.get("/api/audit-events/", **headers)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["detail"].startswith("Request was throttled")
    assert api_client_for("viewer").get("/api/jobs/").status_code == 200


def test_the_schema_and_docs_count_against_the_anon_rate_too(client, low_rates):
    statuses = [client.get("/api/schema/").status_code for _ in range(6)]
    assert statuses[-1] == 429 and set(statuses[:5]) <= {401, 403}


def test_a_browsable_api_page_refused_to_anonymous_counts_once(client, low_rates):
    statuses = [client.get("/api/jobs/", HTTP_ACCEPT="text/html").status_code for _ in range(6)]
    assert statuses == [401] * 5 + [429]
