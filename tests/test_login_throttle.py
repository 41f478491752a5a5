"""Brute force on every password login (dashboard, admin, the API's browsable login): after
AXES_FAILURE_LIMIT wrong passwords for one username from one address, even the right password is
refused (429) until the cool-off; other users and other addresses are not affected; a success
before the limit clears the count."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db.models import F
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "pw-For-tests-1"
SURFACES = ["/login/", "/admin/login/", "/api-auth/login/"]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def attempt(client: Client, url: str, username: str, password: str) -> int:
    response = client.post(url, {"username": username, "password": password})
    return response.status_code


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("url", SURFACES)
def test_the_right_password_is_refused_after_too_many_wrong_ones(url, make_user):
    user = make_user("admin", "victim")
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(attacker, url, user.username, "wrong") == 200  # the form again
    assert attempt(attacker, url, user.username, "wrong") == 429
    assert attempt(attacker, url, user.username, PASSWORD) == 429
    assert not signed_in(attacker)
    # The user, from their own address, still signs in.
    own = Client(REMOTE_ADDR="198.51.100.20")
    assert attempt(own, url, user.username, PASSWORD) == 302
    assert signed_in(own)


def test_a_success_before_the_limit_clears_the_count(make_user):
    user = make_user("viewer", "forgetful")
    client = Client(REMOTE_ADDR="198.51.100.21")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "/login/", user.username, "wrong")
    assert attempt(client, "/login/", user.username, PASSWORD) == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "/login/", user.username, "wrong") == 200
    assert attempt(client, "/login/", user.username, PASSWORD) == 302


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def lock_out(client: Client, url: str, username: str, **headers: str):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post(url, {"username": username, "password": "wrong"}, **headers)
    return client.post(url, {"username": username, "password": "wrong"}, **headers)


@pytest.mark.parametrize("url", SURFACES)
def test_a_locked_out_browser_gets_a_429_page_with_retry_after(url, make_user):
    user = make_user("viewer", "locked")
    client = Client(REMOTE_ADDR="203.0.113.8")
    cool_off = int(settings.AXES_COOLOFF_TIME.total_seconds())
    for response in (
        lock_out(client, url, user.username, HTTP_ACCEPT=BROWSER_ACCEPT),
        client.post(
            url, {"username": user.username, "password": PASSWORD}, HTTP_ACCEPT=BROWSER_ACCEPT
        ),
    ):
        assert response.status_code == 429
        assert 0 < int(response["Retry-After"]) <= cool_off
        assert response["Content-Type"].startswith("text/html")
        body = response.content.decode()
        assert "<!doctype html>" in body.lower()
        assert "Too many failed sign-in attempts" in body
        assert f"{cool_off // 60} minutes" in body


@pytest.mark.parametrize(
    "headers",
    [
        {"HTTP_ACCEPT": "application/json"},
        {"HTTP_ACCEPT": "*/*"},  # an API client that names no type (curl)
        {"HTTP_X_REQUESTED_WITH": "XMLHttpRequest", "HTTP_ACCEPT": BROWSER_ACCEPT},
    ],
    ids=["json", "any", "xhr"],
)
def test_a_locked_out_api_client_gets_a_json_429_with_retry_after(headers, make_user):
    user = make_user("viewer", "scripted")
    client = Client(REMOTE_ADDR="203.0.113.9")
    response = lock_out(client, "/api-auth/login/", user.username, **headers)
    assert response.status_code == 429
    retry_after = int(response["Retry-After"])
    assert 0 < retry_after <= int(settings.AXES_COOLOFF_TIME.total_seconds())
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] == "locked_out"
    assert body["retry_after"] == retry_after
    assert "Too many failed sign-in attempts" in body["detail"]


def test_retry_after_counts_down_from_the_last_refused_attempt(make_user, settings):
    """With the cool-off not restarted by attempts during a lockout, Retry-After is what is left."""
    from datetime import timedelta

    from axes.models import AccessAttempt

    settings.AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
    user = make_user("viewer", "waiting")
    client = Client(REMOTE_ADDR="203.0.113.10")
    lock_out(client, "/login/", user.username)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=5))
    response = client.post("/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 429
    left = int(settings.AXES_COOLOFF_TIME.total_seconds()) - 300
    assert left - 5 <= int(response["Retry-After"]) <= left
