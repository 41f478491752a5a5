"""Shared fixtures: private redis-server processes, users per role, API clients.

Redis tests never touch a shared server's data: each test session starts its own ``redis-server``
processes on free loopback ports and stops them by PID. A missing ``redis-server`` binary is a failure,
not a skip (the README's set-up installs it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.redis_server import RedisServer


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """Each test starts with an empty cache (API throttle counts): keys only this suite wrote."""
    from django.core.cache import cache

    delete_pattern = getattr(cache, "delete_pattern", None)
    if delete_pattern is not None:
        delete_pattern("*")  # django-redis: this KEY_PREFIX's keys only, never the whole server
    else:
        cache.clear()
    # The overview's settled chart minutes are kept per process: another test's rows are not this
    # one's.
    from dashboard.selectors import settled_minutes

    settled_minutes.clear()
    # The partition count is cached per process: a test that set it rolled its row back.
    from jobs import partitioning

    partitioning.forget_count()
    yield
    partitioning.forget_count()


@pytest.fixture(scope="session")
def redis_factory() -> Iterator[Callable[[], RedisServer]]:
    """Start private redis-server processes on demand; all are stopped at the end of the session."""
    started: list[RedisServer] = []
    workdir = tempfile.mkdtemp(prefix="sched-redis-")

    def start() -> RedisServer:
        server = RedisServer(f"test-{len(started)}", Path(workdir))
        try:
            server.start()
        except RuntimeError as exc:
            pytest.fail(str(exc))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server(redis_factory: Callable[[], RedisServer]) -> RedisServer:
    """One private Redis for the whole session (tests flush only their own key prefixes)."""
    return redis_factory()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if not redis_server.running:
        redis_server.start()
    return redis_server.url


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"database engine: {engine}; DATABASE_URL set: {bool(os.environ.get('DATABASE_URL'))}"


# --- users and API clients per role ---------------------------------------------------------------


@pytest.fixture
def make_user(db: None) -> Callable[..., object]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    def make(role: str | None, username: str | None = None, *, staff: bool = True) -> object:
        user = get_user_model().objects.create_user(
            username=username or f"user-{role or 'none'}", password="pw-For-tests-1", is_staff=staff
        )
        if role:
            # get_or_create: a transactional test elsewhere may have flushed the migration's groups.
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        return user

    return make


def api_key_for(user: object) -> str:
    """A valid API key for ``user``, stored as the service stores one (a digest), without the
    audit row ``tokens.issue`` writes: tests that count audit events see only their own."""
    import secrets

    from jobs import tokens
    from jobs.models import ApiToken

    key = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, prefix=key[:8], digest=tokens.digest(key))
    return key


@pytest.fixture
def api_client_for(make_user: Callable[..., object]) -> Callable[[str | None], object]:
    """An APIClient authenticated by token as a user of the given role (None = no role)."""
    from rest_framework.test import APIClient

    def client(role: str | None) -> APIClient:
        api = APIClient()
        user = make_user(role, f"api-{role or 'norole'}")
        api.credentials(HTTP_AUTHORIZATION=f"Token {api_key_for(user)}")
        api.user = user
        return api

    return client


@pytest.fixture
def admin_api(api_client_for: Callable[[str | None], object]) -> object:
    return api_client_for("admin")
