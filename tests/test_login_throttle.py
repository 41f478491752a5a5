"""Brute force on every password login (dashboard, admin, the API's browsable login): after
AXES_FAILURE_LIMIT wrong passwords for one username from one address, even the right password is
refused (429) until the cool-off; other users and other addresses are not affected; a success
before the limit clears the count."""

from __future__ import annotations

import pytest
from django.conf import settings
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
